"""BE PSI throttle's decisions (koordlet/qosmanager/psithrottle.py) on hand-made snapshots: the steps up and back with
their hysteresis, the values at each level, who owns the besteffort quota, and what switching it off gives back. The
real pressure of an LS probe beside a BE burner, in the v2 guest: test_psithrottle_v2.py and bench/psi_throttle.py."""

from __future__ import annotations

import dataclasses

import pytest

from koordlet.api.cfsquota import BEQuotaOwner, be_quota_owner
from koordlet.api.nodeslo import NodeSLOError, parse_node_slo_spec
from koordlet.plan import CgroupWrite, LineKey, LineRestore, LineWrite, Plan
from koordlet.qosmanager import cpusuppress, psithrottle
from koordlet.qosmanager.framework import QoSManagerConfig
from koordlet.qosmanager.psithrottle import PSIThrottleConfig, ThrottleMemo, decide
from tests.koordlet.qosmanager.factory import be_pod, node, pod, snapshot

LS = pod("web", "LS")
BE = be_pod("batch", batch_cpu_milli=2000)
LS_DIR = "kubepods/burstable/poduid-web"
BE_QOS_DIR = "kubepods/besteffort"
IO_KEY = LineKey("io.weight.default", BE_QOS_DIR, "default")
GATES = QoSManagerConfig(feature_gates={"BEPSIThrottle": True})


def _spec(**fields: object) -> object:
    return parse_node_slo_spec({"extensions": {"bePSIThrottleStrategy": {"enable": True, **fields}}})


def _config(**fields: object) -> PSIThrottleConfig:
    return PSIThrottleConfig.from_node_slo(_spec(**fields), GATES)


def _psi(avg10: float) -> str:
    return f"some avg10={avg10:.2f} avg60=0.00 avg300=0.00 total=1\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"


def _snap(at: float, cpu: float | None, io: float | None = 0.0, memo: object = None, **fields: object):
    values = {}
    if cpu is not None:
        values[("cpu.pressure", LS_DIR)] = _psi(cpu)
    if io is not None:
        values[("io.pressure", LS_DIR)] = _psi(io)
    base = {"timestamp": at, "node": node(4000), "node_slo": _spec(), "pods": (LS, BE), "cgroup_values": values,
            "kernel_files": frozenset({"io.weight.default"}), "cgroup_v2": True, "memo": memo}
    return snapshot(**{**base, **fields})


def _quota(plan: Plan) -> int | None:
    found = [w.value for step in plan.steps for w in step.writes if w == CgroupWrite("cpu.cfs_quota_us", BE_QOS_DIR,
                                                                                      w.value, w.reason)]
    return found[0] if found else None


def _run(pressures: list[tuple[float, float, float]], config: PSIThrottleConfig) -> list[tuple[int, int, Plan]]:
    """Tick through (time, LS cpu pressure, LS io pressure), the memo carried over: (cpu level, io level, plan)."""
    memo = None
    out = []
    for at, cpu, io in pressures:
        plan = decide(_snap(at, cpu, io, memo), config)
        memo = plan.memo
        out.append((memo.cpu.level, memo.io.level, plan))
    return out


def test_pressure_at_the_threshold_steps_the_be_cpu_limit_down_no_faster_than_the_step_interval() -> None:
    config = _config(cpuPressureThresholdPercent=10, stepIntervalSeconds=4, cpuStepPercent=25, cpuMinPercent=25)
    ticks = _run([(t, 30.0, 0.0) for t in range(16)], config)
    levels = [cpu for cpu, _, _ in ticks]
    assert levels == [1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3]  # one step each 4 s, and 25 % is the floor
    quotas = [_quota(plan) for _, _, plan in ticks]
    assert quotas[0] == 300000 and quotas[4] == 200000 and quotas[-1] == 100000  # 75 %, 50 %, 25 % of 4 CPUs


