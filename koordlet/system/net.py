"""Network facts of the node: the default route's interface (``/proc/net/route``) and a link's speed
(``/sys/class/net/<if>/speed``), under ``proc_dir`` / ``sys_dir`` (:mod:`koordlet.system.roots`)."""

from __future__ import annotations

import os

from koordlet.system.roots import PROC_DIR, SYS_DIR

_RTF_UP = 0x1


class UplinkError(OSError):
    """No uplink named and no default route to find one."""


def default_route_interface(proc_dir: str = PROC_DIR) -> str:
    """The interface of the IPv4 default route (destination and mask 0, up), from ``<proc_dir>/net/route``."""
    path = os.path.join(proc_dir, "net", "route")
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


def link_speed_bps(ifname: str, sys_dir: str = SYS_DIR) -> int:
    """The link's speed in bits/s from ``<sys_dir>/class/net/<if>/speed``; 0 when unknown (down, virtual)."""
    path = os.path.join(sys_dir, "class", "net", ifname, "speed")
    try:
        with open(path, encoding="ascii") as file:
            mbit = int(file.read().strip())
    except (OSError, ValueError):  # the kernel answers EINVAL for a link that is down
        return 0
    return mbit * 1_000_000 if mbit > 0 else 0
