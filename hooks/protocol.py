"""What plugins see and what they answer (docs/koordinator.md §3.2)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace

from koordlet.api.cpupools import CPUPools
from koordlet.api.nodeslo import NodeSLOSpec, default_node_slo_spec
from koordlet.api.pod import PodMeta
from koordlet.api.units import CFS_PERIOD_US
from wire.kernel_ranges import CFS_QUOTA_MIN_US, CPU_SHARES_MAX, CPU_SHARES_MIN


def shares_from_milli(milli_cpu: int) -> int:
    """cpu.shares for a CPU request (docs/koordinator.md §3.2): max(2, min(262144, milli × 1024 / 1000)); ≤ 0 → 2."""
    if milli_cpu <= 0:
        return CPU_SHARES_MIN
    return max(CPU_SHARES_MIN, min(CPU_SHARES_MAX, milli_cpu * 1024 // 1000))


def quota_from_milli(milli_cpu: int) -> int:
    """cfs_quota_us for a CPU limit (docs/koordinator.md §3.2).

    milli × 100000 / 1000; ≤ 0 → −1 (unlimited); < 1000 → 1000."""
    if milli_cpu <= 0:
        return -1
    return max(CFS_QUOTA_MIN_US, milli_cpu * CFS_PERIOD_US // 1000)


def memory_limit(bytes_: int) -> int:
    """memory.limit_in_bytes for a memory limit (docs/koordinator.md §3.2): ≤ 0 → −1 (unlimited)."""
    return bytes_ if bytes_ > 0 else -1


@dataclass(frozen=True, slots=True)
class ResctrlNode:
    """What the node's resctrl fs offers (read by koordlet, not by plugins): None in NodeContext = no RDT."""

    cbm_mask: int
    cache_ids: tuple[int, ...]
    has_mb: bool = True
    vendor: str = "intel"


@dataclass(frozen=True, slots=True)
class LinuxDevice:
    """A device node a container is to get (NRI's LinuxDevice; the proxy adds it to CreateContainer's devices):
    ``path`` on the host and in the container, ``type`` ``c``/``b``, its numbers and the node's file mode."""

    path: str
    type: str
    major: int
    minor: int
    file_mode: int = 0o666


@dataclass(frozen=True, slots=True)
class Mount:
    """A bind mount a container is to get: ``source`` on the host at ``destination`` in the container."""

    destination: str
    source: str
    type: str = "bind"
    options: tuple[str, ...] = ("rbind",)
    readonly: bool = False


@dataclass(frozen=True, slots=True)
class RDMANode:
    """The node's RDMA device nodes (read by koordlet, not by plugins): ``rdma_cm`` (None when missing) and the
    ``uverbs`` node of each RDMA PCI function by bus id."""

    rdma_cm: LinuxDevice | None = None
    uverbs: Mapping[str, LinuxDevice] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class NodeContext:
    """Node-wide inputs of the rules."""

    node_slo: NodeSLOSpec = field(default_factory=default_node_slo_spec)
    node_annotations: Mapping[str, str] = field(default_factory=dict)
    resctrl: ResctrlNode | None = None
    group_identity_supported: bool = True  # the kernel has cpu.bvt_warp_ns (Anolis); koordlet checks once
    # What the node has, for the value check (hooks/validate.py); empty / 0 = not known, not checked.
    online_cpus: frozenset[int] = frozenset()
    memory_bytes: int = 0
    # The node's CPU pools (koordlet.api.cpupools, what the NodeResourceTopology reports) and kubelet's CPU
    # manager policy; None / "" = unknown (the cpuset hook then leaves LS cpusets as kubelet gave them).
    cpu_pools: CPUPools | None = None
    kubelet_cpu_policy: str = ""
    be_cpu_manager: bool = False  # gate BECPUManager: allocated BE pods get their NUMA nodes' BE shared pools
    cpuset_allocator: bool = True  # gate CPUSetAllocator: the cpuset hook owns bound pods' quotas (api/cfsquota.py)
    cpu_burst: bool = False  # gate CPUBurst: the burst strategy owns running LS containers' quotas (api/cfsquota.py)
    be_cpu_suppress: bool = False  # gate BECPUSuppress: CPU suppress owns the besteffort dir's quota (api/cfsquota.py)
    be_psi_throttle: bool = False  # gate BEPSIThrottle on a cgroup v2 node: it may own that quota (api/cfsquota.py)
    rdma: RDMANode | None = None  # gate RDMADeviceInject: the node's RDMA device nodes
    hami_core_library: str = "/usr/local/vgpu/libvgpu.so"  # -hami-core-library-directory-path
    keep_cpuset_pod_quota: bool = False  # -disable-unset-cpu-quota: a pod bound to CPUs keeps its CFS quota


