"""Carry a network QoS plan out on a link with pyroute2 (rtnetlink), changing only what differs.

``read_link`` reads the root qdisc, the HTB classes and the u32 filters back from the kernel;
``diff`` (pure) turns plan + link state into an ordered list of operations; ``apply`` runs them.
Applying twice is a no-op the second time, so callers may re-apply on every pod or NodeSLO change.

Order matters to the kernel: an HTB class with a filter bound to it cannot be deleted (EBUSY), and a
class needs its parent. So: stale filters out, stale classes out (children first), classes in (parents
first), new filters in.

The ``ipr`` argument is a pyroute2 ``IPRoute`` (:func:`open_iproute`) or ``NetNS`` (tests run in network
namespaces they create). The plan comes from :mod:`koordlet.netqos.plan`.
"""

from __future__ import annotations

import ipaddress
import logging
import struct
from dataclasses import dataclass
from typing import Any

from koordlet.api.netqos import HTBClass, IPFilter, NetQoSPlan, format_handle
from koordlet.system.lightimport import register_without_init

register_without_init("pyroute2")  # its rtnetlink parts only (koordlet/system/lightimport.py)
from pyroute2.netlink.exceptions import NetlinkError  # noqa: E402

_log = logging.getLogger(__name__)

TC_H_ROOT = 0xFFFFFFFF
ETH_P_IP = 0x0800
FILTER_PRIO = 10
# u32 filters we add live in the default hash table 800: (handle 800::<node>); node ids 1..0xfff.
_U32_HT = 0x800 << 20
_U32_MAX_NODE = 0xFFF
_IPV4_SRC_OFFSET = 12  # source address offset in the IPv4 header
_ENOENT = 2


class NetQoSApplyError(RuntimeError):
    """The kernel refused a change (the message names the link and the operation)."""


@dataclass(frozen=True, slots=True)
class LinkClass:
    classid: int
    parent: int
    rate_bytes: int
    ceil_bytes: int
    quantum_bytes: int


@dataclass(frozen=True, slots=True)
class LinkFilter:
    """A u32 filter on the qdisc; ``ip`` is None where it is not one source-address /32 match."""

    handle: int
    prio: int
    protocol: int
    classid: int
    ip: str | None


@dataclass(frozen=True, slots=True)
class LinkState:
    qdisc_kind: str  # "" when the link has no root qdisc of its own
    qdisc_handle: int
    default_classid: int  # HTB only
    classes: tuple[LinkClass, ...]
    filters: tuple[LinkFilter, ...]


@dataclass(frozen=True, slots=True)
class ReplaceQdisc:
    handle: int
    default_minor: int


@dataclass(frozen=True, slots=True)
class AddClass:
    spec: HTBClass


@dataclass(frozen=True, slots=True)
class ChangeClass:
    spec: HTBClass


@dataclass(frozen=True, slots=True)
class DeleteClass:
    classid: int
    parent: int


@dataclass(frozen=True, slots=True)
class AddFilter:
    handle: int
    spec: IPFilter


@dataclass(frozen=True, slots=True)
class DeleteFilter:
    parent: int
    handle: int
    prio: int
    protocol: int


Operation = ReplaceQdisc | AddClass | ChangeClass | DeleteClass | AddFilter | DeleteFilter


# ----------------------------------------------------------------------------------------------- reading


def _link_index(ipr: Any, ifname: str) -> int:
    found = ipr.link_lookup(ifname=ifname)
    if not found:
        raise NetQoSApplyError(f"link {ifname!r} not found")
    return int(found[0])


def _u32_source_ip(options: Any) -> str | None:
    """The address of a single ``src/32`` key, read from the raw selector.

    Parsed by hand: pyroute2 0.9's u32 key decoder starts 4 bytes early (it skips the NLA header
    but not into the selector), so its decoded keys are shifted.
    """
    sel = options.get_attr("TCA_U32_SEL")
    if sel is None:
        return None
    base = sel.offset + 4  # the NLA header
    nkeys = struct.unpack_from("B", sel.data, base + 2)[0]
    if nkeys != 1:
        return None
    mask, value = struct.unpack_from("!II", sel.data, base + 16)
    offset = struct.unpack_from("=i", sel.data, base + 24)[0]
    if mask != 0xFFFFFFFF or offset != _IPV4_SRC_OFFSET:
        return None
    return str(ipaddress.IPv4Address(value))


