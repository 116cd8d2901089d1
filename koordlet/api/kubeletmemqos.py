"""kubelet's own memory QoS (KEP-2570) and who writes each memory QoS file: kubelet or koordlet (docs/colocation.md
"One owner for memory.min, memory.low and memory.high").

kubelet's ``MemoryQoS`` feature (Alpha from 1.22, Beta and on by default in 1.37) writes the same cgroup v2 files as
Koordinator's memory QoS (koordlet/qosmanager/memoryqos.py). What it writes depends on its KubeletConfiguration
(kubelet's pkg/kubelet/cm qos_container_manager_linux.go setMemoryQoS, kuberuntime_container_linux.go):

- ``memoryThrottlingFactor`` set (1.37: no default; 1.27-1.36: 0.9 by default): ``memory.high`` on the containers
  of Burstable and BestEffort pods, ``floor((request + factor × (limit or node allocatable − request)) / page) ×
  page``, through the CRI at creation and resize. Never on Guaranteed pods, never on pod or QoS dirs;
- ``memoryReservationPolicy: TieredReservation`` (1.36+; default ``None``, nothing): ``memory.min`` = the request on
  Guaranteed containers and pods (the pod: the sum of its containers'), ``memory.low`` likewise on Burstable ones;
  the kubepods dir's ``memory.min`` = the Guaranteed and Burstable requests together, the burstable dir's
  ``memory.low`` = the Burstable ones (its periodic QoS update, every minute and at each pod change);
- before 1.36 (no ``memoryReservationPolicy``; :data:`LEGACY`): ``memory.min`` = the request on the containers and
  pods of Guaranteed and Burstable pods, the burstable dir's ``memory.min`` its pods' sum, the kubepods dir's the
  Guaranteed and Burstable sum.

A file kubelet writes at a level and kube QoS class is kubelet's (:func:`kubelet_writes`): koordlet does not write
it, and counts kubelet's value (:func:`kubelet_value`) where it sums children into a parent. Every other file stays
koordlet's. BestEffort pods (Koordinator's BE pods) get no protection from kubelet, so their ``memory.min``/``low``
and the besteffort dir's are always koordlet's.

:func:`from_kubelet_config` reads a KubeletConfiguration (the file, or kubelet's ``/configz``) with the kubelet's
version (the Node's ``status.nodeInfo.kubeletVersion``) for the defaults a config does not spell out.
"""

from __future__ import annotations

import enum
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass

from koordlet.api.qos import KubeQoS

FEATURE_GATE = "MemoryQoS"
NONE, TIERED, LEGACY = "None", "TieredReservation", "Legacy"  # LEGACY: kubelet < 1.36, memory.min on every class
MEMORY_MIN, MEMORY_LOW, MEMORY_HIGH = "memory.min", "memory.low", "memory.high"


class Level(enum.StrEnum):
    """Where a memory QoS file is: a container's dir, a pod's, or a QoS dir (Guaranteed's is kubepods itself)."""

    CONTAINER = "container"
    POD = "pod"
    QOS = "qos"


class KubeletConfigError(ValueError):
    """A KubeletConfiguration whose memory QoS fields cannot be read."""


@dataclass(frozen=True, slots=True)
class KubeletMemoryQoS:
    """What kubelet's memory QoS writes on this node. The default: nothing (its gate off, or not known)."""

    enabled: bool = False  # kubelet's MemoryQoS gate
    throttling_factor: float | None = None  # memoryThrottlingFactor in effect; None: kubelet writes no memory.high
    reservation: str = NONE  # memoryReservationPolicy in effect (LEGACY before 1.36)
    source: str = ""  # where it was learnt, for the log

    def describe(self) -> str:
        if not self.enabled:
            return f"kubelet's memory QoS is off ({self.source or 'no kubelet config read'})"
        high = f"memory.high at factor {self.throttling_factor:g}" if self.throttling_factor is not None else \
            "no memory.high"
        return f"kubelet's memory QoS is on: {high}, reservation {self.reservation} ({self.source})"


