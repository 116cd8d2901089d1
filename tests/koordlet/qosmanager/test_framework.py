"""The QoS manager: gates, NodeSLO switches, error counting, its thread; and the wiring of new_qos_manager."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

import pytest

from koordlet.api.nodeslo import NodeSLOSpec, default_node_slo_spec
from koordlet.eviction import Evictor
from koordlet.executor import ResourceExecutor
from koordlet.metriccache import MetricCache
from koordlet.plan import Plan
from koordlet.qosmanager import QoSManager, QoSManagerConfig, Strategy, new_qos_manager
from koordlet.qosmanager.metrics import STRATEGY_RUNS, value_of
from koordlet.qosmanager.snapshot import Needs, Snapshot
from koordlet.statesinformer.api import StaticStates
from koordlet.system.cgroup import CgroupFS
from tests.koordlet.qosmanager.factory import LAYOUT, node, spec


@dataclass(frozen=True)
class _SwitchConfig:
    enabled: bool
    needs: Needs = Needs()

    @classmethod
    def from_node_slo(cls, node_slo: NodeSLOSpec, flags: object = None) -> _SwitchConfig:
        return cls(node_slo.resource_used_threshold_with_be.enable)


class Recorder:
    """A strategy that records what the manager asks of it (``strategy`` is what the manager gets)."""

    def __init__(self, name: str = "recorder", interval_s: float = 0.05, fail: bool = False) -> None:
        self.fail = fail
        self.runs: list[float] = []
        self.deactivations = 0
        self.ran = threading.Event()
        self.strategy = Strategy(name, "BECPUSuppress", _SwitchConfig, self.decide, interval_s)

    def decide(self, snapshot: Snapshot, config: _SwitchConfig) -> Plan:
        if not config.enabled:
            self.deactivations += 1
            return Plan()
        self.runs.append(snapshot.timestamp)
        self.ran.set()
        if self.fail:
            raise OSError("disk on fire")
        return Plan()


def test_default_gates_schedule_suppress_burst_and_resctrl_only() -> None:
    states = StaticStates(node=node())
    manager = new_qos_manager(states, MetricCache(), ResourceExecutor(CgroupFS("/nonexistent/sys/fs/cgroup")), LAYOUT)
    assert manager.scheduled == ["cpusuppress", "cpuburst", "resctrl"]


def test_gates_turn_on_memory_qos_and_evictions() -> None:
    config = QoSManagerConfig(feature_gates={"CgroupReconcile": True, "BEMemoryEvict": True, "BECPUEvict": True,
                                             "CPUBurst": False})
    manager = new_qos_manager(StaticStates(node=node()), MetricCache(),
                              ResourceExecutor(CgroupFS("/nonexistent/sys/fs/cgroup")), LAYOUT,
                              evictor=Evictor("node-1", cri_endpoint="/nonexistent.sock"), config=config)
    assert manager.scheduled == ["cpusuppress", "memoryqos", "resctrl", "memoryevict", "cpuevict"]


def test_collect_interval_below_one_second_disables_the_manager() -> None:
    manager = QoSManager(StaticStates(node=node()), [Recorder().strategy],
                         QoSManagerConfig(collect_res_used_interval_s=0.5))
    assert manager.scheduled == []


def test_nodeslo_switch_off_deactivates_once_and_on_runs() -> None:
    states = StaticStates(node=node(), node_slo=default_node_slo_spec())  # enable defaults to false
    recorder = Recorder()
    manager = QoSManager(states, [recorder.strategy])
    for _ in range(3):
        manager.run_strategy("recorder")
    assert recorder.deactivations == 1 and recorder.runs == []
    states.set_node_slo(spec())
    manager.run_strategy("recorder")
    assert len(recorder.runs) == 1
    states.set_node_slo(default_node_slo_spec())
    manager.run_strategy("recorder")
    assert recorder.deactivations == 2


def test_unsynced_states_skip_every_strategy() -> None:
    recorder = Recorder()
    manager = QoSManager(StaticStates(node=None, node_slo=spec()), [recorder.strategy])
    assert manager.run_strategy("recorder") is False and recorder.runs == []


def test_failing_strategy_is_counted_logged_once_and_retried(caplog: pytest.LogCaptureFixture) -> None:
    recorder = Recorder(name="failing", fail=True)
    manager = QoSManager(StaticStates(node=node(), node_slo=spec()), [recorder.strategy])
    before = value_of(STRATEGY_RUNS, strategy="failing", status="error")
    with caplog.at_level(logging.WARNING, logger="koordlet.qosmanager.framework"):
        results = [manager.run_strategy("failing") for _ in range(3)]
    assert results == [False, False, False] and len(recorder.runs) == 3
    assert value_of(STRATEGY_RUNS, strategy="failing", status="error") == before + 3
    assert len([r for r in caplog.records if "failed" in r.message]) == 1
    recorder.fail = False
    assert manager.run_strategy("failing") is True


def test_thread_runs_strategies_on_their_interval_and_stops() -> None:
    fast, slow = Recorder("fast", 0.05), Recorder("slow", 10.0)
    manager = QoSManager(StaticStates(node=node(), node_slo=spec()), [fast.strategy, slow.strategy])
    manager.start()
    try:
        deadline = time.monotonic() + 2.0
        while len(fast.runs) < 4 and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        manager.stop(timeout_s=2.0)
    assert len(fast.runs) >= 4 and len(slow.runs) == 1
    count = len(fast.runs)
    time.sleep(0.15)
    assert len(fast.runs) == count  # stopped


def test_the_strategies_of_one_tick_see_one_moment() -> None:
    """Every strategy due in a tick gets a snapshot of the same time, so they share its usage maps."""
    first, second = Recorder("first", 1.0), Recorder("second", 1.0)
    clock = iter(range(1000, 2000))
    manager = QoSManager(StaticStates(node=node(), node_slo=spec()), [first.strategy, second.strategy],
                         monotonic=lambda: 0.0, wall_clock=lambda: float(next(clock)))
    manager.tick(0.0)
    manager.tick(1.0)
    assert first.runs == second.runs == [1000.0, 1001.0]


def test_a_nodeslo_switch_runs_the_strategy_at_once_not_at_its_next_tick() -> None:
    """Suppress switched off must give the besteffort quota back before pods are admitted under the new spec:
    the NodeSLO change wakes the manager, which runs the switched strategy at once (its interval here: 60 s)."""
    slow = Recorder("slow", 60.0)
    states = StaticStates(node=node(), node_slo=spec())
    manager = QoSManager(states, [slow.strategy])
    manager.start()
    try:
        assert slow.ran.wait(2.0)  # the first tick
        switched = time.monotonic()
        states.set_node_slo(default_node_slo_spec())  # enable: false
        deadline = switched + 2.0
        while slow.deactivations == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert slow.deactivations == 1, "the switch-off waited for the next tick"
        assert time.monotonic() - switched < 1.0
        states.set_node_slo(default_node_slo_spec())  # the same spec again: nothing to switch
        time.sleep(0.2)
        assert slow.deactivations == 1 and len(slow.runs) == 1
    finally:
        manager.stop(timeout_s=2.0)


def test_duplicate_names_and_bad_intervals_are_refused() -> None:
    with pytest.raises(ValueError):
        QoSManager(StaticStates(node=node()), [Recorder("a").strategy, Recorder("a").strategy])
    with pytest.raises(ValueError):
        QoSManager(StaticStates(node=node()), [Recorder("a", interval_s=0).strategy])


def test_first_tick_follows_the_collectors_phase() -> None:
    # Collected at wall 1000.0, now 1000.3: the collector ticks again at 1001.0, strategies 0.1 s later.
    manager = QoSManager(StaticStates(node=node()), [Recorder().strategy], monotonic=lambda: 100.0,
                         wall_clock=lambda: 1000.3, phase_source=lambda: 1000.0)
    assert manager._first_due() == pytest.approx(100.8)
    unphased = QoSManager(StaticStates(node=node()), [Recorder().strategy], monotonic=lambda: 100.0)
    assert unphased._first_due() == 100.0
