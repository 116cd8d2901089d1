"""QoS classes, Kubernetes QoS and priority classes, and how a pod maps to them (docs/koordinator.md §12).

Two QoS notions meet on a node: Koordinator's (label ``koordinator.sh/qosClass``: LSE, LSR, LS, BE, SYSTEM)
and Kubernetes' (Guaranteed, Burstable, BestEffort; visible in the pod's cgroup parent). Some Koordinator
code paths look at the raw label only (cpuset, batchresource, suppress filters, burst eligibility):
use :func:`qos_class_from_labels` there. Memory QoS, resctrl and NodeMetric fall back to the kube QoS
when the label is absent: use :func:`qos_class_for_pod` there.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass

from koordlet.api.keys import (
    LABEL_PRIORITY_CLASS,
    LABEL_QOS_CLASS,
    LABEL_SKIP_HOOKSERVER,
    SKIP_HOOKSERVER_VALUE,
)


class QoSClass(enum.StrEnum):
    """Koordinator QoS class. NONE is a pod without (or with an unknown) qosClass label."""

    LSE = "LSE"
    LSR = "LSR"
    LS = "LS"
    BE = "BE"
    SYSTEM = "SYSTEM"
    NONE = ""


class KubeQoS(enum.StrEnum):
    """Kubernetes QoS class (``status.qosClass``)."""

    GUARANTEED = "Guaranteed"
    BURSTABLE = "Burstable"
    BESTEFFORT = "BestEffort"


class PriorityClass(enum.StrEnum):
    PROD = "koord-prod"
    MID = "koord-mid"
    BATCH = "koord-batch"
    FREE = "koord-free"
    NONE = ""


@dataclass(frozen=True, slots=True)
class PriorityRange:
    """Inclusive priority range of a Koordinator priority class and the value used when none is given."""

    low: int
    high: int
    default: int

    def __contains__(self, priority: object) -> bool:
        return isinstance(priority, int) and self.low <= priority <= self.high


PRIORITY_RANGES: Mapping[PriorityClass, PriorityRange] = {
    PriorityClass.PROD: PriorityRange(9000, 9999, 9500),
    PriorityClass.MID: PriorityRange(7000, 7999, 7500),
    PriorityClass.BATCH: PriorityRange(5000, 5999, 5500),
    PriorityClass.FREE: PriorityRange(3000, 3999, 3500),
}

# docs/koordinator.md §12: when the label is absent, Guaranteed pods are treated as LSR (QoSClassForGuaranteed).
_QOS_FOR_KUBE_QOS = {
    KubeQoS.GUARANTEED: QoSClass.LSR,
    KubeQoS.BURSTABLE: QoSClass.LS,
    KubeQoS.BESTEFFORT: QoSClass.BE,
}


# A dict lookup, not QoSClass(value): the strategies ask for every pod's label several times a second.
_QOS_CLASS_OF_LABEL: Mapping[str, QoSClass] = {qos.value: qos for qos in QoSClass}


def qos_class_from_labels(labels: Mapping[str, str]) -> QoSClass:
    """The raw ``koordinator.sh/qosClass`` label; missing or unknown values are NONE."""
    return _QOS_CLASS_OF_LABEL.get(labels.get(LABEL_QOS_CLASS, ""), QoSClass.NONE)


def qos_class_for_pod(labels: Mapping[str, str], kube_qos: KubeQoS | None) -> QoSClass:
    """The label when set, else derived from kube QoS: Guaranteed→LSR, Burstable→LS, BestEffort→BE."""
    qos = qos_class_from_labels(labels)
    if qos is not QoSClass.NONE or kube_qos is None:
        return qos
    return _QOS_FOR_KUBE_QOS[kube_qos]


def kube_qos_from_cgroup_parent(cgroup_parent: str) -> KubeQoS:
    """Kube QoS from a CRI cgroup parent or cgroup dir, by substring as koordlet does (docs/koordinator.md §2.6).

    Works for both drivers: ``/kubepods/besteffort/pod…`` and ``kubepods-besteffort-pod….slice``;
    a path naming neither ``besteffort`` nor ``burstable`` is Guaranteed.
    """
    lowered = cgroup_parent.lower()
    if "besteffort" in lowered:
        return KubeQoS.BESTEFFORT
    if "burstable" in lowered:
        return KubeQoS.BURSTABLE
    return KubeQoS.GUARANTEED


def parse_kube_qos(value: str) -> KubeQoS | None:
    """A ``status.qosClass`` string as KubeQoS; empty or unknown → None."""
    try:
        return KubeQoS(value)
    except ValueError:
        return None


def priority_class_from_priority(priority: int | None) -> PriorityClass:
    """The priority class whose range holds ``priority`` (``spec.priority``); NONE when outside all ranges."""
    for priority_class, priority_range in PRIORITY_RANGES.items():
        if priority in priority_range:
            return priority_class
    return PriorityClass.NONE


def priority_class_for_pod(
    labels: Mapping[str, str], priority: int | None, qos: QoSClass = QoSClass.NONE
) -> PriorityClass:
    """Label ``koordinator.sh/priority-class``, else ``spec.priority``, else derived from QoS (docs/koordinator.md §12).

    QoS derivation: SYSTEM/LSE/LSR/LS → prod, BE → batch, none → NONE.
    """
    try:
        labelled = PriorityClass(labels.get(LABEL_PRIORITY_CLASS, ""))
    except ValueError:
        labelled = PriorityClass.NONE
    if labelled is not PriorityClass.NONE:
        return labelled
    from_priority = priority_class_from_priority(priority)
    if from_priority is not PriorityClass.NONE:
        return from_priority
    if qos is QoSClass.BE:
        return PriorityClass.BATCH
    if qos is QoSClass.NONE:
        return PriorityClass.NONE
    return PriorityClass.PROD


def skips_hooks(labels: Mapping[str, str]) -> bool:
    """True when the pod opts out of runtime hooks (label value exactly "true", docs/koordinator.md §2.1, §15.5)."""
    return labels.get(LABEL_SKIP_HOOKSERVER) == SKIP_HOOKSERVER_VALUE
