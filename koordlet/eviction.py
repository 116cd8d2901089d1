"""The evictor: how koordlet removes a BE pod when a QoS strategy asks (docs/koordinator.md §4.4–4.5).

Default path: the Eviction API (``policy/v1`` Eviction through :class:`koordlet.kubeapi.CoreV1`), so
PodDisruptionBudgets hold. A 429 from the API server means "not now": the pod is left alone and may be
asked for again after ``retry_after_s``. Each accepted eviction gets a Warning Event on the pod whose
reason names the strategy and whose message carries the figures that triggered it.

Koordinator kills containers through the runtime by default and ignores PDBs (its issue #1757); here the
CRI kill (``StopContainer`` with timeout 0 on each of the pod's containers) is used only in local mode
without an API server, or when ``kill_by_cri`` asks for it.

Safety: a pod is evicted only where the feature's :class:`~koordlet.api.eviction.EvictionRule` allows it (by
default: BE pods only; the opt-in features: pods labelled ``koordinator.sh/eviction-enabled: "true"`` at or
below the priority threshold), whatever the caller says. The evictor checks the pod it is given and, right
before acting, checks it again: against the API server's current object (labels, annotations,
``spec.priority``, ``status.qosClass``, same uid) or, in local mode, against the freshest pod list of the
states provider.
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import grpc
from kubernetes.client.exceptions import ApiException
from prometheus_client import REGISTRY

from koordlet.api.eviction import EvictionRule, be_rule
from koordlet.api.pod import PodMeta
from koordlet.api.qos import parse_kube_qos
from koordlet.events import UNREACHABLE, PodEvents
from koordlet.gotext import GoCounter
from koordlet.kubeapi import CoreV1, Throttled
from wire import cri_pb2 as cri
from wire import cri_pb2_grpc as cri_grpc

if TYPE_CHECKING:
    from kubernetes.client import ApiClient

logger = logging.getLogger(__name__)

POD_UID_LABEL = "io.kubernetes.pod.uid"  # label kubelet puts on every CRI container
DEFAULT_RETRY_AFTER_S = 5.0  # after a 429 (PDB) or a failure, before the same pod is asked for again
DEFAULT_EVICTING_TTL_S = 60.0  # a pod whose eviction was accepted counts as "being evicted" this long
DEFAULT_CRI_TIMEOUT_S = 5.0
_MAX_TRACKED_PODS = 4096

# docs/koordinator.md §6; every Koordinator metric carries the node label. Koordinator's bare counter names
# (koordlet/gotext.py); the per-pod detail series go 5 minutes after their last eviction, as Koordinator's
# NewGCCounterVec drops them (pkg/util/metrics/expire_metric.go DefaultExpireTime).
POD_EVICTION = GoCounter("koordlet_pod_eviction", "Pods evicted by koordlet, by reason", ["node", "reason"],
                         registry=REGISTRY)
POD_EVICTION_DETAIL = GoCounter("koordlet_pod_eviction_detail", "Pods evicted by koordlet, by pod and reason",
                                ["node", "pod_namespace", "pod_name", "reason"], registry=REGISTRY,
                                expire_after_s=300.0)


def zero_eviction_counts(node_name: str, features: Iterable[str]) -> None:
    """Export 0 evictions for each feature before its first one, so that increase() (the alert rules) counts it."""
    for feature in features:
        POD_EVICTION.labels(node=node_name, reason=reason_for(feature))


def reason_for(feature: str) -> str:
    """The metric reason Koordinator records for an eviction by a feature (docs/koordinator.md §4.5)."""
    return f"trigger by koordlet feature {feature}"


class EvictionOutcome(enum.StrEnum):
    EVICTED = "evicted"  # the API accepted the eviction, or the containers were stopped
    ALREADY_EVICTING = "already_evicting"  # asked for recently and accepted; counts as released
    BLOCKED = "blocked"  # a PodDisruptionBudget said not now (429), or waiting out retry_after_s
    NOT_BE = "not_be"  # refused: the feature's rule does not allow the pod (not BE, not opted in, priority)
    GONE = "gone"  # the pod no longer exists
    FAILED = "failed"


@dataclass(frozen=True, slots=True)
class EvictionResult:
    outcome: EvictionOutcome
    detail: str = ""

    @property
    def releases(self) -> bool:
        """True when the pod's resources will be freed (count it as released)."""
        return self.outcome in (EvictionOutcome.EVICTED, EvictionOutcome.ALREADY_EVICTING, EvictionOutcome.GONE)