@dataclass(frozen=True, slots=True)
class ContainerResources:
    """The container's current Linux resources as the runtime request carries them (0 = unset)."""

    cpu_shares: int = 0
    cfs_quota_us: int = 0
    cpuset_cpus: str = ""
    memory_limit_bytes: int = 0


@dataclass(frozen=True, slots=True)
class PodContext:
    pod: PodMeta


@dataclass(frozen=True, slots=True)
class ContainerContext:
    pod: PodMeta
    name: str
    container_id: str = ""
    resources: ContainerResources = field(default_factory=ContainerResources)
    envs: Mapping[str, str] = field(default_factory=dict)
    # The container runs already (the reconciler, NRI's synchronize), rather than kubelet creating or updating it
    # (the proxy's and NRI's hook calls): a quota someone else owns then (koordlet/api/cfsquota.py) is left alone.
    running: bool = False


@dataclass(frozen=True, slots=True)
class Changes:
    """Settings a plugin wants; None (or empty) = no opinion. Later plugins win per field."""

    cpu_shares: int | None = None
    cfs_quota_us: int | None = None
    cpuset_cpus: str | None = None  # "" clears the cpuset (BE containers follow their parent)
    memory_limit_bytes: int | None = None
    bvt_warp_ns: int | None = None
    cpu_idle: int | None = None  # SCHED_IDLE group: 1 or 0 (cgroup v2 and v1 kernels >= 5.15)
    envs: Mapping[str, str] = field(default_factory=dict)
    resctrl_group: str | None = None
    resctrl_schemata: str | None = None
    # every process of the container (reconciler only; docs/koordinator.md §3.3 OOMScoreAdj)
    oom_score_adj: int | None = None
    # Added to a container at creation only (the proxy's CreateContainer, NRI's adjustment); a later plugin's
    # entry for the same path replaces an earlier one.
    devices: tuple[LinuxDevice, ...] = ()
    mounts: tuple[Mount, ...] = ()
    # Host directories the container's mounts need (made by koordlet before the answer goes out, mode 0777:
    # HAMi-core's per-container cache dir, gate HamiCoreVGPUMonitor).
    host_dirs: tuple[str, ...] = ()

    def merged(self, later: Changes) -> Changes:
        updates = {}
        for f in fields(self):
            value = getattr(later, f.name)
            if f.name == "envs":
                if value:
                    updates["envs"] = {**self.envs, **value}
            elif f.name in _LISTS:
                if value:
                    updates[f.name] = _merge_list(getattr(self, f.name), value)
            elif value is not None:
                updates[f.name] = value
        return replace(self, **updates) if updates else self

    def __bool__(self) -> bool:
        return any(getattr(self, f.name) not in (None, {}, ()) for f in fields(self))


_LISTS = frozenset({"devices", "mounts", "host_dirs"})


def _merge_list(earlier: tuple, later: tuple) -> tuple:
    """``earlier`` then ``later``, an entry of ``later`` replacing one of ``earlier`` for the same path."""
    def key(item: object) -> object:
        return getattr(item, "path", None) or getattr(item, "destination", None) or item

    replaced = {key(item) for item in later}
    return tuple(item for item in earlier if key(item) not in replaced) + tuple(later)


NO_CHANGES = Changes()
