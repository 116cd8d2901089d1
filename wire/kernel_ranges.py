"""The kernel's ranges and names for the values koordlet and the proxy hand to it, spelled here once: the proxy's
merge of hook answers (``runtimeproxy/interceptor.py``), the hook value check (``hooks/validate.py``), koordlet's
registries of cgroup and node-wide files (``koordlet/system/resources.py``, ``koordlet/system/sysctl.py``), the
NodeSLO fields that carry such values (``koordlet/api/nodeslo.py``) and the executor's resctrl paths
(``koordlet/executor/resctrl.py``) all read them from this module. It lives in ``wire`` because the proxy and
koordlet may share nothing else. (Ranges only one of them knows, such as the sysctls of NodeSLO
``systemStrategy`` or the Anolis memory files, stay in koordlet's registries, each spelled there once.)

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
- ``cpu.idle`` 0 or 1 (kernel/sched/fair.c ``sched_group_set_idle`` answers EINVAL for anything else).
- ``cpu.bvt_warp_ns`` -1..2: the group identity of Alibaba Cloud Linux / Anolis kernels (2 highest, -1 the
  "underclass" BE pods get, 0 none); NodeSLO ``cpuQOS.groupIdentity`` carries the same values.
- ``oom_score_adj`` -1000..1000: ``OOM_SCORE_ADJ_MIN``..``OOM_SCORE_ADJ_MAX`` (include/uapi/linux/oom.h);
  ``/proc/<pid>/oom_score_adj`` answers EINVAL outside.
- resctrl group names (:func:`resctrl_group_problem`): a group is a directory made by ``mkdir`` in the resctrl
  root, so its name is one path component of at most ``NAME_MAX`` (255) bytes without ``/`` or NUL, never
  ``.`` or ``..``; the kernel's ``rdtgroup_mkdir`` refuses a newline (EINVAL), and a name the root holds
  already (``info``, ``mon_groups``, ``mon_data``, the root group's own files) is EEXIST, not a new group.
  runc refuses an RDT class (``linux.intelRdt.closID``) of ``.``, ``..`` or with a ``/``. Within that, the
  rule here takes letters, digits, ``_``, ``.`` and ``-``, the first a letter, digit or ``_``: every name
  Koordinator makes (``LSR``, ``LS``, ``BE``, ``koordlet-<pod uid>``) and none a shell, a log line or a
  hidden-file listing would take for something else.
"""

from __future__ import annotations

import re

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
CPU_IDLE_MIN, CPU_IDLE_MAX = 0, 1
BVT_WARP_NS_MIN, BVT_WARP_NS_MAX = -1, 2
OOM_SCORE_ADJ_MIN, OOM_SCORE_ADJ_MAX = -1000, 1000
RESCTRL_GROUP_NAME_MAX_BYTES = 255  # NAME_MAX
# What the resctrl root holds of its own: mkdir of these is EEXIST, and none of them is a control group.
RESCTRL_ROOT_NAMES = frozenset({"info", "mon_groups", "mon_data", "schemata", "tasks", "cpus", "cpus_list",
                                "mode", "size"})
_RESCTRL_GROUP_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")


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


def _int_problem(value: object, low: int, high: int) -> str | None:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        return f"outside {low}..{high}"
    return None


def cpu_idle_problem(value: object) -> str | None:
    return _int_problem(value, CPU_IDLE_MIN, CPU_IDLE_MAX)


def bvt_warp_ns_problem(value: object) -> str | None:
    return _int_problem(value, BVT_WARP_NS_MIN, BVT_WARP_NS_MAX)


def oom_score_adj_problem(value: object) -> str | None:
    return _int_problem(value, OOM_SCORE_ADJ_MIN, OOM_SCORE_ADJ_MAX)


def resctrl_group_problem(name: object) -> str | None:
    """None for a name koordlet may give a resctrl group (the module docstring says why these), else why not."""
    if not isinstance(name, str) or not name:
        return "an empty resctrl group name"
    if len(name.encode()) > RESCTRL_GROUP_NAME_MAX_BYTES:
        return f"a resctrl group name longer than {RESCTRL_GROUP_NAME_MAX_BYTES} bytes"
    if not _RESCTRL_GROUP_NAME.fullmatch(name):
        return "not a resctrl group name (letters, digits, '_', '.', '-'; the first a letter, digit or '_')"
    if name in RESCTRL_ROOT_NAMES:
        return f"{name!r} is the resctrl root's own entry, not a group"
    return None