def test_between_the_release_mark_and_the_threshold_it_holds_and_below_it_comes_back_step_by_step() -> None:
    config = _config(cpuPressureThresholdPercent=10, releasePercent=50, stepIntervalSeconds=1,
                     releaseIntervalSeconds=10)
    up = [(t, 20.0, 0.0) for t in range(2)]  # level 2
    hold = [(t, 7.0, 0.0) for t in range(2, 30)]  # 7 % is below 10 but not below 5: held
    calm = [(t, 1.0, 0.0) for t in range(30, 55)]
    levels = [cpu for cpu, _, _ in _run(up + hold + calm, config)]
    assert levels[:30] == [1, 2] + [2] * 28
    # below 5 % from t=30: a step back after 10 s (t=40), the next after 10 s more (t=50)
    assert levels[30:] == [2] * 10 + [1] * 10 + [0] * 5


def test_the_release_clock_starts_over_when_the_pressure_comes_back() -> None:
    config = _config(releaseIntervalSeconds=10, stepIntervalSeconds=1)
    ticks = [(0, 20.0, 0.0)] + [(t, 1.0, 0.0) for t in range(1, 9)] + [(9, 8.0, 0.0)] + [
        (t, 1.0, 0.0) for t in range(10, 21)]
    levels = [cpu for cpu, _, _ in _run(ticks, config)]
    assert levels[:20] == [1] * 20 and levels[20:] == [0]  # calm again from t=10: released at t=20, not t=11


def test_io_pressure_halves_the_be_io_weight_and_level_zero_puts_the_recorded_line_back() -> None:
    config = _config(ioPressureThresholdPercent=10, stepIntervalSeconds=1, releaseIntervalSeconds=2)
    ticks = _run([(0, 0.0, 50.0), (1, 0.0, 50.0), (2, 0.0, 50.0), (3, 0.0, 1.0), (4, 0.0, 1.0), (5, 0.0, 1.0)], config)
    assert [(cpu, io) for cpu, io, _ in ticks] == [(0, 1), (0, 2), (0, 3), (0, 3), (0, 3), (0, 2)]
    assert ticks[2][2].lines == (LineWrite("io.weight.default", BE_QOS_DIR, "default 12"),)
    # back at level 0: the line as it was before koordlet's first write, from the record
    recorded = frozenset({IO_KEY})
    plan = decide(_snap(10, 0.0, 0.0, ThrottleMemo(), lines_recorded=recorded), config)
    assert plan.lines == (LineRestore("io.weight.default", BE_QOS_DIR, "default", "BE IO not throttled"),)


def test_io_is_left_alone_on_a_kernel_without_io_weight_and_cpu_still_steps() -> None:
    config = _config(stepIntervalSeconds=1)
    plan = decide(_snap(0, 30.0, 30.0, kernel_files=frozenset()), config)
    assert plan.memo.io.level == 0 and plan.lines == () and _quota(plan) == 300000


def test_every_step_says_what_it_did_and_why_for_the_audit_log_and_explain() -> None:
    plan = decide(_snap(0, 23.4, 0.0), _config())
    assert plan.reason == "BEPSIThrottle"
    assert ("CPU step 0 -> 1: BE CPU limit 3.00 of 4 cores; LS cpu pressure some avg10 23.40% (default/web), "
            "threshold 10%") in plan.why
    assert "IO held at step 0" in plan.why


def test_without_an_ls_pressure_read_nothing_moves() -> None:
    memo = ThrottleMemo(psithrottle.Level(2, 0.0, None))
    plan = decide(_snap(100, None, None, memo), _config())
    assert plan.memo.cpu.level == 2 and _quota(plan) == 200000


def test_switched_off_it_gives_back_the_cpu_limit_and_the_io_line() -> None:
    off = PSIThrottleConfig.from_node_slo(parse_node_slo_spec({}), GATES)
    plan = decide(_snap(0, 50.0, 50.0, ThrottleMemo(psithrottle.Level(3), psithrottle.Level(4)),
                        lines_recorded=frozenset({IO_KEY})), off)
    assert _quota(plan) == -1
    assert [type(line) for line in plan.lines] == [LineRestore]
    assert plan.memo == ThrottleMemo()


