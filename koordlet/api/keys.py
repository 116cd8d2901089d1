"""Label, annotation and extended-resource names of the Koordinator API (docs/koordinator.md §12, §3.3).

Every Koordinator key the node side reads or writes is spelled here once. The GPU names live in
``koordlet.api.device`` (their owner) and are re-exported below so that this module is the one index.
"""

from __future__ import annotations

from koordlet.api.device import (
    ANNOTATION_DEVICE_ALLOCATED,
    LABEL_GPU_ISOLATION_PROVIDER,
    RESOURCE_GPU_CORE,
    RESOURCE_GPU_MEMORY,
    RESOURCE_GPU_MEMORY_RATIO,
    RESOURCE_GPU_SHARED,
    RESOURCE_KOORD_GPU,
    RESOURCE_NVIDIA_GPU,
)

DOMAIN = "koordinator.sh"
NODE_DOMAIN = "node.koordinator.sh"
SCHEDULING_DOMAIN = "scheduling.koordinator.sh"

# ---------------------------------------------------------------------------------------------- pod labels
LABEL_QOS_CLASS = "koordinator.sh/qosClass"
LABEL_PRIORITY_CLASS = "koordinator.sh/priority-class"
LABEL_SUB_PRIORITY = "koordinator.sh/priority"
LABEL_EVICTION_ENABLED = "koordinator.sh/eviction-enabled"
LABEL_CORE_SCHED_GROUP_ID = "koordinator.sh/core-sched-group-id"
LABEL_CORE_SCHED_POLICY = "koordinator.sh/core-sched-policy"
# A pod carrying this label with value "true" bypasses every runtime hook (a label, not an annotation;
# docs/koordinator.md §2.1).
LABEL_SKIP_HOOKSERVER = "runtimeproxy.koordinator.sh/skip-hookserver"
SKIP_HOOKSERVER_VALUE = "true"

# ----------------------------------------------------------------------------------------- pod annotations
ANNOTATION_EXTENDED_RESOURCE_SPEC = "node.koordinator.sh/extended-resource-spec"
ANNOTATION_RESOURCE_STATUS = "scheduling.koordinator.sh/resource-status"
ANNOTATION_CPU_QOS = "koordinator.sh/cpuQOS"
ANNOTATION_MEMORY_QOS = "koordinator.sh/memoryQOS"
ANNOTATION_CPU_BURST = "koordinator.sh/cpuBurst"
ANNOTATION_BLKIO_QOS = "koordinator.sh/blkioQOS"
ANNOTATION_NETWORK_QOS = "koordinator.sh/networkQOS"
ANNOTATION_RESCTRL = "node.koordinator.sh/resctrl"
ANNOTATION_EVICTION_POLICY = "koordinator.sh/eviction-policy"
ANNOTATION_EVICTION_PRIORITY = "koordinator.sh/eviction-priority"
ANNOTATION_OOM_SCORE_ADJ = "koordinator.sh/oom-score-adj"
ANNOTATION_OOM_SCORE_ADJ_SPEC = "koordinator.sh/oom-score-adj-spec"
# Set by dockershim-era runtimes; its presence tells the container id prefix is docker:// (docs/koordinator.md §3.2).
ANNOTATION_DOCKER_TYPE = "io.kubernetes.docker.type"

# ---------------------------------------------------------------------------------------- node annotations
ANNOTATION_NODE_CPU_NORMALIZATION_RATIO = "node.koordinator.sh/cpu-normalization-ratio"
ANNOTATION_NODE_CPU_NORMALIZATION_ENABLED = "node.koordinator.sh/cpu-normalization-enabled"
ANNOTATION_NODE_RESERVATION = "node.koordinator.sh/reservation"
ANNOTATION_NODE_SYSTEM_QOS_RESOURCE = "node.koordinator.sh/system-qos-resource"
ANNOTATION_NODE_CPU_RECLAIM_RATIO = "node.koordinator.sh/cpu-reclaim-ratio"
ANNOTATION_NODE_MEMORY_RECLAIM_RATIO = "node.koordinator.sh/memory-reclaim-ratio"
# NodeResourceTopology annotations koordlet writes (docs/koordinator.md §5.5).
ANNOTATION_NRT_CPU_BASIC_INFO = "node.koordinator.sh/cpu-basic-info"
ANNOTATION_NRT_CPU_TOPOLOGY = "node.koordinator.sh/cpu-topology"
ANNOTATION_NRT_CPU_SHARED_POOLS = "node.koordinator.sh/cpu-shared-pools"
ANNOTATION_NRT_BE_CPU_SHARED_POOLS = "node.koordinator.sh/be-cpu-shared-pools"
ANNOTATION_NRT_KUBELET_CPU_MANAGER_POLICY = "kubelet.koordinator.sh/cpu-manager-policy"
ANNOTATION_NRT_POD_CPU_ALLOCS = "node.koordinator.sh/pod-cpu-allocs"

