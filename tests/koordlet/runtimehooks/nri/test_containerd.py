"""koordlet as an NRI plugin of real containerd 1.7.24 (NRI v0.6.1) and 2.1.9 (NRI v0.8.0), NRI on, no proxy
(unless a test says so), pods started straight on containerd's CRI, values read back from cgroup v1 files and
from the OCI spec containerd created the container with (the spec shows what came through NRI; a value the
reconciler writes later is only in the cgroup file).

The in-process koordlet here knows no pods (its reconciler has nothing to do), so every value seen came
through NRI. What containerd does that the tests rely on, by version, is said where it matters.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from prometheus_client import REGISTRY

from koordlet.api.nodeslo import NodeSLOSpec, parse_node_slo_spec
from koordlet.executor import ResourceExecutor
from koordlet.runtimehooks import RuntimeHooks, RuntimeHooksConfig
from koordlet.runtimehooks.nri import NriConfig
from koordlet.statesinformer.api import NodeInfo, StaticStates
from koordlet.system.cgroup import CgroupFS
from koordlet.system.kubepods import KubeCgroupLayout
from tests.support.containerd import CGROUP_ROOT
from tests.support.cri import CriClient, PodFactory, container_config, sandbox_config
from tests.support.nri import (
    NriContainerd,
    TinyPlugin,
    clean_up_dead_instances,
    koordlet_nri_args,
    oci_spec,
    wait_registered,
)
from tests.support.proxy import ProxyProcess
from tests.support.stack import KoordletProcess, http_get
from tests.support.waiting import wait_for
from wire import cri_pb2 as cri
from wire import nri_pb2 as api
from wire.ttrpc import MESSAGE_MAX

pytestmark = [pytest.mark.containerd, pytest.mark.cgroupv1]

GATES = {"BatchResource": True, "CPUSetAllocator": True, "GroupIdentity": True, "CPUNormalization": True}
SPEC = {"containers": {"job": {"requests": {"kubernetes.io/batch-cpu": "500", "kubernetes.io/batch-memory": "64Mi"},
                               "limits": {"kubernetes.io/batch-cpu": "1500", "kubernetes.io/batch-memory": "96Mi"}}}}
BE = {"labels": {"koordinator.sh/qosClass": "BE"},
      "annotations": {"node.koordinator.sh/extended-resource-spec": json.dumps(SPEC)}}
LS = {"labels": {"koordinator.sh/qosClass": "LS"}}
RATIO = {"node.koordinator.sh/cpu-normalization-ratio": "1.25"}
CGROUP_V1 = Path("/sys/fs/cgroup")
KUBELET_LS = cri.LinuxContainerResources(cpu_shares=2048, cpu_quota=200000, cpu_period=100000)


@pytest.fixture(scope="module", params=["1.7", "2.1"])
def runtime(request: pytest.FixtureRequest) -> Iterator[NriContainerd]:
    if os.geteuid() != 0 or not shutil.which("runc"):
        pytest.skip("needs root and runc to run containerd")
    if not (CGROUP_V1 / "cpu").is_dir():
        pytest.skip("needs cgroup v1 (the v2 guest runs test_containerd_v2.py)")
    clean_up_dead_instances()
    instance = NriContainerd.for_process(request.param).up()
    try:
        yield instance
    finally:
        instance.down()


@pytest.fixture()
def client(runtime: NriContainerd) -> Iterator[CriClient]:
    crictl = CriClient(runtime.socket)
    yield crictl
    crictl.close()


@pytest.fixture()
def pods(client: CriClient) -> Iterator[PodFactory]:
    factory = PodFactory(client)
    yield factory
    factory.cleanup()


class Koordlet:
    """koordlet's runtime hooks in this process, NRI on, knowing no pods (so no reconciler writes)."""

    def __init__(self, runtime: NriContainerd, tmp_path: Path, node_annotations: dict[str, str] | None = None,
                 serve_hooks: bool = False, hook_dir: str | None = None, register_within_s: float | None = 10.0,
                 gates: dict[str, bool] | None = None, resctrl_dir: str | None = None,
                 node_slo: NodeSLOSpec | None = None, **nri: object) -> None:
        """``register_within_s``: entering waits that long for the registration (None: does not wait);
        ``gates``: instead of GATES; ``resctrl_dir``: a fixture resctrl tree (gate ``Resctrl``); ``node_slo``:
        instead of the default one."""
        self._register_within_s = register_within_s
        config = RuntimeHooksConfig(
            socket_path=str(tmp_path / "koordlet.sock"), host_endpoint=str(tmp_path / "koordlet.sock"),
            config_dir=hook_dir or str(tmp_path / "hookserver.d"), reconcile_interval_s=3600,
            feature_gates=gates or GATES, serve_hooks=serve_hooks, resctrl_dir=resctrl_dir,
            nri=NriConfig(socket_path=runtime.nri_socket, **{"socket_poll_s": 0.2, **nri}))  # type: ignore[arg-type]
        states = StaticStates(node=NodeInfo("n1", annotations=node_annotations or {}))
        if node_slo is not None:
            states.set_node_slo(node_slo)
        self.executor = ResourceExecutor(CgroupFS(), resctrl_root=resctrl_dir)
        self.hooks = RuntimeHooks(config, states, self.executor, KubeCgroupLayout(cgroup_root=CGROUP_ROOT))
        assert self.hooks.nri is not None
        self.nri = self.hooks.nri

    def __enter__(self) -> Koordlet:
        self.hooks.start()
        if self._register_within_s is not None and not self.nri.registered.wait(self._register_within_s):
            self.hooks.stop()
            raise AssertionError(f"koordlet did not register with NRI within {self._register_within_s} s")
        return self

    def __exit__(self, *exc: object) -> None:
        self.hooks.stop()


