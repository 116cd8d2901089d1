"""The node stack of a cgroup v2 guest session, started once and shared by the guest's tests (fixture ``v2_stack``,
tests/conftest.py): under emulation a containerd costs 10-30 s to start and a Python process 10 s to import, where a
pod on a running stack costs a few seconds.

What it holds, on the guest's cgroup driver (``KPY_CGROUP_DRIVER``: cgroupfs, or systemd in the systemd guest):
- the session's containerd (the ``containerd_socket`` fixture), which in a guest also serves NRI on its own socket
  (tests/support/containerd.py), with no plugin registered until a test asks for one (:meth:`V2Stack.nri_plugin`);
- koordlet's runtime hooks (``RuntimeHooks``, in the test process: the hook server with its registration and the
  reconciler every second) over one ``StaticStates`` (the node, its NodeSLO, the pods a test puts there), with the
  session's feature gates (:data:`GATES`);
- koord-runtime-proxy in front of containerd, its hooks registered: ``client`` is kubelet's side of it, ``direct``
  containerd's own CRI.

A test makes pods with :meth:`V2Stack.pods` (through the proxy, or ``direct``: no hook on the way, or the NRI path
once a plugin is registered) and removes them (``PodFactory.cleanup``); it puts what it changed in the states back
with :meth:`V2Stack.reset`; a QoS strategy runs over the stack's states with :meth:`V2Stack.manager`. Through the
proxy and through NRI at once would apply each hook twice, so a test that registers the NRI plugin makes its pods
``direct``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from koordlet.api.nodeslo import default_node_slo_spec, parse_node_slo_spec
from koordlet.api.pod import ContainerMeta, PodMeta
from koordlet.api.qos import KubeQoS
from koordlet.executor import ResourceExecutor
from koordlet.metriccache import MetricCache
from koordlet.metricsadvisor.pods import DemandBoard
from koordlet.qosmanager import QoSManagerConfig, new_qos_manager
from koordlet.runtimehooks import RuntimeHooks, RuntimeHooksConfig
from koordlet.runtimehooks.nri import NriConfig
from koordlet.statesinformer.api import NodeInfo, StaticStates
from koordlet.system.cgroup import CgroupDriver, CgroupFS, CgroupVersion
from koordlet.system.kubepods import KubeCgroupLayout
from tests.support.containerd import CGROUP_ROOT
from tests.support.cri import CriClient, PodFactory, sandbox_config
from tests.support.proxy import ProxyProcess
from wire import cri_pb2 as cri

V2 = Path("/sys/fs/cgroup")
DRIVER = CgroupDriver(os.environ.get("KPY_CGROUP_DRIVER", "cgroupfs"))
# kubelet's layout: with cgroupfs our tests' --cgroup-root keeps pods apart from any real ones; with systemd
# (only in the systemd guest) kubelet's default root, as systemd expands the slice names.
LAYOUT = (KubeCgroupLayout(driver=CgroupDriver.SYSTEMD) if DRIVER is CgroupDriver.SYSTEMD
          else KubeCgroupLayout(cgroup_root=CGROUP_ROOT))
# The hook plugins of the session's koordlet. A test needing another plugin adds its gate here (every test then runs
# with it, as on a node with that gate on); one that needs a plugin off registers its own hooks for NRI.
GATES = {"BatchResource": True, "CPUSetAllocator": True, "GroupIdentity": True}
NODE = "v2-node"
MiB = 1 << 20
RECONCILE_INTERVAL_S = 1.0
STARTUP_TIMEOUT_S = 120.0  # an emulated guest imports the proxy's Python in ~10 s; on a busy host far more


def kubelet_sandbox(name: str, kube_qos: KubeQoS, labels: dict[str, str],
                    annotations: dict[str, str]) -> cri.PodSandboxConfig:
    """What kubelet sends: with the systemd driver the cgroup parent is the pod's bare slice name."""
    sandbox = sandbox_config(name, kube_qos=kube_qos.value.lower(), labels=labels, annotations=annotations)
    if DRIVER is CgroupDriver.SYSTEMD:
        qos = "" if kube_qos is KubeQoS.GUARANTEED else f"-{kube_qos.value.lower()}"
        sandbox.linux.cgroup_parent = f"kubepods{qos}-pod{sandbox.metadata.uid.replace('-', '_')}.slice"
    return sandbox


