"""The registry of cgroup files koordlet reads and writes, with v1 and v2 names, validators and the v1→v2
value translation (docs/koordinator.md §10, docs/node-interfaces.md §9.1, ranges of
docs/node-interfaces.md §14.6). The ranges of the values hooks also set (shares, quota, period, the memory
limit's floor, ``cpu.idle``, ``cpu.bvt_warp_ns``) are ``wire.kernel_ranges``, which the proxy and the hook
value check read too.

Values are given in v1 terms (``cpu.cfs_quota_us = -1``, ``cpu.shares = 1024``) everywhere in koordlet;
:meth:`CgroupResource.to_file_value` turns them into what the file of the running version takes.

cpu.shares → cpu.weight uses the formula of the runtime on the node (:class:`WeightFormula`, docs/node-interfaces.md
§9.1): the linear ``weight = 1 + (shares − 2) × 9999 / 262142`` (integer division; 1024 → 39) of runc ≤ 1.3.1 and
crun < 1.23 (Debian 12's runc 1.1.5; the one Koordinator always writes), or the quadratic one of runc ≥ 1.3.2 and
crun ≥ 1.23 (1024 → 100). The runtime writes a container's weight from the CRI ``cpu_shares`` and koordlet writes the
same file from the same shares, so the two must use one formula, or each would rewrite the other's value whenever it
writes. Which one the runtime uses is the executor's to hold (``ResourceExecutor.weight_formula``: the
``-cgroup-v2-weight-formula`` flag, or observed from the runtime's own writes, koordlet/runtimehooks/weightformula.py);
the translation here takes it as an argument.
"""

from __future__ import annotations

import enum
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from koordlet.api.cpuset import CPUListError, format_cpu_list, parse_cpu_list
from koordlet.api.units import CFS_PERIOD_US
from koordlet.system.cgroup import CgroupVersion
from wire.kernel_ranges import (
    BVT_WARP_NS_MAX,
    BVT_WARP_NS_MIN,
    CFS_PERIOD_MAX_US,
    CFS_PERIOD_MIN_US,
    CFS_QUOTA_MAX_US,
    CFS_QUOTA_MIN_US,
    CPU_IDLE_MAX,
    CPU_IDLE_MIN,
    CPU_SHARES_MAX,
    CPU_SHARES_MIN,
    MEMORY_LIMIT_MIN_BYTES,
)

INT64_MAX = 2**63 - 1
PID_MAX_LIMIT = 4194304  # kernel PID_MAX_LIMIT on 64-bit
CPU_WEIGHT_MIN = 1
CPU_WEIGHT_MAX = 10000


class InvalidCgroupValueError(ValueError):
    """A value is not valid for a cgroup resource; it is never written."""


class UnknownCgroupResourceError(KeyError):
    """No resource of that name in the registry."""


class ValueKind(enum.Enum):
    INT_RANGE = "int-range"
    CPU_LIST = "cpu-list"
    READ_ONLY = "read-only"


Validator = Callable[[str], str]
# (validated v1 value, current content of the v2 file or None) → content to write to the v2 file.
V2Translator = Callable[[str, str | None], str]
# (current v1 value, wanted v1 value) → the looser of the two, for the leveled batch.
Merger = Callable[[str, str], str]