def cgroup(sandbox: cri.PodSandboxConfig, controller: str, name: str, container_id: str = "") -> str:
    path = CGROUP_V1 / controller / sandbox.linux.cgroup_parent.lstrip("/") / container_id / name
    return path.read_text().strip()


def _events(event: str, result: str) -> float:
    return REGISTRY.get_sample_value("koordlet_nri_events_total", {"event": event, "result": result}) or 0.0


def test_ls_and_be_pods_started_on_containerd_get_the_hook_values(runtime, client, pods, tmp_path) -> None:
    with Koordlet(runtime, tmp_path, node_annotations=RATIO):
        _, be_id, be = pods.start_pod("job", **BE)
        _, ls_id, ls = pods.start_pod("ls-web", resources=KUBELET_LS, kube_qos="burstable", **LS)
        bound = {"scheduling.koordinator.sh/resource-status": json.dumps({"cpuset": "1"})}
        _, lsr_id, lsr = pods.start_pod("ls-bound", resources=KUBELET_LS, kube_qos="burstable",
                                        labels=LS["labels"], annotations=bound)
    # BE: batch resources at container level (CreateContainer adjustment) and pod level (RunPodSandbox plan);
    # the batch-cpu limit's quota is normalized too (150000 / 1.25)
    # (the pod level is written right after koordlet answered RunPodSandbox, so containerd does not wait)
    assert wait_for(lambda: cgroup(be, "memory", "memory.limit_in_bytes") == str(96 << 20), 5)
    for container_id in (be_id, ""):
        assert cgroup(be, "cpu", "cpu.shares", container_id) == "512"
        assert cgroup(be, "cpu", "cpu.cfs_quota_us", container_id) == "120000"
        assert cgroup(be, "memory", "memory.limit_in_bytes", container_id) == str(96 << 20)
    spec = oci_spec(client, be_id)["linux"]["resources"]
    assert (spec["cpu"]["shares"], spec["cpu"]["quota"], spec["memory"]["limit"]) == (512, 120000, 96 << 20)
    # LS: kubelet's quota normalized by the node's ratio (200000 / 1.25)
    assert cgroup(ls, "cpu", "cpu.cfs_quota_us", ls_id) == "160000"
    assert cgroup(ls, "cpu", "cpu.shares", ls_id) == "2048"  # kubelet's, untouched
    # LS bound by the scheduler: its cpuset, and no CFS quota (Koordinator #489)
    assert cgroup(lsr, "cpuset", "cpuset.cpus", lsr_id) == "1"
    assert cgroup(lsr, "cpu", "cpu.cfs_quota_us", lsr_id) == "-1"


