"""One owner for the CFS quota of a pod or container dir (``cpu.cfs_quota_us`` / ``cpu.max``): the order in which
the parts that touch it win, in one place (docs/colocation.md "One owner for the CFS quota").

Five parts of koordlet touch the quota: the cpuset hook (``CPUSetAllocator``), batch resources
(``BatchResource``), CPU normalization (``CPUNormalization``), CPU burst (``CPUBurst``, a QoS strategy) and CPU
suppress (``BECPUSuppress``). Koordinator lets them write in turn, so two of them undo each other every few seconds
(its #2306: burst scales an LS container's quota, normalization's reconciler sets it back). Here each pod and
container dir has one owner, by :func:`quota_owner`, first match wins; each part that writes a pod's or a
container's quota (the cpuset hook, batch resources, normalization, burst) asks it before it writes, so the hook
plugins' answer does not hang on the order they run in:

1. :attr:`QuotaOwner.CPUSET` a pod the scheduler bound to a cpuset, a BE one too: unlimited (Koordinator #489: a
   quota would throttle it on its own CPUs), or kubelet's quota with ``-disable-unset-cpu-quota``;
2. :attr:`QuotaOwner.BATCH` a BE pod: its batch-cpu limit, normalized, or unlimited under CPU suppress's
   cfsQuota policy (the besteffort dir's quota, CPU suppress's, is the limit then; v1 refuses a child quota above
   its parent's);
3. :attr:`QuotaOwner.BURST` a running container CPU burst takes (not LSR, LSE, BE), with the gate on: burst moves it
   within [base, base × cfsQuotaBurstPercent/100] and resets it to the base, where the base is kubelet's limit
   normalized by the node's ratio (:func:`normalized_quota_us`): burst is a feedback loop nobody else can
   reproduce, normalization a fixed rule burst applies itself;
4. :attr:`QuotaOwner.NORMALIZATION` an LS or unlabelled pod's container on a node with a ratio > 1: kubelet's quota ÷
   ratio, at creation and update (the proxy, NRI), and in the reconciler where burst does not own it;
5. :attr:`QuotaOwner.KUBELET` the rest: kubelet's value, untouched.

At creation a container burst will own gets normalization's value, which is burst's base: the two agree.

The besteffort QoS dir's quota has its own owner (:func:`be_quota_owner`): CPU suppress under its ``cfsQuota`` policy,
where it is the BE pods' shared limit and BE pods' own quotas are unlimited (:func:`be_quota_suppressed`; cgroup v1
refuses a parent quota below a child's); else BE PSI throttle (gate ``BEPSIThrottle``, cgroup v2) while its NodeSLO
switch is on, stepping it by the LS pods' pressure; else CPU suppress, which keeps it unlimited. So a BE pod's own
quota needs the besteffort dir unlimited above it first: the runtime hooks' reconciler writes that −1 (suppress's own
value then) ahead of the pod's quota in one leveled update, rather than leaving the pod unlimited until suppress's
next tick and the reconciler's next pass; never while PSI throttle owns the dir (cgroup v2 takes a child quota above
its parent's).
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass

from koordlet.api.annotations import AnnotationError, parse_cpu_normalization_ratio, parse_resource_status
from koordlet.api.keys import ANNOTATION_NODE_CPU_NORMALIZATION_RATIO, ANNOTATION_RESOURCE_STATUS
from koordlet.api.nodeslo import CPU_SUPPRESS_POLICY_CFS_QUOTA, NodeSLOSpec
from koordlet.api.pod import PodMeta
from koordlet.api.qos import QoSClass
from wire.kernel_ranges import CFS_QUOTA_MIN_US


class QuotaOwner(enum.StrEnum):
    """Who sets a pod or container dir's CFS quota, in the order they win (module docstring)."""

    CPUSET = "cpuset"
    BATCH = "batchresource"
    BURST = "cpuburst"
    NORMALIZATION = "cpunormalization"
    KUBELET = "kubelet"


_BURST_INELIGIBLE = (QoSClass.LSR, QoSClass.LSE, QoSClass.BE)
_NORMALIZED = (QoSClass.LS, QoSClass.NONE)


@dataclass(frozen=True, slots=True)
class QuotaGates:
    """The feature gates of the quota's writers that decide ownership (the agent's flags)."""

    cpuset: bool = True  # CPUSetAllocator
    cpu_burst: bool = False  # CPUBurst
    normalization: bool = False  # CPUNormalization