@dataclass(frozen=True, slots=True)
class CgroupResource:
    """One cgroup file. ``name`` is the registry key: the v1 file name, or the v2 name for v2-only files.

    ``v1_file``/``v2_file`` None: the resource does not exist in that version. ``merge`` None: the file
    has no parent/child constraint, so the leveled batch writes it once with the exact value.
    """

    name: str
    subsystem: str
    v1_file: str | None
    v2_file: str | None
    kind: ValueKind
    validator: Validator | None = None
    to_v2: V2Translator | None = None
    merge: Merger | None = None
    description: str = ""
    v2_needs_current: bool = False  # the v2 file holds more than this value (cpu.max: quota and period)
    per_device: bool = False  # one "MAJ:MIN ..." line per block device (the blkio files): cached per device
    # Write-only: each write asks the kernel to act (memory.reclaim), so it is never cached or read back, and the
    # kernel may do less than asked (EAGAIN).
    action: bool = False
    # cpu.shares: its v2 file is cpu.weight, by the runtime's formula (to_file_value's weight_formula)
    shares_to_weight: bool = False

    @property
    def writable(self) -> bool:
        return self.validator is not None

    def file_name(self, version: CgroupVersion) -> str | None:
        return self.v2_file if version is CgroupVersion.V2 else self.v1_file

    def validate(self, value: str | int) -> str:
        """The value in canonical v1 form; raises InvalidCgroupValueError naming the resource and reason."""
        if self.validator is None:
            raise InvalidCgroupValueError(f"{self.name} is read-only")
        text = str(value) if isinstance(value, int) and not isinstance(value, bool) else value
        if not isinstance(text, str):
            raise InvalidCgroupValueError(f"{self.name}: value must be a string or int, got {type(value).__name__}")
        try:
            return self.validator(text)
        except InvalidCgroupValueError as exc:
            raise InvalidCgroupValueError(f"{self.name}: {exc}") from exc

    def to_file_value(self, value: str, version: CgroupVersion, current_v2: str | None = None,
                      weight_formula: WeightFormula | None = None) -> str:
        """What to write to the file of ``version`` for the validated v1 ``value``; ``weight_formula``: the runtime's
        shares → weight formula (cpu.shares on v2 only; default linear)."""
        if version is not CgroupVersion.V2:
            return value
        if self.shares_to_weight:
            return str(cpu_shares_to_weight(int(value), weight_formula or WeightFormula.LINEAR))
        if self.to_v2 is not None:
            return self.to_v2(value, current_v2)
        return value


# ------------------------------------------------------------------------------------------- validators


def _parse_int(text: str) -> int:
    stripped = text.strip()
    body = stripped[1:] if stripped[:1] in "+-" else stripped
    if not body or not body.isascii() or not body.isdigit():
        raise InvalidCgroupValueError(f"not an integer: {text[:40]!r}")
    return int(stripped)


def _int_range(low: int, high: int, *, allow_unlimited: bool = False) -> Validator:
    """An integer in [low, high]; with ``allow_unlimited`` also -1 (and "max", normalised to -1)."""

    def validate(text: str) -> str:
        if allow_unlimited and text.strip() in ("-1", "max"):
            return "-1"
        value = _parse_int(text)
        if not low <= value <= high:
            extra = " or -1" if allow_unlimited else ""
            raise InvalidCgroupValueError(f"{value} outside [{low}, {high}]{extra}")
        return str(value)

    return validate


def _cpu_list(text: str) -> str:
    """A kernel CPU/node list, normalised (``"3,0-2"`` → ``"0-3"``); empty is allowed (inherit on v2)."""
    try:
        return format_cpu_list(parse_cpu_list(text))
    except CPUListError as exc:
        raise InvalidCgroupValueError(str(exc)) from exc


# ------------------------------------------------------------------------------------- v2 translations


class WeightFormula(enum.StrEnum):
    """The cpu.shares → cpu.weight mapping of a container runtime (docs/node-interfaces.md §9.1)."""

    LINEAR = "linear"  # runc ≤ 1.3.1, crun < 1.23: 1 + (shares − 2) × 9999 / 262142; Koordinator's
    QUADRATIC = "quadratic"  # runc ≥ 1.3.2 (opencontainers/cgroups ≥ 0.0.3), crun ≥ 1.23: 1024 → 100


def cpu_shares_to_weight(shares: int, formula: WeightFormula = WeightFormula.LINEAR) -> int:
    """The weight ``formula`` gives ``shares``, clamped to cpu.weight's range. The quadratic one is runc's
    (opencontainers/cgroups ConvertCPUSharesToCgroupV2Value): with L = log2(shares), the exponent
    (L² + 125·L) / 612 − 7/34 fits 2 → 1, 1024 → 100 and 262144 → 10000, and the weight is 10 to that power,
    rounded up."""
    if formula is WeightFormula.QUADRATIC:
        if shares <= CPU_SHARES_MIN:
            return CPU_WEIGHT_MIN
        if shares >= CPU_SHARES_MAX:
            return CPU_WEIGHT_MAX
        log2 = math.log2(shares)
        return math.ceil(math.pow(10, (log2 * log2 + 125 * log2) / 612.0 - 7.0 / 34.0))
    shares = min(max(shares, CPU_SHARES_MIN), CPU_SHARES_MAX)
    return CPU_WEIGHT_MIN + (shares - CPU_SHARES_MIN) * 9999 // (CPU_SHARES_MAX - CPU_SHARES_MIN)


