"""In-memory metric cache, bounded by construction.

Koordinator keeps its samples in an embedded Prometheus TSDB on disk (docs/koordinator.md §7.2) and its
users see the agent grow past its 256 MiB limit. Here every series is a ring of preallocated
``array('d')`` slots (8 bytes per timestamp and 8 per value; a list of Python floats costs 4× that),
so memory is set by (number of live series × capacity) and never by uptime. Series of pods and
containers that are gone are dropped by :meth:`MetricCache.gc`.

Capacity is per metric kind: node-level kinds keep 30 min at 1 s (the longest NodeMetric aggregate
window, docs/koordinator.md §5.3), pod and container kinds keep 10 min (twice the default 300 s aggregateDuration).
Both are constructor arguments.

Concurrency: one writer (the collector runner) and any number of readers. Writes and the copy-out
of a query window happen under one lock; aggregation happens outside it on the copy.

Percentiles use the nearest-rank method: for p in [0, 100] and n samples sorted ascending, the
result is the sample at 1-based rank ceil(p/100 × n) (rank 1 for p = 0), i.e. the smallest sample
such that at least p % of the samples are less than or equal to it. It always returns an observed
value and never interpolates.
"""

from __future__ import annotations

import logging
import math
import threading
from array import array
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from koordlet.metriccache.series import GPU_DEVICES_KV, GPUDevice, Label, MetricKind, Sample, SeriesKey

logger = logging.getLogger(__name__)

NODE_WINDOW_CAPACITY = 1800  # 30 min at 1 s
POD_WINDOW_CAPACITY = 600  # 10 min at 1 s
# PSI: what reads it is the /metrics export (the latest sample, stale after three intervals), and the kernel's
# avg10/avg60/avg300 already are windows. 18 series per cgroup: at 150 pods 60 samples each cost ~5 MiB.
PSI_WINDOW_CAPACITY = 3
PER_CPU_WINDOW_CAPACITY = 300  # 5 min at 1 s per CPU: 256 CPUs stay near 1.2 MiB
# Pod and container usage: most pods are read once a fan-out interval (10 s), a few every second
# (metricsadvisor/pods.py): each keeps 10 min, in as many slots as that takes.
POD_WINDOW_RETENTION_S = 600.0
_RETAINED_POD_KINDS = (
    MetricKind.POD_CPU_USAGE, MetricKind.POD_MEMORY_USAGE, MetricKind.POD_MEMORY_USAGE_WITH_PAGE_CACHE,
    MetricKind.POD_CPU_THROTTLED, MetricKind.CONTAINER_CPU_USAGE, MetricKind.CONTAINER_MEMORY_USAGE,
    MetricKind.CONTAINER_MEMORY_USAGE_WITH_PAGE_CACHE, MetricKind.CONTAINER_CPU_THROTTLED,
)
# The Alpha collectors' kinds keep about 10 min at their default intervals (CPI 60 s, resctrl 10 s, cold
# pages 5 s): what their consumers look at, and a bounded share of the agent's memory at 150 pods.
CPI_WINDOW_CAPACITY = 10
RESCTRL_WINDOW_CAPACITY = 60
COLD_PAGE_WINDOW_CAPACITY = 120
_COLD_PAGE_KINDS = (MetricKind.NODE_MEMORY_WITH_HOT_PAGE_USAGE, MetricKind.POD_MEMORY_WITH_HOT_PAGE_USAGE,
                    MetricKind.CONTAINER_MEMORY_WITH_HOT_PAGE_USAGE, MetricKind.HOST_APP_MEMORY_WITH_HOT_PAGE_USAGE,
                    MetricKind.NODE_MEMORY_COLD_PAGE_SIZE, MetricKind.POD_MEMORY_COLD_PAGE_SIZE,
                    MetricKind.CONTAINER_MEMORY_COLD_PAGE_SIZE, MetricKind.HOST_APP_MEMORY_COLD_PAGE_SIZE)

_NO_SERIES: Mapping[SeriesKey, _Ring] = MappingProxyType({})