def node_normalization_ratio(annotations: Mapping[str, str]) -> float | None:
    """The node's ``node.koordinator.sh/cpu-normalization-ratio`` when it is above 1, else None. Raises
    AnnotationError for a malformed value (a hook plugin reports it; a strategy treats it as no ratio)."""
    raw = annotations.get(ANNOTATION_NODE_CPU_NORMALIZATION_RATIO)
    ratio = parse_cpu_normalization_ratio(raw) if raw else None
    return ratio if ratio is not None and ratio > 1 else None


def normalized_quota_us(quota_us: int, ratio: float | None) -> int:
    """``ceil(quota / ratio)``, at least the kernel's 1000 µs; unlimited (≤ 0) and no ratio leave it as it is."""
    if quota_us <= 0 or ratio is None:
        return quota_us
    return max(CFS_QUOTA_MIN_US, math.ceil(quota_us / ratio))


def be_quota_suppressed(spec: NodeSLOSpec) -> bool:
    """CPU suppress limits the BE pods by the besteffort dir's quota (NodeSLO ``resourceUsedThresholdWithBE`` enabled
    with ``cpuSuppressPolicy: cfsQuota``): BE pods' own quotas are unlimited then (Koordinator's batchresource rule),
    and the besteffort dir's quota is unlimited otherwise (module docstring)."""
    threshold = spec.resource_used_threshold_with_be
    return threshold.enable and threshold.cpu_suppress_policy == CPU_SUPPRESS_POLICY_CFS_QUOTA


class BEQuotaOwner(enum.StrEnum):
    """Who sets the besteffort QoS dir's quota (module docstring)."""

    CPU_SUPPRESS = "BECPUSuppress"
    PSI_THROTTLE = "BEPSIThrottle"
    NOBODY = ""


def be_quota_owner(spec: NodeSLOSpec, *, suppress: bool, psi_throttle: bool) -> BEQuotaOwner:
    """The besteffort dir's quota owner, first match wins: CPU suppress under ``cfsQuota``; BE PSI throttle when it
    can run (``psi_throttle``: its gate on, on cgroup v2) and its NodeSLO switch is on; CPU suppress (unlimited);
    nobody (both gates off: left as it is)."""
    if suppress and be_quota_suppressed(spec):
        return BEQuotaOwner.CPU_SUPPRESS
    if psi_throttle and spec.be_psi_throttle_strategy.enable:
        return BEQuotaOwner.PSI_THROTTLE
    return BEQuotaOwner.CPU_SUPPRESS if suppress else BEQuotaOwner.NOBODY


def burst_eligible(pod: PodMeta) -> bool:
    """Running or pending, qosClass label not LSR, LSE or BE: a pod CPU burst takes (docs/koordinator.md §4.3)."""
    return pod.phase in ("Running", "Pending", "") and pod.qos_label not in _BURST_INELIGIBLE


def _bound(pod: PodMeta) -> bool:
    raw = pod.annotations.get(ANNOTATION_RESOURCE_STATUS)
    if not raw:
        return False
    try:
        return bool(parse_resource_status(raw).cpuset)
    except AnnotationError:
        return False


def quota_owner(pod: PodMeta, gates: QuotaGates, *, running: bool, ratio: float | None = None) -> QuotaOwner:
    """Who owns the quota of ``pod``'s containers (module docstring). ``running``: the container runs already (the
    reconciler, NRI's synchronize, CPU burst), not being created or updated by kubelet; ``ratio``: the node's
    normalization ratio (:func:`node_normalization_ratio`)."""
    if gates.cpuset and _bound(pod):
        return QuotaOwner.CPUSET
    if pod.qos_label is QoSClass.BE:
        return QuotaOwner.BATCH
    if running and gates.cpu_burst and burst_eligible(pod):
        return QuotaOwner.BURST
    if (gates.normalization and ratio is not None and pod.qos_label in _NORMALIZED
            and ANNOTATION_RESOURCE_STATUS not in pod.annotations):
        return QuotaOwner.NORMALIZATION
    return QuotaOwner.KUBELET


def burst_base_quota_us(pod: PodMeta, limit_quota_us: int, gates: QuotaGates, ratio: float | None) -> int:
    """The quota CPU burst scales from and resets to: kubelet's limit, normalized where normalization would own the
    container were burst off (an LS or unlabelled pod on a node with a ratio)."""
    after_burst = quota_owner(pod, QuotaGates(gates.cpuset, False, gates.normalization), running=True, ratio=ratio)
    return normalized_quota_us(limit_quota_us, ratio) if after_burst is QuotaOwner.NORMALIZATION else limit_quota_us