def formulas_giving(shares: int, weight: int) -> frozenset[WeightFormula]:
    """The formulas that map ``shares`` to ``weight`` (both for 2 and 262144, where they agree; none for a weight
    neither gives: set by hand, or by a runtime with a third formula)."""
    return frozenset(f for f in WeightFormula if cpu_shares_to_weight(shares, f) == weight)


def _split_cpu_max(current: str | None) -> tuple[str, str]:
    parts = (current or "").split()
    quota = parts[0] if parts and (parts[0] == "max" or parts[0].isdigit()) else "max"
    period = parts[1] if len(parts) > 1 and parts[1].isdigit() else str(CFS_PERIOD_US)
    return quota, period


def _quota_to_cpu_max(value: str, current: str | None) -> str:
    _, period = _split_cpu_max(current)
    return f"{'max' if value == '-1' else value} {period}"


def _period_to_cpu_max(value: str, current: str | None) -> str:
    quota, _ = _split_cpu_max(current)
    return f"{quota} {value}"


def _unlimited_to_max(value: str, current: str | None) -> str:
    return "max" if value == "-1" else value


# --------------------------------------------------------------------------------------------- blkio

_DEVICE_LINE = re.compile(r"^(\d{1,10}):(\d{1,10}) (\S.*)$")
_COST_WORD = re.compile(r"^(enable=[01]|ctrl=(auto|user)|model=linear|[a-z]{3,9}=\d{1,19}(\.\d{1,2})?)$")
IO_MAX_KEYS = {"blkio.throttle.read_bps_device": "rbps", "blkio.throttle.write_bps_device": "wbps",
               "blkio.throttle.read_iops_device": "riops", "blkio.throttle.write_iops_device": "wiops"}


def _device_int(low: int, high: int) -> Validator:
    """``"MAJ:MIN N"`` with N in [low, high] (the v1 per-device blkio files)."""

    def validate(text: str) -> str:
        match = _DEVICE_LINE.match(text.strip())
        if match is None:
            raise InvalidCgroupValueError(f"expected 'MAJ:MIN value', got {text[:60]!r}")
        value = _parse_int(match.group(3))
        if not low <= value <= high:
            raise InvalidCgroupValueError(f"{value} outside [{low}, {high}]")
        return f"{int(match.group(1))}:{int(match.group(2))} {value}"

    return validate


def _device_cost(text: str) -> str:
    """``"MAJ:MIN key=value ..."`` of blk-iocost (``blkio.cost.qos``/``model``, v2 ``io.cost.qos``/``model``)."""
    match = _DEVICE_LINE.match(text.strip())
    if match is None or not all(_COST_WORD.match(word) for word in match.group(3).split()):
        raise InvalidCgroupValueError(f"expected 'MAJ:MIN key=value ...', got {text[:80]!r}")
    return f"{int(match.group(1))}:{int(match.group(2))} {' '.join(match.group(3).split())}"


def device_of(value: str) -> str:
    """The ``MAJ:MIN`` a validated per-device value is for."""
    return value.split(" ", 1)[0]


def _throttle_to_io_max(key: str) -> V2Translator:
    """v1 ``MAJ:MIN N`` → v2 ``io.max`` ``MAJ:MIN <key>=N``, 0 (no limit) → ``max``."""

    def translate(value: str, current: str | None) -> str:
        device, amount = value.split(" ", 1)
        return f"{device} {key}={'max' if amount == '0' else amount}"

    return translate


def _same(value: str, current: str | None) -> str:
    return value


def _default_weight(text: str) -> str:
    """``"default N"``, N in [1, 10000]: io.weight's default line, kept with the per-device lines as the line of the
    "device" ``default`` (:func:`device_of`)."""
    head, _, value = text.strip().partition(" ")
    if head != "default":
        raise InvalidCgroupValueError(f"expected 'default N', got {text[:40]!r}")
    number = _parse_int(value)
    if not CPU_WEIGHT_MIN <= number <= CPU_WEIGHT_MAX:
        raise InvalidCgroupValueError(f"{number} outside [{CPU_WEIGHT_MIN}, {CPU_WEIGHT_MAX}]")
    return f"default {number}"


# ---------------------------------------------------------------------------------- leveled-batch merges


def _merge_cpu_list(current: str, wanted: str) -> str:
    """Union: a parent must hold every CPU a child is about to get (v1 cpuset: child ⊆ parent)."""
    try:
        return format_cpu_list(set(parse_cpu_list(current)) | set(parse_cpu_list(wanted)))
    except CPUListError:
        return wanted


