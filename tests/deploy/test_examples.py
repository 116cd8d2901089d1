"""deploy/examples: QoS without koord-manager. The NodeSLO examples are valid objects for the chart's CRD, the
every-node template renders the one-node example's spec once per node through real kubectl, and a real koordlet
(in process, against the project's API server, real cgroup v1 under a private prefix) suppresses a BE pod under LS
load once the example is applied, and not before."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes.client
import pytest
import yaml

from koordlet.agent.lifecycle import Koordlet
from koordlet.api.qos import KubeQoS
from koordlet.config import parse_config
from koordlet.system.kubepods import KubeCgroupLayout
from tests.deploy.tools import DEPLOY, ROOT, tool
from tests.koordlet.metricsadvisor.v1cgroups import V1TestCgroups, skip_unless_v1_writable
from tests.support.apiserver import ApiServer, kube_api_client, write_kubeconfig
from tests.support.kubelet import Kubelet, grant_kubelet_access
from tests.support.waiting import wait_for

EXAMPLES = DEPLOY / "examples"
ONE_NODE = EXAMPLES / "nodeslo-one-node.yaml"
EVERY_NODE = EXAMPLES / "nodeslo-every-node.gotmpl"
CONTROLLERS = ("cpu", "cpuacct", "cpuset", "memory")
BURN = "while True:\n    pass\n"


def _one_node_slo() -> dict[str, Any]:
    return yaml.safe_load(ONE_NODE.read_text())


def _node(name: str, cpus: int = 2, port: int | None = None) -> dict[str, Any]:
    status: dict[str, Any] = {"capacity": {"cpu": str(cpus), "memory": "8Gi"},
                              "allocatable": {"cpu": str(cpus), "memory": "8Gi"},
                              "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}]}
    if port is not None:
        status["daemonEndpoints"] = {"kubeletEndpoint": {"Port": port}}
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}, "status": status}


def _apply(custom: kubernetes.client.CustomObjectsApi, slo: dict[str, Any]) -> None:
    custom.create_cluster_custom_object("slo.koordinator.sh", "v1alpha1", "nodeslos", slo)


def test_the_every_node_template_renders_the_one_node_spec_for_each_node(tmp_path: Path) -> None:
    """The README's command, `kubectl get nodes -o go-template-file=... | kubectl apply -f -`: its first half run by
    real kubectl against the project's API server, its output created there (validated by the chart's CRD)."""
    with ApiServer() as server, kube_api_client(server) as api:
        for name in ("worker-1", "worker-2", "gpu-1"):
            server.seed(_node(name))
        done = subprocess.run([tool("kubectl-1.35"), "get", "nodes", "-o",
                               f"go-template-file={EVERY_NODE.relative_to(ROOT)}"],
                              cwd=ROOT, capture_output=True, text=True, timeout=60,
                              env={"PATH": os.environ["PATH"], "HOME": str(tmp_path),
                                   "KUBECONFIG": str(write_kubeconfig(server, tmp_path / "kubeconfig"))})
        assert done.returncode == 0, done.stderr
        rendered = yaml.safe_load(done.stdout)
        assert rendered["kind"] == "List"
        custom = kubernetes.client.CustomObjectsApi(api)
        for item in rendered["items"]:
            _apply(custom, item)
        assert sorted(o["metadata"]["name"] for o in server.list_objects("nodeslos")) == ["gpu-1", "worker-1",
                                                                                        "worker-2"]
        assert all(o["spec"] == _one_node_slo()["spec"] for o in rendered["items"])


def test_the_one_node_example_switches_suppression_and_memory_eviction_on() -> None:
    spec = _one_node_slo()["spec"]["resourceUsedThresholdWithBE"]
    assert spec["enable"] is True and spec["memoryEvictThresholdPercent"] == 70
    assert spec["cpuSuppressPolicy"] == "cfsQuota"


@pytest.fixture
def cgroups() -> Iterator[V1TestCgroups]:
    skip_unless_v1_writable(CONTROLLERS)
    groups = V1TestCgroups("examples", CONTROLLERS)
    try:
        yield groups
    finally:
        groups.cleanup()


def _pod(name: str, uid: str, qos_label: str, kube_qos: str, node: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "default", "uid": uid,
                         "labels": {"koordinator.sh/qosClass": qos_label}},
            "spec": {"nodeName": node, "containers": [{"name": "main", "image": "localhost/busybox"}]},
            "status": {"phase": "Running", "qosClass": kube_qos}}


def _quota(groups: V1TestCgroups, rel: str) -> int:
    with open(os.path.join(groups.path("cpu", rel), "cpu.cfs_quota_us")) as f:
        return int(f.read())


def _cores(groups: V1TestCgroups, rel: str, seconds: float = 1.0) -> float:
    def usage() -> int:
        with open(os.path.join(groups.path("cpuacct", rel), "cpuacct.usage")) as f:
            return int(f.read())

    start, started = usage(), time.monotonic()
    time.sleep(seconds)
    return (usage() - start) / 1e9 / (time.monotonic() - started)


@pytest.mark.alone  # the BE burner's share before and after suppression: no other test's load beside it
def test_a_real_koordlet_suppresses_be_under_ls_load_once_the_example_is_applied(
        cgroups: V1TestCgroups, tmp_path: Path) -> None:
    example = _one_node_slo()
    node = example["metadata"]["name"]
    layout = KubeCgroupLayout(cgroup_root="/" + cgroups.prefix)
    uids = {"ls": "e5a0c1d2-0000-4000-8000-000000000001", "be": "e5a0c1d2-0000-4000-8000-000000000002"}
    ls_dir = layout.pod_dir(uids["ls"], KubeQoS.BURSTABLE)
    be_qos_dir, be_dir = layout.qos_dir(KubeQoS.BESTEFFORT), layout.pod_dir(uids["be"], KubeQoS.BESTEFFORT)
    rel = {name: path.removeprefix(cgroups.prefix).strip("/") for name, path in
           (("ls", ls_dir), ("be", be_dir), ("be-qos", be_qos_dir))}
    for name in ("ls", "be"):
        cgroups.make(rel[name])
    payload = {"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": [
        _pod("web", uids["ls"], "LS", "Burstable", node), _pod("batch", uids["be"], "BE", "BestEffort", node)]}
    token = tmp_path / "token"
    state = Path(tempfile.mkdtemp(prefix="kex-", dir="/tmp"))  # short: unix socket paths
    cpus = os.cpu_count() or 1
    agent = None
    try:
        with ApiServer() as server, kube_api_client(server) as api, Kubelet(server, node, payload) as kubelet:
            token.write_text(grant_kubelet_access(server))
            server.seed(_node(node, cpus, kubelet.port))
            config = parse_config([
                f"-kubelet-cgroup-root=/{cgroups.prefix}", f"-kubelet-token-file={token}", "-addr=127.0.0.1:0",
                f"-var-lib-kubelet-dir={state}/kubelet", f"-sys-fs-root-dir={state}",
                f"-runtime-hooks-addr={state}/koordlet.sock", f"-runtime-hooks-config-path={state}/hookserver.d",
                "-enable-nri-runtime-hook=false", f"-prediction-checkpoint-filepath={state}/checkpoints",
                f"-system-config-record-file={state}/originals.json", f"-audit-log-dir={state}/audit"],
                {"NODE_NAME": node, "agent_mode": "hostMode"})  # host paths: the real /sys/fs/cgroup
            agent = Koordlet(config, api_client=api, states_sync_timeout_s=10)
            agent.start()
            cgroups.spawn(rel["be"], BURN)
            cgroups.spawn(rel["ls"], BURN)
            # The default NodeSLO: suppression off, the BE quota stays unlimited under LS load.
            time.sleep(4)
            before = _quota(cgroups, rel["be-qos"]), _cores(cgroups, rel["be"])
            assert before[0] == -1, "suppressed without a NodeSLO that enables it"
            _apply(kubernetes.client.CustomObjectsApi(api), example)
            budget_us = cpus * example["spec"]["resourceUsedThresholdWithBE"]["cpuSuppressThresholdPercent"] * 1000
            assert wait_for(lambda: 0 < _quota(cgroups, rel["be-qos"]) < budget_us, 15.0), \
                f"BE quota still {_quota(cgroups, rel['be-qos'])} after the example NodeSLO"
            after = _quota(cgroups, rel["be-qos"]), _cores(cgroups, rel["be"])
            print(json.dumps({"cpus": cpus, "be_quota_us": {"before": before[0], "after": after[0]},
                              "be_cores": {"before": round(before[1], 2), "after": round(after[1], 2)}}))
            assert after[1] < before[1], (before, after)
    finally:
        if agent is not None:
            agent.stop(5.0)
        subprocess.run(["rm", "-rf", str(state)], check=False)
