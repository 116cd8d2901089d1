"""The worst annotations a webhook or a hand edit can put on a pod, through the proxy onto real containerd:
every pod starts, as it would without koordlet-py, and the values no kernel takes are dropped and counted.

Without the value check (hooks/validate.py) these pods failed in runc: a batch-cpu limit of 200000000000
milli became cpu_quota 20000000000000, a resource-status cpuset of "0-63" on a 2-CPU node a cpuset outside
the node's CPUs, a batch-memory limit of 1 byte a memory limit below one page; and a BE pod asking for more
CPU than its besteffort parent's quota (set by CPU suppress) failed with "cpu.cfs_quota_us: invalid argument".
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

import grpc
import pytest
from prometheus_client import REGISTRY

from koordlet.api.nodeslo import default_node_slo_spec
from koordlet.statesinformer.api import NodeInfo, StaticStates
from tests.koordlet.runtimehooks.test_runtimehooks import CGROUP_V1, _hooks
from tests.support.containerd import CGROUP_ROOT
from tests.support.cri import CriClient, PodFactory, container_config, sandbox_config
from tests.support.proxy import ProxyProcess
from tests.support.waiting import wait_for
from wire import cri_pb2 as cri

pytestmark = [pytest.mark.containerd, pytest.mark.cgroupv1]


def _batch(cpu_limit: str, memory_limit: str = "64Mi") -> dict[str, str]:
    spec = {"containers": {"job": {"requests": {"kubernetes.io/batch-cpu": "100", "kubernetes.io/batch-memory": "16Mi"},
                                   "limits": {"kubernetes.io/batch-cpu": cpu_limit,
                                              "kubernetes.io/batch-memory": memory_limit}}}}
    return {"node.koordinator.sh/extended-resource-spec": json.dumps(spec)}


def _cpuset(cpus: str) -> dict[str, str]:
    return {"scheduling.koordinator.sh/resource-status": json.dumps({"cpuset": cpus})}


BE = {"koordinator.sh/qosClass": "BE"}
LSR = {"koordinator.sh/qosClass": "LSR"}
WORST = [
    ("huge-quota", "besteffort", BE, _batch("200000000000"), "cfs_quota_us"),
    ("over-node", "besteffort", BE, _batch("4000"), "cfs_quota_us"),
    ("one-byte", "besteffort", BE, _batch("500", "1"), "memory_limit_bytes"),
    ("cpus-0-63", "burstable", LSR, _cpuset("0-63"), "cpuset_cpus"),
    ("cpu-64", "burstable", LSR, _cpuset("64"), "cpuset_cpus"),
    ("cpus-0-65535", "burstable", LSR, _cpuset("0-65535"), "cpuset_cpus"),
    ("cpu-2", "burstable", LSR, _cpuset("2"), "cpuset_cpus"),
]


def _rejected(key: str) -> float:
    return REGISTRY.get_sample_value("koordlet_runtime_hook_value_rejected_total", {"key": key}) or 0.0


@pytest.fixture
def stack(containerd_socket: str, tmp_path: Path):
    states = StaticStates(node=NodeInfo("n1"), node_slo=default_node_slo_spec())
    hooks = _hooks(tmp_path, states)
    hooks.start()
    proxy = ProxyProcess(str(tmp_path / "proxy.sock"), containerd_socket, state_dir=str(tmp_path)).start()
    client = CriClient(proxy.listen)
    pods = PodFactory(client)
    try:
        yield pods
    finally:
        pods.cleanup()
        client.close()
        proxy.terminate()
        hooks.stop()


def _start(pods: PodFactory, name: str, kube_qos: str, labels: dict, annotations: dict) -> tuple[str, str]:
    sandbox = sandbox_config(name, kube_qos=kube_qos, labels=labels, annotations=annotations)
    sid = pods.run_pod(sandbox)
    cid = pods.create_container(sid, sandbox, container_config("job"))
    pods.client.runtime.StartContainer(cri.StartContainerRequest(container_id=cid), timeout=60)
    return sandbox.linux.cgroup_parent, cid


def test_every_pod_with_the_worst_annotations_starts_and_the_bad_values_are_counted(stack: PodFactory) -> None:
    failed: list[str] = []
    for name, kube_qos, labels, pod_annotations, key in WORST:
        before = _rejected(key)
        try:
            parent, cid = _start(stack, name, kube_qos, labels, pod_annotations)
        except grpc.RpcError as err:
            failed.append(f"{name}: {err.code().name}: {err.details()[:160]}")
            continue
        assert _rejected(key) > before, f"{name}: {key} was not counted as dropped"
        container = CGROUP_V1 / "cpu" / parent.lstrip("/") / cid
        quota = int((container / "cpu.cfs_quota_us").read_text())
        assert quota == -1 or 1000 <= quota <= 200_000, (name, quota)
        memory = int((CGROUP_V1 / "memory" / parent.lstrip("/") / cid / "memory.limit_in_bytes").read_text())
        assert memory >= 4096, (name, memory)
    assert failed == [], "pods that start without koordlet-py failed through the proxy:\n" + "\n".join(failed)


def _wrote(path: Path, value: str) -> bool:
    try:
        path.write_text(value)
    except OSError:
        return False
    return True


def test_a_be_pod_asking_more_than_its_suppressed_parent_starts(stack: PodFactory) -> None:
    """CPU suppress left the besteffort dir at 148635 µs; a BE pod whose batch-cpu limit (2 cores) is above
    it gets no quota of its own (the parent's applies) instead of failing with EINVAL."""
    besteffort = CGROUP_V1 / "cpu" / CGROUP_ROOT.lstrip("/") / "kubepods" / "besteffort"
    besteffort.mkdir(parents=True, exist_ok=True)
    quota = besteffort / "cpu.cfs_quota_us"
    saved = quota.read_text().strip()
    # A parent's quota below a child's is EINVAL. Pod dirs that earlier tests of this session left behind (empty, a
    # quota kept) go first, and a removed dir still counts until the kernel frees it (a dying cgroup, ~0.1 s): wait
    # for that, then the write must succeed.
    for dirpath, _dirs, _files in os.walk(besteffort, topdown=False):
        if dirpath != str(besteffort):
            with contextlib.suppress(OSError):  # a dir still in use stays; the write below then says so
                os.rmdir(dirpath)
    wait_for(lambda: _wrote(quota, "148635"), 10.0)
    quota.write_text("148635")
    try:
        before = _rejected("cfs_quota_us")
        parent, cid = _start(stack, "wants-two-cores", "besteffort", BE, _batch("2000"))
        assert _rejected("cfs_quota_us") > before
        container_quota = int((CGROUP_V1 / "cpu" / parent.lstrip("/") / cid / "cpu.cfs_quota_us").read_text())
        assert container_quota == -1 or container_quota <= 148635
    finally:
        stack.cleanup()
        quota.write_text(saved)
