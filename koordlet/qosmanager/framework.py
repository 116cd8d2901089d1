"""The QoS manager: runs each strategy on its own interval, behind its feature gate and NodeSLO switch.

Shape (one for every strategy, checked by tests/koordlet/qosmanager/test_registry.py): a strategy module
has a frozen config built by ``from_node_slo(spec, flags)`` and a pure ``decide(snapshot, config) -> Plan``,
and registers them as a :class:`Strategy` (``STRATEGY`` at the bottom of the module; the list is
:data:`koordlet.qosmanager.STRATEGIES`). The manager builds the snapshot the config ``needs``, calls
``decide`` and hands the :class:`~koordlet.plan.Plan` to its :class:`~koordlet.actuator.PlanRunner`;
strategies never see the executor or the evictor. The smallest strategy to copy: ``memoryevict.py``.

One thread ticks all strategies (as the collector runner does): strategies are cheap, and one thread keeps
the agent's cost flat. Ticks are put just after the collector's (``phase_source``: the time of the newest
collection): two free-running 1 s loops would add up to a whole second between a sample and the decision
on it, with this phase the decision follows the sample by ``PHASE_LAG_S``.

A strategy that raises is logged when it starts failing and when it recovers, counted in
``koordlet_qosmanager_strategy_runs{status="error"}``, and run again at its next tick.
Flags and defaults: docs/koordinator.md §4.1; feature gates: docs/koordinator.md §9.2.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Generic, Protocol, TypeVar

from koordlet import features
from koordlet.actuator import PlanRecord, PlanRunner
from koordlet.api.nodeslo import NodeSLOSpec
from koordlet.metriccache import MetricCache
from koordlet.metricsadvisor.pods import UsageDemand
from koordlet.plan import Plan
from koordlet.qosmanager import metrics
from koordlet.qosmanager.snapshot import Needs, Snapshot, SnapshotBuilder, usage_demand
from koordlet.statesinformer.api import CallbackKind, StatesProvider
from koordlet.ticker import TickerThread

logger = logging.getLogger(__name__)

PHASE_LAG_S = 0.1  # strategies tick this long after the collector's tick

# Feature gates of the QoS strategies and their defaults (docs/koordinator.md §9.2).
GATE_BE_CPU_SUPPRESS = "BECPUSuppress"
GATE_CPU_BURST = "CPUBurst"
GATE_BE_CPU_EVICT = "BECPUEvict"
GATE_BE_MEMORY_EVICT = "BEMemoryEvict"
GATE_CGROUP_RECONCILE = "CgroupReconcile"
GATE_RDT_RESCTRL = "RdtResctrl"
GATE_BE_CPU_MANAGER = "BECPUManager"
GATE_CPU_EVICT = "CPUEvict"
GATE_CPU_ALLOCATABLE_EVICT = "CPUAllocatableEvict"
GATE_MEMORY_EVICT = "MemoryEvict"
GATE_MEMORY_ALLOCATABLE_EVICT = "MemoryAllocatableEvict"
GATE_SYSTEM_CONFIG = "SystemConfig"
GATE_BLKIO_RECONCILE = "BlkIOReconcile"
GATE_BE_PSI_THROTTLE = "BEPSIThrottle"  # koordlet-py's own (koordlet/features.py)

DEFAULT_FEATURE_GATES: Mapping[str, bool] = MappingProxyType({  # defaults from the one table (koordlet.features)
    name: features.DEFAULTS[name] for name in (GATE_BE_CPU_SUPPRESS, GATE_CPU_BURST, GATE_RDT_RESCTRL,
                                               GATE_BE_CPU_EVICT, GATE_BE_MEMORY_EVICT, GATE_CGROUP_RECONCILE,
                                               GATE_BE_CPU_MANAGER, GATE_CPU_EVICT, GATE_CPU_ALLOCATABLE_EVICT,
                                               GATE_MEMORY_EVICT, GATE_MEMORY_ALLOCATABLE_EVICT, GATE_SYSTEM_CONFIG,
                                               GATE_BLKIO_RECONCILE, GATE_BE_PSI_THROTTLE)
})


def resolve_feature_gates(overrides: Mapping[str, bool] | None) -> Mapping[str, bool]:
    """Defaults with ``overrides`` applied; unknown gate names are kept (other components own them)."""
    gates = dict(DEFAULT_FEATURE_GATES)
    gates.update(overrides or {})
    return MappingProxyType(gates)


@dataclass(frozen=True, slots=True)
class QoSManagerConfig:
    """Flags of docs/koordinator.md §4.1 (seconds)."""

    node_name: str = ""
    collect_res_used_interval_s: float = 1.0
    reconcile_interval_s: float = 1.0
    cpu_suppress_interval_s: float = 1.0
    cpu_evict_interval_s: float = 1.0
    memory_evict_interval_s: float = 1.0
    memory_evict_cool_time_s: float = 4.0
    cpu_evict_cool_time_s: float = 20.0
    started_at: float | None = None  # the agent's wall-clock start (BECPUEvict rests its cool time after it)
    # -collect-pod-res-used-interval: how often a pod no strategy acts on every tick is looked at (CPU burst's idle
    # pods); at most the reconcile interval means every tick
    fanout_interval_s: float = 1.0
    feature_gates: Mapping[str, bool] = field(default_factory=lambda: DEFAULT_FEATURE_GATES)

    def gate(self, name: str) -> bool:
        return bool(resolve_feature_gates(self.feature_gates).get(name, False))


# ---------------------------------------------------------------------------------------------- strategy


class StrategyConfig(Protocol):
    """A strategy's frozen config: what the NodeSLO (and the agent's flags) say, read once per tick."""

    @property
    def enabled(self) -> bool:
        """The NodeSLO switch (e.g. ``resourceUsedThresholdWithBE.enable``); the gate is checked by the manager."""
        ...

    @property
    def needs(self) -> Needs:
        """What the snapshot must hold for ``decide``: metric windows, cgroup values, kernel probes."""
        ...


C = TypeVar("C", bound=StrategyConfig)


@dataclass(frozen=True, slots=True)
class Strategy(Generic[C]):
    """One QoS strategy: ``config.from_node_slo(spec, flags)`` gives a frozen config, ``decide(snapshot,
    config)`` a :class:`~koordlet.plan.Plan`; nothing else. ``decide`` reads only its arguments (its state
    of the last tick comes back as ``snapshot.memo``) and is called with a disabled config once when the
    NodeSLO switch turns off, to undo what it imposed."""

    name: str
    feature_gate: str | tuple[str, ...]  # the strategy runs when any of these gates is on
    config: type[C]
    decide: Callable[[Snapshot, C], Plan]
    interval_s: float = 1.0

    @property
    def gates(self) -> tuple[str, ...]:
        return (self.feature_gate,) if isinstance(self.feature_gate, str) else self.feature_gate

    def configure(self, spec: NodeSLOSpec, flags: QoSManagerConfig) -> C:
        return self.config.from_node_slo(spec, flags)  # type: ignore[attr-defined]


@dataclass(frozen=True, slots=True)
class StrategyState:
    """One strategy as :meth:`QoSManager.schedule` shows it: its interval, whether its NodeSLO switch was on at its
    last tick (None before the first), the seconds to its next tick and its last plan."""

    name: str
    interval_s: float
    active: bool | None
    next_in_s: float
    plan: Plan | None


class _Scheduled:
    __slots__ = ("active", "failing", "memo", "next_due", "plan", "record", "strategy")

    def __init__(self, strategy: Strategy) -> None:
        self.strategy = strategy
        self.next_due = 0.0
        self.failing = False
        self.active: bool | None = None  # unknown until the first tick
        self.memo: Any = None
        self.plan: Plan | None = None
        self.record: PlanRecord | None = None


class QoSManager(TickerThread):
    """Ticks the strategies on their intervals in one daemon thread until :meth:`stop`.

    Strategies whose feature gate is off are not scheduled at all. Before each tick the states provider
    must have synced. Each tick of a strategy: config from the current NodeSLO → snapshot with what the
    config needs (and the strategy's memo) → ``decide`` → the plan runner. A strategy whose NodeSLO switch
    is off is not run, except once when it turns off: then ``decide`` gets the disabled config and its
    plan undoes what the strategy imposed.
    """

    def __init__(
        self,
        states: StatesProvider,
        strategies: Sequence[Strategy],
        config: QoSManagerConfig | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        phase_source: Callable[[], float | None] | None = None,
        *,
        builder: SnapshotBuilder | None = None,
        runner: PlanRunner | None = None,
        publish_demand: Callable[[UsageDemand], None] | None = None,
    ) -> None:
        """``phase_source``: wall-clock time of the newest collection, or None before the first one (default:
        the builder's). ``builder``/``runner``: where snapshots come from and who carries plans out (default:
        a builder on ``states`` and an empty metric cache; a runner that cannot write — tests of the
        schedule). ``publish_demand``: told, before each tick, which pods' usage the strategies that are on read
        (the collector reads those every tick, the others less often); the snapshots then hold only those. None:
        the collector reads every pod every tick."""
        self._publish_demand = publish_demand
        self._demand_of: tuple[object, tuple[object, ...]] | None = None  # (pods, configs) the demand is of
        self._config = config or QoSManagerConfig()
        self._builder = builder or SnapshotBuilder(states, MetricCache(),
                                                   collect_interval_s=self._config.collect_res_used_interval_s)
        self._runner = runner
        self._phase_source = phase_source if phase_source is not None or builder is None else (
            builder.latest_collection)
        names = [s.name for s in strategies]
        if len(set(names)) != len(names):
            raise ValueError(f"strategy names must be unique: {names}")
        self._states = states
        self._monotonic = monotonic
        self._wall_clock = wall_clock
        self._entries: list[_Scheduled] = []
        if self._config.collect_res_used_interval_s < 1.0:
            # Koordinator disables the whole QoS manager then (docs/koordinator.md §4.1): its metrics would be
            # too coarse.
            logger.warning(
                "qos manager disabled: collect interval %.3f s is below 1 s", self._config.collect_res_used_interval_s
            )
        else:
            for strategy in strategies:
                if strategy.interval_s <= 0:
                    raise ValueError(f"strategy {strategy.name}: interval must be positive")
                if any(self._config.gate(gate) for gate in strategy.gates):
                    self._entries.append(_Scheduled(strategy))
                else:
                    logger.info("qos strategy %s off (feature gate %s)", strategy.name, " / ".join(strategy.gates))
        super().__init__("qosmanager", monotonic)

    @property
    def config(self) -> QoSManagerConfig:
        return self._config

    @property
    def scheduled(self) -> list[str]:
        return [entry.strategy.name for entry in self._entries]

    def schedule(self) -> list[StrategyState]:
        """Every scheduled strategy as it stands (``/debug/pods``); read from another thread, each field is one
        tick's value."""
        now = self._monotonic()
        return [StrategyState(e.strategy.name, e.strategy.interval_s, e.active, max(e.next_due - now, 0.0), e.plan)
                for e in self._entries]

    def _entry(self, name: str) -> _Scheduled:
        for entry in self._entries:
            if entry.strategy.name == name:
                return entry
        raise KeyError(name)

    def last_plan(self, name: str) -> Plan | None:
        """The plan of the newest tick of strategy ``name`` (None before its first decision)."""
        return self._entry(name).plan

    def last_record(self, name: str) -> PlanRecord | None:
        """What the runner did with that plan."""
        return self._entry(name).record

    def run_strategy(self, name: str) -> bool:
        """Run one strategy now (tests, benchmarks); True when it ran without error."""
        entry = self._entry(name)
        self._update_demand()
        return self._run(entry, self._wall_clock())

    def _tick_once(self, entry: _Scheduled, config: Any, now: float) -> None:
        snapshot = self._builder.build(config.needs, now=now, memo=entry.memo, last=entry.record)
        if snapshot is None:
            return
        plan = entry.strategy.decide(snapshot, config)
        entry.plan = plan
        entry.memo = plan.memo
        if self._runner is None:
            return
        record = self._runner.run(plan, entry.strategy.name, now)
        entry.record = record
        if record.failed:
            metrics.STRATEGY_WRITE_FAILURES.labels(strategy=entry.strategy.name).inc(record.failed)

    @property
    def period_s(self) -> float:
        """The shortest strategy interval: a healthy manager ticks at least that often."""
        return min((entry.strategy.interval_s for entry in self._entries), default=1.0)

    def _run(self, entry: _Scheduled, now: float) -> bool:
        """One tick of ``entry`` at wall-clock ``now`` (the strategies of one tick share it, and so their snapshots
        share the usage maps read at it)."""
        strategy = entry.strategy
        self.doing = f"strategy {strategy.name}"
        if not self._states.has_synced():
            metrics.STRATEGY_RUNS.labels(strategy=strategy.name, status="skipped").inc()
            return False
        try:
            config = strategy.configure(self._states.node_slo(), self._config)
            if not config.enabled:
                if entry.active is not False:
                    logger.info("qos strategy %s inactive by NodeSLO", strategy.name)
                    entry.active = False
                    self._tick_once(entry, config, now)  # the undo plan
                metrics.STRATEGY_RUNS.labels(strategy=strategy.name, status="skipped").inc()
                return True
            if entry.active is not True:
                logger.info("qos strategy %s active", strategy.name)
            entry.active = True
            self._tick_once(entry, config, now)
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
        """Run every strategy due at ``monotonic_now``; returns the next due time.

        Woken by a NodeSLO change: a strategy switched on or off runs at once, not at its next tick, so that
        what it imposed (a suppressed besteffort quota) is undone before pods are admitted under the new spec."""
        now = self._wall_clock()
        if self._woken:
            self._woken = False
            self._run_switched(now)
        self._update_demand()
        for entry in self._entries:
            if entry.next_due <= monotonic_now:
                self._run(entry, now)
                interval = entry.strategy.interval_s
                entry.next_due += interval
                if entry.next_due <= monotonic_now:
                    entry.next_due = monotonic_now + interval  # fell behind: skip, never catch up in a burst
        return min((entry.next_due for entry in self._entries), default=monotonic_now + 1.0)

    def _update_demand(self) -> None:
        """Publish the pods whose usage the strategies that are on read, and have the snapshots hold only those;
        worked out again when the pods or a strategy's config changed."""
        if self._publish_demand is None or not self._states.has_synced():
            return
        spec, pods = self._states.node_slo(), self._states.pods()
        configs: list[Any] = []
        for entry in self._entries:
            try:
                config = entry.strategy.configure(spec, self._config)
            except Exception:  # noqa: BLE001 - its own tick reports a bad config
                continue
            if config.enabled:
                configs.append(config)
        key = (pods, tuple(configs))
        if self._demand_of is not None and self._demand_of[0] is pods and self._demand_of[1] == key[1]:
            return
        self._demand_of = key
        demand = usage_demand(pods, [config.needs for config in configs])
        self._builder.restrict(demand)
        self._publish_demand(demand)

    def _run_switched(self, now: float) -> None:
        if not self._states.has_synced():
            return
        spec = self._states.node_slo()
        for entry in self._entries:
            if entry.active is None:
                continue  # not run yet: its first tick decides
            try:
                enabled = entry.strategy.configure(spec, self._config).enabled
            except Exception:  # noqa: BLE001 - its own tick reports a bad config
                continue
            if enabled != entry.active:
                self._run(entry, now)

    def start(self) -> None:
        """Start ticking; a NodeSLO change wakes the loop (see :meth:`tick`)."""
        self._states.register_callback(CallbackKind.NODE_SLO_SPEC, "qosmanager", self.wake)
        super().start()

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
