"""koordlet."""
