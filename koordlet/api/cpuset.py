"""CPU list strings as the kernel writes them (``0-3,8,10-11``): parse and format.

Used for ``cpuset.cpus``/``cpuset.mems`` values, ``/sys/devices/system/cpu/online`` and the cpuset fields of
Koordinator annotations (``scheduling.koordinator.sh/resource-status``, node reservation). It lives in
``koordlet.api`` (the leaf package) so that hook plugins, which may import only ``koordlet.api``, and the
executor validate cpusets with the same code.
"""

from __future__ import annotations

from collections.abc import Iterable

# Linux NR_CPUS tops out at 8192 today; the cap keeps a hostile "0-99999999999" from allocating a huge set.
MAX_CPU_ID = 65535


class CPUListError(ValueError):
    """A string is not a kernel CPU list."""


def parse_cpu_list(text: str) -> tuple[int, ...]:
    """Sorted, de-duplicated CPU ids of a kernel CPU list; blank text is the empty tuple.

    Accepts what the kernel prints (``0-3,8``), surrounding whitespace and a trailing newline.
    Raises CPUListError for anything else (negative ids, reversed ranges, ids above MAX_CPU_ID, junk).
    """
    stripped = text.strip()
    if not stripped:
        return ()
    cpus: set[int] = set()
    for part in stripped.split(","):
        first, sep, last = part.strip().partition("-")
        low = _cpu_id(first, stripped)
        high = _cpu_id(last, stripped) if sep else low
        if high < low:
            raise CPUListError(f"reversed range {part.strip()!r} in CPU list {stripped!r}")
        cpus.update(range(low, high + 1))
    return tuple(sorted(cpus))


def _cpu_id(token: str, whole: str) -> int:
    # str.isdigit() accepts non-ASCII digits ("²") that int() then rejects; check ASCII explicitly.
    if not token or not token.isascii() or not token.isdigit():
        raise CPUListError(f"bad CPU id {token!r} in CPU list {whole!r}")
    value = int(token)
    if value > MAX_CPU_ID:
        raise CPUListError(f"CPU id {value} above {MAX_CPU_ID} in CPU list {whole!r}")
    return value


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
