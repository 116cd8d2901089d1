"""Every registered strategy has the one shape: a frozen config built by ``from_node_slo``, a pure
``decide(snapshot, config) -> Plan``, nothing else (koordlet/qosmanager/framework.py)."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import re
import sys
from pathlib import Path
from types import MappingProxyType

import pytest

from koordlet.api.nodeslo import parse_node_slo_spec
from koordlet.api.pod import ContainerMeta
from koordlet.plan import Plan
from koordlet.qosmanager import STRATEGIES, QoSManagerConfig, Strategy
from koordlet.qosmanager.framework import DEFAULT_FEATURE_GATES
from koordlet.qosmanager.snapshot import BECPUWindow, Needs
from koordlet.system.blockdev import BlockDevice, StorageInfo
from koordlet.system.resctrl import ResctrlInfo
from tests.koordlet.qosmanager.factory import GiB, be_pod, cpus, node, pod, snapshot

REPO = Path(__file__).resolve().parents[3]
SLO = parse_node_slo_spec({
    "resourceUsedThresholdWithBE": {"enable": True, "cpuSuppressThresholdPercent": 60,
                                    "cpuEvictBESatisfactionUpperPercent": 80,
                                    "cpuEvictBESatisfactionLowerPercent": 50, "memoryEvictThresholdPercent": 60},
    "resourceQOSStrategy": {"lsClass": {"memoryQOS": {"enable": True}, "resctrlQOS": {"enable": True}},
                            "beClass": {"memoryQOS": {"enable": True}, "resctrlQOS": {"enable": True},
                                        "blkioQOS": {"enable": True, "blocks": [
                                            {"name": "/dev/vdb", "type": "device", "ioCfg": {"readBPS": 1 << 20}}]}}},
    "cpuBurstStrategy": {"policy": "auto"},
    "systemStrategy": {"minFreeKbytesFactor": 100, "watermarkScaleFactor": 150},
    "extensions": {"beMemoryReclaimStrategy": {"enable": True, "reclaimThresholdPercent": 50},
                   "bePSIThrottleStrategy": {"enable": True}},
})
LS = pod("web", "LS", containers=(ContainerMeta("app", container_id="a" * 12, requests={"cpu": 1000, "memory": GiB},
                                                limits={"cpu": 2000, "memory": 2 * GiB}),))
BE = be_pod("batch", batch_cpu_milli=2000, batch_memory=GiB)
LS_DIR = "kubepods/burstable/poduid-web"
BE_DIR = "kubepods/besteffort/poduid-batch"
BE_MEMORY_STAT = ("anon 1073741824\nfile 2147483648\ninactive_anon 0\nactive_anon 1073741824\n"
                  "inactive_file 2147483648\nactive_file 0\nunevictable 0\n")
PRESSURE = ("some avg10=30.00 avg60=10.00 avg300=2.00 total=9000000\n"
            "full avg10=5.00 avg60=1.00 avg300=0.20 total=900000\n")
ALL_ON = dict.fromkeys(DEFAULT_FEATURE_GATES, True)  # every strategy's every feature


def _snapshot():
    return snapshot(
        node=node(8000, 16 * GiB, batch_cpu_milli=4000), node_slo=SLO, pods=(LS, BE), cpus=cpus(),
        node_cpu_cores=7.0, node_memory_bytes=14 * GiB, pod_cpu_cores={LS.uid: 5.0, BE.uid: 1.0},
        pod_memory_bytes={LS.uid: 8 * GiB, BE.uid: 3 * GiB}, container_throttled_ratio={"a" * 12: 0.3},
        container_cpu_cores={"a" * 12: 1.9}, node_cpu_avg_cores=6.0, pod_cpu_avg_cores={LS.uid: 5.0},
        be_cpu=BECPUWindow(10, 10, 1900, 4000, 1000, 1900, 4000, 1000),
        cgroup_values={("cpu.cfs_quota_us", LS_DIR): "200000",
                       ("cpu.cfs_quota_us", f"{LS_DIR}/{'a' * 12}"): "200000",
                       ("cpuset.cpus", "kubepods/besteffort"): "0-7",
                       ("cpu.cfs_quota_us", "kubepods/besteffort"): "-1",
                       ("memory.stat", BE_DIR): BE_MEMORY_STAT,
                       ("cpu.pressure", LS_DIR): PRESSURE, ("io.pressure", LS_DIR): PRESSURE},
        node_memory_with_page_cache_bytes=15 * GiB,
        kernel_files=frozenset({"memory.min", "memory.low", "memory.high", "memory.reclaim", "io.weight.default"}),
        cgroup_v2=True,
        resctrl=ResctrlInfo(0x7FF, (0, 1), True),
        system_values={"min_free_kbytes": "67584", "watermark_scale_factor": "10"},
        storage=StorageInfo(MappingProxyType({"vdb": BlockDevice("vdb", "254:16", "vdb")})),
    )


def test_the_registry_names_every_strategy_module_once() -> None:
    modules = {s.decide.__module__ for s in STRATEGIES}
    assert len(modules) == len(STRATEGIES) == len({s.name for s in STRATEGIES})
    on_disk = {f"koordlet.qosmanager.{p.stem}" for p in (REPO / "koordlet/qosmanager").glob("*.py")
               if re.search(r"^STRATEGY = Strategy\(", p.read_text(), re.MULTILINE)}
    assert modules == on_disk


@pytest.mark.parametrize("strategy", STRATEGIES, ids=lambda s: s.name)
def test_strategy_has_the_one_shape(strategy: Strategy) -> None:
    assert isinstance(strategy, Strategy)
    # The config: a frozen dataclass built from the NodeSLO (and the agent's flags), saying what it needs.
    assert dataclasses.is_dataclass(strategy.config) and strategy.config.__dataclass_params__.frozen
    config = strategy.configure(SLO, QoSManagerConfig(feature_gates=ALL_ON))
    assert isinstance(config, strategy.config)
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.enabled = False  # type: ignore[misc]
    assert isinstance(config.enabled, bool) and isinstance(config.needs, Needs)
    # decide(snapshot, config) -> Plan, and nothing else.
    parameters = list(inspect.signature(strategy.decide).parameters)
    assert parameters == ["snapshot", "config"]
    assert inspect.signature(strategy.decide).return_annotation in ("Plan", Plan)


@pytest.mark.parametrize("strategy", STRATEGIES, ids=lambda s: s.name)
def test_decide_is_pure_same_input_same_plan_input_untouched(strategy: Strategy) -> None:
    flags = QoSManagerConfig(started_at=0.0, feature_gates=ALL_ON)
    config = strategy.configure(SLO, flags)
    snap = _snapshot()
    before = repr(snap)
    first = strategy.decide(snap, config)
    assert isinstance(first, Plan)
    assert strategy.decide(snap, config) == first
    assert repr(snap) == before
    # Its memo goes into the next tick and gives a plan again (state lives in the memo, not in the module).
    follow = strategy.decide(dataclasses.replace(snap, memo=first.memo, timestamp=snap.timestamp + 1), config)
    assert isinstance(follow, Plan)
    # Switched off by the NodeSLO: still a plan (the undo), never an exception.
    off = parse_node_slo_spec({"resourceUsedThresholdWithBE": {"enable": False}})
    assert isinstance(strategy.decide(snap, strategy.configure(off, flags)), Plan)


def test_the_shared_snapshot_makes_every_strategy_act() -> None:
    """The snapshot above is rich enough that each strategy's plan is not empty (so the purity test is not
    comparing empty plans)."""
    flags = QoSManagerConfig(started_at=0.0, feature_gates=ALL_ON)
    empty = [s.name for s in STRATEGIES if s.decide(_snapshot(), s.configure(SLO, flags)).empty]
    assert empty == []


@pytest.mark.parametrize("strategy", STRATEGIES, ids=lambda s: s.name)
def test_strategy_module_never_touches_the_executor_the_evictor_or_files(strategy: Strategy) -> None:
    module = sys.modules[strategy.decide.__module__]
    tree = ast.parse(Path(module.__file__).read_text())
    imported: set[str] = set()
    for item in ast.walk(tree):
        if isinstance(item, ast.ImportFrom):
            imported.add(item.module or "")
        elif isinstance(item, ast.Import):
            imported.update(alias.name for alias in item.names)
        elif isinstance(item, ast.Call) and isinstance(item.func, ast.Name):
            assert item.func.id != "open", f"{module.__name__} opens a file"
    forbidden = ("koordlet.executor", "koordlet.eviction", "koordlet.actuator", "koordlet.system.cgroup", "os",
                 "subprocess", "random", "time")
    bad = sorted(name for name in imported if name in forbidden or name.startswith(tuple(f + "." for f in forbidden)))
    assert bad == [], f"{module.__name__} imports {bad}"
