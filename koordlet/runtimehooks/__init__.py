"""koordlet's runtime hooks: the hook server the proxy calls, its registration file, the NRI plugin
containerd calls (``nri/``), and the reconciler.

    hooks = RuntimeHooks(RuntimeHooksConfig(...), states, executor, layout)
    hooks.start()   # server up, koordlet.json written, NRI plugin connecting, reconciler running
    hooks.stop()    # registration removed first, so the proxy stops calling a server that is going away

With both front doors on, a container the proxy asked about is answered once: the NRI plugin takes the hook
server's decision (decisions.py) instead of deciding again from a request the proxy already changed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from hooks import registry
from hooks import resctrl as resctrl_hook
from hooks.protocol import LinuxDevice, NodeContext, RDMANode, ResctrlNode
from koordlet.api.cpupools import CPUPools, compute_cpu_pools
from koordlet.api.pod import PodMeta
from koordlet.executor import ResourceExecutor
from koordlet.history.answers import HookAnswers
from koordlet.statesinformer.api import CallbackKind, StatesProvider
from koordlet.statesinformer.cpumanager import CPUManagerState
from koordlet.statesinformer.enacted import LinuxResources
from koordlet.system.cgroup import CgroupVersion
from koordlet.system.kubepods import KubeCgroupLayout
from koordlet.system.procfs import read_meminfo
from koordlet.system.rdma import DeviceNode, rdma_device_nodes
from koordlet.system.resctrl import ResctrlInfoError, read_resctrl_info
from koordlet.system.roots import DEV_DIR, PROC_DIR, SYS_DIR
from koordlet.system.sysfs import SysfsError, read_cpu_topology, read_online_cpus
from wire.sockets import remove_socket

from . import metrics
from .apply import RejectedValues
from .decisions import Decisions
from .metrics import zero_counts
from .nri import NriConfig, NriHandlers, NriPlugin
from .reconciler import Reconciler
from .registration import remove_registration, write_registration
from .server import HookService, serve
from .weightformula import WeightFormulaSource

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class RuntimeHooksConfig:
    socket_path: str = "/var/run/koordlet/koordlet.sock"  # where koordlet listens
    host_endpoint: str = "/var/run/koordlet/koordlet.sock"  # the same socket as the proxy on the host sees it
    config_dir: str = "/etc/runtime/hookserver.d"
    failure_policy: str = "Ignore"
    disabled_stages: frozenset[str] = frozenset()
    reconcile_interval_s: float = 10.0
    feature_gates: Mapping[str, bool] = field(default_factory=dict)
    resctrl_dir: str | None = None
    serve_hooks: bool = True  # False: reconciler only (no proxy on this node)
    sys_dir: str = SYS_DIR  # online CPUs, for the hook value check; RDMA functions
    proc_dir: str = PROC_DIR  # the node's memory, for the hook value check
    nri: NriConfig | None = None  # NRI mode: register as a plugin at nri.socket_path (None: off)
    dev_dir: str = DEV_DIR  # RDMA device nodes (gate RDMADeviceInject)
    hami_core_library: str = "/usr/local/vgpu/libvgpu.so"  # -hami-core-library-directory-path
    disable_unset_cpu_quota: bool = False  # -disable-unset-cpu-quota: the cpuset hook keeps bound pods' quota
    node_name: str = ""  # the ``node`` label of the runtime hook metrics
    weight_formula: str = "auto"  # -cgroup-v2-weight-formula: auto, linear or quadratic (weightformula.py)


def node_capacity(sys_dir: str, proc_dir: str) -> tuple[frozenset[int], int]:
    """(online CPUs, memory bytes) of the node, for hooks/validate.py; unknown parts empty / 0 (not checked)."""
    try:
        cpus = frozenset(read_online_cpus(sys_dir))
    except SysfsError as err:
        log.warning("online CPUs unknown (%s): hook cpusets are not checked against them", err)
        cpus = frozenset()
    try:
        memory = read_meminfo(proc_dir).mem_total_bytes
    except (OSError, ValueError) as err:
        log.warning("node memory unknown (%s): hook memory limits are not checked against it", err)
        memory = 0
    return cpus, memory


def read_resctrl_node(resctrl_dir: str | None) -> ResctrlNode | None:
    """The node's RDT capabilities for the pod-level resctrl hook; None without RDT."""
    if not resctrl_dir:
        return None
    try:
        info = read_resctrl_info(resctrl_dir)
    except ResctrlInfoError as err:
        log.warning("resctrl at %s unusable: %s", resctrl_dir, err)
        return None
    return None if info is None else ResctrlNode(info.cbm_mask, info.cache_ids, info.has_mb, info.vendor)


