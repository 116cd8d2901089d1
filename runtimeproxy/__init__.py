"""runtimeproxy."""
