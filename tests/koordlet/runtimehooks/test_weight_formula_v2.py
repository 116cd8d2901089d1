"""One cpu.shares → cpu.weight formula with the runtime (docs/koordinator.md "Where koordlet-py differs"), on the real
cgroup v2 kernel of the VM stage, with runc 1.1.5 (Debian 12's, the linear formula: the runtime handler ``runc``) and
runc 1.3.6 (Debian unstable's, the quadratic one: the handler ``runc-1.3`` the guest's containerd adds).

For each runc: an LS pod (Burstable, 1 CPU requested: 1024 shares) and a BE pod with batch resources, whose container
the runtime was given the shares batch resources decides (512: what the proxy or an NRI adjustment hands the
runtime), start on that handler. A koordlet reconciler (``-cgroup-v2-weight-formula=auto``, batch resources on) over
those two pods only (one node, one runtime) passes every half second for a minute; halfway, kubelet's
UpdateContainerResources gives the BE container its shares again, so the runtime writes its value once more. The BE
container's ``cpu.weight`` must keep the one value the runtime wrote at its start through every pass: koordlet read
the runtime's formula from the LS container and writes the same. The two runcs run side by side, so the minute is
spent once. A reconciler made to use the other formula shows what that avoids: it writes its own value over the
runtime's, and the runtime's next write puts its own back.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from koordlet.api.keys import LABEL_QOS_CLASS
from koordlet.api.nodeslo import default_node_slo_spec
from koordlet.api.pod import ContainerMeta, PodMeta
from koordlet.api.qos import KubeQoS
from koordlet.executor import ResourceExecutor
from koordlet.runtimehooks import RuntimeHooks, RuntimeHooksConfig
from koordlet.statesinformer.api import NodeInfo, StaticStates
from koordlet.system.cgroup import CgroupFS, CgroupVersion
from koordlet.system.kubepods import KubeCgroupLayout
from koordlet.system.resources import WeightFormula, cpu_shares_to_weight
from tests.koordlet.qosmanager.realnode import skip_unless_v2_writable
from tests.support.containerd import CGROUP_ROOT, RUNC_13_HANDLER
from tests.support.cri import CriClient, PodFactory, container_config, sandbox_config
from wire import cri_pb2 as cri

pytestmark = [pytest.mark.cgroupv2, pytest.mark.containerd]

V2 = Path("/sys/fs/cgroup")
LAYOUT = KubeCgroupLayout(cgroup_root=CGROUP_ROOT)
MiB = 1 << 20
INTERVAL_S = 0.5  # the reconcile interval, shortened: a minute is 120 passes
WATCH_S = 60.0
BE_SHARES = 512  # batch resources' shares for 500 milli batch-cpu (hooks/protocol.py shares_from_milli)
LS_SHARES = 1024  # kubelet's for a request of 1 CPU
BE_REQUESTS = {"kubernetes.io/batch-cpu": 500, "kubernetes.io/batch-memory": 64 * MiB}
BE_LIMITS = {"kubernetes.io/batch-cpu": 1500, "kubernetes.io/batch-memory": 96 * MiB}
# (runtime handler, the formula its runc uses)
RUNCS = {"1.1.5": ("runc", WeightFormula.LINEAR), "1.3.6": (RUNC_13_HANDLER, WeightFormula.QUADRATIC)}


@dataclass
class Node:
    """The two pods of one runtime handler, and a koordlet's reconciler over them."""

    handler: str
    formula: WeightFormula
    states: StaticStates
    be_container: Path
    be_pod: Path
    be_id: str
    ls_container: Path
    samples: list[str] = field(default_factory=list)

    def hooks(self, weight_formula: str) -> RuntimeHooks:
        config = RuntimeHooksConfig(serve_hooks=False, reconcile_interval_s=INTERVAL_S, weight_formula=weight_formula,
                                    feature_gates={"BatchResource": True})
        return RuntimeHooks(config, self.states, ResourceExecutor(CgroupFS.detect()), LAYOUT)

    def weight(self) -> str:
        return (self.be_container / "cpu.weight").read_text().strip()


def _start(pods: PodFactory, handler: str, name: str, kube_qos: KubeQoS, labels: dict[str, str],
           shares: int) -> tuple[cri.PodSandboxConfig, str, str]:
    sandbox = sandbox_config(f"{name}-{uuid.uuid4().hex[:6]}", kube_qos=kube_qos.value.lower(), labels=labels)
    sid = pods.client.runtime.RunPodSandbox(cri.RunPodSandboxRequest(config=sandbox, runtime_handler=handler),
                                            timeout=120).pod_sandbox_id
    pods.sandboxes.append(sid)
    resources = cri.LinuxContainerResources(cpu_shares=shares, memory_limit_in_bytes=96 * MiB)
    cid = pods.create_container(sid, sandbox, container_config(name, resources=resources), timeout=120)
    pods.client.runtime.StartContainer(cri.StartContainerRequest(container_id=cid), timeout=120)
    return sandbox, sid, cid


