"""Network QoS plan: NodeSLO + pods -> the HTB qdisc, classes and filters one uplink should carry.

Pure: no netlink, no files. :mod:`koordlet.system.tc` compares a plan with what is on the link and
changes only the difference.

Layout (Koordinator's tc mode, docs/koordinator.md §3.3 NetQoS): an HTB qdisc with major 1 on the
uplink's egress; root class 1:1 holds the whole node bandwidth; the class children are system 1:2, LS 1:3
(LSE/LSR/LS pods) and BE 1:4; unclassified traffic goes to the system class (the qdisc default). Each class
is guaranteed its ``egressRequest`` and may borrow up to its ``egressLimit`` (NodeSLO ``networkQOS`` of the
systemClass / lsClass / beClass; an int is a percent of ``systemStrategy.totalNetworkBandwidth``, a string
an absolute rate like "50M", both in bits per second).

Where Koordinator marks packets with ipsets and an iptables CLASSIFY rule, we classify with one u32 filter
per pod IPv4 address on the source address (pod egress leaves the uplink with the pod IP as source):
no iptables/ipset dependency and the whole state lives in one place (the qdisc) that the diff can read back.
A pod whose ``koordinator.sh/networkQOS`` annotation sets ``egressLimit`` gets its own leaf class under its
QoS class with that ceiling. Ingress shaping (Koordinator's ``ingress*`` fields) needs an IFB device and is
not planned here.
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from koordlet.api.annotations import AnnotationError, PodNetworkQOS, parse_network_qos
from koordlet.api.keys import ANNOTATION_NETWORK_QOS
from koordlet.api.netqos import HTBClass, IPFilter, NetQoSPlan, handle
from koordlet.api.nodeslo import NET_QOS_POLICY_TC, NetworkQOS, NodeSLOSpec
from koordlet.api.qos import QoSClass
from koordlet.api.quantity import QuantityError, parse_quantity

_log = logging.getLogger(__name__)

QDISC_MAJOR = 1
ROOT_MINOR = 1
SYSTEM_MINOR = 2
LS_MINOR = 3
BE_MINOR = 4
# Per-pod leaf classes take minors from here on (below: the fixed layout).
POD_MINOR_BASE = 0x100
POD_MINOR_MAX = 0xFFFF

# HTB wants a positive rate; a class with no guarantee gets this floor and lives by borrowing.
MIN_RATE_BPS = 8_000
# HTB quantum (bytes) per class: rate/r2q as HTB does, kept in [one full frame, the kernel's "big" mark]
# so the kernel neither warns nor lets one class starve another while borrowing.
MIN_QUANTUM_BYTES = 1_600
MAX_QUANTUM_BYTES = 200_000


class NetQoSError(ValueError):
    """The NodeSLO or a pod cannot be turned into a network QoS plan."""


def classid(minor: int) -> int:
    return handle(QDISC_MAJOR, minor)


@dataclass(frozen=True, slots=True)
class ClassRates:
    """Guaranteed rate and ceiling of one class, bits per second."""

    rate_bps: int
    ceil_bps: int


@dataclass(frozen=True, slots=True)
class NetQoSSpec:
    """What the plan needs from NodeSLO: the node bandwidth and the rates of the three QoS classes."""

    total_bps: int
    system: ClassRates
    ls: ClassRates
    be: ClassRates


@dataclass(frozen=True, slots=True)
class NetPod:
    """A pod as network QoS sees it: its IPs, QoS class and optional own egress limit (bits/s)."""

    key: str  # namespace/name, for logs and a stable order
    ips: tuple[str, ...]
    qos: QoSClass
    egress_limit_bps: int | None = None


def resolve_rate(value: int | str, total_bps: int) -> int:
    """NodeSLO IntOrString: int = percent of ``total_bps``, string = absolute bits/s; capped at the total."""
    if isinstance(value, bool):
        raise NetQoSError(f"rate must be a percent or a quantity, got {value!r}")
    if isinstance(value, int):
        if not 0 <= value <= 100:
            raise NetQoSError(f"percent must be in [0, 100], got {value}")
        return total_bps * value // 100
    try:
        absolute = parse_quantity(value)
    except QuantityError as exc:
        raise NetQoSError(f"rate {value!r}: {exc}") from exc
    if absolute < 0:
        raise NetQoSError(f"rate must not be negative, got {value!r}")
    return min(absolute, total_bps)


def class_rates(config: NetworkQOS, total_bps: int) -> ClassRates:
    """A class's egress request/limit resolved to bits/s; a disabled class may use the whole bandwidth."""
    if not config.enable:
        return ClassRates(rate_bps=0, ceil_bps=total_bps)
    rate = resolve_rate(config.egress_request, total_bps)
    ceil = resolve_rate(config.egress_limit, total_bps)
    return ClassRates(rate_bps=rate, ceil_bps=max(ceil, rate))


