"""Kernel interfaces: cgroup v1/v2, /proc, sysfs, resctrl; every reader takes its root as an argument."""
