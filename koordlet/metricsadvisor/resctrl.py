"""Resctrl monitoring of the QoS groups (gate ``ResctrlCollector`` with ``-enable-resctrl-collector``;
Koordinator metricsadvisor/collectors/resctrl): LLC occupancy and memory bandwidth of the ``LSR``, ``LS`` and
``BE`` resctrl groups (those the ``RdtResctrl`` strategy makes) per L3 domain, from their ``mon_data``.

LLC occupancy is a level (bytes) and is stored as read. Memory bandwidth (``mbm_total_bytes``,
``mbm_local_bytes``) is a byte counter: the collector stores its rate, bytes per second over the interval
between two reads (Koordinator stores the raw counter under ``memory bandwidth``). A counter that went back
was reset (the group was made again, its RMID reused): that interval gives no rate and the new value
becomes the base; a counter that went back from above 2^63 to below 2^62 wrapped at 2^64 and the rate is
taken across the wrap. A value the kernel reports ``Unavailable`` gives no sample, and the next value
after it restarts the rate.

The collector is on only where the kernel monitors: ``info/L3_MON/mon_features`` names ``llc_occupancy``
or the ``mbm_*`` events (Koordinator checks the CPU flags ``cqm_llc``/``cqm_occup_llc``/``cqm_mbm_*``);
without it, it says so once at start and stays off.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from koordlet.metriccache import RESCTRL_TYPE_MB, Label, MetricKind, Sample, SeriesKey
from koordlet.system.resctrl import LLC_OCCUPANCY, MBM_LOCAL_BYTES, MBM_TOTAL_BYTES, read_mon_data, read_mon_features

logger = logging.getLogger(__name__)

GROUPS = ("LSR", "LS", "BE")  # Koordinator's QoS groups (qosmanager resctrl)
_MBM_EVENTS = (MBM_TOTAL_BYTES, MBM_LOCAL_BYTES)
_WRAP = 1 << 64


def counter_delta(before: int, after: int) -> int | None:
    """Bytes counted between two reads; None when the counter was reset (went back without wrapping)."""
    if after >= before:
        return after - before
    if before >= 1 << 63 and after < 1 << 62:  # wrapped at 2^64
        return after + _WRAP - before
    return None


class ResctrlCollector:
    name = "resctrl"

    def __init__(self, resctrl_dir: str, interval_s: float = 10.0,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.interval_s = interval_s
        self._dir = resctrl_dir
        self._monotonic = monotonic
        self._events: frozenset[str] = frozenset()
        self._previous: dict[tuple[str, int, str], tuple[float, int]] = {}  # (group, cache, event) → (t, bytes)
        self._keys: dict[tuple[str, int, str], SeriesKey] = {}

    def enabled(self) -> bool:
        features = read_mon_features(self._dir)
        self._events = features & {LLC_OCCUPANCY, *_MBM_EVENTS}
        if not self._events:
            logger.info("resctrl collector off: %s has no monitoring (info/L3_MON/mon_features names no "
                        "llc_occupancy or mbm_* event)", self._dir)
            return False
        logger.info("resctrl collector on: %s for groups %s", ", ".join(sorted(self._events)), ", ".join(GROUPS))
        return True

    def _key(self, group: str, cache_id: int, event: str) -> SeriesKey:
        ident = (group, cache_id, event)
        key = self._keys.get(ident)
        if key is None:
            if event == LLC_OCCUPANCY:
                key = SeriesKey.of(MetricKind.RESCTRL_LLC, **{Label.QOS: group, Label.CACHE_ID: str(cache_id)})
            else:
                key = SeriesKey.of(MetricKind.RESCTRL_MB, **{
                    Label.QOS: group, Label.CACHE_ID: str(cache_id), Label.RESCTRL_TYPE: RESCTRL_TYPE_MB,
                    Label.RESCTRL_MB_TYPE: event})
            self._keys[ident] = key
        return key

    def collect(self, now: float) -> list[Sample]:
        samples: list[Sample] = []
        read_at = self._monotonic()
        seen: set[tuple[str, int, str]] = set()
        for group in GROUPS:
            for domain in read_mon_data(self._dir, group, self._events):
                for event, value in domain.values:
                    if value is None:
                        continue
                    ident = (group, domain.cache_id, event)
                    if event == LLC_OCCUPANCY:
                        samples.append(Sample(self._key(*ident), now, float(value)))
                        continue
                    seen.add(ident)
                    rate = self._rate(ident, read_at, value)
                    if rate is not None:
                        samples.append(Sample(self._key(*ident), now, rate))
        for gone in set(self._previous) - seen:  # a group removed, a value unavailable: start over
            del self._previous[gone]
        return samples

    def _rate(self, ident: tuple[str, int, str], read_at: float, value: int) -> float | None:
        previous = self._previous.get(ident)
        self._previous[ident] = (read_at, value)
        if previous is None:
            return None
        elapsed = read_at - previous[0]
        delta = counter_delta(previous[1], value)
        if delta is None:
            logger.debug("resctrl %s counter of %s/%d reset (%d after %d)", ident[2], ident[0], ident[1], value,
                         previous[1])
            return None
        return delta / elapsed if elapsed > 0 else None
