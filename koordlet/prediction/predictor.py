"""Prod reclaimable and prod peak (docs/koordinator.md §5.3; Koordinator pkg/koordlet/prediction
peak_predictor.go): what NodeMetric's ``prodReclaimableMetric`` and ``prodPeakMetric`` carry, from which
koord-manager computes the Mid-tier resources.

Two predictors, over the pods NodeMetric reports (the pods with usage samples), both for pods of priority class
koord-prod or none; the result is their minimum and the peak their maximum, per resource (cpu in milli-cores,
memory in bytes). ``margin`` = 1 + safety margin% (default 10), products truncated to integers.

- per pod: a pod created within the cold start (24 h) is not predicted: its request counts into the peak as it
  is. Otherwise (unless it is terminating or done) its model's p95 CPU and p98 memory × margin are its peak; what
  its request exceeds the peak by is reclaimable (never negative per pod). A pod without a model counts like a
  cold-start pod. reclaimable = min(Σ reclaimable, allocatable − Σ peak (≥ 0)); peak = Σ peak + Σ unpredicted.
- per priority class: peak = (p95/p98 of ``sys`` + of each prod/none class item) × margin; reclaimable =
  min(max(Σ requests − peak, 0), allocatable − peak (≥ 0)).

Allocatable is the node annotation ``node.koordinator.sh/raw-allocatable`` (a resource list) when it reads,
else the node's allocatable. Requests: the larger of Σ regular containers and the largest init container.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

from koordlet.api.pod import PodMeta, aggregate_request
from koordlet.api.qos import PriorityClass
from koordlet.api.quantity import QuantityError, parse_resource_quantity
from koordlet.prediction.server import SYSTEM_ITEM, Prediction, node_item_uid
from koordlet.statesinformer.api import NodeInfo

logger = logging.getLogger(__name__)

ANNOTATION_NODE_RAW_ALLOCATABLE = "node.koordinator.sh/raw-allocatable"
CPU, MEMORY = "cpu", "memory"
_RECLAIMABLE_CLASSES = (PriorityClass.PROD, PriorityClass.NONE)
_TERMINAL_PHASES = ("Succeeded", "Failed")

Predictions = Callable[[str], Prediction | None]


class PredictionUnavailable(ValueError):
    """The prediction cannot be made (no node, no ``sys`` model yet)."""


Amounts = Mapping[str, int]
# Koordinator's predictor names (the ``predictor`` label of koordlet_node_predicted_resource_*).
POD_PREDICTOR, PRIORITY_PREDICTOR, MIN_PREDICTOR = "podReclaimablePredictor", "priorityReclaimablePredictor", \
    "minPredictor"


@dataclass(frozen=True, slots=True)
class ProdPrediction:
    """``cpu`` (milli-cores) and ``memory`` (bytes) of each; None when it cannot be computed (and why).
    ``by_predictor``: each predictor's (reclaimable, peak), None where that one could not say."""

    reclaimable: Amounts | None
    peak: Amounts | None
    problem: str = ""
    by_predictor: Mapping[str, tuple[Amounts | None, Amounts | None]] = field(default_factory=dict)


def pod_request(pod: PodMeta, resource: str) -> int:
    """The pod's request of ``resource``: its pod-level request, else the larger of Σ regular containers and the
    largest init container (koordlet.api.pod.aggregate_request)."""
    return aggregate_request(pod, resource)


def node_allocatable(node: NodeInfo) -> dict[str, int]:
    """``node.koordinator.sh/raw-allocatable`` when it reads as a resource list, else the node's allocatable."""
    raw = node.annotations.get(ANNOTATION_NODE_RAW_ALLOCATABLE)
    if raw:
        try:
            data = json.loads(raw)
            if isinstance(data, dict):
                return {str(k): parse_resource_quantity(str(k), v) for k, v in data.items()
                        if isinstance(v, str | int) and not isinstance(v, bool)}
        except (ValueError, QuantityError) as err:
            logger.debug("node %s: %s unreadable (%s); using its allocatable", node.name,
                         ANNOTATION_NODE_RAW_ALLOCATABLE, err)
    return {k: int(v) for k, v in node.allocatable.items()}


def _margin(value: int, margin_percent: int) -> int:
    """Koordinator's MultiplyMilliQuant/MultiplyQuant: int64(float64(value) × ratio), ratio = (100 + m) / 100."""
    return int(value * ((100 + margin_percent) / 100))


def _zero() -> dict[str, int]:
    return {CPU: 0, MEMORY: 0}


def _subtract_non_negative(a: Mapping[str, int], b: Mapping[str, int]) -> dict[str, int]:
    return {k: max(a.get(k, 0) - b.get(k, 0), 0) for k in (CPU, MEMORY)}


