"""Resctrl schemata maths (docs/koordinator.md §3.3, §4.7), shared by the class-level resctrl
strategy (koordlet.qosmanager.resctrl) and the pod-level resctrl hook (hooks.resctrl)."""

from __future__ import annotations

import math

VENDOR_INTEL = "intel"
VENDOR_AMD = "amd"
AMD_MB_UNLIMITED = 2048


class ResctrlMathError(ValueError):
    """A cbm mask or a cache range that cannot give a schemata."""


def l3_mask(cbm_mask: int, start_percent: int, end_percent: int) -> int:
    """Bits [ceil(ways × start/100), ceil(ways × end/100)) of a contiguous cbm (docs/koordinator.md §3.3)."""
    ways = cbm_mask.bit_length()
    if cbm_mask <= 0 or bin(cbm_mask).count("1") != ways:
        raise ResctrlMathError(f"cbm_mask {cbm_mask:x} is not a contiguous block from bit 0")
    if not 0 <= start_percent < end_percent <= 100:
        raise ResctrlMathError(f"bad cache range [{start_percent}, {end_percent})")
    start_way = math.ceil(ways * start_percent / 100)
    end_way = math.ceil(ways * end_percent / 100)
    return (1 << end_way) - (1 << start_way)


def mb_value(percent: int, vendor: str) -> int:
    if vendor == VENDOR_AMD:
        return AMD_MB_UNLIMITED if percent >= 100 else int(25 * 8 * 0.8 * percent / 100)
    return min(math.ceil(percent / 10) * 10, 100)
