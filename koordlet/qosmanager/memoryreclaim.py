"""BE memory reclaim on stock kernels (``memory.reclaim``, cgroup v2, Linux ≥ 5.19): make room before eviction.

Koordinator reclaims BE memory ahead of pressure only through the Anolis memcg watermarks
(``memory.wmark_ratio``); on a stock kernel its answer to memory pressure is eviction (its #3186). This strategy
is koordlet-py's: NodeSLO ``extensions.beMemoryReclaimStrategy`` (koordlet.api.nodeslo.BEMemoryReclaimStrategy,
docs/colocation.md "Memory QoS on stock kernels"), feature gate ``CgroupReconcile`` (Koordinator's memory QoS gate).

Every tick (``-reconcile-interval-seconds``): node memory *with* page cache (MemTotal − MemFree) at or above
``reclaimThresholdPercent`` of capacity (default: ``memoryEvictThresholdPercent`` − 10) asks the BE pods to give
back what is above ``reclaimLowerPercent`` (default: threshold − 5), at most the tick's step: each BE pod is
asked, largest reclaimable first, for up to its reclaimable memory, through ``memory.reclaim`` on its pod dir.
Reclaimable is the pod's page cache, and the anonymous memory its containers may still swap out where the node
has swap left. kubelet sets swap per container, through CRI ``Unified`` (``memory.swap.max`` of the container's
cgroup: 0 under its NoSwap behaviour, a share of the node's swap under LimitedSwap), and leaves the pod dir's at
``max``; the kernel holds a cgroup to the lowest limit on its path. So each app container's anonymous memory counts
up to what its effective limit leaves (the lower of its own and the pod's ``memory.swap.max``, less what each
has swapped already, ``memory.swap.current``), the pod's total up to the pod's own room and the node's free swap.
A container whose limit cannot be read counts none. (Init containers, sidecars included, are not counted: the
count may fall short, never over.)

The step is steered by memory pressure: it starts at ``reclaimStepBytes``; while the node's use keeps rising tick
over tick it doubles (up to ``reclaimMaxStepBytes``): reclaim presses harder as the demand outruns it; when the LS
pods' memory PSI (the highest ``some avg10`` of their ``memory.pressure``) rose to ``lsMemoryPressureThresholdPercent``
or more after a tick that reclaimed, and the use did not rise, it halves (down to ``reclaimStepBytes``): the reclaim
itself is what hurts the LS pods (shared page cache refaulting), so it backs off. Below the threshold the step starts
over. A pod the kernel could not give all that was asked (EAGAIN: its pages are in use) rests for a tick.

Eviction (``BEMemoryEvict``) counts MemTotal − MemAvailable, which does not count the page cache this strategy
frees; with the reclaim threshold below the eviction threshold, reclaim acts first, and eviction happens only for
what reclaim cannot free (anonymous memory without swap) or cannot free fast enough. On kernels without
``memory.reclaim`` (cgroup v1; v2 before 5.19) the strategy says so once and stays off; eviction works as before.
The strategy changes no setting, so switching it off leaves nothing to undo.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, replace

from koordlet.api.nodeslo import NodeSLOSpec
from koordlet.api.pod import PodMeta
from koordlet.plan import CgroupWrite, Plan, WriteStep
from koordlet.qosmanager.framework import GATE_CGROUP_RECONCILE, QoSManagerConfig, Strategy
from koordlet.qosmanager.snapshot import (
    CgroupRead,
    Needs,
    Scope,
    Snapshot,
    container_cgroup_dir,
    is_be,
    ls_pressure,
    pod_cgroup_dir,
)
from koordlet.system.cgroup_stats import CgroupStatError, MemoryStat, parse_memory_stat

logger = logging.getLogger(__name__)

RECLAIM = "memory.reclaim"
AUDIT_REASON = "BEMemoryReclaim"
_CGROUP_V2 = 2  # memory.reclaim is a cgroup v2 file: the memory.stat beside it is v2's
MIN_ASK_BYTES = 1 << 20  # a pod with less reclaimable than this is not asked (a write costs more than it gives)
_SWAP_FILES = ("memory.swap.max", "memory.swap.current")
_NEEDS = Needs(cgroup_reads=(CgroupRead("memory.stat", Scope.PODS, is_be),
                             CgroupRead("memory.stat", Scope.APP_CONTAINERS, is_be),
                             *(CgroupRead(name, scope, is_be) for name in _SWAP_FILES
                               for scope in (Scope.PODS, Scope.APP_CONTAINERS)),
                             CgroupRead("memory.pressure", Scope.PODS, lambda pod: not is_be(pod))),
               kernel_files=(RECLAIM,), pod_usage=None, container_usage=None)


@dataclass(frozen=True, slots=True)
class ReclaimConfig:
    enabled: bool = False  # extensions.beMemoryReclaimStrategy.enable
    threshold_percent: int = 60
    lower_percent: int = 55
    step_bytes: int = 64 << 20
    max_step_bytes: int = 1 << 30
    ls_pressure_percent: int = 10
    evict_threshold_percent: int = 70  # resourceUsedThresholdWithBE.memoryEvictThresholdPercent

    @classmethod
    def from_node_slo(cls, spec: NodeSLOSpec, flags: QoSManagerConfig | None = None) -> ReclaimConfig:
        strategy = spec.be_memory_reclaim_strategy
        evict = spec.resource_used_threshold_with_be.memory_evict_threshold_percent
        threshold = strategy.reclaim_threshold_percent
        if threshold is None:
            threshold = max(evict - 10, 1)
        lower = strategy.reclaim_lower_percent
        return cls(strategy.enable, threshold, max(threshold - 5, 0) if lower is None else lower,
                   strategy.reclaim_step_bytes, strategy.reclaim_max_step_bytes,
                   strategy.ls_memory_pressure_threshold_percent, evict)

    @property
    def needs(self) -> Needs:
        return _NEEDS

    def invalid(self) -> str | None:
        """Why the strategy cannot run with this config; None when it can."""
        if self.lower_percent >= self.threshold_percent:
            return (f"reclaimLowerPercent {self.lower_percent} is not below reclaimThresholdPercent "
                    f"{self.threshold_percent}")
        if self.threshold_percent >= self.evict_threshold_percent:
            return (f"reclaimThresholdPercent {self.threshold_percent} is not below memoryEvictThresholdPercent "
                    f"{self.evict_threshold_percent}: reclaim would start after eviction")
        return None


@dataclass(frozen=True, slots=True)
class ReclaimMemo:
    """Between ticks: the step, the node's use and the LS pressure of the last tick, whether it reclaimed, the pod
    dirs the kernel could not give all that was asked, and the last reason it was off (said once)."""

    step_bytes: int
    use_bytes: float | None = None
    ls_pressure: float | None = None
    reclaimed: bool = False
    short: frozenset[str] = frozenset()
    off_because: str = ""


@dataclass(frozen=True, slots=True)
class Reclaimable:
    pod: PodMeta
    pod_dir: str
    file_bytes: int
    anon_bytes: int  # what its containers may still swap out (module docstring), 0 without swap left on the node

    @property
    def bytes(self) -> int:
        return self.file_bytes + self.anon_bytes


@dataclass(frozen=True, slots=True)
class ReclaimDecision:
    use_percent: float
    need_bytes: int
    step_bytes: int
    step_why: str
    ls_pressure: float | None
    asked: tuple[tuple[Reclaimable, int], ...]  # (pod, bytes asked), largest reclaimable first


def _memory_stat(snapshot: Snapshot, cgroup_dir: str) -> MemoryStat | None:
    raw = snapshot.cgroup_value("memory.stat", cgroup_dir)
    if raw is None:
        return None
    try:
        return parse_memory_stat(raw.encode(), _CGROUP_V2)
    except CgroupStatError as exc:
        logger.debug("cannot parse the memory.stat of %s: %s", cgroup_dir, exc)
        return None


def _swap_room(snapshot: Snapshot, cgroup_dir: str) -> float:
    """What ``cgroup_dir`` may still swap out by its own ``memory.swap.max`` (``max``: no bound); 0 when the limit
    was not read or cannot be parsed."""
    limit = snapshot.cgroup_value("memory.swap.max", cgroup_dir)
    current = snapshot.cgroup_value("memory.swap.current", cgroup_dir)
    if limit == "max":
        return math.inf
    try:
        return max(int(limit or "0") - int(current or "0"), 0)
    except ValueError:
        logger.debug("cannot parse the swap limit of %s: %r, %r", cgroup_dir, limit, current)
        return 0


def _swappable_anon_bytes(snapshot: Snapshot, pod: PodMeta, pod_dir: str) -> int:
    """The anonymous memory ``pod``'s app containers may still swap out (module docstring)."""
    pod_room = min(_swap_room(snapshot, pod_dir), snapshot.node_swap_free_bytes or 0)
    total = 0.0
    for container in pod.containers:
        if pod_room <= total:
            break
        container_dir = None if container.is_init else container_cgroup_dir(snapshot.layout, pod_dir, container)
        stat = _memory_stat(snapshot, container_dir) if container_dir is not None else None
        if container_dir is None or stat is None:
            continue
        total += min(stat.inactive_anon_bytes + stat.active_anon_bytes, _swap_room(snapshot, container_dir))
    return int(min(total, pod_room))


