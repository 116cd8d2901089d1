"""Reads of the resctrl filesystem (``/sys/fs/resctrl``): the node's RDT capabilities.

Every reader takes the resctrl mount dir ``resctrl_dir`` (:mod:`koordlet.system.roots`). Writes (schemata,
tasks, group dirs) and the reads of a group's files go through the executor.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from koordlet.api.resctrl import VENDOR_INTEL, ResctrlMathError


class ResctrlInfoError(ResctrlMathError):
    """The resctrl tree cannot be understood (bad cbm_mask or schemata)."""


@dataclass(frozen=True, slots=True)
class ResctrlInfo:
    cbm_mask: int
    cache_ids: tuple[int, ...]
    has_mb: bool = True
    vendor: str = VENDOR_INTEL


def read_resctrl_info(resctrl_dir: str, vendor: str = VENDOR_INTEL) -> ResctrlInfo | None:
    """``info/L3/cbm_mask`` and the cache ids of the root ``schemata``; None when RDT is absent."""
    try:
        with open(os.path.join(resctrl_dir, "info", "L3", "cbm_mask"), encoding="ascii") as f:
            cbm_text = f.read().strip()
        with open(os.path.join(resctrl_dir, "schemata"), encoding="ascii") as f:
            schemata = f.read()
    except FileNotFoundError:
        return None
    try:
        cbm = int(cbm_text, 16)
    except ValueError as exc:
        raise ResctrlInfoError(f"bad cbm_mask {cbm_text!r}") from exc
    cache_ids: list[int] = []
    has_mb = False
    for line in schemata.splitlines():
        kind, _, entries = line.strip().partition(":")
        kind = kind.strip()
        if kind == "MB":
            has_mb = True
        if kind != "L3":
            continue
        for entry in entries.split(";"):
            cache_id, _, _ = entry.partition("=")
            try:
                cache_ids.append(int(cache_id))
            except ValueError as exc:
                raise ResctrlInfoError(f"bad L3 entry {entry!r} in schemata") from exc
    if not cache_ids:
        raise ResctrlInfoError("no L3 line in the root schemata")
    return ResctrlInfo(cbm, tuple(sorted(cache_ids)), has_mb, vendor)