def _node(pods: PodFactory, handler: str, formula: WeightFormula) -> Node:
    ls_sandbox, _, ls_id = _start(pods, handler, "ls", KubeQoS.BURSTABLE, {LABEL_QOS_CLASS: "LS"}, LS_SHARES)
    be_sandbox, _, be_id = _start(pods, handler, "be", KubeQoS.BESTEFFORT, {LABEL_QOS_CLASS: "BE"}, BE_SHARES)

    def meta(sandbox: cri.PodSandboxConfig, container: ContainerMeta, kube_qos: KubeQoS) -> PodMeta:
        return PodMeta(name=sandbox.metadata.name, namespace="default", uid=sandbox.metadata.uid,
                       labels=dict(sandbox.labels), kube_qos=kube_qos, cgroup_parent=sandbox.linux.cgroup_parent,
                       phase="Running", containers=(container,))

    ls = meta(ls_sandbox, ContainerMeta("ls", ls_id, requests={"cpu": 1000, "memory": 64 * MiB},
                                        limits={"memory": 96 * MiB}), KubeQoS.BURSTABLE)
    be = meta(be_sandbox, ContainerMeta("be", be_id, requests=BE_REQUESTS, limits=BE_LIMITS), KubeQoS.BESTEFFORT)
    node = NodeInfo("v2-node", capacity={"cpu": 4000, "memory": 4096 * MiB},
                    allocatable={"cpu": 4000, "memory": 4096 * MiB})
    states = StaticStates(node=node, node_slo=default_node_slo_spec())
    states.set_pods([ls, be])
    ls_pod_dir = LAYOUT.dir_from_cgroup_parent(ls_sandbox.linux.cgroup_parent)
    be_pod_dir = LAYOUT.dir_from_cgroup_parent(be_sandbox.linux.cgroup_parent)
    return Node(handler, formula, states, V2 / LAYOUT.container_dir(be_pod_dir, be_id), V2 / be_pod_dir, be_id,
                V2 / LAYOUT.container_dir(ls_pod_dir, ls_id))


@pytest.fixture(scope="module")
def nodes(containerd_socket: str) -> Iterator[dict[str, Node]]:
    skip_unless_v2_writable()
    assert CgroupFS.detect().version is CgroupVersion.V2
    client = CriClient(containerd_socket)
    pods = PodFactory(client)
    try:
        yield {version: _node(pods, handler, formula) for version, (handler, formula) in RUNCS.items()}
    finally:
        pods.cleanup()
        client.close()


def _update_shares(socket: str, container_id: str, shares: int) -> None:
    """kubelet's UpdateContainerResources with the container's shares (a resize that leaves CPU as it was)."""
    client = CriClient(socket)
    try:
        client.runtime.UpdateContainerResources(cri.UpdateContainerResourcesRequest(
            container_id=container_id, linux=cri.LinuxContainerResources(cpu_shares=shares,
                                                                          memory_limit_in_bytes=96 * MiB)), timeout=60)
    finally:
        client.close()


def _watch(node: Node, socket: str, hooks: RuntimeHooks, seconds: float, errors: list[BaseException]) -> None:
    """Reconcile every INTERVAL_S for ``seconds``, sampling the BE container's weight after each pass; halfway,
    the runtime writes the container's weight again (kubelet's update)."""
    try:
        deadline = time.monotonic() + seconds
        updated = False
        while time.monotonic() < deadline:
            hooks.reconciler.reconcile_once()
            node.samples.append(node.weight())
            if not updated and time.monotonic() > deadline - seconds / 2:
                _update_shares(socket, node.be_id, BE_SHARES)
                node.samples.append(node.weight())
                updated = True
            time.sleep(INTERVAL_S)
    except BaseException as err:  # noqa: BLE001 - handed to the test's thread
        errors.append(err)


def test_the_weight_runc_wrote_keeps_one_value_through_a_minute_of_reconciles_with_either_runc(
        nodes: dict[str, Node], containerd_socket: str, record_property: Callable[[str, object], None]) -> None:
    started = {version: node.weight() for version, node in nodes.items()}
    # What each runc made of the BE container's 512 shares at its start, before any koordlet: its own formula.
    assert started == {version: str(cpu_shares_to_weight(BE_SHARES, node.formula)) for version, node in nodes.items()}
    assert started == {"1.1.5": "20", "1.3.6": "59"}
    all_hooks = {version: node.hooks("auto") for version, node in nodes.items()}
    errors: list[BaseException] = []
    threads = [threading.Thread(target=_watch, args=(nodes[v], containerd_socket, all_hooks[v], WATCH_S, errors))
               for v in nodes]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WATCH_S + 120)
    assert not errors, errors
    for version, node in nodes.items():
        hooks = all_hooks[version]
        assert hooks.weight_formula.observed is node.formula, version  # read from the LS container's weight
        assert hooks.reconciler.passes >= WATCH_S / INTERVAL_S / 2, (version, hooks.reconciler.passes)
        assert set(node.samples) == {started[version]}, (version, sorted(set(node.samples)))
        # the BE pod dir, koordlet's own write, has the same formula's value
        assert (node.be_pod / "cpu.weight").read_text().strip() == str(cpu_shares_to_weight(BE_SHARES, node.formula))
        record_property(f"runc_{version}_passes", hooks.reconciler.passes)
        record_property(f"runc_{version}_values", sorted(set(node.samples)))


def test_a_koordlet_on_the_other_formula_and_the_runtime_overwrite_each_other(
        nodes: dict[str, Node], containerd_socket: str) -> None:
    node = nodes["1.3.6"]
    runtime_value = str(cpu_shares_to_weight(BE_SHARES, WeightFormula.QUADRATIC))
    hooks = node.hooks(WeightFormula.LINEAR.value)  # what Koordinator (and koordlet-py before) writes everywhere
    try:
        seen = []
        for _ in range(2):
            hooks.reconciler.reconcile_once()
            seen.append(node.weight())
            _update_shares(containerd_socket, node.be_id, BE_SHARES)
            seen.append(node.weight())
        assert seen == ["20", runtime_value, "20", runtime_value]
    finally:
        node.hooks("auto").reconciler.reconcile_once()  # the runtime's formula again, for the module's other tests
    assert node.weight() == runtime_value
