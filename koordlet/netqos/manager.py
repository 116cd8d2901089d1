"""Keep the uplink's HTB layout in step with NodeSLO and the pods (Koordinator gate ``TCNetworkQoS``).

On every NodeSLO or pod change (states informer callbacks) and every ``interval_s``, one sync:
``spec_from_node_slo`` + ``plan`` over the pods that have IPs, then :func:`koordlet.system.tc.apply`
(changes only the difference). When NodeSLO no longer asks for tc network QoS, our qdisc (handle 1:, HTB)
is taken off the uplink; any other root qdisc is left alone. The syncs run on the manager's own thread,
so a callback only wakes it. Failures are logged and counted (``koordlet_netqos_apply_total{status}``),
never fatal: the next change or tick tries again.

The uplink is ``uplink`` or, when empty, the interface of the default route in ``<proc dir>/net/route``
(read at every sync: it may change). Its speed (``<sys dir>/class/net/<if>/speed``, Mbit/s) stands in for
``systemStrategy.totalNetworkBandwidth`` when NodeSLO leaves that at 0. :mod:`koordlet.system.net` reads both.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, Counter

from koordlet.netqos.plan import QDISC_MAJOR, NetPod, NetQoSError, handle, net_pod, plan, spec_from_node_slo
from koordlet.statesinformer.api import CallbackKind, StatesProvider
from koordlet.system import tc
from koordlet.system.net import UplinkError, default_route_interface, link_speed_bps
from koordlet.system.roots import PROC_DIR, SYS_DIR
from koordlet.system.tc import NetlinkError
from koordlet.ticker import PeriodicThread

_log = logging.getLogger(__name__)

DEFAULT_INTERVAL_S = 10.0
_DONE_PHASES = ("Succeeded", "Failed")

STATUS_APPLIED = "applied"
STATUS_UNCHANGED = "unchanged"
STATUS_REMOVED = "removed"
STATUS_ERROR = "error"


def pods_for_netqos(states: StatesProvider) -> list[NetPod]:
    return [
        net_pod(pod.key, pod.ips, pod.qos_class, pod.annotations)
        for pod in states.pods()
        if pod.ips and pod.phase not in _DONE_PHASES
    ]


class NetQoSManager:
    """The network QoS component: ``start()`` registers the callbacks and runs the sync thread."""

    def __init__(
        self,
        states: StatesProvider,
        uplink: str = "",
        interval_s: float = DEFAULT_INTERVAL_S,
        ipr_factory: Callable[[], Any] | None = None,
        proc_dir: str = PROC_DIR,
        sys_dir: str = SYS_DIR,
        registry: CollectorRegistry | None = None,
    ) -> None:
        if interval_s <= 0:
            raise ValueError(f"interval must be positive, got {interval_s}")
        self._states = states
        self._uplink = uplink
        self._ipr_factory = ipr_factory or tc.open_iproute
        self._proc_dir = proc_dir
        self._sys_dir = sys_dir
        self._applies = Counter(
            "koordlet_netqos_apply", "network QoS syncs by outcome", ["status"], registry=registry
        )
        self._thread = PeriodicThread("netqos", interval_s, self.sync_once, on_error=self._unexpected)
        self._registered = False
        self._plan_handle = handle(QDISC_MAJOR, 0)
        self.syncs = 0  # completed syncs (any outcome), for observers and tests

    def start(self) -> None:
        """The first sync at once, then every interval and on every NodeSLO or pod change."""
        if self._thread.running:
            return
        if not self._registered:
            self._states.register_callback(CallbackKind.NODE_SLO_SPEC, "netqos", self.request_sync)
            self._states.register_callback(CallbackKind.ALL_PODS, "netqos", self.request_sync)
            self._registered = True
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> bool:
        return self._thread.stop(timeout_s)

    def request_sync(self) -> None:
        """Wake the sync thread (callbacks call this; it returns at once)."""
        self._thread.wake()

    def _unexpected(self, err: Exception) -> None:
        # An unforeseen failure must not end the thread; the next tick retries.
        _log.exception("network QoS sync failed unexpectedly")
        self._applies.labels(status=STATUS_ERROR).inc()

    def sync_once(self) -> str:
        """One sync; returns its status (also counted). Never raises for a sync failure."""
        status = STATUS_ERROR
        try:
            status = self._sync()
        except (NetQoSError, tc.NetQoSApplyError, UplinkError, NetlinkError, OSError) as exc:
            _log.error("network QoS sync failed: %s", exc)
        self._applies.labels(status=status).inc()
        self.syncs += 1
        return status

    def _sync(self) -> str:
        uplink = self._uplink or default_route_interface(self._proc_dir)
        spec = spec_from_node_slo(self._states.node_slo(), link_speed_bps(uplink, self._sys_dir))
        ipr = self._ipr_factory()
        try:
            if spec is None:
                if tc.remove(ipr, uplink, self._plan_handle):
                    _log.info("%s: network QoS off, our qdisc removed", uplink)
                    return STATUS_REMOVED
                return STATUS_UNCHANGED
            wanted = plan(spec, pods_for_netqos(self._states))
            return STATUS_APPLIED if tc.apply(ipr, uplink, wanted) else STATUS_UNCHANGED
        finally:
            ipr.close()