def _live_pod(current: dict, known: PodMeta) -> PodMeta:
    """The pod as the API server has it now (what an eviction rule reads), on top of what the states knew."""
    meta = current.get("metadata") or {}
    spec = current.get("spec") or {}
    status = current.get("status") or {}
    priority = spec.get("priority")
    return replace(
        known,
        labels=dict(meta.get("labels") or {}),
        annotations=dict(meta.get("annotations") or {}),
        priority=priority if isinstance(priority, int) and not isinstance(priority, bool) else None,
        kube_qos=parse_kube_qos(status.get("qosClass") or "") or known.effective_kube_qos,
        phase=str(status.get("phase") or known.phase),
    )


class Evictor:
    """Evicts BE pods through the Eviction API or, in local mode, by stopping their containers via the CRI."""

    def __init__(
        self,
        node_name: str,
        *,
        api_client: ApiClient | None = None,
        cri_endpoint: str | None = None,
        kill_by_cri: bool = False,
        pods: Callable[[], Sequence[PodMeta]] | None = None,
        retry_after_s: float = DEFAULT_RETRY_AFTER_S,
        evicting_ttl_s: float = DEFAULT_EVICTING_TTL_S,
        cri_timeout_s: float = DEFAULT_CRI_TIMEOUT_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``api_client``: the API server (None = local mode); ``cri_endpoint``: the runtime socket path for the
        kill path; ``kill_by_cri``: kill through the CRI even with an API server; ``pods``: the states
        provider's pod list, used in local mode to check a pod again right before acting."""
        if api_client is None and cri_endpoint is None:
            raise ValueError("the evictor needs an API client or a CRI endpoint")
        if kill_by_cri and cri_endpoint is None:
            raise ValueError("kill_by_cri needs a CRI endpoint")
        self._node_name = node_name
        self._api = CoreV1(api_client).essential() if api_client is not None else None
        self._events = PodEvents(node_name, api_client) if api_client is not None else None
        self._cri_endpoint = cri_endpoint
        self._use_cri = kill_by_cri or api_client is None
        self._pods = pods
        self._retry_after_s = retry_after_s
        self._evicting_ttl_s = evicting_ttl_s
        self._cri_timeout_s = cri_timeout_s
        self._clock = clock
        self._lock = threading.Lock()
        self._evicting: dict[str, float] = {}  # pod uid → time the eviction was accepted
        self._blocked: dict[str, float] = {}  # pod uid → time before which we do not ask again

    @property
    def uses_cri(self) -> bool:
        return self._use_cri

    def is_evicting(self, pod_uid: str) -> bool:
        with self._lock:
            since = self._evicting.get(pod_uid)
            return since is not None and self._clock() - since < self._evicting_ttl_s

    def evict(self, pod: PodMeta, feature: str, message: str, rule: EvictionRule | None = None) -> EvictionResult:
        """Evict ``pod`` on behalf of ``feature`` (a gate name: BEMemoryEvict, BECPUEvict…) where ``rule`` (by
        default: BE pods only) allows it.

        ``message`` carries the figures that triggered it and goes into the Event. Never raises for API or
        runtime errors: they come back as FAILED (logged)."""
        rule = rule or be_rule(feature)
        refusal = rule.refusal(pod)
        if refusal is not None:
            logger.error("refusing to evict %s for %s: %s", pod.key, feature, refusal)
            return EvictionResult(EvictionOutcome.NOT_BE, refusal)
        now = self._clock()
        with self._lock:
            self._expire(now)
            if pod.uid in self._evicting:
                return EvictionResult(EvictionOutcome.ALREADY_EVICTING)
            until = self._blocked.get(pod.uid)
            if until is not None and now < until:
                return EvictionResult(EvictionOutcome.BLOCKED, f"retry in {until - now:.1f} s")
        if self._use_cri:
            result = self._kill_by_cri(pod, feature, rule)
        else:
            result = self._evict_by_api(pod, feature, message, rule)
        with self._lock:
            if result.outcome is EvictionOutcome.EVICTED:
                self._evicting[pod.uid] = self._clock()
                self._blocked.pop(pod.uid, None)
            elif result.outcome in (EvictionOutcome.BLOCKED, EvictionOutcome.FAILED):
                self._blocked[pod.uid] = self._clock() + self._retry_after_s
        if result.outcome is EvictionOutcome.EVICTED:
            reason = reason_for(feature)
            POD_EVICTION.labels(node=self._node_name, reason=reason).inc()
            POD_EVICTION_DETAIL.labels(
                node=self._node_name, pod_namespace=pod.namespace, pod_name=pod.name, reason=reason
            ).inc()
            logger.warning("evicted %s (%s): %s", pod.key, feature, message)
        return result

    def _expire(self, now: float) -> None:
        """Forget old entries so the bookkeeping stays bounded. Caller holds the lock."""
        for uid in [uid for uid, since in self._evicting.items() if now - since >= self._evicting_ttl_s]:
            del self._evicting[uid]
        for uid in [uid for uid, until in self._blocked.items() if now >= until]:
            del self._blocked[uid]
        for table in (self._evicting, self._blocked):
            while len(table) > _MAX_TRACKED_PODS:
                del table[next(iter(table))]

    # ------------------------------------------------------------------------------------- Eviction API

    def _evict_by_api(self, pod: PodMeta, feature: str, message: str,
                      rule: EvictionRule | None = None) -> EvictionResult:
        rule = rule or be_rule(feature)
        current = self._read_live(pod)
        if isinstance(current, EvictionResult):
            return current
        meta = current.get("metadata") or {}
        live_uid = meta.get("uid") or ""
        if live_uid and pod.uid and live_uid != pod.uid:
            return EvictionResult(EvictionOutcome.GONE, "the pod was recreated")
        live = _live_pod(current, pod)
        refusal = rule.refusal(live)
        if refusal is not None:
            logger.error("refusing to evict %s for %s: as the API server has it now, %s", pod.key, feature, refusal)
            return EvictionResult(EvictionOutcome.NOT_BE, f"as the API server has it now, {refusal}")
        result = self._post_eviction(pod, feature, live_uid)
        if result.outcome is EvictionOutcome.EVICTED:
            assert self._events is not None
            self._events.warning(pod, feature, f"evicted by koordlet {feature}: {message}", uid=live_uid or pod.uid)
        return result

    def _read_live(self, pod: PodMeta) -> dict | EvictionResult:
        """The pod as the API server has it, or why it cannot be evicted now."""
        assert self._api is not None
        try:
            # The watch cache's copy (resourceVersion 0, no etcd read): the eviction carries the UID as a
            # precondition, so a pod recreated since is never evicted in its place.
            return self._api.read_namespaced_pod(pod.name, pod.namespace, resource_version="0")
        except Throttled as held:
            return EvictionResult(EvictionOutcome.FAILED, f"read: {held.why}")
        except UNREACHABLE as exc:
            logger.warning("cannot read %s before evicting it: API server unreachable: %s", pod.key, exc)
            return EvictionResult(EvictionOutcome.FAILED, "read: API server unreachable")
        except ApiException as exc:
            if exc.status == 404:
                return EvictionResult(EvictionOutcome.GONE)
            logger.warning("cannot read %s before evicting it: %s %s", pod.key, exc.status, exc.reason)
            return EvictionResult(EvictionOutcome.FAILED, f"read: {exc.status}")

    def _post_eviction(self, pod: PodMeta, feature: str, live_uid: str) -> EvictionResult:
        assert self._api is not None
        body: dict = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": pod.name, "namespace": pod.namespace},
        }
        if live_uid:
            body["deleteOptions"] = {"preconditions": {"uid": live_uid}}
        try:
            self._api.create_namespaced_pod_eviction(pod.name, pod.namespace, body)
        except Throttled as held:
            return EvictionResult(EvictionOutcome.FAILED, f"eviction: {held.why}")
        except UNREACHABLE as exc:
            logger.warning("eviction of %s for %s failed: API server unreachable: %s", pod.key, feature, exc)
            return EvictionResult(EvictionOutcome.FAILED, "eviction: API server unreachable")
        except ApiException as exc:
            if exc.status == 429:
                logger.info("eviction of %s for %s refused for now (disruption budget)", pod.key, feature)
                return EvictionResult(EvictionOutcome.BLOCKED, "429: disruption budget")
            if exc.status in (404, 409):  # 409: the UID precondition failed, the pod was recreated
                return EvictionResult(EvictionOutcome.GONE)
            logger.warning("eviction of %s for %s failed: %s %s", pod.key, feature, exc.status, exc.reason)
            return EvictionResult(EvictionOutcome.FAILED, f"eviction: {exc.status}")
        return EvictionResult(EvictionOutcome.EVICTED)

    # ----------------------------------------------------------------------------------------- CRI kill

    def _fresh_pod(self, pod: PodMeta) -> PodMeta | None:
        if self._pods is None:
            return pod
        for candidate in self._pods():
            if candidate.uid == pod.uid:
                return candidate
        return None

    def _kill_by_cri(self, pod: PodMeta, feature: str, rule: EvictionRule) -> EvictionResult:
        fresh = self._fresh_pod(pod)
        if fresh is None:
            return EvictionResult(EvictionOutcome.GONE)
        refusal = rule.refusal(fresh)
        if refusal is not None:
            logger.error("refusing to kill %s for %s: as the pod is now, %s", pod.key, feature, refusal)
            return EvictionResult(EvictionOutcome.NOT_BE, f"as the pod is now, {refusal}")
        assert self._cri_endpoint is not None
        target = self._cri_endpoint if "://" in self._cri_endpoint else f"unix://{self._cri_endpoint}"
        stopped = 0
        try:
            with grpc.insecure_channel(target) as channel:
                runtime = cri_grpc.RuntimeServiceStub(channel)
                # The sandbox id when the states source knows it (CRI), else kubelet's pod uid label.
                selector = (
                    cri.ContainerFilter(pod_sandbox_id=fresh.sandbox_id)
                    if fresh.sandbox_id
                    else cri.ContainerFilter(label_selector={POD_UID_LABEL: pod.uid})
                )
                request = cri.ListContainersRequest(filter=selector)
                listing = runtime.ListContainers(request, timeout=self._cri_timeout_s)
                for container in listing.containers:
                    if container.state == cri.CONTAINER_EXITED:
                        continue
                    runtime.StopContainer(
                        cri.StopContainerRequest(container_id=container.id, timeout=0), timeout=self._cri_timeout_s
                    )
                    stopped += 1
        except grpc.RpcError as exc:
            logger.warning("killing %s for %s through the CRI failed: %s", pod.key, feature, exc)
            return EvictionResult(EvictionOutcome.FAILED, f"cri: {exc}")
        if stopped == 0:
            return EvictionResult(EvictionOutcome.GONE, "no running container")
        return EvictionResult(EvictionOutcome.EVICTED, f"stopped {stopped} containers")
