"""Reporters: NodeMetric status (nodemetric.py); the Device CR reporter lives in koordlet.gpu."""