DEFAULT_CAPACITY_BY_KIND: Mapping[str, int] = {
    **{kind.value: POD_WINDOW_CAPACITY for kind in MetricKind if kind.value.startswith(("pod_", "container_"))},
    **{kind.value: PSI_WINDOW_CAPACITY for kind in MetricKind if kind.value.endswith("_psi")},
    MetricKind.NODE_PER_CPU_USAGE.value: PER_CPU_WINDOW_CAPACITY,
    MetricKind.CONTAINER_CPI.value: CPI_WINDOW_CAPACITY,
    MetricKind.RESCTRL_LLC.value: RESCTRL_WINDOW_CAPACITY,
    MetricKind.RESCTRL_MB.value: RESCTRL_WINDOW_CAPACITY,
    **{kind.value: COLD_PAGE_WINDOW_CAPACITY for kind in _COLD_PAGE_KINDS},
}


DEFAULT_RETENTION_BY_KIND: Mapping[str, float] = {kind.value: POD_WINDOW_RETENTION_S for kind in _RETAINED_POD_KINDS}


@dataclass(frozen=True, slots=True)
class Aggregate:
    """The samples of one series inside a query window, with the aggregates Koordinator's querier offers."""

    first_timestamp: float
    last_timestamp: float
    last: float
    count: int
    avg: float
    sorted_values: tuple[float, ...]  # the window's values, ascending

    def percentile(self, p: float) -> float:
        """Nearest-rank percentile (see module docstring); p in [0, 100]."""
        if not 0.0 <= p <= 100.0:
            raise ValueError(f"percentile must be within [0, 100], got {p}")
        rank = max(math.ceil(p / 100.0 * self.count), 1)
        return self.sorted_values[rank - 1]

    @property
    def p50(self) -> float:
        return self.percentile(50)

    @property
    def p90(self) -> float:
        return self.percentile(90)

    @property
    def p95(self) -> float:
        return self.percentile(95)

    @property
    def p99(self) -> float:
        return self.percentile(99)

    @property
    def time_range_duration(self) -> float:
        """Seconds from the first to the last sample in the window (Koordinator's TimeRangeDuration)."""
        return self.last_timestamp - self.first_timestamp


class _Ring:
    """Ring of at most ``capacity`` (timestamp, value), timestamps strictly increasing.

    Every slot holds a sample (``size`` is the arrays' length); ``head`` is the oldest, the next one overwritten. The
    arrays grow as samples arrive until they hold ``capacity``, and only then wrap: a series seen for a minute costs a
    minute of samples, not a full window preallocated. With ``retention_s`` they stop growing once the oldest sample is
    that old, and wrap there: a series written every 10 s keeps its ``retention_s`` in a tenth of the slots of one
    written every second (and grows again, up to ``capacity``, if it is written more often later)."""

    __slots__ = ("capacity", "head", "retention_s", "size", "timestamps", "values")

    def __init__(self, capacity: int, retention_s: float | None = None) -> None:
        self.capacity = capacity
        self.retention_s = retention_s
        self.timestamps = array("d")
        self.values = array("d")
        self.head = 0  # the oldest sample: the next slot overwritten once the ring wraps
        self.size = 0

    def last_index(self) -> int:
        return (self.head - 1) % self.size

    def append(self, timestamp: float, value: float) -> bool:
        size, head = self.size, self.head
        if size and timestamp <= self.timestamps[(head - 1) % size]:
            return False
        retention = self.retention_s
        if size < self.capacity and (retention is None or not size or self.timestamps[head] >= timestamp - retention):
            if head == 0:  # growing at the end: the oldest stays first
                self.timestamps.append(timestamp)
                self.values.append(value)
            else:  # a wrapped ring grows between its newest and its oldest
                self.timestamps.insert(head, timestamp)
                self.values.insert(head, value)
                self.head = head + 1
            self.size = size + 1
        else:
            self.timestamps[head] = timestamp
            self.values[head] = value
            self.head = (head + 1) % size
        return True

    def _physical(self, logical: int) -> int:
        return (self.head + logical) % self.size

    def _lower_bound(self, timestamp: float) -> int:
        """First logical index whose timestamp is >= timestamp."""
        low, high = 0, self.size
        stamps, phys = self.timestamps, self._physical
        while low < high:
            mid = (low + high) // 2
            if stamps[phys(mid)] < timestamp:
                low = mid + 1
            else:
                high = mid
        return low

    def _upper_bound(self, timestamp: float) -> int:
        """First logical index whose timestamp is > timestamp."""
        low, high = 0, self.size
        stamps, phys = self.timestamps, self._physical
        while low < high:
            mid = (low + high) // 2
            if stamps[phys(mid)] <= timestamp:
                low = mid + 1
            else:
                high = mid
        return low

    def last_in(self, start: float, end: float) -> float | None:
        """The value of the newest sample with start <= timestamp <= end (usually the newest of all)."""
        if not self.size:
            return None
        phys = self.last_index()
        stamp = self.timestamps[phys]
        if stamp > end:
            stop = self._upper_bound(end)
            if not stop:
                return None
            phys = self._physical(stop - 1)
            stamp = self.timestamps[phys]
        return self.values[phys] if stamp >= start else None

    def window(self, start: float, end: float) -> tuple[float, float, list[float]] | None:
        """(first timestamp, last timestamp, values in time order) of samples with start <= t <= end."""
        begin, stop = self._lower_bound(start), self._upper_bound(end)
        if begin >= stop:
            return None
        first, last = self._physical(begin), self._physical(stop - 1)
        if first <= last:
            values = self.values[first : last + 1].tolist()
        else:
            values = self.values[first:].tolist() + self.values[: last + 1].tolist()
        return self.timestamps[first], self.timestamps[last], values