def kubelet_writes(file: str, level: Level, kube_qos: KubeQoS, kubelet: KubeletMemoryQoS) -> bool:
    """Whether kubelet writes ``file`` at ``level`` for ``kube_qos`` (a QoS dir: the class whose dir it is)."""
    if not kubelet.enabled:
        return False
    if file == MEMORY_HIGH:
        return (kubelet.throttling_factor is not None and level is Level.CONTAINER
                and kube_qos in (KubeQoS.BURSTABLE, KubeQoS.BESTEFFORT))
    if kubelet.reservation == TIERED:
        protected = {MEMORY_MIN: KubeQoS.GUARANTEED, MEMORY_LOW: KubeQoS.BURSTABLE}.get(file)
        if level is Level.QOS and file == MEMORY_MIN:
            # the kubepods dir (Guaranteed's QoS dir) covers both classes' protection with memory.min
            return kube_qos is KubeQoS.GUARANTEED
        return protected is not None and kube_qos is protected
    if kubelet.reservation == LEGACY:
        return file == MEMORY_MIN and kube_qos in (KubeQoS.GUARANTEED, KubeQoS.BURSTABLE)
    return False


def kubelet_value(file: str, level: Level, kube_qos: KubeQoS, request_bytes: int, kubelet: KubeletMemoryQoS) -> int:
    """The protection kubelet gives a dir whose file it writes (:func:`kubelet_writes`), for a parent's sum: the
    request (a QoS dir: the requests of the pods under it that count), 0 where kubelet writes nothing."""
    return request_bytes if kubelet_writes(file, level, kube_qos, kubelet) else 0


_VERSION = re.compile(r"^v?(\d+)\.(\d+)")


def minor_version(kubelet_version: str) -> int | None:
    """The minor version of a 1.x kubelet (``v1.37.2`` → 37); None when unknown."""
    match = _VERSION.match(kubelet_version or "")
    if match is None or match.group(1) != "1":
        return None
    return int(match.group(2))


def from_kubelet_config(doc: Mapping[str, object], kubelet_version: str = "", source: str = "") -> KubeletMemoryQoS:
    """kubelet's memory QoS from its KubeletConfiguration ``doc`` (a file, or ``/configz``'s ``kubeletconfig``).

    The gate: ``featureGates.MemoryQoS``, else the kubelet's default (on from 1.37; off before, and when the version
    is not known: a config that does not name the gate of a kubelet of unknown age is taken as off, as every
    kubelet before 1.37 has it). The factor: ``memoryThrottlingFactor``, else 0.9 on 1.27-1.36 (none from 1.37, and
    when the version is not known). The reservation: ``memoryReservationPolicy``, else :data:`LEGACY` before 1.36
    and :data:`NONE` from 1.36 (and when not known). Raises KubeletConfigError for a field of the wrong type."""
    minor = minor_version(kubelet_version)
    gates = doc.get("featureGates") or {}
    if not isinstance(gates, Mapping):
        raise KubeletConfigError(f"featureGates: expected a map, got {type(gates).__name__}")
    gate = gates.get(FEATURE_GATE)
    if gate is None:
        enabled = minor is not None and minor >= 37
    elif isinstance(gate, bool):
        enabled = gate
    else:
        raise KubeletConfigError(f"featureGates.{FEATURE_GATE}: expected true or false, got {gate!r}")
    factor = doc.get("memoryThrottlingFactor")
    if factor is None:
        factor = 0.9 if minor is not None and 27 <= minor < 37 else None
    elif isinstance(factor, bool) or not isinstance(factor, int | float) or not 0 < factor <= 1 or math.isnan(factor):
        raise KubeletConfigError(f"memoryThrottlingFactor: expected a number in (0, 1], got {factor!r}")
    policy = doc.get("memoryReservationPolicy")
    if policy is None:
        policy = LEGACY if minor is not None and minor < 36 else NONE
    elif policy not in (NONE, TIERED):
        raise KubeletConfigError(f"memoryReservationPolicy: expected {NONE} or {TIERED}, got {policy!r}")
    where = source + (f", kubelet {kubelet_version}" if kubelet_version else ", kubelet version not known")
    return KubeletMemoryQoS(enabled, float(factor) if factor is not None else None, str(policy), where)