def test_be_pod_gets_cpu_idle_through_nri_where_the_option_asks_for_it(runtime, client, pods, tmp_path) -> None:
    """CoreSched with ``beClass.cpuQOS.schedIdle: 1`` (docs/colocation.md): the BE pod dir is a SCHED_IDLE group from
    RunPodSandbox on, the LS pod's is not; the BE pod's own shares stay off its dir while it is idle."""
    core_sched = parse_node_slo_spec({"resourceQOSStrategy": {
        "policies": {"cpuPolicy": "coreSched"}, "beClass": {"cpuQOS": {"enable": True, "schedIdle": 1}}}})
    with Koordlet(runtime, tmp_path, gates={**GATES, "CoreSched": True}, node_slo=core_sched):
        _, be_id, be = pods.start_pod("job", **BE)
        _, _, ls = pods.start_pod("ls-web", resources=KUBELET_LS, kube_qos="burstable", **LS)
        assert wait_for(lambda: cgroup(be, "cpu", "cpu.idle") == "1", 5)
        assert wait_for(lambda: cgroup(ls, "cpu", "cpu.idle") == "0", 5)
    assert cgroup(be, "cpu", "cpu.shares") == "3"  # the kernel's weight of an idle group, not batchresource's 512
    assert cgroup(be, "cpu", "cpu.shares", be_id) == "512"  # the container's own weight inside the idle pod


def test_a_pods_resctrl_group_is_made_at_run_pod_sandbox_and_removed_after_remove_pod_sandbox(
        runtime, client, pods, tmp_path) -> None:
    """Through NRI, on a fixture resctrl tree (no resctrl here, so no container of this pod could start with an RDT
    class: runc checks the kernel's): the group follows the sandbox, by the record of what koordlet made."""
    from tests.support.resctrl import resctrl_tree

    root = resctrl_tree(tmp_path / "resctrl")
    annotations = {"node.koordinator.sh/resctrl": json.dumps({"llc": {"schemata": {"range": [0, 50]}}})}
    with Koordlet(runtime, tmp_path, gates={**GATES, "Resctrl": True}, resctrl_dir=str(root)) as koordlet:
        sandbox = sandbox_config("rdt", annotations=annotations, cgroup_root=pods.cgroup_root)
        sid = pods.run_pod(sandbox)
        group = root / f"koordlet-{sandbox.metadata.uid}"
        assert wait_for(group.is_dir, 5), "the group is made after RunPodSandbox is answered"
        assert koordlet.executor.records.resctrl_groups.get(group.name) is not None
        client.runtime.StopPodSandbox(cri.StopPodSandboxRequest(pod_sandbox_id=sid), timeout=30)
        assert group.is_dir()  # NRI has no stop event koordlet subscribes to: the group goes with the sandbox
        client.runtime.RemovePodSandbox(cri.RemovePodSandboxRequest(pod_sandbox_id=sid), timeout=30)
        pods.sandboxes.remove(sid)
        assert wait_for(lambda: not group.exists(), 5), "RemovePodSandbox removes the group"


def test_update_container_resources_goes_through_nri_and_lands(runtime, client, pods, tmp_path) -> None:
    with Koordlet(runtime, tmp_path):
        _, cid, sandbox = pods.start_pod("job", **BE)
        # kubelet asks for more; the BE pod's batch resources still decide (the update carries the id)
        client.runtime.UpdateContainerResources(cri.UpdateContainerResourcesRequest(
            container_id=cid, linux=cri.LinuxContainerResources(cpu_shares=1024, cpu_quota=300000, cpu_period=100000,
                                                                memory_limit_in_bytes=1 << 30)), timeout=10)
        assert _events("UpdateContainer", "changed") >= 1
    assert cgroup(sandbox, "cpu", "cpu.shares", cid) == "512"
    assert cgroup(sandbox, "cpu", "cpu.cfs_quota_us", cid) == "150000"
    assert cgroup(sandbox, "memory", "memory.limit_in_bytes", cid) == str(96 << 20)


def test_koordlet_started_after_its_pods_converges_them_through_synchronize_within_a_second(
        runtime, client, pods, tmp_path) -> None:
    _, cid, sandbox = pods.start_pod("job", **BE)  # no plugin yet: kubelet's values (none: the kernel's 1024)
    assert cgroup(sandbox, "cpu", "cpu.shares", cid) == "1024"
    koordlet = Koordlet(runtime, tmp_path, register_within_s=None)
    started = time.monotonic()
    with koordlet:
        assert wait_for(lambda: cgroup(sandbox, "cpu", "cpu.shares", cid) == "512", 1.0, 0.01), \
            "Synchronize did not converge the running container within a second"
        took = time.monotonic() - started
        assert cgroup(sandbox, "memory", "memory.limit_in_bytes", cid) == str(96 << 20)
        assert wait_for(lambda: cgroup(sandbox, "cpu", "cpu.shares") == "512", 1.0)  # the pod level too
        sync = koordlet.nri.connection.sync if koordlet.nri.connection else None
        assert sync is not None and sync.containers >= 1 and sync.updates >= 1
    print(f"containerd {runtime.containerd.version}: converged {took * 1000:.0f} ms after koordlet's start")


