"""Terway's network QoS files (gate ``TerwayQoS``, NodeSLO ``policies.netQOSPolicy: terway-qos``; Koordinator
runtimehooks/hooks/terwayqos): koordlet writes what Terway's QoS daemon (terway-qos) reads from
``-terway-qos-dir`` (``/var/lib/terway/qos``):

- ``global_bps_config``, one ``<name> <bytes per second>`` line per field in this order: ``hw_tx_bps_max``,
  ``hw_rx_bps_max`` (``systemStrategy.totalNetworkBandwidth``), ``offline_l1_{tx,rx}_bps_{min,max}`` (the LS
  class's ``networkQOS`` egress/ingress request and limit) and ``offline_l2_…`` (the BE class's), 0 for a class
  whose ``networkQOS`` is off;
- ``pod.json``, ``{pod uid: {podName, podNamespace, podUID, prio, cgroupDir, qosConfig: {ingressBandwidth,
  egressBandwidth}}}`` for every pod: ``prio`` 0 SYSTEM, 1 LSE/LSR/LS (and Guaranteed/Burstable pods without
  a QoS label), 2 BE (and BestEffort ones); ``cgroupDir`` its ``net_cls`` cgroup on the host; the bandwidths
  the pod's ``koordinator.sh/networkQOS`` limits in bytes per second (0: none). A pod with a malformed
  annotation is left out, as Koordinator does.

NodeSLO gives rates in bits per second (a percent of the total or a quantity); the files hold bytes per
second: a percent is converted too (Koordinator leaves a percent in bits). A quantity above the total
bandwidth is refused, as in Koordinator: the files are then left as they were and the error logged.

When the policy is not ``terway-qos`` both files are removed. Files are written atomically and only when
their content changes; every change goes into the audit log.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass

from koordlet import audit
from koordlet.api.annotations import AnnotationError, parse_network_qos
from koordlet.api.keys import ANNOTATION_NETWORK_QOS
from koordlet.api.nodeslo import NET_QOS_POLICY_TERWAY, NetworkQOS, NodeSLOSpec
from koordlet.api.pod import PodMeta
from koordlet.api.qos import KubeQoS, QoSClass
from koordlet.api.quantity import QuantityError, parse_quantity
from koordlet.statesinformer.api import CallbackKind, StatesProvider
from koordlet.system.cgroup import host_cgroup_dir
from koordlet.system.kubepods import KubeCgroupLayout, pod_cgroup_dir
from koordlet.ticker import PeriodicThread
from wire.files import write_atomic

_log = logging.getLogger(__name__)

POD_CONFIG = "pod.json"
NODE_CONFIG = "global_bps_config"
DEFAULT_INTERVAL_S = 10.0
_PRIO_BY_QOS = {QoSClass.SYSTEM: 0, QoSClass.LSE: 1, QoSClass.LSR: 1, QoSClass.LS: 1, QoSClass.BE: 2}
_PRIO_BY_KUBE_QOS = {KubeQoS.GUARANTEED: 1, KubeQoS.BURSTABLE: 1, KubeQoS.BESTEFFORT: 2}


@dataclass(frozen=True, slots=True)
class _ClassRates:
    rx_min: int = 0
    rx_max: int = 0
    tx_min: int = 0
    tx_max: int = 0


class TerwayQoSError(ValueError):
    """A NodeSLO rate Terway's files cannot take."""


def _bytes(value: int | str, total_bps: int) -> int:
    """A NodeSLO rate (an int: percent of the total; a string: bits per second) in bytes per second; a quantity
    above the total is refused (Koordinator's check)."""
    if isinstance(value, bool):
        raise TerwayQoSError(f"rate must be a percent or a quantity, got {value!r}")
    if isinstance(value, int):
        if not 0 <= value <= 100:
            raise TerwayQoSError(f"percent must be in [0, 100], got {value}")
        return total_bps * value // 100 // 8
    try:
        absolute = parse_quantity(value)
    except QuantityError as exc:
        raise TerwayQoSError(f"rate {value!r}: {exc}") from exc
    if not 0 <= absolute <= total_bps:
        raise TerwayQoSError(f"quantity {value} is not within the total bandwidth {total_bps} bits/s")
    return absolute // 8


def _class(config: NetworkQOS, total_bps: int) -> _ClassRates:
    if not config.enable:
        return _ClassRates()
    return _ClassRates(rx_min=_bytes(config.ingress_request, total_bps), rx_max=_bytes(config.ingress_limit, total_bps),
                       tx_min=_bytes(config.egress_request, total_bps), tx_max=_bytes(config.egress_limit, total_bps))


