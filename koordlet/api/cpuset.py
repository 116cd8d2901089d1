"""CPU list strings as the kernel writes them (``0-3,8,10-11``): parse and format.

Used for ``cpuset.cpus``/``cpuset.mems`` values, ``/sys/devices/system/cpu/online`` and the cpuset fields of
Koordinator annotations (``scheduling.koordinator.sh/resource-status``, node reservation). Parsing is
``wire.kernel_ranges.parse_cpu_list``, re-exported here: hook plugins, the executor and the proxy validate
cpusets with the same code.
"""

from __future__ import annotations

from collections.abc import Iterable

# The parser is the kernel-range module's, so that the proxy (which may not import koordlet) checks cpusets with
# the same code.
from wire.kernel_ranges import MAX_CPU_ID, CPUListError, parse_cpu_list

__all__ = ["MAX_CPU_ID", "CPUListError", "format_cpu_list", "parse_cpu_list"]


def format_cpu_list(cpus: Iterable[int]) -> str:
    """The kernel's compact form: sorted, ranges of 2+ consecutive ids as ``a-b``; empty input → ``""``."""
    ordered = sorted(set(cpus))
    parts: list[str] = []
    index = 0
    while index < len(ordered):
        start = ordered[index]
        while index + 1 < len(ordered) and ordered[index + 1] == ordered[index] + 1:
            index += 1
        end = ordered[index]
        parts.append(str(start) if start == end else f"{start}-{end}")
        index += 1
    return ",".join(parts)