def test_koordlet_killed_9_pods_still_start_and_it_registers_again(runtime, client, pods, tmp_path) -> None:
    koordlet = KoordletProcess(tmp_path, runtime.socket, str(tmp_path / "hookserver.d"))
    koordlet.args += koordlet_nri_args(runtime, "-runtime-hooks-reconcile-interval=1h")
    metrics = lambda: http_get(f"http://127.0.0.1:{koordlet.port}/metrics")  # noqa: E731
    koordlet.start()
    try:
        assert wait_registered(metrics, 15)
        _, hooked, _ = pods.start_pod("job", **BE)
        assert oci_spec(client, hooked)["linux"]["resources"]["cpu"]["shares"] == 512
        koordlet.kill()  # SIGKILL: no goodbye to containerd
        started = time.monotonic()
        _, unhooked, sandbox = pods.start_pod("job", **BE)  # containerd drops the plugin and goes on
        assert time.monotonic() - started < 10
        assert "shares" not in oci_spec(client, unhooked)["linux"]["resources"].get("cpu", {})  # kubelet's: none
        koordlet.start()
        assert wait_registered(metrics, 15)
        _, again, _ = pods.start_pod("job", **BE)
        assert oci_spec(client, again)["linux"]["resources"]["cpu"]["shares"] == 512
        # and the pod made while koordlet was down converged when it synchronized
        assert wait_for(lambda: cgroup(sandbox, "cpu", "cpu.shares", unhooked) == "512", 5)
    finally:
        koordlet.stop()


def test_a_containerd_restart_is_followed_by_a_new_registration(runtime, client, pods, tmp_path) -> None:
    with Koordlet(runtime, tmp_path) as koordlet:
        runtime.restart()
        assert wait_for(lambda: koordlet.nri.registrations == 2 and koordlet.nri.registered.is_set(), 10), \
            "koordlet did not register again after containerd restarted"
        reconnected = time.monotonic()
        _, cid, _ = pods.start_pod("job", **BE)
        assert oci_spec(client, cid)["linux"]["resources"]["cpu"]["shares"] == 512
    assert REGISTRY.get_sample_value("koordlet_nri_reconnects_total") >= 1
    print(f"containerd {runtime.containerd.version}: registered again, pod hooked "
          f"{(time.monotonic() - reconnected) * 1000:.0f} ms later")


def test_a_socket_absent_at_start_is_registered_with_within_the_backoff_cap(runtime, pods, tmp_path) -> None:
    hidden = runtime.nri_socket + ".away"
    os.rename(runtime.nri_socket, hidden)  # containerd still listens; the path is just not there
    try:
        with Koordlet(runtime, tmp_path, register_within_s=None, backoff_cap_s=2.0, socket_poll_s=1.0) as koordlet:
            time.sleep(1.5)
            assert not koordlet.nri.registered.is_set()
            os.rename(hidden, runtime.nri_socket)
            appeared = time.monotonic()
            assert koordlet.nri.registered.wait(2.0), "not registered within the 2 s backoff cap"
            print(f"containerd {runtime.containerd.version}: registered {(time.monotonic() - appeared) * 1000:.0f} "
                  "ms after the socket appeared")
    finally:
        if os.path.exists(hidden):
            os.rename(hidden, runtime.nri_socket)