# ------------------------------------------------------------------------------------- extended resources
RESOURCE_CPU = "cpu"
RESOURCE_MEMORY = "memory"
# Batch resources: batch-cpu is an integer count of milli-cores ("1000" = 1 core), batch-memory bytes.
RESOURCE_BATCH_CPU = "kubernetes.io/batch-cpu"
RESOURCE_BATCH_MEMORY = "kubernetes.io/batch-memory"
RESOURCE_MID_CPU = "kubernetes.io/mid-cpu"
RESOURCE_MID_MEMORY = "kubernetes.io/mid-memory"
# Deprecated spellings still written by old webhooks; read them as aliases of the current names.
RESOURCE_DEPRECATED_BATCH_CPU = "koordinator.sh/batch-cpu"
RESOURCE_DEPRECATED_BATCH_MEMORY = "koordinator.sh/batch-memory"
RESOURCE_RDMA = "koordinator.sh/rdma"
RESOURCE_FPGA = "koordinator.sh/fpga"
# Deprecated GPU aliases (docs/koordinator.md §12: "deprecated kubernetes.io/gpu… aliases").
RESOURCE_DEPRECATED_GPU = "kubernetes.io/gpu"
RESOURCE_DEPRECATED_GPU_CORE = "kubernetes.io/gpu-core"
RESOURCE_DEPRECATED_GPU_MEMORY = "kubernetes.io/gpu-memory"
RESOURCE_DEPRECATED_GPU_MEMORY_RATIO = "kubernetes.io/gpu-memory-ratio"

_RESOURCE_ALIASES = {
    RESOURCE_DEPRECATED_BATCH_CPU: RESOURCE_BATCH_CPU,
    RESOURCE_DEPRECATED_BATCH_MEMORY: RESOURCE_BATCH_MEMORY,
    RESOURCE_DEPRECATED_GPU: RESOURCE_KOORD_GPU,
    RESOURCE_DEPRECATED_GPU_CORE: RESOURCE_GPU_CORE,
    RESOURCE_DEPRECATED_GPU_MEMORY: RESOURCE_GPU_MEMORY,
    RESOURCE_DEPRECATED_GPU_MEMORY_RATIO: RESOURCE_GPU_MEMORY_RATIO,
}


def canonical_resource_name(name: str) -> str:
    """The current name of a resource: deprecated aliases map to their replacement, others unchanged."""
    return _RESOURCE_ALIASES.get(name, name)


__all__ = [
    "ANNOTATION_BLKIO_QOS",
    "ANNOTATION_CPU_BURST",
    "ANNOTATION_CPU_QOS",
    "ANNOTATION_DEVICE_ALLOCATED",
    "ANNOTATION_DOCKER_TYPE",
    "ANNOTATION_EVICTION_POLICY",
    "ANNOTATION_EVICTION_PRIORITY",
    "ANNOTATION_EXTENDED_RESOURCE_SPEC",
    "ANNOTATION_MEMORY_QOS",
    "ANNOTATION_NETWORK_QOS",
    "ANNOTATION_NODE_CPU_NORMALIZATION_ENABLED",
    "ANNOTATION_NODE_CPU_NORMALIZATION_RATIO",
    "ANNOTATION_NODE_CPU_RECLAIM_RATIO",
    "ANNOTATION_NODE_MEMORY_RECLAIM_RATIO",
    "ANNOTATION_NODE_RESERVATION",
    "ANNOTATION_NODE_SYSTEM_QOS_RESOURCE",
    "ANNOTATION_NRT_BE_CPU_SHARED_POOLS",
    "ANNOTATION_NRT_CPU_BASIC_INFO",
    "ANNOTATION_NRT_CPU_SHARED_POOLS",
    "ANNOTATION_NRT_CPU_TOPOLOGY",
    "ANNOTATION_NRT_KUBELET_CPU_MANAGER_POLICY",
    "ANNOTATION_NRT_POD_CPU_ALLOCS",
    "ANNOTATION_OOM_SCORE_ADJ",
    "ANNOTATION_OOM_SCORE_ADJ_SPEC",
    "ANNOTATION_RESCTRL",
    "ANNOTATION_RESOURCE_STATUS",
    "DOMAIN",
    "LABEL_CORE_SCHED_GROUP_ID",
    "LABEL_CORE_SCHED_POLICY",
    "LABEL_EVICTION_ENABLED",
    "LABEL_GPU_ISOLATION_PROVIDER",
    "LABEL_PRIORITY_CLASS",
    "LABEL_QOS_CLASS",
    "LABEL_SKIP_HOOKSERVER",
    "LABEL_SUB_PRIORITY",
    "NODE_DOMAIN",
    "RESOURCE_BATCH_CPU",
    "RESOURCE_BATCH_MEMORY",
    "RESOURCE_CPU",
    "RESOURCE_DEPRECATED_BATCH_CPU",
    "RESOURCE_DEPRECATED_BATCH_MEMORY",
    "RESOURCE_DEPRECATED_GPU",
    "RESOURCE_DEPRECATED_GPU_CORE",
    "RESOURCE_DEPRECATED_GPU_MEMORY",
    "RESOURCE_DEPRECATED_GPU_MEMORY_RATIO",
    "RESOURCE_FPGA",
    "RESOURCE_GPU_CORE",
    "RESOURCE_GPU_MEMORY",
    "RESOURCE_GPU_MEMORY_RATIO",
    "RESOURCE_GPU_SHARED",
    "RESOURCE_KOORD_GPU",
    "RESOURCE_MEMORY",
    "RESOURCE_MID_CPU",
    "RESOURCE_MID_MEMORY",
    "RESOURCE_NVIDIA_GPU",
    "RESOURCE_RDMA",
    "SCHEDULING_DOMAIN",
    "SKIP_HOOKSERVER_VALUE",
    "canonical_resource_name",
]
