"""Keep the uplink's HTB layout in step with NodeSLO and the pods (Koordinator gate ``TCNetworkQoS``).

On every NodeSLO or pod change (states informer callbacks) and every ``interval_s``, one sync:
``spec_from_node_slo`` + ``plan`` over the pods that have IPs, then :func:`koordlet.netqos.tc.apply`
(changes only the difference). When NodeSLO no longer asks for tc network QoS, our qdisc (handle 1:, HTB)
is taken off the uplink; any other root qdisc is left alone. The syncs run on the manager's own thread,
so a callback only wakes it. Failures are logged and counted (``koordlet_netqos_apply_total{status}``),
never fatal: the next change or tick tries again.

The uplink is ``uplink`` or, when empty, the interface of the default route in ``<proc root>/net/route``
(read at every sync: it may change). Its speed (``<sys dir>/class/net/<if>/speed``, Mbit/s) stands in for
``systemStrategy.totalNetworkBandwidth`` when NodeSLO leaves that at 0.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, Counter
from pyroute2.netlink.exceptions import NetlinkError

from koordlet.netqos import tc
from koordlet.netqos.plan import QDISC_MAJOR, NetPod, NetQoSError, handle, net_pod, plan, spec_from_node_slo
from koordlet.statesinformer.api import CallbackKind, StatesProvider
from koordlet.ticker import PeriodicThread

_log = logging.getLogger(__name__)

DEFAULT_INTERVAL_S = 10.0
_DONE_PHASES = ("Succeeded", "Failed")
_RTF_UP = 0x1

STATUS_APPLIED = "applied"
STATUS_UNCHANGED = "unchanged"
STATUS_REMOVED = "removed"
STATUS_ERROR = "error"


class UplinkError(OSError):
    """No uplink named and no default route to find one."""


def default_route_interface(proc_root: str) -> str:
    """The interface of the IPv4 default route (destination and mask 0, up), from ``<proc_root>/net/route``."""
    path = os.path.join(proc_root, "net", "route")
    try:
        with open(path, encoding="ascii") as file:
            lines = file.read().splitlines()[1:]
    except OSError as exc:
        raise UplinkError(f"cannot read {path}: {exc}") from exc
    best: tuple[int, str] | None = None
    for line in lines:
        fields = line.split()
        if len(fields) < 8:
            continue
        try:
            destination, flags, mask = int(fields[1], 16), int(fields[3], 16), int(fields[7], 16)
            metric = int(fields[6])
        except ValueError:
            continue
        if destination == 0 and mask == 0 and flags & _RTF_UP and (best is None or metric < best[0]):
            best = (metric, fields[0])
    if best is None:
        raise UplinkError(f"no default route in {path}")
    return best[1]


def link_speed_bps(sys_dir: str, ifname: str) -> int:
    """The link's speed in bits/s from ``<sys_dir>/class/net/<if>/speed``; 0 when unknown (down, virtual)."""
    path = os.path.join(sys_dir, "class", "net", ifname, "speed")
    try:
        with open(path, encoding="ascii") as file:
            mbit = int(file.read().strip())
    except (OSError, ValueError):  # the kernel answers EINVAL for a link that is down
        return 0
    return mbit * 1_000_000 if mbit > 0 else 0


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
        proc_root: str = "/proc",
        sys_dir: str = "/sys",
        registry: CollectorRegistry | None = None,
    ) -> None:
        if interval_s <= 0:
            raise ValueError(f"interval must be positive, got {interval_s}")
        self._states = states
        self._uplink = uplink
        self._ipr_factory = ipr_factory or _iproute
        self._proc_root = proc_root
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
        uplink = self._uplink or default_route_interface(self._proc_root)
        spec = spec_from_node_slo(self._states.node_slo(), link_speed_bps(self._sys_dir, uplink))
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


def _iproute() -> Any:
    from pyroute2 import IPRoute

    return IPRoute()