def reclaimable(snapshot: Snapshot) -> list[Reclaimable]:
    """BE pods' reclaimable memory from their memory.stat, largest first (ties by name)."""
    found: list[Reclaimable] = []
    for pod in snapshot.pods:
        if not is_be(pod) or (pod_dir := pod_cgroup_dir(snapshot.layout, pod)) is None:
            continue
        stat = _memory_stat(snapshot, pod_dir)
        if stat is None:
            continue
        found.append(Reclaimable(pod, pod_dir, stat.inactive_file_bytes + stat.active_file_bytes,
                                 _swappable_anon_bytes(snapshot, pod, pod_dir)))
    found.sort(key=lambda r: (-r.bytes, r.pod.name))
    return found


def _step(config: ReclaimConfig, memo: ReclaimMemo, use: float, ls_pressure: float | None) -> tuple[int, str]:
    """The tick's step and why (module docstring)."""
    rising = memo.use_bytes is not None and use > memo.use_bytes
    if (memo.reclaimed and not rising and ls_pressure is not None and ls_pressure >= config.ls_pressure_percent
            and ls_pressure > (memo.ls_pressure or 0.0)):
        return (max(config.step_bytes, memo.step_bytes // 2),
                f"backing off: LS memory pressure rose to {ls_pressure:.2f}% after a reclaim")
    if rising and memo.use_bytes is not None:
        return (min(config.max_step_bytes, memo.step_bytes * 2),
                f"pressing: use rose by {int(use - memo.use_bytes)} bytes since the last tick")
    return memo.step_bytes, "steady"


def decide_reclaim(snapshot: Snapshot, config: ReclaimConfig, memo: ReclaimMemo) -> ReclaimDecision | None:
    """The tick's figures and asks; None without a memory sample or below the threshold."""
    use, capacity = snapshot.node_memory_with_page_cache_bytes, snapshot.capacity_memory_bytes
    if use is None or capacity <= 0:
        return None
    use_percent = use * 100 / capacity
    if use_percent < config.threshold_percent:
        return None
    worst = ls_pressure(snapshot, "memory.pressure")
    pressure = worst.percent if worst is not None else None
    step, why = _step(config, memo, use, pressure)
    need = int(use - capacity * config.lower_percent / 100)
    left = min(need, step)
    asked: list[tuple[Reclaimable, int]] = []
    for candidate in reclaimable(snapshot):
        if left < MIN_ASK_BYTES:
            break
        if candidate.pod_dir in memo.short or candidate.bytes < MIN_ASK_BYTES:
            continue
        amount = min(candidate.bytes, left)
        asked.append((candidate, amount))
        left -= amount
    return ReclaimDecision(use_percent, need, step, why, pressure, tuple(asked))


def _off(snapshot: Snapshot, config: ReclaimConfig) -> str:
    """Why the strategy cannot act on this node, or ""."""
    if RECLAIM not in snapshot.kernel_files:
        return ("BE memory reclaim off: this kernel has no memory.reclaim (cgroup v1, or Linux before 5.19); "
                "memory eviction works as before")
    problem = config.invalid()
    return f"BE memory reclaim off: {problem}" if problem else ""


def decide(snapshot: Snapshot, config: ReclaimConfig) -> Plan:
    """Ask the BE pods for memory above the lower threshold (module docstring); nothing to undo when off."""
    memo = snapshot.memo if isinstance(snapshot.memo, ReclaimMemo) else ReclaimMemo(config.step_bytes)
    if not config.enabled:
        return Plan(memo=ReclaimMemo(config.step_bytes))
    off = _off(snapshot, config)
    if off:
        if off != memo.off_because:
            logger.warning("%s", off)
        return Plan(memo=ReclaimMemo(config.step_bytes, off_because=off))
    short = frozenset(snapshot.last.partial) if snapshot.last is not None else frozenset()
    decision = decide_reclaim(snapshot, config, replace(memo, short=short))
    use = snapshot.node_memory_with_page_cache_bytes
    if decision is None:
        return Plan(memo=ReclaimMemo(config.step_bytes, use_bytes=use))
    writes = tuple(CgroupWrite(RECLAIM, candidate.pod_dir, amount,
                               f"{candidate.pod.key}: {candidate.file_bytes} bytes of page cache, "
                               f"{candidate.anon_bytes} swappable") for candidate, amount in decision.asked)
    why = (f"node memory with page cache {decision.use_percent:.1f}% >= {config.threshold_percent}%: "
           f"{decision.need_bytes} bytes above {config.lower_percent}%, step {decision.step_bytes} "
           f"({decision.step_why})")
    new_memo = ReclaimMemo(decision.step_bytes, use, decision.ls_pressure, bool(writes))
    return Plan((WriteStep(writes),) if writes else (), memo=new_memo, report=decision, reason=AUDIT_REASON, why=why)


STRATEGY = Strategy("memoryreclaim", GATE_CGROUP_RECONCILE, ReclaimConfig, decide)