def test_a_sync_over_4_mib(runtime, client, pods, tmp_path) -> None:
    """containerd 2.1.9 (NRI v0.8.0, ttrpc v1.2.7) refuses to send a message over 4 MiB and splits the sync;
    1.7.24 (NRI v0.6.1, Debian's ttrpc v1.2.4) sends it in one message. A plugin that takes no more than
    ttrpc's 4 MiB, as every Go plugin (Koordinator's among them, its #2678), answers that RESOURCE_EXHAUSTED:
    containerd 1.7.24 then logs the failed sync and never calls it, though it stays connected. koordlet takes
    up to 16 MiB and answers."""
    filler = "x" * (900 << 10)
    for index in range(6):
        pods.start_pod(f"big-{index}", annotations={"example.com/filler": filler})
    _, cid, sandbox = pods.start_pod("job", **BE)
    with Koordlet(runtime, tmp_path, register_within_s=15) as koordlet:
        sync = koordlet.nri.connection.sync
        assert sync.request_bytes > 4 << 20 and sync.pods >= 7
        if runtime.containerd.version == "1.7":
            assert sync.messages == 1  # unsplit
        else:
            assert sync.messages > 1  # split: answered more=true without updates, then once with them
        assert sync.updates >= 1 and wait_for(lambda: cgroup(sandbox, "cpu", "cpu.shares", cid) == "512", 2)
        _, new_id, _ = pods.start_pod("job", **BE)  # events flow: containerd took the sync
        assert oci_spec(client, new_id)["linux"]["resources"]["cpu"]["shares"] == 512
    assert runtime.log_lines(r'plugin \\?"00-koordlet_nri\\?" connected')
    with TinyPlugin(runtime.nri_socket, _with_env, name="golike", index="95", receive_limit=MESSAGE_MAX) as golike:
        pods.start_pod("job", **BE)
        synced_golike = golike.registered.is_set()
        assert golike.created == (0 if runtime.containerd.version == "1.7" else 1)
    assert synced_golike is (runtime.containerd.version != "1.7")
    failed = runtime.log_lines(r"failed to synchroni[sz]e plugin")  # NRI v0.6.1 logs it at info, no name
    if runtime.containerd.version == "1.7":
        assert failed and "exceed maximum message size of 4194304" in failed[-1]
    print(f"containerd {runtime.containerd.version}: sync of {sync.request_bytes} bytes in {sync.messages} "
          f"message(s), {sync.updates} update(s); a plugin taking 4 MiB at most: "
          f"{'synchronized' if synced_golike else 'not synchronized, no events'}; containerd logged: "
          f"{failed[-1][:300] if failed else '-'}")


def _with_env(request: api.CreateContainerRequest) -> api.ContainerAdjustment:
    return api.ContainerAdjustment(env=[api.KeyValue(key="TINY_PLUGIN", value="yes")])


def _with_shares(request: api.CreateContainerRequest) -> api.ContainerAdjustment:
    adjust = api.ContainerAdjustment()
    adjust.linux.resources.cpu.shares.value = 999
    return adjust


def test_a_second_plugin_setting_another_field_does_not_conflict(runtime, client, pods, tmp_path) -> None:
    with Koordlet(runtime, tmp_path), TinyPlugin(runtime.nri_socket, _with_env) as tiny:
        assert tiny.registered.is_set()
        _, cid, _ = pods.start_pod("job", **BE)
    spec = oci_spec(client, cid)
    assert spec["linux"]["resources"]["cpu"]["shares"] == 512 and "TINY_PLUGIN=yes" in spec["process"]["env"]


def test_a_second_plugin_setting_the_same_field_fails_the_creation_with_containerds_error(
        runtime, client, pods, tmp_path) -> None:
    with Koordlet(runtime, tmp_path), TinyPlugin(runtime.nri_socket, _with_shares) as tiny:
        assert tiny.registered.is_set()
        sandbox = sandbox_config("job", **BE)
        sid = pods.run_pod(sandbox)
        with pytest.raises(grpc.RpcError) as failed:
            pods.create_container(sid, sandbox, container_config("job"))
    message = failed.value.details()
    assert 'plugins "90-tiny" and "00-koordlet_nri" both tried to set CPU shares' in message, message


def test_with_proxy_and_nri_both_on_a_container_gets_one_answer(runtime, client, tmp_path) -> None:
    """kubelet's quota 200000 at ratio 1.25: the proxy's answer is 160000; containerd then asks NRI about the
    container as the proxy changed it. NRI takes the proxy's decision: 160000, not 128000."""
    proxy = ProxyProcess(str(tmp_path / "proxy.sock"), runtime.socket, state_dir=str(tmp_path))
    unchanged = _events("CreateContainer", "unchanged")
    with Koordlet(runtime, tmp_path, node_annotations=RATIO, serve_hooks=True, hook_dir=proxy.hook_dir) as koordlet:
        proxy.start()
        through_proxy = CriClient(proxy.listen)
        pods = PodFactory(through_proxy)
        try:
            _, cid, sandbox = pods.start_pod("ls-both", resources=KUBELET_LS, kube_qos="burstable", **LS)
            assert cgroup(sandbox, "cpu", "cpu.cfs_quota_us", cid) == "160000"
            assert oci_spec(client, cid)["linux"]["resources"]["cpu"]["quota"] == 160000
            assert koordlet.hooks.decisions is not None and koordlet.hooks.decisions.reused >= 1
            assert _events("CreateContainer", "unchanged") >= unchanged + 1
        finally:
            pods.client = client
            pods.cleanup()
            through_proxy.close()
            proxy.terminate()
