"""The kernel's ranges for the cgroup values hooks set: the one check the proxy's merge of hook answers
(``runtimeproxy/interceptor.py``), the hook value check (``hooks/validate.py``) and koordlet's cgroup file
registry (``koordlet/system/resources.py``) share. It lives in ``wire`` because the proxy and koordlet may
share nothing else.

Each ``*_problem`` function returns None for a value the kernel takes, else why not (a phrase for a log line,
a metric label's reason or an Event). Values are in cgroup v1 terms; the v2 files take the same values
through the executor's conversion.

- ``cpu.shares`` 2..262144: kernel/sched ``MIN_SHARES`` and ``MAX_SHARES``. The kernel clamps a value outside
  instead of refusing it, so one outside is a caller's mistake, refused here.
- ``cpu.cfs_period_us`` 1 ms..1 s and ``cpu.cfs_quota_us`` -1 (unlimited) or 1 ms..2^44 - 1 µs:
  kernel/sched/core.c ``min_cfs_quota_period``, ``max_cfs_quota_period`` and ``max_cfs_runtime`` (``MAX_BW``
  µs); ``tg_set_cfs_bandwidth`` answers EINVAL outside them (Documentation/scheduler/sched-bwc.rst).
- ``memory.limit_in_bytes`` -1 (unlimited) or at least one page: the kernel counts the limit in whole pages,
  so less than one leaves the group no memory at all, which no pod asks for.
- ``cpuset.cpus``/``cpuset.mems``: the kernel's list form (``0-3,8``, what ``/sys`` and cgroup files print),
  ids up to :data:`MAX_CPU_ID`; empty means "as the parent" (v2) or "none set yet".
"""

from __future__ import annotations

CPU_SHARES_MIN = 2
CPU_SHARES_MAX = 262_144
CFS_PERIOD_MIN_US = 1000
CFS_PERIOD_MAX_US = 1_000_000
CFS_QUOTA_MIN_US = 1000
CFS_QUOTA_MAX_US = (1 << 44) - 1
UNLIMITED = -1  # cpu.cfs_quota_us and memory.limit_in_bytes without a limit
PAGE_BYTES = 4096  # the smallest page of the architectures we run on (x86-64, arm64 with 4K pages)
MEMORY_LIMIT_MIN_BYTES = PAGE_BYTES
# Linux NR_CPUS tops out at 8192 today; the cap keeps a hostile "0-99999999999" from allocating a huge set.
MAX_CPU_ID = 65535


class CPUListError(ValueError):
    """A string is not a kernel CPU list."""


def shares_problem(shares: int) -> str | None:
    if CPU_SHARES_MIN <= shares <= CPU_SHARES_MAX:
        return None
    return f"outside {CPU_SHARES_MIN}..{CPU_SHARES_MAX}"


def period_problem(period_us: int) -> str | None:
    if CFS_PERIOD_MIN_US <= period_us <= CFS_PERIOD_MAX_US:
        return None
    return f"outside the kernel's {CFS_PERIOD_MIN_US}..{CFS_PERIOD_MAX_US} µs"


def quota_problem(quota_us: int) -> str | None:
    """The kernel's own bounds; callers that know the node or the parent cgroup add theirs."""
    if quota_us == UNLIMITED:
        return None
    if quota_us < CFS_QUOTA_MIN_US:
        return f"below the kernel's minimum of {CFS_QUOTA_MIN_US} µs (and not -1)"
    if quota_us > CFS_QUOTA_MAX_US:
        return f"above the kernel's maximum of {CFS_QUOTA_MAX_US} µs"
    return None


def memory_limit_problem(limit_bytes: int) -> str | None:
    """The kernel's floor; callers that know the node's memory add the ceiling."""
    if limit_bytes == UNLIMITED or limit_bytes >= MEMORY_LIMIT_MIN_BYTES:
        return None
    return f"below one page ({PAGE_BYTES} bytes, and not -1)"


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


def cpu_list_problem(text: str) -> str | None:
    """None for a kernel CPU list (or "": none given), else why not."""
    try:
        parse_cpu_list(text)
    except CPUListError as err:
        return f"not a CPU list: {err}"
    return None
