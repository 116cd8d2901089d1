"""The one check every value a hook returns passes before it reaches a CRI request or a cgroup file.

``registry.run_pod`` and ``registry.run_container`` end here, so the hook server's answers to the proxy and
the reconciler's cgroup writes see the same rules. A value no kernel would take, or one outside what the node
has, is dropped: that field stays as kubelet asked for it, so a malformed annotation can never make a pod
fail that would start without koordlet. Each dropped value comes back as a :class:`Rejected` for the caller
to log, count and report.

The rules (cgroup v1 names; the v2 files take the same values through the executor's conversion). The
kernel's own ranges are ``wire.kernel_ranges``, which the proxy's merge and koordlet's cgroup registry check
too; what only koordlet knows (the node, the parent cgroup) is added here:

- ``cpu.shares`` 2..262144 (the kernel's range);
- ``cpu.cfs_quota_us`` -1 (unlimited) or 1000 µs .. the node's capacity (online CPUs × the 100 ms period),
  which is far below the kernel's own maximum (2^44 - 1 µs); and never above a limited parent's quota
  (cgroup v1 refuses a child quota above its parent's with EINVAL);
- ``cpuset.cpus`` "" (follow the parent) or a valid CPU list that is a subset of the node's online CPUs;
- ``memory.limit_in_bytes`` -1 (unlimited) or one page .. the node's memory;
- ``cpu.bvt_warp_ns`` -1..2, ``cpu.idle`` 0 or 1 (``wire.kernel_ranges``);
- environment variables: POSIX-style names of at most 256 characters, values without NUL of at most 32 KiB;
- resctrl group names: ``wire.kernel_ranges.resctrl_group_problem``, the rule the executor's resctrl writes
  check too ("" is no group); schemata of at most 4 KiB, one line per resource, printable;
- ``oom_score_adj`` −1000..1000 (``wire.kernel_ranges``: the kernel's OOM_SCORE_ADJ_MIN..MAX).
- devices: a normalised absolute path under ``/dev/``, type ``c`` or ``b``, numbers 0..2^32-1, a file mode
  within 0o777; mounts: normalised absolute source and destination (no ``..``), a ``bind`` mount; host dirs a
  normalised absolute path: a value that is not is dropped on its own, the others kept.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from koordlet.api.units import CFS_PERIOD_US
from wire import kernel_ranges
from wire.kernel_ranges import CPUListError, parse_cpu_list

from .protocol import Changes, LinuxDevice, Mount, NodeContext

MAX_CPU_LIST_CHARS = 4096
MAX_ENV_NAME = 256
MAX_ENV_VALUE = 32 << 10
MAX_RESCTRL_SCHEMATA = 4096
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True, slots=True)
class Rejected:
    """One value dropped: the Changes field (``envs.<NAME>`` for an env), the value, and why."""

    key: str
    value: object
    reason: str


ParentQuota = int | None | Callable[[], int | None]


def _quota_problem(quota: int, node: NodeContext, parent_quota: ParentQuota) -> str | None:
    problem = kernel_ranges.quota_problem(quota)
    if problem is not None or quota == kernel_ranges.UNLIMITED:
        return problem
    if node.online_cpus:
        capacity = len(node.online_cpus) * CFS_PERIOD_US
        if quota > capacity:
            return f"above the node's capacity of {capacity} µs ({len(node.online_cpus)} CPUs)"
    parent = parent_quota() if callable(parent_quota) else parent_quota
    if parent is not None and parent > 0 and quota > parent:
        return f"above the parent cgroup's quota of {parent} µs"
    return None


def _cpuset_problem(text: str, node: NodeContext) -> str | None:
    if text == "":
        return None
    if len(text) > MAX_CPU_LIST_CHARS:
        return f"a CPU list longer than {MAX_CPU_LIST_CHARS} characters"
    try:
        cpus = parse_cpu_list(text)
    except CPUListError as err:
        return f"not a CPU list: {err}"
    if not cpus:
        return "an empty CPU list"
    if node.online_cpus:
        outside = sorted(set(cpus) - node.online_cpus)
        if outside:
            return f"CPUs {outside[:8]} are not online on this node"
    return None


def _memory_problem(limit: int, node: NodeContext) -> str | None:
    problem = kernel_ranges.memory_limit_problem(limit)
    if problem is None and limit != kernel_ranges.UNLIMITED and node.memory_bytes and limit > node.memory_bytes:
        return f"above the node's memory of {node.memory_bytes} bytes"
    return problem


def _env_problem(name: object, value: object) -> str | None:
    if not isinstance(name, str) or not _ENV_NAME.match(name) or len(name) > MAX_ENV_NAME:
        return "not a valid environment variable name"
    if not isinstance(value, str) or "\x00" in value or len(value) > MAX_ENV_VALUE:
        return f"not a valid environment value (no NUL, at most {MAX_ENV_VALUE} characters)"
    return None


def _schemata_problem(text: str) -> str | None:
    if len(text) > MAX_RESCTRL_SCHEMATA:
        return f"longer than {MAX_RESCTRL_SCHEMATA} characters"
    if not all(line.isprintable() for line in text.split("\n")):
        return "not printable text"
    return None


# Field of Changes -> (value, node, parent quota) -> why the value is refused, or None; checked in this order.
_FIELD_RULES: tuple[tuple[str, Callable[[object, NodeContext, ParentQuota], str | None]], ...] = (
    ("cpu_shares", lambda value, node, parent: kernel_ranges.shares_problem(value)),
    ("cfs_quota_us", _quota_problem),
    ("cpuset_cpus", lambda value, node, parent: _cpuset_problem(value, node)),
    ("memory_limit_bytes", lambda value, node, parent: _memory_problem(value, node)),
    ("bvt_warp_ns", lambda value, node, parent: kernel_ranges.bvt_warp_ns_problem(value)),
    ("cpu_idle", lambda value, node, parent: kernel_ranges.cpu_idle_problem(value)),
    ("resctrl_group", lambda value, node, parent: None if value == "" else kernel_ranges.resctrl_group_problem(value)),
    ("resctrl_schemata", lambda value, node, parent: _schemata_problem(value)),
    ("oom_score_adj", lambda value, node, parent: kernel_ranges.oom_score_adj_problem(value)),
)


def _checked_envs(envs: Mapping[str, str], rejected: list[Rejected]) -> dict[str, str] | None:
    """``envs`` without the invalid ones (each added to ``rejected``), or None when all are valid."""
    bad = {name: reason for name, value in envs.items() if (reason := _env_problem(name, value)) is not None}
    if not bad:
        return None
    for name, reason in bad.items():
        rejected.append(Rejected(f"envs.{str(name)[:64]}", str(envs[name])[:64], reason))
    return {name: value for name, value in envs.items() if name not in bad}
def _absolute(path: object) -> bool:
    """A normalised absolute path: no ``..``, ``.``, empty or doubled components, no NUL."""
    return (isinstance(path, str) and path.startswith("/") and "\x00" not in path and len(path) <= 4096
            and posixpath.normpath(path) == path and "/../" not in f"{path}/")


def _device_problem(device: LinuxDevice) -> str | None:
    if not _absolute(device.path) or not device.path.startswith("/dev/"):
        return "not a normalised path under /dev/"
    if device.type not in ("c", "b"):
        return "type is not c or b"
    if not (0 <= device.major < 1 << 32 and 0 <= device.minor < 1 << 32 and 0 <= device.file_mode <= 0o777):
        return "device numbers or file mode out of range"
    return None


def _mount_problem(mount: Mount) -> str | None:
    if not (_absolute(mount.destination) and _absolute(mount.source)) or mount.destination == "/":
        return "source and destination must be normalised absolute paths"
    if mount.type != "bind":
        return "only bind mounts"
    return None


def _check_lists(changes: Changes, drop: dict[str, object], rejected: list[Rejected]) -> None:
    """Devices, mounts and host dirs: the bad entries dropped one by one."""
    checks: tuple[tuple[str, Callable[[object], str | None]], ...] = (
        ("devices", _device_problem),  # type: ignore[arg-type]
        ("mounts", _mount_problem),  # type: ignore[arg-type]
        ("host_dirs", lambda path: None if _absolute(path) and path != "/" else "not a normalised absolute path"),
    )
    for name, problem in checks:
        items = getattr(changes, name)
        kept = []
        for item in items:
            reason = problem(item)
            if reason is None:
                kept.append(item)
            else:
                rejected.append(Rejected(name, item, reason))
        if len(kept) != len(items):
            drop[name] = tuple(kept)


def check(changes: Changes, node: NodeContext, parent_quota: ParentQuota = None) -> tuple[Changes, list[Rejected]]:
    """``changes`` without the values the kernel or the node would refuse, and what was dropped.

    ``parent_quota``: the ``cpu.cfs_quota_us`` of the cgroup the settings' cgroup lives in (a container's pod,
    a pod's QoS class dir), or a function reading it (called only when a limited quota is to be checked);
    -1 or None means unlimited."""
    rejected: list[Rejected] = []
    drop: dict[str, object] = {}
    for key, problem in _FIELD_RULES:
        value = getattr(changes, key)
        if value is None:
            continue
        reason = problem(value, node, parent_quota)
        if reason is not None:
            rejected.append(Rejected(key, value, reason))
            drop[key] = None
    _check_lists(changes, drop, rejected)
    envs = _checked_envs(changes.envs, rejected)
    if envs is not None:
        drop["envs"] = envs
    if not drop:
        return changes, []
    return replace(changes, **drop), rejected
