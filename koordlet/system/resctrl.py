"""Reads of the resctrl filesystem (``/sys/fs/resctrl``): the node's RDT capabilities and the monitoring
counters of a group.

Every reader takes the resctrl mount dir ``resctrl_dir`` (:mod:`koordlet.system.roots`). Writes (schemata,
tasks, group dirs) and the reads of a group's files go through the executor.

Monitoring (the kernel's layout, Documentation/arch/x86/resctrl.rst): ``info/L3_MON/mon_features`` names the
events the CPU counts (``llc_occupancy``, ``mbm_total_bytes``, ``mbm_local_bytes``); every control group
(and the root) has ``mon_data/mon_L3_<cache id, two digits>/<event>``, a decimal count of bytes, or
``Unavailable``/``Error`` while the hardware has no value for the group's RMID.
"""

from __future__ import annotations

import os
import re
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


MON_FEATURES_FILE = ("info", "L3_MON", "mon_features")
LLC_OCCUPANCY = "llc_occupancy"
MBM_TOTAL_BYTES = "mbm_total_bytes"
MBM_LOCAL_BYTES = "mbm_local_bytes"
MON_EVENTS = (LLC_OCCUPANCY, MBM_TOTAL_BYTES, MBM_LOCAL_BYTES)
_MON_L3_DIR = re.compile(r"^mon_L3_(\d+)$")


def read_mon_features(resctrl_dir: str) -> frozenset[str]:
    """The monitoring events of this CPU and kernel (``info/L3_MON/mon_features``); empty without monitoring."""
    try:
        with open(os.path.join(resctrl_dir, *MON_FEATURES_FILE), encoding="ascii", errors="replace") as f:
            return frozenset(line.strip() for line in f if line.strip())
    except OSError:
        return frozenset()


@dataclass(frozen=True, slots=True)
class MonDomain:
    """One L3 domain's counters of one group: event → bytes (None: the kernel has no value now)."""

    cache_id: int
    values: tuple[tuple[str, int | None], ...]

    def value(self, event: str) -> int | None:
        return dict(self.values).get(event)


def _counter(path: str) -> int | None:
    """A counter file: its bytes, or None for ``Unavailable``/``Error`` (the RMID has no value now)."""
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            text = f.read().strip()
    except FileNotFoundError:
        return None
    try:
        return int(text)
    except ValueError:
        return None


def read_mon_data(resctrl_dir: str, group: str,
                  events: frozenset[str] = frozenset(MON_EVENTS)) -> tuple[MonDomain, ...]:
    """The ``events`` counters of each L3 domain of ``group`` ("" = the root group), sorted by cache id; ()
    when the group (or its ``mon_data``) does not exist."""
    base = os.path.join(resctrl_dir, group, "mon_data") if group else os.path.join(resctrl_dir, "mon_data")
    try:
        names = os.listdir(base)
    except OSError:
        return ()
    domains = []
    for name in names:
        match = _MON_L3_DIR.match(name)
        if match is None:
            continue
        domain_dir = os.path.join(base, name)
        values = tuple((event, _counter(os.path.join(domain_dir, event))) for event in MON_EVENTS if event in events)
        domains.append(MonDomain(int(match.group(1)), values))
    return tuple(sorted(domains, key=lambda d: d.cache_id))