def _merge_unlimited_max(current: str, wanted: str) -> str:
    """The larger limit, -1 (unlimited) being the largest (v1 cfs quota: child ≤ parent)."""
    try:
        current_value = int(current.strip())
    except ValueError:
        return wanted
    if current_value < 0 or wanted == "-1":
        return "-1"
    return str(max(current_value, int(wanted)))


def _merge_max(current: str, wanted: str) -> str:
    try:
        return str(max(int(current.strip()), int(wanted)))
    except ValueError:
        return wanted


# ------------------------------------------------------------------------------------------- registry


def _rw(
    name: str,
    subsystem: str,
    validator: Validator,
    *,
    v2_file: str | None = "",
    to_v2: V2Translator | None = None,
    merge: Merger | None = None,
    kind: ValueKind = ValueKind.INT_RANGE,
    description: str = "",
    shares_to_weight: bool = False,
) -> CgroupResource:
    shares_v2_file = to_v2 in (_quota_to_cpu_max, _period_to_cpu_max)
    return CgroupResource(
        name=name,
        subsystem=subsystem,
        v1_file=name,
        v2_file=name if v2_file == "" else v2_file,
        kind=kind,
        validator=validator,
        to_v2=to_v2,
        merge=merge,
        description=description,
        v2_needs_current=shares_v2_file,
        shares_to_weight=shares_to_weight,
    )


def _ro(name: str, subsystem: str, *, v1_file: str | None = "", v2_file: str | None = "") -> CgroupResource:
    return CgroupResource(
        name=name,
        subsystem=subsystem,
        v1_file=name if v1_file == "" else v1_file,
        v2_file=name if v2_file == "" else v2_file,
        kind=ValueKind.READ_ONLY,
    )


_NON_NEGATIVE = _int_range(0, INT64_MAX)
_BOOL = _int_range(0, 1)

