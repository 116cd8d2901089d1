"""One writer a memory QoS file, with kubelet's own memory QoS (KEP-2570) beside koordlet's, on the real cgroup v2
kernel of the VM stage: each row of the ownership table of docs/colocation.md with both writers present.

A node of three pods laid out as kubelet lays them out (tests/koordlet/qosmanager/realnode.py): an LSR pod
(Guaranteed, 200 MiB), an LS pod (Burstable, 100 MiB requested, 200 MiB limit) and a BE pod (BestEffort, 64 MiB of
batch memory), a container each. A stand-in for kubelet writes what kubelet's memory QoS writes under its
KubeletConfiguration (the files it owns, with kubelet's values: the requests, and memory.high by its throttling
factor), before every tick of koordlet's memory QoS strategy, which reads the same KubeletConfiguration from a file
(``-kubelet-config-file``). After each tick every file holds its owner's value: kubelet's where kubelet writes it,
koordlet's (from the NodeSLO's percents) everywhere else, the sums koordlet writes counting kubelet's values."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from koordlet.api.nodeslo import parse_node_slo_spec
from koordlet.api.pod import ContainerMeta
from koordlet.api.qos import KubeQoS, QoSClass
from koordlet.qosmanager import QoSManagerConfig, new_qos_manager
from koordlet.statesinformer.kubeletconfig import KubeletMemoryQoSSource
from tests.koordlet.qosmanager.realnode import RealNode, skip_unless_v2_writable

pytestmark = pytest.mark.cgroupv2

MiB = 1 << 20
PAGE = 4096
PODS = (("lsr", QoSClass.LSR, KubeQoS.GUARANTEED), ("ls", QoSClass.LS, KubeQoS.BURSTABLE),
        ("be", QoSClass.BE, KubeQoS.BESTEFFORT))
CONTAINERS = {
    "lsr": ContainerMeta("db", "c" * 12, requests={"memory": 200 * MiB}, limits={"memory": 200 * MiB}),
    "ls": ContainerMeta("app", "a" * 12, requests={"memory": 100 * MiB}, limits={"memory": 200 * MiB}),
    "be": ContainerMeta("job", "b" * 12, requests={"kubernetes.io/batch-memory": 64 * MiB}),
}
SLO = parse_node_slo_spec({"resourceQOSStrategy": {
    "lsrClass": {"memoryQOS": {"enable": True, "minLimitPercent": 50, "lowLimitPercent": 75, "throttlingPercent": 0}},
    "lsClass": {"memoryQOS": {"enable": True, "minLimitPercent": 50, "lowLimitPercent": 80, "throttlingPercent": 50}},
    "beClass": {"memoryQOS": {"enable": True, "minLimitPercent": 100, "lowLimitPercent": 100}},
}})
# (kubelet's version, its KubeletConfiguration)
TIERED = ("v1.37.0", "memoryThrottlingFactor: 0.9\nmemoryReservationPolicy: TieredReservation\n")
LEGACY = ("v1.35.2", "featureGates:\n  MemoryQoS: true\n")  # 1.35: memory.min for both classes, factor 0.9


def _page(value: float) -> int:
    return int(value) // PAGE * PAGE


@pytest.fixture
def node() -> Iterator[RealNode]:
    skip_unless_v2_writable()
    real = RealNode("memory-owner", PODS, v2=True)
    try:
        for name, container in CONTAINERS.items():
            real.add_container(name, container)
        yield real
    finally:
        real.close()


def _dirs(node: RealNode) -> dict[str, str]:
    pods = {name: node.pod_dir(node.pod(name)) for name in CONTAINERS}
    dirs = {f"{name} pod": d for name, d in pods.items()}
    dirs |= {f"{name} container": f"{d}/{CONTAINERS[name].container_id}" for name, d in pods.items()}
    dirs |= {"kubepods": node.layout.kubepods_dir(), "burstable": node.layout.qos_dir(KubeQoS.BURSTABLE),
             "besteffort": node.be_dir}
    return dirs


def _kubelet(mode: tuple[str, str], allocatable: int) -> dict[tuple[str, str], int]:
    """What kubelet writes in ``mode``: (dir, file) → value (its values: requests; memory.high by factor 0.9)."""
    high = {("ls container", "memory.high"): _page(100 * MiB + 0.9 * 100 * MiB),
            ("be container", "memory.high"): _page(0.9 * allocatable)}  # BestEffort: 0.9 of node allocatable
    if mode is TIERED:
        return {("lsr container", "memory.min"): 200 * MiB, ("lsr pod", "memory.min"): 200 * MiB,
                ("ls container", "memory.low"): 100 * MiB, ("ls pod", "memory.low"): 100 * MiB,
                ("kubepods", "memory.min"): 300 * MiB, ("burstable", "memory.low"): 100 * MiB, **high}
    return {("lsr container", "memory.min"): 200 * MiB, ("lsr pod", "memory.min"): 200 * MiB,
            ("ls container", "memory.min"): 100 * MiB, ("ls pod", "memory.min"): 100 * MiB,
            ("kubepods", "memory.min"): 300 * MiB, ("burstable", "memory.min"): 100 * MiB, **high}


# koordlet's values from the NodeSLO: LSR min 50 % low 75 % of 200 MiB; LS min 50 % low 80 % of 100 MiB and high at
# 50 % of the way to its 200 MiB limit; BE min and low 100 % of its 64 MiB batch memory, high "max" (throttling 0)
KOORDLET = {
    ("lsr pod", "memory.min"): 100 * MiB, ("lsr pod", "memory.low"): 150 * MiB,
    ("lsr container", "memory.min"): 100 * MiB, ("lsr container", "memory.low"): 150 * MiB,
    ("lsr container", "memory.high"): -1,
    ("ls pod", "memory.min"): 50 * MiB, ("ls pod", "memory.low"): 80 * MiB,
    ("ls container", "memory.min"): 50 * MiB, ("ls container", "memory.low"): 80 * MiB,
    ("ls container", "memory.high"): 150 * MiB,
    ("be pod", "memory.min"): 64 * MiB, ("be pod", "memory.low"): 64 * MiB,
    ("be container", "memory.min"): 64 * MiB, ("be container", "memory.low"): 64 * MiB,
    ("be container", "memory.high"): -1,
    ("besteffort", "memory.min"): 64 * MiB, ("besteffort", "memory.low"): 64 * MiB,
}


def _koordlet(mode: tuple[str, str]) -> dict[tuple[str, str], int]:
    """koordlet's values for the files it owns in ``mode``; its sums count kubelet's values where kubelet owns a
    child's file."""
    kubelet = _kubelet(mode, 0)
    own = {key: value for key, value in KOORDLET.items() if key not in kubelet}
    if mode is TIERED:  # burstable min: the LS pod's (koordlet's 50 MiB); kubepods low: LSR 150 + kubelet's 100 + 64
        own |= {("burstable", "memory.min"): 50 * MiB, ("kubepods", "memory.low"): 314 * MiB}
    else:  # burstable low: the LS pod's 80 MiB; kubepods low: 150 + 80 + 64
        own |= {("burstable", "memory.low"): 80 * MiB, ("kubepods", "memory.low"): 294 * MiB}
    return own


