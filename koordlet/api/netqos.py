"""Network QoS values shared by the planner (``koordlet.netqos.plan``) and the tc state code
(``koordlet.system.tc``): tc handles and the HTB qdisc, classes and filters one uplink should carry."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["HTBClass", "IPFilter", "NetQoSPlan", "format_handle", "handle"]


def handle(major: int, minor: int) -> int:
    """tc handle ``major:minor`` as the kernel stores it."""
    return (major << 16) | minor


def format_handle(value: int) -> str:
    return f"{value >> 16:x}:{value & 0xFFFF:x}"


@dataclass(frozen=True, slots=True)
class HTBClass:
    classid: int
    parent: int
    rate_bps: int
    ceil_bps: int
    quantum_bytes: int


@dataclass(frozen=True, slots=True)
class IPFilter:
    """Send packets whose source address is ``ip`` to class ``classid``."""

    ip: str
    classid: int


@dataclass(frozen=True, slots=True)
class NetQoSPlan:
    qdisc_handle: int
    default_classid: int
    classes: tuple[HTBClass, ...]
    filters: tuple[IPFilter, ...]

    def class_by_id(self) -> dict[int, HTBClass]:
        return {c.classid: c for c in self.classes}