_RESOURCES = (
    # CPU (cpu subsystem)
    _rw(
        "cpu.shares",
        "cpu",
        _int_range(CPU_SHARES_MIN, CPU_SHARES_MAX),
        v2_file="cpu.weight",
        shares_to_weight=True,
        description="CPU weight; v2 cpu.weight by the runtime's formula (WeightFormula)",
    ),
    _rw(
        "cpu.cfs_quota_us",
        "cpu",
        _int_range(CFS_QUOTA_MIN_US, CFS_QUOTA_MAX_US, allow_unlimited=True),
        v2_file="cpu.max",
        to_v2=_quota_to_cpu_max,
        merge=_merge_unlimited_max,
        description="CFS quota; v2 first field of cpu.max, -1 → max, period kept",
    ),
    _rw(
        "cpu.cfs_period_us",
        "cpu",
        _int_range(CFS_PERIOD_MIN_US, CFS_PERIOD_MAX_US),
        v2_file="cpu.max",
        to_v2=_period_to_cpu_max,
        description="CFS period; v2 second field of cpu.max, quota kept",
    ),
    _rw("cpu.cfs_burst_us", "cpu", _int_range(0, 100 * 10 * CFS_PERIOD_US), v2_file="cpu.max.burst"),
    _rw("cpu.bvt_warp_ns", "cpu", _int_range(BVT_WARP_NS_MIN, BVT_WARP_NS_MAX),
        description="group identity (Anolis/Alinux)"),
    _rw("cpu.idle", "cpu", _int_range(CPU_IDLE_MIN, CPU_IDLE_MAX), description="SCHED_IDLE group"),
    # cpuset
    _rw("cpuset.cpus", "cpuset", _cpu_list, merge=_merge_cpu_list, kind=ValueKind.CPU_LIST),
    _rw("cpuset.mems", "cpuset", _cpu_list, merge=_merge_cpu_list, kind=ValueKind.CPU_LIST),
    # memory
    _rw(
        "memory.limit_in_bytes",
        "memory",
        _int_range(MEMORY_LIMIT_MIN_BYTES, INT64_MAX, allow_unlimited=True),
        v2_file="memory.max",
        to_v2=_unlimited_to_max,
        merge=_merge_unlimited_max,
    ),
    _rw("memory.min", "memory", _NON_NEGATIVE, merge=_merge_max),
    _rw("memory.low", "memory", _NON_NEGATIVE, merge=_merge_max),
    _rw(
        "memory.high",
        "memory",
        _int_range(0, INT64_MAX, allow_unlimited=True),
        to_v2=_unlimited_to_max,
        merge=_merge_unlimited_max,
    ),
    _rw("memory.wmark_ratio", "memory", _int_range(0, 100), description="Anolis async reclaim"),
    _rw("memory.wmark_scale_factor", "memory", _int_range(1, 1000), description="Anolis async reclaim"),
    _rw("memory.wmark_min_adj", "memory", _int_range(-25, 50), description="Anolis"),
    _rw("memory.priority", "memory", _int_range(0, 12), description="Anolis"),
    _rw("memory.use_priority_oom", "memory", _BOOL, description="Anolis"),
    _rw("memory.oom.group", "memory", _BOOL),
    CgroupResource("memory.reclaim", "memory", None, "memory.reclaim", ValueKind.INT_RANGE, _int_range(1, INT64_MAX),
                   action=True, description="proactive reclaim of this many bytes (v2, Linux >= 5.19)"),
    # tasks (written in the hierarchy the caller names; cpu by default)
    _rw("cgroup.procs", "cpu", _int_range(1, PID_MAX_LIMIT)),
    _rw("tasks", "cpu", _int_range(1, PID_MAX_LIMIT), v2_file="cgroup.threads"),
    # blkio (docs/koordinator.md §4.8): v1 per-device files; v2 io.max keys, io.weight and the root's blk-iocost files
    *(CgroupResource(name, "blkio", name, "io.max", ValueKind.INT_RANGE, _device_int(0, INT64_MAX),
                     _throttle_to_io_max(key), per_device=True, description=f"v2 io.max {key}")
      for name, key in IO_MAX_KEYS.items()),
    CgroupResource("blkio.cost.weight", "blkio", "blkio.cost.weight", "io.weight", ValueKind.INT_RANGE,
                   _device_int(1, 100), _same, per_device=True, description="blk-iocost weight (Anolis v1; v2)"),
    # v2 only: io.weight's default line, the weight of every device without a line of its own (the per-device lines
    # above are the blkio strategy's; BE PSI throttle steers this one)
    CgroupResource("io.weight.default", "blkio", None, "io.weight", ValueKind.INT_RANGE, _default_weight, _same,
                   per_device=True, description="v2 io.weight's default line, 'default N' (blk-iocost)"),
    CgroupResource("blkio.cost.qos", "blkio", "blkio.cost.qos", "io.cost.qos", ValueKind.INT_RANGE, _device_cost,
                   _same, per_device=True, description="blk-iocost QoS, root cgroup only (Anolis v1; v2)"),
    CgroupResource("blkio.cost.model", "blkio", "blkio.cost.model", "io.cost.model", ValueKind.INT_RANGE,
                   _device_cost, _same, per_device=True, description="blk-iocost model, root only (Anolis v1; v2)"),
    # net_cls (v1 only)
    _rw("net_cls.classid", "net_cls", _int_range(0, 2**32 - 1), v2_file=None),
    # read-only statistics
    _ro("cpu.stat", "cpu"),
    _ro("cpuacct.usage", "cpuacct", v2_file=None),
    _ro("cpuacct.stat", "cpuacct", v2_file=None),
    _ro("cpuset.effective_cpus", "cpuset", v2_file="cpuset.cpus.effective"),
    _ro("memory.stat", "memory"),
    _ro("memory.numa_stat", "memory"),
    _ro("memory.usage_in_bytes", "memory", v2_file="memory.current"),
    _ro("memory.events", "memory", v1_file=None),
    _ro("memory.swap.max", "memory", v1_file=None),  # read only: koordlet never sets a pod's swap
    _ro("memory.swap.current", "memory", v1_file=None),
    _ro("cpu.pressure", "cpuacct"),
    _ro("memory.pressure", "memory"),
    _ro("io.pressure", "blkio"),
)

CGROUP_RESOURCES: Mapping[str, CgroupResource] = MappingProxyType({r.name: r for r in _RESOURCES})


def get_resource(name: str) -> CgroupResource:
    """The registry entry for ``name`` (e.g. ``"cpu.cfs_quota_us"``)."""
    try:
        return CGROUP_RESOURCES[name]
    except KeyError:
        raise UnknownCgroupResourceError(f"unknown cgroup resource {name!r}") from None