def read_link(ipr: Any, ifname: str) -> LinkState:
    """What the kernel has on the link's egress root now."""
    index = _link_index(ipr, ifname)
    kind, qdisc_handle, default_classid = "", 0, 0
    for qdisc in ipr.get_qdiscs(index=index):
        if qdisc["parent"] != TC_H_ROOT:
            continue
        kind = qdisc.get_attr("TCA_KIND") or ""
        qdisc_handle = qdisc["handle"]
        if kind == "htb":
            init = qdisc.get_attr("TCA_OPTIONS").get_attr("TCA_HTB_INIT")
            default_classid = (qdisc_handle & 0xFFFF0000) | init["defcls"]
    if kind != "htb":
        return LinkState(kind, qdisc_handle, 0, (), ())
    classes = []
    for msg in ipr.get_classes(index=index):
        options = msg.get_attr("TCA_OPTIONS")
        params = options.get_attr("TCA_HTB_PARMS") if options is not None else None
        if params is None:
            continue
        classes.append(
            LinkClass(
                classid=msg["handle"],
                # HTB reports a top-level class's parent as the root; the plan names the qdisc.
                parent=qdisc_handle if msg["parent"] == TC_H_ROOT else msg["parent"],
                rate_bytes=options.get_attr("TCA_HTB_RATE64") or params["rate"],
                ceil_bytes=options.get_attr("TCA_HTB_CEIL64") or params["ceil"],
                quantum_bytes=params["quantum"],
            )
        )
    filters = []
    for msg in ipr.get_filters(index=index, parent=qdisc_handle):
        options = msg.get_attr("TCA_OPTIONS")
        if options is None or msg.get_attr("TCA_KIND") != "u32":
            continue
        target = options.get_attr("TCA_U32_CLASSID")
        if target is None:  # hash table headers, not rules
            continue
        info = msg["info"]
        filters.append(
            LinkFilter(
                handle=msg["handle"],
                prio=info >> 16,
                protocol=int.from_bytes((info & 0xFFFF).to_bytes(2, "little"), "big"),
                classid=target,
                ip=_u32_source_ip(options),
            )
        )
    return LinkState("htb", qdisc_handle, default_classid, tuple(classes), tuple(filters))


# ------------------------------------------------------------------------------------------------- diff