def _min(a: Mapping[str, int], b: Mapping[str, int]) -> dict[str, int]:
    return {k: min(a[k], b[k]) for k in (CPU, MEMORY)}


def _by_pod(pods: Sequence[PodMeta], predictions: Predictions, now: float, cold_start_s: float,
            margin_percent: int) -> tuple[dict[str, int], dict[str, int], dict[str, int]]:
    """(reclaimable, peak, unpredicted) of the per-pod predictor."""
    reclaimable, peak, unpredicted = _zero(), _zero(), _zero()
    seen: set[str] = set()
    for pod in pods:
        if pod.priority_class not in _RECLAIMABLE_CLASSES or pod.uid in seen:
            continue  # Koordinator: another class, or a duplicate (an error for that pod)
        seen.add(pod.uid)
        request = {CPU: pod_request(pod, CPU), MEMORY: pod_request(pod, MEMORY)}
        young = pod.created_at is None or now - pod.created_at <= cold_start_s
        if not young and (pod.deleting or pod.phase in _TERMINAL_PHASES):
            continue
        prediction = None if young else predictions(pod.uid)
        if prediction is None:
            for k in (CPU, MEMORY):
                unpredicted[k] += request[k]
            continue
        pod_peak = {CPU: _margin(prediction.cpu_milli["p95"], margin_percent),
                    MEMORY: _margin(prediction.memory_bytes["p98"], margin_percent)}
        for k in (CPU, MEMORY):
            peak[k] += pod_peak[k]
            reclaimable[k] += max(request[k] - pod_peak[k], 0)
    return reclaimable, peak, unpredicted


def _by_priority(pods: Sequence[PodMeta], predictions: Predictions, margin_percent: int) -> tuple[dict[str, int],
                                                                                                dict[str, int]]:
    """(Σ requests, peak) of the per-priority-class predictor."""
    requested = _zero()
    for pod in pods:
        if pod.priority_class in _RECLAIMABLE_CLASSES and not pod.deleting and pod.phase not in _TERMINAL_PHASES:
            requested[CPU] += pod_request(pod, CPU)
            requested[MEMORY] += pod_request(pod, MEMORY)
    peak = _zero()
    for item in (SYSTEM_ITEM, *(c.value for c in _RECLAIMABLE_CLASSES)):
        prediction = predictions(node_item_uid(item))
        if prediction is None:
            raise PredictionUnavailable(f"no prediction of {node_item_uid(item)} yet")
        peak[CPU] += prediction.cpu_milli["p95"]
        peak[MEMORY] += prediction.memory_bytes["p98"]
    return requested, {CPU: _margin(peak[CPU], margin_percent), MEMORY: _margin(peak[MEMORY], margin_percent)}


def predict_prod(pods: Sequence[PodMeta], node: NodeInfo | None, predictions: Predictions, now: float,
                 cold_start_s: float, margin_percent: int) -> ProdPrediction:
    """Prod reclaimable (the two predictors' minimum) and prod peak (their maximum)."""
    pod_reclaimable, pod_peak, unpredicted = _by_pod(pods, predictions, now, cold_start_s, margin_percent)
    allocatable = node_allocatable(node) if node is not None else None
    pod_peak_total = MappingProxyType({k: pod_peak[k] + unpredicted[k] for k in (CPU, MEMORY)})
    by_pod = (MappingProxyType(_min(_subtract_non_negative(allocatable, pod_peak), pod_reclaimable))
              if allocatable is not None else None)
    try:
        requested, class_peak = _by_priority(pods, predictions, margin_percent)
    except PredictionUnavailable as err:
        return ProdPrediction(None, None, str(err), MappingProxyType({POD_PREDICTOR: (by_pod, pod_peak_total),
                                                                      PRIORITY_PREDICTOR: (None, None)}))
    peak = MappingProxyType({k: max(pod_peak_total[k], class_peak[k]) for k in (CPU, MEMORY)})
    by_class = (MappingProxyType(_min(_subtract_non_negative(allocatable, class_peak),
                                      _subtract_non_negative(requested, class_peak)))
                if allocatable is not None else None)
    reclaimable = MappingProxyType(_min(by_pod, by_class)) if by_pod is not None and by_class is not None else None
    predictors = MappingProxyType({POD_PREDICTOR: (by_pod, pod_peak_total),
                                   PRIORITY_PREDICTOR: (by_class, MappingProxyType(class_peak)),
                                   MIN_PREDICTOR: (reclaimable, peak)})
    return ProdPrediction(reclaimable, peak, "" if node is not None else "the node is not known", predictors)