POST_STOP_POD_SANDBOX = "PostStopPodSandbox"  # runtime.v1alpha1's stage name
# kubelet writes a resized pod's status after its CRI calls return (its pod worker, then the status manager): poll
# again this much later for the enacted amounts
RESIZE_RESYNC_S = 2.0
RDMA_REFRESH_S = 60.0  # how often the RDMA device nodes are read again (they change with hotplug only)


class _RDMANodes:
    """The node's RDMA device nodes for the RDMADeviceInject plugin, read at most every RDMA_REFRESH_S."""

    def __init__(self, sys_dir: str, dev_dir: str) -> None:
        self._sys_dir, self._dev_dir = sys_dir, dev_dir
        self._value: RDMANode | None = None
        self._read_at = float("-inf")

    @staticmethod
    def _device(node: DeviceNode) -> LinuxDevice:
        return LinuxDevice(node.path, node.type, node.major, node.minor)

    def get(self) -> RDMANode:
        now = time.monotonic()
        if self._value is None or now - self._read_at >= RDMA_REFRESH_S:
            rdma_cm, uverbs = rdma_device_nodes(self._sys_dir, self._dev_dir)
            self._value = RDMANode(self._device(rdma_cm) if rdma_cm is not None else None,
                                   {bus: self._device(node) for bus, node in uverbs.items()})
            self._read_at = now
        return self._value


def group_identity_supported(executor: ResourceExecutor, layout: KubeCgroupLayout) -> bool:
    """Koordinator's check (docs/koordinator.md §3.3).

    ``cpu.bvt_warp_ns`` exists in the kubepods dir (Anolis kernels)."""
    from koordlet.executor import ExecutorError

    try:
        executor.read("cpu.bvt_warp_ns", layout.kubepods_dir())
    except ExecutorError:
        return False
    return True