def spec_from_node_slo(node_slo: NodeSLOSpec, link_speed_bps: int = 0) -> NetQoSSpec | None:
    """The network QoS spec of a merged NodeSLO, or None when tc network QoS is not asked for.

    None when the policy is not ``tc``, or no class enables ``networkQOS``. The node bandwidth is
    ``systemStrategy.totalNetworkBandwidth``, else ``link_speed_bps`` (the uplink's speed); with neither,
    percentages mean nothing and a :class:`NetQoSError` says so.
    """
    strategy = node_slo.resource_qos_strategy
    if strategy.policies.net_qos_policy != NET_QOS_POLICY_TC:
        return None
    configs = {
        QoSClass.SYSTEM: strategy.system_class.network_qos,
        QoSClass.LS: strategy.ls_class.network_qos,
        QoSClass.BE: strategy.be_class.network_qos,
    }
    if not any(c.enable for c in configs.values()) and not strategy.lsr_class.network_qos.enable:
        return None
    total = node_slo.system_strategy.total_network_bandwidth_bps or link_speed_bps
    if total <= 0:
        raise NetQoSError(
            "networkQOS is enabled but systemStrategy.totalNetworkBandwidth is 0 and the link speed unknown"
        )
    return NetQoSSpec(
        total_bps=total,
        system=class_rates(configs[QoSClass.SYSTEM], total),
        ls=class_rates(configs[QoSClass.LS], total),
        be=class_rates(configs[QoSClass.BE], total),
    )


def net_pod(key: str, ips: Iterable[str], qos: QoSClass, annotations: Mapping[str, str] | None = None) -> NetPod:
    """A :class:`NetPod` from a pod's IPs, QoS class and annotations (a bad annotation is logged and ignored)."""
    limit: int | None = None
    raw = (annotations or {}).get(ANNOTATION_NETWORK_QOS)
    if raw:
        try:
            parsed: PodNetworkQOS = parse_network_qos(raw)
            limit = parsed.egress_limit_bps
        except AnnotationError as exc:
            _log.warning("pod %s: ignoring %s: %s", key, ANNOTATION_NETWORK_QOS, exc)
    return NetPod(key=key, ips=tuple(ips), qos=qos, egress_limit_bps=limit)


def qos_minor(qos: QoSClass) -> int:
    """The class a QoS goes to.

    LSE/LSR/LS share the LS class (docs/koordinator.md §3.3); BE its own; the rest system."""
    if qos in (QoSClass.LSE, QoSClass.LSR, QoSClass.LS):
        return LS_MINOR
    if qos is QoSClass.BE:
        return BE_MINOR
    return SYSTEM_MINOR


def quantum_bytes(rate_bps: int) -> int:
    return max(MIN_QUANTUM_BYTES, min(rate_bps // 8 // 10, MAX_QUANTUM_BYTES))


def _htb_class(minor: int, parent: int, rate_bps: int, ceil_bps: int) -> HTBClass:
    rate = max(rate_bps, MIN_RATE_BPS)
    return HTBClass(
        classid=classid(minor),
        parent=parent,
        rate_bps=rate,
        ceil_bps=max(ceil_bps, rate),
        quantum_bytes=quantum_bytes(rate),
    )


def _ipv4(pod: NetPod) -> list[str]:
    addresses = []
    for text in pod.ips:
        try:
            address = ipaddress.ip_address(text)
        except ValueError:
            _log.warning("pod %s: ignoring bad IP %r", pod.key, text)
            continue
        if address.version == 4:
            addresses.append(str(address))
    return addresses


def plan(spec: NetQoSSpec, pods: Iterable[NetPod]) -> NetQoSPlan:
    """The qdisc, classes and filters for ``spec`` and the pods now on the node."""
    root = classid(ROOT_MINOR)
    classes = [
        _htb_class(ROOT_MINOR, handle(QDISC_MAJOR, 0), spec.total_bps, spec.total_bps),
        _htb_class(SYSTEM_MINOR, root, spec.system.rate_bps, spec.system.ceil_bps),
        _htb_class(LS_MINOR, root, spec.ls.rate_bps, spec.ls.ceil_bps),
        _htb_class(BE_MINOR, root, spec.be.rate_bps, spec.be.ceil_bps),
    ]
    ceilings = {c.classid: c.ceil_bps for c in classes}
    filters: dict[str, IPFilter] = {}
    next_pod_minor = POD_MINOR_BASE
    for pod in sorted(pods, key=lambda p: p.key):
        ips = _ipv4(pod)
        if not ips:
            continue
        target = classid(qos_minor(pod.qos))
        if pod.egress_limit_bps is not None and pod.egress_limit_bps > 0:
            if next_pod_minor > POD_MINOR_MAX:
                raise NetQoSError("too many pods with an egress limit for one HTB qdisc")
            ceil = min(pod.egress_limit_bps, ceilings[target])
            leaf = _htb_class(next_pod_minor, target, MIN_RATE_BPS, ceil)
            classes.append(leaf)
            target = leaf.classid
            next_pod_minor += 1
        for ip in ips:
            if ip in filters:
                _log.warning("IP %s claimed by two pods; keeping the first (%s)", ip, pod.key)
                continue
            filters[ip] = IPFilter(ip=ip, classid=target)
    return NetQoSPlan(
        qdisc_handle=handle(QDISC_MAJOR, 0),
        default_classid=classid(SYSTEM_MINOR),
        classes=tuple(classes),
        filters=tuple(sorted(filters.values(), key=lambda f: ipaddress.ip_address(f.ip))),
    )