def pod_dirs(sandbox: cri.PodSandboxConfig, container_id: str) -> tuple[Path, Path]:
    """The pod's and the container's cgroup dirs on the guest's layout."""
    pod_dir = LAYOUT.dir_from_cgroup_parent(sandbox.linux.cgroup_parent)
    return V2 / pod_dir, V2 / LAYOUT.container_dir(pod_dir, container_id)


@dataclass
class V2Pod:
    """A started pod of one container, where its cgroup files are, and what koordlet's states say of it."""

    name: str
    uid: str
    sandbox_id: str
    sandbox: cri.PodSandboxConfig
    container_id: str
    meta: PodMeta

    @property
    def dir(self) -> Path:
        return pod_dirs(self.sandbox, self.container_id)[0]

    @property
    def container_dir(self) -> Path:
        return pod_dirs(self.sandbox, self.container_id)[1]

    def read(self, name: str, container: bool = True) -> str:
        return ((self.container_dir if container else self.dir) / name).read_text().strip()


@dataclass
class V2Stack:
    containerd_socket: str
    nri_socket: str | None
    states: StaticStates
    hooks: RuntimeHooks
    proxy: ProxyProcess
    client: CriClient  # through the proxy, as kubelet calls it
    direct: CriClient  # containerd's own CRI

    @classmethod
    @contextmanager
    def running(cls, containerd_socket: str, nri_socket: str | None, state_dir: Path) -> Iterator[V2Stack]:
        """Start the hooks and the proxy on ``containerd_socket``; stop both after (pods are the tests' own)."""
        fs = CgroupFS.detect()
        assert fs.version is CgroupVersion.V2
        states = StaticStates(node=_node(), node_slo=default_node_slo_spec())
        config = RuntimeHooksConfig(socket_path=str(state_dir / "koordlet.sock"),
                                    host_endpoint=str(state_dir / "koordlet.sock"),
                                    config_dir=str(state_dir / "hookserver.d"),
                                    reconcile_interval_s=RECONCILE_INTERVAL_S, feature_gates=GATES)
        hooks = RuntimeHooks(config, states, ResourceExecutor(fs), LAYOUT)
        proxy = ProxyProcess(str(state_dir / "proxy.sock"), containerd_socket, state_dir=str(state_dir))
        hooks.start()
        try:
            proxy.start(timeout_s=STARTUP_TIMEOUT_S)
            stack = cls(containerd_socket, nri_socket, states, hooks, proxy, CriClient(proxy.listen),
                        CriClient(containerd_socket))
            try:
                yield stack
            finally:
                stack.client.close()
                stack.direct.close()
                proxy.terminate()
        finally:
            hooks.stop()

    def pods(self, direct: bool = False) -> PodFactory:
        """A factory of pods through the proxy (``direct``: on containerd's own CRI); ``cleanup()`` removes them."""
        return PodFactory(self.direct if direct else self.client)

    def start_pod(self, pods: PodFactory, name: str, kube_qos: KubeQoS, labels: dict[str, str],
                  annotations: dict[str, str], container: cri.ContainerConfig,
                  requests: dict[str, int] | None = None, limits: dict[str, int] | None = None) -> V2Pod:
        """Run a pod of ``container`` through ``pods`` and start it. Its ``meta`` is what kubelet would tell koordlet
        of it (``requests`` and ``limits`` of the container, milli-CPU and bytes); :meth:`add_pods` puts it in
        koordlet's states."""
        sandbox = kubelet_sandbox(name, kube_qos, labels, annotations)
        sid = pods.run_pod(sandbox, timeout=STARTUP_TIMEOUT_S)
        cid = pods.create_container(sid, sandbox, container, timeout=STARTUP_TIMEOUT_S)
        pods.client.runtime.StartContainer(cri.StartContainerRequest(container_id=cid), timeout=STARTUP_TIMEOUT_S)
        meta = PodMeta(name=name, namespace="default", uid=sandbox.metadata.uid, labels=dict(sandbox.labels),
                       annotations=dict(sandbox.annotations), kube_qos=kube_qos,
                       cgroup_parent=sandbox.linux.cgroup_parent, phase="Running",
                       containers=(ContainerMeta(container.metadata.name, cid, requests=requests or {},
                                                 limits=limits or {}),))
        return V2Pod(name, sandbox.metadata.uid, sid, sandbox, cid, meta)

    def add_pods(self, *pods: V2Pod) -> None:
        """koordlet's states learn of ``pods`` (as the states informer would from kubelet)."""
        self.states.set_pods([*self.states.pods(), *(p.meta for p in pods)])

    def reset(self) -> None:
        """The states as the session started them: the node, the default NodeSLO, no pods."""
        self.states.set_pods([])
        self.states.set_node(_node())
        self.states.set_node_slo(default_node_slo_spec())

    def manager(self, slo_spec: dict, gates: dict[str, bool], cache: MetricCache | None = None,  # noqa: ANN201
                demand: DemandBoard | None = None, fanout_interval_s: float = 1.0):
        """A QoS manager over the stack's states with only ``gates`` on, NodeSLO ``slo_spec``; ``cache``: where
        collectors put usage; ``demand``: where it tells the collector which pods to read every tick (as koordlet
        runs it), with pods read once in ``fanout_interval_s`` otherwise. The caller starts and stops it."""
        self.states.set_node_slo(parse_node_slo_spec(slo_spec))
        config = QoSManagerConfig(node_name=NODE, feature_gates={
            "BECPUSuppress": False, "CPUBurst": False, "RdtResctrl": False, "CgroupReconcile": False, **gates},
            fanout_interval_s=fanout_interval_s if demand is not None else 1.0)
        return new_qos_manager(self.states, cache or MetricCache(), ResourceExecutor(CgroupFS.detect()), LAYOUT,
                               config=config, started_at=time.time() - 60,
                               publish_demand=demand.set if demand is not None else None)

    @contextmanager
    def nri_plugin(self, state_dir: Path, gates: dict[str, bool] = GATES) -> Iterator[RuntimeHooks]:
        """koordlet's hooks registered as an NRI plugin of the stack's containerd (no hook server, no reconciler
        to speak of), over states of their own; unregistered after."""
        if self.nri_socket is None:
            raise RuntimeError("the session's containerd serves NRI only in a v2 guest (KPY_V2_GUEST=1)")
        fs = CgroupFS.detect()
        config = RuntimeHooksConfig(socket_path=str(state_dir / "koordlet.sock"), config_dir=str(state_dir / "hooks.d"),
                                    reconcile_interval_s=3600, feature_gates=gates, serve_hooks=False,
                                    nri=NriConfig(socket_path=self.nri_socket, socket_poll_s=0.2))
        hooks = RuntimeHooks(config, StaticStates(node=NodeInfo(NODE)), ResourceExecutor(fs), LAYOUT)
        hooks.start()
        try:
            if hooks.nri is None or not hooks.nri.registered.wait(30):
                raise RuntimeError("koordlet did not register with the stack's containerd over NRI")
            yield hooks
        finally:
            hooks.stop()


def _node() -> NodeInfo:
    cpu_milli = (os.cpu_count() or 1) * 1000
    return NodeInfo(NODE, capacity={"cpu": cpu_milli, "memory": 4096 * MiB},
                    allocatable={"cpu": cpu_milli, "memory": 4096 * MiB})