class RuntimeHooks:
    def __init__(self, config: RuntimeHooksConfig, states: StatesProvider, executor: ResourceExecutor,
                 layout: KubeCgroupLayout, warn: Callable[[PodMeta, str, str], None] | None = None,
                 cpu_manager: Callable[[], CPUManagerState | None] | None = None,
                 task_ids: Callable[[str], Mapping[str, tuple[int, ...]]] | None = None) -> None:
        """``warn``: writes a Warning Event on a pod (an API server is present), for hook values dropped;
        ``cpu_manager``: kubelet's CPU manager state, for the cpuset hook's shared pools (None: unknown);
        ``task_ids``: the threads of each pod's containers as the states informer read them (``-enable-pod-taskids``),
        for the reconciler's resctrl moves."""
        self.config = config
        self.states = states
        if config.node_name:
            metrics.set_node(config.node_name)
        self.plugins = registry.enabled(config.feature_gates)
        gates = config.feature_gates
        if gates.get("HamiCoreVGPUMonitor") and not gates.get("GPUEnvInject"):
            # Koordinator's monitor is a part of its GPU env hook: without that hook it does nothing.
            log.info("HamiCoreVGPUMonitor needs GPUEnvInject on (as in Koordinator); off")
            self.plugins = [p for p in self.plugins if p.gate != "HamiCoreVGPUMonitor"]
        zero_counts(self.plugins)
        self._resctrl = read_resctrl_node(config.resctrl_dir) if config.feature_gates.get("Resctrl") else None
        self._bvt = group_identity_supported(executor, layout)
        self._v2 = executor.cgroup_fs.version is CgroupVersion.V2
        self._online_cpus, self._memory_bytes = node_capacity(config.sys_dir, config.proc_dir)
        self._cpu_manager = cpu_manager
        try:
            self._topology = read_cpu_topology(config.sys_dir)
        except SysfsError as err:
            log.warning("CPU topology unknown (%s): the cpuset hook leaves shared-pool cpusets alone", err)
            self._topology = ()
        # (the pod list, kubelet's state, the annotations) -> their pools, replaced in one assignment: the hook
        # server, the NRI plugin's workers and the reconciler ask from their own threads
        self._pools: tuple[tuple, CPUPools] | None = None
        self._rdma = _RDMANodes(config.sys_dir, config.dev_dir) if gates.get("RDMADeviceInject") else None
        rejects = RejectedValues(warn)
        self.answers = HookAnswers()  # what the plugins answered at each pod's creation (/debug/pods)
        self.weight_formula = WeightFormulaSource(config.weight_formula, executor, layout)
        self.reconciler = Reconciler(states.pods, self.node_context, lambda: self.plugins, executor, layout,
                                     config.reconcile_interval_s, rejects, self.answers, task_ids,
                                     self.weight_formula)
        # both front doors: the hook server's decisions, remembered for the NRI plugin to take
        self.decisions = Decisions() if config.nri is not None and config.serve_hooks else None
        self.service = HookService(lambda: self.plugins, self.node_context, self._known_pod, executor, layout,
                                   config.disabled_stages, rejects, self.decisions, self.answers, self.resized)
        self.nri: NriPlugin | None = None
        self.nri_handlers: NriHandlers | None = None
        if config.nri is not None:
            self.nri_handlers = NriHandlers(lambda: self.plugins, self.node_context, states.pods, executor, layout,
                                            config.disabled_stages, rejects, self.decisions, self.answers,
                                            self.resized)
            self.nri = NriPlugin(config.nri, self.nri_handlers)
        self._server = None
        self._nri_started = False

    def node_context(self) -> NodeContext:
        node = self.states.node()
        annotations = dict(node.annotations) if node else {}
        kubelet = self._cpu_manager() if self._cpu_manager is not None else None
        return NodeContext(node_slo=self.states.node_slo(), node_annotations=annotations,
                           resctrl=self._resctrl, group_identity_supported=self._bvt,
                           online_cpus=self._online_cpus, memory_bytes=self._memory_bytes,
                           cpu_pools=self._cpu_pools(annotations, kubelet),
                           kubelet_cpu_policy=kubelet.policy if kubelet is not None else "",
                           be_cpu_manager=self.config.feature_gates.get("BECPUManager", False),
                           cpuset_allocator=self.config.feature_gates.get("CPUSetAllocator", False),
                           cpu_burst=self.config.feature_gates.get("CPUBurst", False),
                           be_cpu_suppress=self.config.feature_gates.get("BECPUSuppress", False),
                           be_psi_throttle=self._v2 and self.config.feature_gates.get("BEPSIThrottle", False),
                           rdma=self._rdma.get() if self._rdma is not None else None,
                           hami_core_library=self.config.hami_core_library,
                           keep_cpuset_pod_quota=self.config.disable_unset_cpu_quota)

    def _cpu_pools(self, annotations: dict[str, str], kubelet: CPUManagerState | None) -> CPUPools | None:
        """The node's CPU pools, computed again only when the pods, kubelet's state or the annotations change
        (hook calls are frequent; the pod list and the state are the same objects while unchanged)."""
        if not self._topology or kubelet is None:
            return None  # kubelet's exclusive CPUs unknown: no pool could be trusted to leave them out
        pods = self.states.pods()
        items = tuple(sorted(annotations.items()))
        cached = self._pools
        if cached is not None and cached[0][0] is pods and cached[0][1] is kubelet and cached[0][2] == items:
            return cached[1]
        pools = compute_cpu_pools(self._topology, pods, kubelet, annotations)
        self._pools = ((pods, kubelet, items), pools)  # the key held, so an unchanged list is recognised by identity
        return pools

    def resized(self, pod_uid: str, container_id: str = "", resources: LinuxResources | None = None) -> None:
        """kubelet resized a pod (UpdatePodSandboxResources, NRI's UpdatePodSandbox) or one of its containers
        (``resources``: what UpdateContainerResources set on ``container_id``). The container's new amounts go over
        the pod list at once (statesinformer/enacted.py: nothing puts the old limit back while kubelet's status
        lags); the states poll again a few seconds on, when kubelet's status has the enacted amounts; the
        reconciler passes now."""
        log.debug("pod %s resized (container %s): resync and reconcile", pod_uid, container_id or "-")
        if container_id and resources is not None:
            self.states.enacted.record(container_id, resources)
        self.states.request_resync(RESIZE_RESYNC_S)
        self.reconciler.trigger()

    def _forget_gone_pods(self) -> None:
        self.answers.retain(pod.uid for pod in self.states.pods())

    def _known_pod(self, uid: str) -> PodMeta | None:
        return next((p for p in self.states.pods() if p.uid == uid), None)

    def stages(self) -> list[str]:
        """The plugins' stages, and PostStopPodSandbox while pods may have resctrl groups (gate ``Resctrl``), in
        which the hook server removes them; less ``-runtime-hooks-disable-stages``."""
        stages = [s.value for s in registry.stages(self.config.feature_gates)]
        if self.config.feature_gates.get(resctrl_hook.PLUGIN.gate):
            stages.append(POST_STOP_POD_SANDBOX)
        return [stage for stage in stages if stage not in self.config.disabled_stages]

    def start_nri(self) -> None:
        """Register with the runtime's NRI now (idempotent): an NRI request carries the pod's labels and
        annotations, so the plugin answers before the states informer has the pod list (koordlet/agent/parts.py
        starts it before the sync wait)."""
        if self.nri is not None and not self._nri_started:
            self._nri_started = True
            self.nri.start()

    def stop_nri(self, timeout_s: float) -> bool:
        """Stop the NRI plugin (idempotent)."""
        if self.nri is None or self.nri_handlers is None or not self._nri_started:
            return True
        self._nri_started = False
        stopped = self.nri.stop(timeout_s)
        self.nri_handlers.close()
        return stopped

    def start(self) -> None:
        if self.config.serve_hooks:
            self._server = serve(self.service, self.config.socket_path)
            write_registration(self.config.config_dir, self.config.host_endpoint, self.config.failure_policy,
                               self.stages())
        self.start_nri()
        for kind in (CallbackKind.ALL_PODS, CallbackKind.NODE_SLO_SPEC, CallbackKind.NODE_METADATA):
            self.states.register_callback(kind, "runtimehooks-reconciler", self.reconciler.trigger)
        self.states.register_callback(CallbackKind.ALL_PODS, "runtimehooks-answers", self._forget_gone_pods)
        self.reconciler.start()
        log.info("runtime hooks: plugins %s, stages %s", [p.name for p in self.plugins], self.stages())

    def stop(self, timeout_s: float = 5.0) -> bool:
        """Within ``timeout_s`` in all: the NRI plugin a quarter, the hook server half of what is left, the
        reconciler the rest."""
        deadline = time.monotonic() + timeout_s
        stopped = self.stop_nri(timeout_s / 4)
        if self._server is not None:
            remove_registration(self.config.config_dir)
            server_s = max(deadline - time.monotonic(), 0.0) / 2
            self._server.stop(grace=min(server_s, 2.0)).wait(server_s)
            self._server = None
            remove_socket(self.config.socket_path)
        return self.reconciler.stop(max(deadline - time.monotonic(), 0.0)) and stopped
