"""Kernel and CRI constants every layer shares (defined once; hooks, system and strategies import them)."""

from __future__ import annotations

CFS_PERIOD_US = 100_000  # the CFS period kubelet and runc set, and the one quotas are computed against
UNLIMITED = -1  # "no limit" in v1 cgroup files (cpu.cfs_quota_us, memory.limit_in_bytes) and in CRI values