class MetricCache:
    """Series of samples in fixed rings, plus a static key/value store for node information."""

    def __init__(
        self,
        default_capacity: int = NODE_WINDOW_CAPACITY,
        capacity_by_kind: Mapping[str, int] | None = None,
        retention_by_kind: Mapping[str, float] | None = None,
    ) -> None:
        """``capacity_by_kind``: the most samples a series of each kind keeps (``default_capacity`` for the rest);
        ``retention_by_kind``: how long back a series of each kind keeps samples when fewer slots hold that (the
        rest: up to their capacity)."""
        if default_capacity < 1:
            raise ValueError("capacity must be at least 1")
        by_kind = dict(DEFAULT_CAPACITY_BY_KIND if capacity_by_kind is None else capacity_by_kind)
        bad = {kind: cap for kind, cap in by_kind.items() if cap < 1}
        if bad:
            raise ValueError(f"capacities must be at least 1: {bad}")
        self._default_capacity = default_capacity
        self._capacity_by_kind = by_kind
        self._retention_by_kind = dict(DEFAULT_RETENTION_BY_KIND if retention_by_kind is None else retention_by_kind)
        # Series by kind: the readers that scan (last_values, last_by_key, keys) visit one kind's series only,
        # not every series of the node (with every gate on, 18 PSI series per pod and container alone).
        self._series: dict[str, dict[SeriesKey, _Ring]] = {}
        self._kv: dict[str, object] = {}
        self._lock = threading.Lock()
        self._rejected = 0

    def capacity_of(self, kind: str) -> int:
        return self._capacity_by_kind.get(kind, self._default_capacity)

    # ---------------------------------------------------------------------------------------- writing

    def append(self, key: SeriesKey, timestamp: float, value: float) -> bool:
        """Add one sample; False (and counted) when it is not newer than the series' last sample."""
        with self._lock:
            ring = self._ring_for(key)
            accepted = ring.append(timestamp, value)
            if not accepted:
                self._rejected += 1
            return accepted

    def append_samples(self, samples: Iterable[Sample]) -> int:
        """Add many samples under one lock; returns how many were accepted."""
        accepted = 0
        with self._lock:
            ring_for = self._ring_for
            for sample in samples:
                ring = ring_for(sample.key)
                if ring.append(sample.timestamp, sample.value):
                    accepted += 1
                else:
                    self._rejected += 1
        return accepted

    def _ring_for(self, key: SeriesKey) -> _Ring:
        """The series' ring, made on its first sample (call under the lock)."""
        of_kind = self._series.get(key.kind)
        if of_kind is None:
            of_kind = self._series[key.kind] = {}
        ring = of_kind.get(key)
        if ring is None:
            ring = of_kind[key] = _Ring(self.capacity_of(key.kind), self._retention_by_kind.get(key.kind))
        return ring

    def _ring(self, key: SeriesKey) -> _Ring | None:
        of_kind = self._series.get(key.kind)
        return None if of_kind is None else of_kind.get(key)

    def gc(self, live_pod_uids: Collection[str], live_container_ids: Collection[str]) -> int:
        """Drop series labelled with a pod uid or container id that is not live; returns how many."""
        return self.drop_where(
            lambda key: (
                ((pod := key.label(Label.POD_UID)) is not None and pod not in live_pod_uids)
                or ((container := key.label(Label.CONTAINER_ID)) is not None and container not in live_container_ids)
            )
        )

    def drop_where(self, predicate: Callable[[SeriesKey], bool]) -> int:
        with self._lock:
            doomed = [key for of_kind in self._series.values() for key in of_kind if predicate(key)]
            for key in doomed:
                del self._series[key.kind][key]
        if doomed:
            logger.debug("metric cache dropped %d series", len(doomed))
        return len(doomed)

    # ---------------------------------------------------------------------------------------- reading

    def latest(self, key: SeriesKey) -> tuple[float, float] | None:
        """(timestamp, value) of the newest sample, or None."""
        with self._lock:
            ring = self._ring(key)
            if ring is None or ring.size == 0:
                return None
            index = ring.last_index()
            return ring.timestamps[index], ring.values[index]

    def query(self, key: SeriesKey, start: float, end: float) -> Aggregate | None:
        """Aggregate of the samples with start <= timestamp <= end, or None when there are none."""
        with self._lock:
            ring = self._ring(key)
            window = ring.window(start, end) if ring is not None else None
        if window is None:
            return None
        first, last, values = window
        count = len(values)
        return Aggregate(
            first_timestamp=first,
            last_timestamp=last,
            last=values[-1],
            count=count,
            avg=math.fsum(values) / count,
            sorted_values=tuple(sorted(values)),
        )

    def last_value(self, key: SeriesKey, start: float, end: float) -> float | None:
        """``query(key, start, end).last`` without aggregating the window: the newest value in it, or None."""
        with self._lock:
            ring = self._ring(key)
            return ring.last_in(start, end) if ring is not None else None

    def last_values(self, kind: str, label: str, start: float, end: float) -> dict[str, float]:
        """{value of ``label``: newest value with start <= timestamp <= end} over the series of ``kind`` that
        carry ``label`` and have a sample in the window (one pass, one lock)."""
        out: dict[str, float] = {}
        with self._lock:
            for key, ring in self._series.get(kind, _NO_SERIES).items():
                ident = key.label(label)
                if ident is None:
                    continue
                value = ring.last_in(start, end)
                if value is not None:
                    out[ident] = value
        return out

    def last_values_of(self, keys: Mapping[str, SeriesKey], start: float, end: float) -> dict[str, float]:
        """{name: newest value with start <= timestamp <= end} of the series ``keys`` names, those that have one: a
        lookup each, not a pass over every series of a kind (for the few wanted of many)."""
        out: dict[str, float] = {}
        with self._lock:
            series = self._series
            for name, key in keys.items():
                of_kind = series.get(key.kind)
                ring = of_kind.get(key) if of_kind is not None else None
                value = ring.last_in(start, end) if ring is not None else None
                if value is not None:
                    out[name] = value
        return out

    def last_by_key(self, kind: str, start: float, end: float) -> dict[SeriesKey, float]:
        """{series of ``kind``: its newest value with start <= timestamp <= end} (one pass, one lock)."""
        out: dict[SeriesKey, float] = {}
        with self._lock:
            for key, ring in self._series.get(kind, _NO_SERIES).items():
                value = ring.last_in(start, end)
                if value is not None:
                    out[key] = value
        return out

    def keys(self, kind: str | None = None) -> list[SeriesKey]:
        with self._lock:
            if kind is None:
                return [key for of_kind in self._series.values() for key in of_kind]
            return list(self._series.get(kind, _NO_SERIES))

    @property
    def series_count(self) -> int:
        with self._lock:
            return sum(len(of_kind) for of_kind in self._series.values())

    @property
    def rejected_samples(self) -> int:
        """Samples refused because they were not newer than their series' last one."""
        return self._rejected

    # ------------------------------------------------------------------------------------- static KV

    def set_kv(self, key: str, value: object) -> None:
        """Node information that is not a time series (CPU topology, NUMA info, GPU list)."""
        with self._lock:
            self._kv[key] = value

    def get_kv(self, key: str, default: object = None) -> object:
        with self._lock:
            return self._kv.get(key, default)

    def gpu_devices(self) -> tuple[GPUDevice, ...]:
        """The node's GPUs (KV ``gpu_devices``, set where the GPU service runs); () on a node without."""
        value = self.get_kv(GPU_DEVICES_KV)
        return tuple(gpu for gpu in value if isinstance(gpu, GPUDevice)) if isinstance(value, tuple) else ()
