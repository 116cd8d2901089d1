"""The QoS manager: runs each strategy on its own interval, behind its feature gate and NodeSLO switch.

Shape (STYLE.md, kubelet ``cm``): a strategy module has a config taken from NodeSLO, a pure
``decide(snapshot, ...) -> actions`` and a ``Strategy`` object that builds the snapshot, calls ``decide``
and hands the actions to the executor (cgroup writes) or the evictor. The manager knows strategies only
through the :class:`Strategy` protocol.

One thread ticks all strategies (as the collector runner does): strategies are cheap, and one thread keeps
the agent's cost flat. Ticks are put just after the collector's (``phase_source``: the time of the newest
collection): two free-running 1 s loops would add up to a whole second between a sample and the decision
on it, with this phase the decision follows the sample by ``PHASE_LAG_S``.

A strategy that raises is logged when it starts failing and when it recovers, counted in
``koordlet_qosmanager_strategy_runs{status="error"}``, and run again at its next tick.
Flags and defaults: koordinator.md §4.1; feature gates: §9.2.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Protocol

from koordlet.api.nodeslo import NodeSLOSpec
from koordlet.executor import BatchResult, ResourceExecutor, ResourceUpdate
from koordlet.qosmanager import metrics
from koordlet.statesinformer.api import StatesProvider
from koordlet.system.resources import UnknownCgroupResourceError
from koordlet.ticker import TickerThread

logger = logging.getLogger(__name__)

PHASE_LAG_S = 0.1  # strategies tick this long after the collector's tick

# Feature gates of the QoS strategies and their defaults (koordinator.md §9.2).
GATE_BE_CPU_SUPPRESS = "BECPUSuppress"
GATE_CPU_BURST = "CPUBurst"
GATE_BE_CPU_EVICT = "BECPUEvict"
GATE_BE_MEMORY_EVICT = "BEMemoryEvict"
GATE_CGROUP_RECONCILE = "CgroupReconcile"
GATE_RDT_RESCTRL = "RdtResctrl"
GATE_BE_CPU_MANAGER = "BECPUManager"

DEFAULT_FEATURE_GATES: Mapping[str, bool] = MappingProxyType(
    {
        GATE_BE_CPU_SUPPRESS: True,
        GATE_CPU_BURST: True,
        GATE_RDT_RESCTRL: True,
        GATE_BE_CPU_EVICT: False,
        GATE_BE_MEMORY_EVICT: False,
        GATE_CGROUP_RECONCILE: False,
        GATE_BE_CPU_MANAGER: False,
    }
)


def resolve_feature_gates(overrides: Mapping[str, bool] | None) -> Mapping[str, bool]:
    """Defaults with ``overrides`` applied; unknown gate names are kept (other components own them)."""
    gates = dict(DEFAULT_FEATURE_GATES)
    gates.update(overrides or {})
    return MappingProxyType(gates)


@dataclass(frozen=True, slots=True)
class QoSManagerConfig:
    """Flags of koordinator.md §4.1 (seconds)."""

    node_name: str = ""
    collect_res_used_interval_s: float = 1.0
    reconcile_interval_s: float = 1.0
    cpu_suppress_interval_s: float = 1.0
    cpu_evict_interval_s: float = 1.0
    memory_evict_interval_s: float = 1.0
    memory_evict_cool_time_s: float = 4.0
    cpu_evict_cool_time_s: float = 20.0
    feature_gates: Mapping[str, bool] = field(default_factory=lambda: DEFAULT_FEATURE_GATES)

    def gate(self, name: str) -> bool:
        return bool(resolve_feature_gates(self.feature_gates).get(name, False))


# ------------------------------------------------------------------------------------------------ actions


@dataclass(frozen=True, slots=True)
class CgroupWrite:
    """Write ``value`` (v1 semantics) to ``resource`` of ``cgroup_dir`` (relative to the hierarchy root)."""

    resource: str
    cgroup_dir: str
    value: str | int


@dataclass(frozen=True, slots=True)
class WriteStep:
    """Writes carried out together: in the given order, or ``leveled`` (parents loosened first, then exact
    values children first; the executor's leveled update)."""

    writes: tuple[CgroupWrite, ...]
    leveled: bool = False


def apply_steps(executor: ResourceExecutor, steps: Sequence[WriteStep], strategy: str) -> BatchResult:
    """Carry out ``steps`` in order through the executor; failures are logged, counted and returned."""
    written = skipped = 0
    failures = []
    for step in steps:
        updates: list[ResourceUpdate] = []
        for write in step.writes:
            try:
                updates.append(ResourceUpdate.of(write.resource, write.cgroup_dir, write.value))
            except UnknownCgroupResourceError:
                logger.error("strategy %s asked for unknown resource %s", strategy, write.resource)
                metrics.STRATEGY_WRITE_FAILURES.labels(strategy=strategy).inc()
        result = executor.leveled_update(updates) if step.leveled else executor.update_batch(updates)
        written += result.written
        skipped += result.skipped
        failures.extend(result.failures)
    for failure in failures:
        metrics.STRATEGY_WRITE_FAILURES.labels(strategy=strategy).inc()
        logger.debug(
            "strategy %s: %s of %r not written: %s",
            strategy,
            failure.update.resource.name,
            failure.update.cgroup_dir,
            failure.error,
        )
    return BatchResult(written=written, skipped=skipped, failures=tuple(failures))


# ---------------------------------------------------------------------------------------------- strategy


class Strategy(Protocol):
    """What the manager needs of a strategy."""

    @property
    def name(self) -> str: ...

    @property
    def feature_gate(self) -> str: ...

    @property
    def interval_s(self) -> float: ...

    def active(self, spec: NodeSLOSpec) -> bool:
        """The NodeSLO switch (e.g. ``resourceUsedThresholdWithBE.enable``); the gate is checked by the manager."""
        ...

    def run(self, now: float) -> None:
        """One tick: snapshot, decide, act. Raising is allowed; the manager logs and counts it."""
        ...

    def deactivate(self) -> None:
        """Called once when the strategy turns inactive (NodeSLO switch off): undo what it imposed."""
        ...


class _Scheduled:
    __slots__ = ("active", "failing", "next_due", "strategy")

    def __init__(self, strategy: Strategy) -> None:
        self.strategy = strategy
        self.next_due = 0.0
        self.failing = False
        self.active: bool | None = None  # unknown until the first tick


class QoSManager(TickerThread):
    """Ticks the strategies on their intervals in one daemon thread until :meth:`stop`.

    Strategies whose feature gate is off are not scheduled at all. Before each tick the states provider
    must have synced; the NodeSLO switch of the strategy is checked with the current spec, and a strategy
    that turns inactive gets one :meth:`Strategy.deactivate` call.
    """

    def __init__(
        self,
        states: StatesProvider,
        strategies: Sequence[Strategy],
        config: QoSManagerConfig | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        phase_source: Callable[[], float | None] | None = None,
    ) -> None:
        """``phase_source``: wall-clock time of the newest collection, or None before the first one."""
        self._config = config or QoSManagerConfig()
        self._phase_source = phase_source
        names = [s.name for s in strategies]
        if len(set(names)) != len(names):
            raise ValueError(f"strategy names must be unique: {names}")
        self._states = states
        self._monotonic = monotonic
        self._wall_clock = wall_clock
        self._entries: list[_Scheduled] = []
        if self._config.collect_res_used_interval_s < 1.0:
            # Koordinator disables the whole QoS manager then (§4.1): its metrics would be too coarse.
            logger.warning(
                "qos manager disabled: collect interval %.3f s is below 1 s", self._config.collect_res_used_interval_s
            )
        else:
            for strategy in strategies:
                if strategy.interval_s <= 0:
                    raise ValueError(f"strategy {strategy.name}: interval must be positive")
                if self._config.gate(strategy.feature_gate):
                    self._entries.append(_Scheduled(strategy))
                else:
                    logger.info("qos strategy %s off (feature gate %s)", strategy.name, strategy.feature_gate)
        super().__init__("qosmanager", monotonic)

    @property
    def config(self) -> QoSManagerConfig:
        return self._config

    @property
    def scheduled(self) -> list[str]:
        return [entry.strategy.name for entry in self._entries]

    def run_strategy(self, name: str) -> bool:
        """Run one strategy now (tests, benchmarks); True when it ran without error."""
        for entry in self._entries:
            if entry.strategy.name == name:
                return self._run(entry)
        raise KeyError(name)

    def _run(self, entry: _Scheduled) -> bool:
        strategy = entry.strategy
        if not self._states.has_synced():
            metrics.STRATEGY_RUNS.labels(strategy=strategy.name, status="skipped").inc()
            return False
        try:
            active = strategy.active(self._states.node_slo())
            if not active:
                if entry.active is not False:
                    logger.info("qos strategy %s inactive by NodeSLO", strategy.name)
                    strategy.deactivate()
                entry.active = False
                metrics.STRATEGY_RUNS.labels(strategy=strategy.name, status="skipped").inc()
                return True
            if entry.active is not True:
                logger.info("qos strategy %s active", strategy.name)
            entry.active = True
            strategy.run(self._wall_clock())
        except Exception:  # a daemon loop: log, count, go on (STYLE.md)
            metrics.STRATEGY_RUNS.labels(strategy=strategy.name, status="error").inc()
            if not entry.failing:
                logger.warning("qos strategy %s failed; will keep retrying", strategy.name, exc_info=True)
            entry.failing = True
            return False
        if entry.failing:
            logger.info("qos strategy %s recovered", strategy.name)
            entry.failing = False
        metrics.STRATEGY_RUNS.labels(strategy=strategy.name, status="ok").inc()
        return True

    def tick(self, monotonic_now: float) -> float:
        """Run every strategy due at ``monotonic_now``; returns the next due time."""
        for entry in self._entries:
            if entry.next_due <= monotonic_now:
                self._run(entry)
                interval = entry.strategy.interval_s
                entry.next_due += interval
                if entry.next_due <= monotonic_now:
                    entry.next_due = monotonic_now + interval  # fell behind: skip, never catch up in a burst
        return min((entry.next_due for entry in self._entries), default=monotonic_now + 1.0)

    def _first_due(self) -> float:
        """Monotonic time of the first tick: ``PHASE_LAG_S`` after the collector's next tick when its phase is
        known within two collect intervals, else now."""
        interval = self._config.collect_res_used_interval_s
        if self._phase_source is None:
            return self._monotonic()
        deadline = self._monotonic() + 2 * interval
        collected = self._phase_source()
        while collected is None and self._monotonic() < deadline and not self._stop.is_set():
            self._stop.wait(0.05)
            collected = self._phase_source()
        if collected is None:
            logger.info("no collection seen within %.1f s; qos ticks are not phased to it", 2 * interval)
            return self._monotonic()
        return self._monotonic() + (collected + PHASE_LAG_S - self._wall_clock()) % interval

    def _schedule_from(self, start: float) -> None:
        for entry in self._entries:
            entry.next_due = start