def node_config(node_slo: NodeSLOSpec) -> str:
    """``global_bps_config`` for a NodeSLO whose policy is terway-qos; TerwayQoSError for a bad rate."""
    total = node_slo.system_strategy.total_network_bandwidth_bps
    strategy = node_slo.resource_qos_strategy
    l1, l2 = _class(strategy.ls_class.network_qos, total), _class(strategy.be_class.network_qos, total)
    fields = (("hw_tx_bps_max", total // 8), ("hw_rx_bps_max", total // 8),
              ("offline_l1_tx_bps_min", l1.tx_min), ("offline_l1_tx_bps_max", l1.tx_max),
              ("offline_l1_rx_bps_min", l1.rx_min), ("offline_l1_rx_bps_max", l1.rx_max),
              ("offline_l2_tx_bps_min", l2.tx_min), ("offline_l2_tx_bps_max", l2.tx_max),
              ("offline_l2_rx_bps_min", l2.rx_min), ("offline_l2_rx_bps_max", l2.rx_max))
    return "".join(f"{name} {value}\n" for name, value in fields)


def pod_prio(pod: PodMeta) -> int:
    prio = _PRIO_BY_QOS.get(pod.qos_label)
    if prio is not None:
        return prio
    return _PRIO_BY_KUBE_QOS.get(pod.effective_kube_qos, 0) if pod.effective_kube_qos is not None else 0


def pod_config(pods: Sequence[PodMeta], layout: KubeCgroupLayout) -> str:
    """``pod.json`` for these pods (Go's encoding: keys of the map sorted, struct fields in order, compact)."""
    entries: dict[str, dict[str, object]] = {}
    for pod in sorted(pods, key=lambda p: p.uid):
        ingress = egress = 0
        raw = pod.annotations.get(ANNOTATION_NETWORK_QOS)
        try:
            if raw:
                limits = parse_network_qos(raw)
                ingress, egress = (limits.ingress_limit_bps or 0) // 8, (limits.egress_limit_bps or 0) // 8
        except AnnotationError as exc:
            _log.warning("terway QoS: pod %s left out: %s", pod.key, exc)
            continue
        rel = pod_cgroup_dir(layout, pod)
        if rel is None:
            _log.debug("terway QoS: pod %s left out: no cgroup dir", pod.key)
            continue
        entries[pod.uid] = {"podName": pod.name, "podNamespace": pod.namespace, "podUID": pod.uid,
                            "prio": pod_prio(pod), "cgroupDir": host_cgroup_dir("net_cls", rel),
                            "qosConfig": {"ingressBandwidth": ingress, "egressBandwidth": egress}}
    return json.dumps(entries, separators=(",", ":"), ensure_ascii=False)


class TerwayQoSWriter:
    """Keeps ``pod.json`` and ``global_bps_config`` in ``qos_dir`` in step with NodeSLO and the pods, on every
    NodeSLO or pod change and every ``interval_s``."""

    def __init__(self, states: StatesProvider, layout: KubeCgroupLayout, qos_dir: str,
                 interval_s: float = DEFAULT_INTERVAL_S) -> None:
        self._states = states
        self._layout = layout
        self._dir = qos_dir
        self._written: dict[str, str | None] = {}
        self._thread = PeriodicThread("terway-qos", interval_s, self.sync_once, on_error=self._unexpected)
        self._registered = False
        self.syncs = 0

    def start(self) -> None:
        if not self._registered:
            for kind in (CallbackKind.NODE_SLO_SPEC, CallbackKind.ALL_PODS):
                self._states.register_callback(kind, "terway-qos", self._thread.wake)
            self._registered = True
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> bool:
        return self._thread.stop(timeout_s)

    def _unexpected(self, err: Exception) -> None:
        _log.exception("terway QoS sync failed unexpectedly")

    def sync_once(self) -> None:
        node_slo = self._states.node_slo()
        try:
            if node_slo.resource_qos_strategy.policies.net_qos_policy != NET_QOS_POLICY_TERWAY:
                self._put(NODE_CONFIG, None)
                self._put(POD_CONFIG, None)
            else:
                self._put(NODE_CONFIG, node_config(node_slo))
                self._put(POD_CONFIG, pod_config(self._states.pods(), self._layout))
        except (TerwayQoSError, OSError) as exc:
            _log.error("terway QoS files in %s not written: %s", self._dir, exc)
        self.syncs += 1

    def _put(self, name: str, content: str | None) -> None:
        """Write (or with None remove) one file when its content differs from what is there."""
        path = os.path.join(self._dir, name)
        if name in self._written and self._written[name] == content:
            return
        if content is None:
            try:
                os.remove(path)
            except FileNotFoundError:
                self._written[name] = None
                return
            what = f"removed {path}: netQOSPolicy is not terway-qos"
        else:
            os.makedirs(self._dir, mode=0o755, exist_ok=True)
            try:
                with open(path, encoding="utf-8") as f:
                    unchanged = f.read() == content
            except FileNotFoundError:
                unchanged = False
            if not unchanged:
                write_atomic(path, content, prefix=f".{name}-", mode=0o644)
            what = f"{path} to {content.strip()[:512]}"
            if unchanged:
                self._written[name] = content
                return
        self._written[name] = content
        auditor = audit.current()
        if auditor is not None:
            auditor.log(audit.LEVEL_UPDATE, audit.NODE, "NetQoSReconcile", what)
        _log.info("terway QoS: %s", what.split(" to ")[0] if content is not None else what)
