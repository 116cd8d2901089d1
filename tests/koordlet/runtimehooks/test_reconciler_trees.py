"""The reconciler on file formats this kernel cannot show: cgroup v2 (fixture tree, and the real thing
in the VM stage of `make test`) and Anolis group identity files."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from hooks import registry
from hooks.protocol import NodeContext
from koordlet.api.nodeslo import parse_node_slo_spec
from koordlet.api.pod import ContainerMeta, PodMeta
from koordlet.executor import ResourceExecutor
from koordlet.runtimehooks import RuntimeHooksConfig
from koordlet.runtimehooks.reconciler import Reconciler
from koordlet.statesinformer.api import NodeInfo, StaticStates
from koordlet.system.cgroup import CgroupFS, CgroupVersion
from koordlet.system.kubepods import KubeCgroupLayout

SPEC = {"containers": {"job": {"requests": {"kubernetes.io/batch-cpu": "500"},
                               "limits": {"kubernetes.io/batch-cpu": "1500", "kubernetes.io/batch-memory": "96Mi"}}}}
GATES = {"BatchResource": True, "GroupIdentity": True}
UID, CID = "1f2e3d4c-0000-4000-8000-000000000001", "c" * 64


def _pod(cgroup_root: str) -> PodMeta:
    return PodMeta(name="job", namespace="ns", uid=UID, labels={"koordinator.sh/qosClass": "BE"},
                   annotations={"node.koordinator.sh/extended-resource-spec": json.dumps(SPEC)},
                   cgroup_parent=f"{cgroup_root}/kubepods/besteffort/pod{UID}",
                   containers=(ContainerMeta("job", CID),))


def _reconciler(fs: CgroupFS, cgroup_root: str, node_slo=None, gates=GATES) -> Reconciler:
    states = StaticStates(node=NodeInfo("n1"), pods=(_pod(cgroup_root),))
    if node_slo is not None:
        states.set_node_slo(node_slo)
    layout = KubeCgroupLayout(cgroup_root=cgroup_root)
    plugins = registry.enabled(gates)
    return Reconciler(states.pods, lambda: NodeContext(node_slo=states.node_slo()), lambda: plugins,
                      ResourceExecutor(fs), layout)


def test_v2_tree_gets_cpu_max_weight_and_memory_max(tmp_path: Path) -> None:
    pod_dir = tmp_path / "sys/fs/cgroup/kubepods/besteffort" / f"pod{UID}"
    for d in (pod_dir, pod_dir / CID):
        d.mkdir(parents=True)
        for name, content in {"cpu.max": "max 100000", "cpu.weight": "100", "memory.max": "max",
                              "cpuset.cpus": "", "cpu.idle": "0"}.items():
            (d / name).write_text(content + "\n")
    _reconciler(CgroupFS(mount_dir=str(tmp_path / "sys/fs/cgroup"), version=CgroupVersion.V2), "/").reconcile_once()
    container = pod_dir / CID
    assert (container / "cpu.max").read_text().strip() == "150000 100000"
    assert (container / "cpu.weight").read_text().strip() == "20"  # shares 512 -> 1 + 510 * 9999 / 262142
    assert (container / "memory.max").read_text().strip() == str(96 << 20)
    assert (pod_dir / "cpu.max").read_text().strip() == "150000 100000"


def test_v2_tree_gets_cpu_idle_for_be_pods_under_core_sched(tmp_path: Path) -> None:
    pod_dir = tmp_path / "sys/fs/cgroup/kubepods/besteffort" / f"pod{UID}"
    (pod_dir / CID).mkdir(parents=True)
    for d in (pod_dir, pod_dir / CID):
        (d / "cpu.idle").write_text("0\n")
    slo = parse_node_slo_spec({"resourceQOSStrategy": {"policies": {"cpuPolicy": "coreSched"},
                                                       "beClass": {"cpuQOS": {"enable": True, "schedIdle": 1}}}})
    _reconciler(CgroupFS(mount_dir=str(tmp_path / "sys/fs/cgroup"), version=CgroupVersion.V2), "/", slo,
                {"CoreSched": True}).reconcile_once()
    assert (pod_dir / "cpu.idle").read_text().strip() == "1"
    assert (pod_dir / CID / "cpu.idle").read_text().strip() == "0"  # pod level only; the child inherits


def test_anolis_bvt_is_written_where_the_kernel_has_it(tmp_path: Path) -> None:
    pod_dir = tmp_path / "sys/fs/cgroup/cpu/kubepods/besteffort" / f"pod{UID}"
    for d in (pod_dir, pod_dir / CID):
        d.mkdir(parents=True)
        for name, content in {"cpu.cfs_quota_us": "-1", "cpu.shares": "1024", "cpu.bvt_warp_ns": "0"}.items():
            (d / name).write_text(content + "\n")
    mem = tmp_path / "sys/fs/cgroup/memory/kubepods/besteffort" / f"pod{UID}"
    for d in (mem, mem / CID):
        d.mkdir(parents=True)
        (d / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    slo = parse_node_slo_spec({"resourceQOSStrategy": {"beClass": {"cpuQOS": {"enable": True}}}})
    _reconciler(CgroupFS(str(tmp_path / "sys/fs/cgroup"), CgroupVersion.V1), "/", slo).reconcile_once()
    assert (pod_dir / "cpu.bvt_warp_ns").read_text().strip() == "-1"
    assert (pod_dir / CID / "cpu.shares").read_text().strip() == "512"


def _real_v2() -> str | None:
    controllers = Path("/sys/fs/cgroup/cgroup.controllers")
    if os.geteuid() != 0 or not controllers.exists() or "cpu" not in controllers.read_text().split():
        return "needs root and a writable cgroup v2 with the cpu controller (the VM stage of make test runs this)"
    return None


@pytest.mark.cgroupv2
@pytest.mark.skipif(_real_v2() is not None, reason=str(_real_v2()))
def test_real_cgroup_v2_reconcile(tmp_path: Path) -> None:
    root = Path("/sys/fs/cgroup")
    base = f"/koordlet-py-v2-{os.getpid()}"
    pod_dir = root / base.lstrip("/") / "kubepods/besteffort" / f"pod{UID}"
    made = []
    try:
        for d in (root / base.lstrip("/"), root / base.lstrip("/") / "kubepods",
                  root / base.lstrip("/") / "kubepods/besteffort", pod_dir, pod_dir / CID):
            d.mkdir()
            made.append(d)
            if d != pod_dir / CID:
                (d / "cgroup.subtree_control").write_text("+cpu +memory")
        _reconciler(CgroupFS(version=CgroupVersion.V2), base).reconcile_once()
        assert (pod_dir / CID / "cpu.max").read_text().split() == ["150000", "100000"]
        assert (pod_dir / CID / "cpu.weight").read_text().strip() == "20"
        assert (pod_dir / CID / "memory.max").read_text().strip() == str(96 << 20)
    finally:
        for d in reversed(made):
            d.rmdir()


def test_config_defaults_match_koordinator() -> None:
    config = RuntimeHooksConfig()
    assert (config.socket_path, config.config_dir, config.failure_policy, config.reconcile_interval_s) == (
        "/var/run/koordlet/koordlet.sock", "/etc/runtime/hookserver.d", "Ignore", 10.0)