def _read(path: Path) -> int:
    text = path.read_text().strip()
    return -1 if text == "max" else int(text)


@pytest.mark.parametrize("mode", [TIERED, LEGACY], ids=["kubelet-1.37-tiered-throttled", "kubelet-1.35"])
def test_every_memory_qos_file_keeps_its_owners_value_with_kubelet_and_koordlet_both_writing(
        node: RealNode, mode: tuple[str, str], tmp_path: Path) -> None:
    version, config = mode
    config_file = tmp_path / "kubelet-config.yaml"
    config_file.write_text("apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n" + config)
    node.states.set_node(replace(node.node, kubelet_version=version))
    node.states.set_node_slo(SLO)
    source = KubeletMemoryQoSSource(str(config_file), None, lambda: node.states.node().kubelet_version)
    manager = new_qos_manager(node.states, node.cache, node.executor, node.layout, kubelet_memory_qos=source,
                              config=QoSManagerConfig(feature_gates={"CgroupReconcile": True, "BECPUSuppress": False,
                                                                     "CPUBurst": False, "RdtResctrl": False}))
    root = Path(node.fs.cgroup_dir("memory", ""))
    dirs = _dirs(node)
    kubelet = _kubelet(mode, node.node.allocatable["memory"])
    want = {**_koordlet(mode), **kubelet}
    # every row: min and low of every dir, high of every container, each with one owner
    assert set(want) == {(d, f) for d in dirs for f in ("memory.min", "memory.low")} | {
        (f"{name} container", "memory.high") for name in CONTAINERS}
    for tick in range(5):
        for (name, file), value in kubelet.items():  # the stand-in: kubelet's periodic and creation-time writes
            (root / dirs[name] / file).write_text(str(value))
        assert manager.run_strategy("memoryqos"), tick
        got = {(name, file): _read(root / dirs[name] / file) for name, file in want}
        assert got == want, (tick, {k: (v, want[k]) for k, v in got.items() if v != want[k]})