def _same_class(spec: HTBClass, have: LinkClass) -> bool:
    # The kernel keeps bytes/s; a plan in bits/s may differ by the truncated remainder.
    return (
        spec.parent == have.parent
        and abs(spec.rate_bps // 8 - have.rate_bytes) <= 1
        and abs(spec.ceil_bps // 8 - have.ceil_bytes) <= 1
        and spec.quantum_bytes == have.quantum_bytes
    )


def _free_handles(used: set[int]) -> list[int]:
    return [_U32_HT | node for node in range(1, _U32_MAX_NODE + 1) if _U32_HT | node not in used]


def diff(plan: NetQoSPlan, state: LinkState) -> list[Operation]:
    """The operations that turn ``state`` into ``plan``, in an order the kernel accepts: the qdisc (replaced when
    it is not the plan's), stale filters away, stale classes away (children first), classes added or changed
    (parents first), then the missing filters."""
    ops: list[Operation] = []
    fresh = (
        state.qdisc_kind != "htb"
        or state.qdisc_handle != plan.qdisc_handle
        or state.default_classid != plan.default_classid
    )
    if fresh:
        ops.append(ReplaceQdisc(plan.qdisc_handle, plan.default_classid & 0xFFFF))
        state = LinkState("htb", plan.qdisc_handle, plan.default_classid, (), ())
    kept = _kept_filters(plan, state, ops)
    _class_ops(plan, state, ops)
    _new_filter_ops(plan, kept, ops)
    return ops


def _kept_filters(plan: NetQoSPlan, state: LinkState, ops: list[Operation]) -> dict[str, LinkFilter]:
    """The filters that stay as they are, by pod IP; a delete for every other one goes to ``ops``."""
    wanted_filters = {f.ip: f for f in plan.filters}
    kept: dict[str, LinkFilter] = {}
    for have in state.filters:
        want = wanted_filters.get(have.ip) if have.ip is not None else None
        if (
            want is not None
            and have.ip not in kept
            and have.classid == want.classid
            and have.prio == FILTER_PRIO
            and have.protocol == ETH_P_IP
        ):
            kept[have.ip] = have
            continue
        ops.append(DeleteFilter(state.qdisc_handle, have.handle, have.prio, have.protocol))
    return kept


def _class_ops(plan: NetQoSPlan, state: LinkState, ops: list[Operation]) -> None:
    wanted_classes = plan.class_by_id()
    existing = {c.classid: c for c in state.classes}
    stale = [
        c for c in state.classes if c.classid not in wanted_classes or c.parent != wanted_classes[c.classid].parent
    ]
    stale_ids = {c.classid for c in stale}

    def depth(cls: LinkClass) -> int:
        level, parent = 0, cls.parent
        while parent in existing and level < 16:
            level, parent = level + 1, existing[parent].parent
        return level

    # Children before parents; a class whose parent goes away goes too (the kernel would refuse).
    for have in state.classes:
        if have.classid not in stale_ids and have.parent in stale_ids:
            stale.append(have)
            stale_ids.add(have.classid)
    for have in sorted(stale, key=depth, reverse=True):
        ops.append(DeleteClass(have.classid, have.parent))

    for spec in plan.classes:  # the plan lists parents first
        have = existing.get(spec.classid)
        if have is None or spec.classid in stale_ids:
            ops.append(AddClass(spec))
        elif not _same_class(spec, have):
            ops.append(ChangeClass(spec))


def _new_filter_ops(plan: NetQoSPlan, kept: dict[str, LinkFilter], ops: list[Operation]) -> None:
    free = iter(_free_handles({f.handle for f in kept.values()}))
    for want in plan.filters:
        if want.ip in kept:
            continue
        try:
            handle = next(free)
        except StopIteration:
            raise NetQoSApplyError("more than 4095 pod IPs on one link") from None
        ops.append(AddFilter(handle, want))


# ------------------------------------------------------------------------------------------------ apply


def _rate(bps: int) -> str:
    return f"{bps}bit"


def _run(ipr: Any, index: int, op: Operation) -> None:
    if isinstance(op, ReplaceQdisc):
        try:
            ipr.tc("del", index=index, parent=TC_H_ROOT)
        except NetlinkError as exc:
            if exc.code not in (_ENOENT,):  # no qdisc of our own yet: nothing to remove
                raise
        ipr.tc("add", "htb", index, op.handle, default=op.default_minor)
    elif isinstance(op, AddClass | ChangeClass):
        spec = op.spec
        command = "add-class" if isinstance(op, AddClass) else "change-class"
        ipr.tc(
            command,
            "htb",
            index,
            spec.classid,
            parent=spec.parent,
            rate=_rate(spec.rate_bps),
            ceil=_rate(spec.ceil_bps),
            quantum=spec.quantum_bytes,
        )
    elif isinstance(op, DeleteClass):
        ipr.tc("del-class", index=index, handle=op.classid, parent=op.parent)
    elif isinstance(op, AddFilter):
        address = int(ipaddress.IPv4Address(op.spec.ip))
        ipr.tc(
            "add-filter",
            "u32",
            index,
            parent=_qdisc_of(op.spec.classid),
            prio=FILTER_PRIO,
            protocol=ETH_P_IP,
            handle=op.handle,
            target=op.spec.classid,
            keys=[f"0x{address:08x}/0xffffffff+{_IPV4_SRC_OFFSET}"],
        )
    else:
        ipr.tc(
            "del-filter",
            "u32",
            index,
            parent=op.parent,
            prio=op.prio,
            protocol=op.protocol,
            handle=op.handle,
            target=0,
        )


def _qdisc_of(classid: int) -> int:
    return classid & 0xFFFF0000


def describe(op: Operation) -> str:
    if isinstance(op, ReplaceQdisc):
        return f"qdisc htb {format_handle(op.handle)} default {op.default_minor:x}"
    if isinstance(op, AddClass | ChangeClass):
        verb = "add" if isinstance(op, AddClass) else "change"
        spec = op.spec
        return (
            f"{verb} class {format_handle(spec.classid)} parent {format_handle(spec.parent)} "
            f"rate {spec.rate_bps}bit ceil {spec.ceil_bps}bit"
        )
    if isinstance(op, DeleteClass):
        return f"delete class {format_handle(op.classid)}"
    if isinstance(op, AddFilter):
        return f"add filter src {op.spec.ip} -> {format_handle(op.spec.classid)}"
    return f"delete filter {op.handle:#x}"


def apply(ipr: Any, ifname: str, plan: NetQoSPlan) -> list[Operation]:
    """Make the link match ``plan``; returns the operations carried out (empty when it already did)."""
    index = _link_index(ipr, ifname)
    ops = diff(plan, read_link(ipr, ifname))
    for op in ops:
        try:
            _run(ipr, index, op)
        except NetlinkError as exc:
            raise NetQoSApplyError(f"{ifname}: {describe(op)}: {exc}") from exc
        _log.debug("%s: %s", ifname, describe(op))
    if ops:
        _log.info("%s: network QoS updated with %d changes", ifname, len(ops))
    return ops


def remove(ipr: Any, ifname: str, plan_handle: int) -> bool:
    """Take our HTB qdisc (and with it every class and filter) off the link; False when it was not there."""
    state = read_link(ipr, ifname)
    if state.qdisc_kind != "htb" or state.qdisc_handle != plan_handle:
        return False
    index = _link_index(ipr, ifname)
    try:
        ipr.tc("del", index=index, parent=TC_H_ROOT)
    except NetlinkError as exc:
        raise NetQoSApplyError(f"{ifname}: delete qdisc: {exc}") from exc
    return True


def open_iproute() -> Any:
    """An rtnetlink socket in the agent's network namespace (close it after use)."""
    from pyroute2.iproute.linux import IPRoute

    return IPRoute()