def test_on_cgroup_v1_it_does_nothing_and_says_why_once(caplog: pytest.LogCaptureFixture) -> None:
    config = _config()
    first = decide(_snap(0, 50.0, cgroup_v2=False), config)
    second = decide(_snap(1, 50.0, memo=first.memo, cgroup_v2=False), config)
    assert first.empty and second.empty
    assert [r.message for r in caplog.records].count(first.memo.off_because) == 1


def test_under_cpu_suppress_cfs_quota_policy_the_quota_is_suppress_s_and_only_io_is_steered() -> None:
    spec = parse_node_slo_spec({"resourceUsedThresholdWithBE": {"enable": True, "cpuSuppressPolicy": "cfsQuota"},
                                "extensions": {"bePSIThrottleStrategy": {"enable": True}}})
    gates = QoSManagerConfig(feature_gates={"BEPSIThrottle": True, "BECPUSuppress": True})
    config = PSIThrottleConfig.from_node_slo(spec, gates)
    plan = decide(_snap(0, 50.0, 50.0, node_slo=spec), config)
    assert _quota(plan) is None and plan.memo.cpu.level == 0 and plan.memo.io.level == 1
    assert "CPU left to CPU suppress" in plan.why
    assert be_quota_owner(spec, suppress=True, psi_throttle=True) is BEQuotaOwner.CPU_SUPPRESS


def test_the_besteffort_quota_has_one_owner_and_cpu_suppress_leaves_it_to_psi_throttle() -> None:
    psi_on = _spec()
    assert be_quota_owner(psi_on, suppress=True, psi_throttle=True) is BEQuotaOwner.PSI_THROTTLE
    assert be_quota_owner(psi_on, suppress=True, psi_throttle=False) is BEQuotaOwner.CPU_SUPPRESS
    assert be_quota_owner(parse_node_slo_spec({}), suppress=True, psi_throttle=True) is BEQuotaOwner.CPU_SUPPRESS
    assert be_quota_owner(psi_on, suppress=False, psi_throttle=False) is BEQuotaOwner.NOBODY
    # CPU suppress's first tick (cpuset policy) unlimits a quota left behind, unless PSI throttle owns it
    spec = parse_node_slo_spec({"resourceUsedThresholdWithBE": {"enable": True},
                                "extensions": {"bePSIThrottleStrategy": {"enable": True}}})
    left = {("cpu.cfs_quota_us", BE_QOS_DIR): "100000"}
    for gates, v2, unlimits in ((GATES, True, False), (GATES, False, True), (QoSManagerConfig(), True, True)):
        config = cpusuppress.SuppressConfig.from_node_slo(spec, gates)
        plan = cpusuppress.decide(_snap(0, 0.0, node_slo=spec, cgroup_values=left, node_cpu_cores=1.0,
                                        cgroup_v2=v2), config)
        assert (_quota(plan) == -1) is unlimits, (gates.feature_gates, v2)


def test_the_nodeslo_extension_has_defaults_and_refuses_bad_values() -> None:
    config = PSIThrottleConfig.from_node_slo(parse_node_slo_spec({}), GATES)
    assert not config.enabled and config.cpu_threshold_percent == config.io_threshold_percent == 10
    assert config.max_level("cpu") == 3 and config.max_level("io") == 6
    with pytest.raises(NodeSLOError, match="bePSIThrottleStrategy.cpuPressureThresholdPercent: 0 is below"):
        parse_node_slo_spec({"extensions": {"bePSIThrottleStrategy": {"cpuPressureThresholdPercent": 0}}})
    with pytest.raises(NodeSLOError, match="bePSIThrottleStrategy.ioMinWeight"):
        parse_node_slo_spec({"extensions": {"bePSIThrottleStrategy": {"ioMinWeight": 101}}})
    assert dataclasses.replace(config, cpu_min_percent=50, cpu_step_percent=30).max_level("cpu") == 2
