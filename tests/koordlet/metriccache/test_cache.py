"""MetricCache: window aggregates against hand-computed values, gc, thread safety, bounded memory."""

from __future__ import annotations

import random
import threading
import tracemalloc

import pytest

from koordlet.metriccache import (
    DEFAULT_CAPACITY_BY_KIND,
    NODE_WINDOW_CAPACITY,
    Label,
    MetricCache,
    MetricKind,
    Sample,
    SeriesKey,
)

NODE_CPU = SeriesKey.of(MetricKind.NODE_CPU_USAGE)


def _container_key(pod: str, container: str) -> SeriesKey:
    return SeriesKey.of(MetricKind.CONTAINER_CPU_USAGE, pod_uid=pod, container_id=container)


def test_series_keys_with_the_same_labels_in_any_order_are_equal() -> None:
    a = SeriesKey(MetricKind.NODE_BE.value, (("be_allocation", "usage"), ("be_resource", "cpu")))
    b = SeriesKey.of(MetricKind.NODE_BE, be_resource="cpu", be_allocation="usage")
    assert a == b and hash(a) == hash(b)
    assert b.label(Label.BE_RESOURCE) == "cpu" and b.label(Label.POD_UID) is None


def test_window_aggregates_match_hand_computed_values() -> None:
    cache = MetricCache()
    # t = 100..109, values 1..10 in scrambled time order of value
    values = [7.0, 1.0, 10.0, 3.0, 5.0, 2.0, 9.0, 4.0, 8.0, 6.0]
    for offset, value in enumerate(values):
        assert cache.append(NODE_CPU, 100.0 + offset, value)
    agg = cache.query(NODE_CPU, 100.0, 109.0)
    assert agg is not None
    assert agg.count == 10
    assert agg.avg == 5.5
    assert agg.last == 6.0
    # nearest rank: rank = ceil(p/100 × 10) over sorted 1..10
    assert (agg.p50, agg.p90, agg.p95, agg.p99) == (5.0, 9.0, 10.0, 10.0)
    assert agg.percentile(0) == 1.0 and agg.percentile(100) == 10.0 and agg.percentile(10) == 1.0
    assert agg.percentile(11) == 2.0
    assert agg.time_range_duration == 9.0


def test_window_bounds_are_inclusive_and_empty_windows_are_none() -> None:
    cache = MetricCache()
    for t in range(10):
        cache.append(NODE_CPU, float(t), float(t))
    agg = cache.query(NODE_CPU, 3.0, 5.0)
    assert agg is not None and agg.count == 3 and agg.avg == 4.0
    assert (agg.first_timestamp, agg.last_timestamp) == (3.0, 5.0)
    half = cache.query(NODE_CPU, 2.5, 4.5)
    assert half is not None and half.count == 2 and half.time_range_duration == 1.0
    assert cache.query(NODE_CPU, 10.5, 20.0) is None
    assert cache.query(SeriesKey.of(MetricKind.NODE_MEMORY_USAGE), 0.0, 9.0) is None


def test_percentiles_of_five_samples_hand_computed() -> None:
    cache = MetricCache()
    for t, value in enumerate([15.0, 20.0, 35.0, 40.0, 50.0]):
        cache.append(NODE_CPU, float(t), value)
    agg = cache.query(NODE_CPU, 0.0, 4.0)
    assert agg is not None
    # Wikipedia's nearest-rank example: P30 = 20, P40 = 20, P50 = 35, P100 = 50
    assert (agg.percentile(30), agg.percentile(40), agg.p50, agg.percentile(100)) == (20.0, 20.0, 35.0, 50.0)
    with pytest.raises(ValueError):
        agg.percentile(101)


def test_ring_keeps_only_the_newest_capacity_samples_across_wraps() -> None:
    cache = MetricCache(default_capacity=4, capacity_by_kind={})
    for t in range(11):
        cache.append(NODE_CPU, float(t), float(t))
    agg = cache.query(NODE_CPU, 0.0, 100.0)
    assert agg is not None
    assert agg.count == 4 and agg.first_timestamp == 7.0 and agg.last == 10.0 and agg.avg == 8.5
    # a window whose samples wrap around the end of the ring storage
    tail = cache.query(NODE_CPU, 8.0, 10.0)
    assert tail is not None and tail.count == 3 and tail.avg == 9.0
    assert cache.latest(NODE_CPU) == (10.0, 10.0)


def test_last_value_is_the_newest_sample_of_the_window_as_query_gives_it() -> None:
    rng = random.Random(7)
    cache = MetricCache(default_capacity=8, capacity_by_kind={})
    keys = [_container_key(f"pod-{i}", f"c-{i}") for i in range(3)]
    for key in keys:  # gaps in time, growing rings and wrapped ones
        stamp = 0.0
        for _ in range(rng.randint(0, 20)):
            stamp += rng.choice((0.5, 1.0, 3.0))
            cache.append(key, stamp, rng.random())
    for key in keys:
        for _ in range(300):
            start = rng.uniform(-2.0, 60.0)
            end = start + rng.uniform(0.0, 10.0)
            if rng.random() < 0.3:  # bounds on sample times: both are inclusive
                start, end = float(round(start)), float(round(end))
            aggregate = cache.query(key, start, end)
            assert cache.last_value(key, start, end) == (None if aggregate is None else aggregate.last)
    assert cache.last_value(NODE_CPU, 0.0, 100.0) is None
    start, end = 20.0, 22.0
    expected = {}
    for i, key in enumerate(keys):
        aggregate = cache.query(key, start, end)
        if aggregate is not None:
            expected[f"c-{i}"] = aggregate.last
    assert cache.last_values(MetricKind.CONTAINER_CPU_USAGE, Label.CONTAINER_ID, start, end) == expected
    assert cache.last_values(MetricKind.CONTAINER_CPU_USAGE, Label.HOST_APP_NAME, start, end) == {}


def test_samples_not_newer_than_the_last_are_rejected_and_counted() -> None:
    cache = MetricCache()
    assert cache.append(NODE_CPU, 5.0, 1.0)
    assert not cache.append(NODE_CPU, 5.0, 2.0)
    assert not cache.append(NODE_CPU, 4.0, 3.0)
    accepted = cache.append_samples([Sample(NODE_CPU, 6.0, 4.0), Sample(NODE_CPU, 6.0, 5.0)])
    assert accepted == 1 and cache.rejected_samples == 3
    assert cache.latest(NODE_CPU) == (6.0, 4.0)


def test_capacity_is_per_kind_and_configurable() -> None:
    assert DEFAULT_CAPACITY_BY_KIND[MetricKind.CONTAINER_CPU_USAGE] == 600
    cache = MetricCache()
    assert cache.capacity_of(MetricKind.NODE_CPU_USAGE) == NODE_WINDOW_CAPACITY == 1800
    assert cache.capacity_of(MetricKind.POD_MEMORY_USAGE) == 600
    custom = MetricCache(default_capacity=10, capacity_by_kind={MetricKind.POD_CPU_USAGE: 3})
    assert custom.capacity_of(MetricKind.POD_CPU_USAGE) == 3 and custom.capacity_of("anything") == 10
    with pytest.raises(ValueError):
        MetricCache(default_capacity=0)


def test_gc_drops_series_of_pods_and_containers_that_are_gone() -> None:
    cache = MetricCache()
    cache.append(NODE_CPU, 1.0, 1.0)
    cache.append(SeriesKey.of(MetricKind.POD_CPU_USAGE, pod_uid="live"), 1.0, 1.0)
    cache.append(SeriesKey.of(MetricKind.POD_CPU_USAGE, pod_uid="dead"), 1.0, 1.0)
    cache.append(_container_key("live", "c-live"), 1.0, 1.0)
    cache.append(_container_key("live", "c-dead"), 1.0, 1.0)
    cache.append(_container_key("dead", "c-of-dead-pod"), 1.0, 1.0)
    removed = cache.gc(live_pod_uids={"live"}, live_container_ids={"c-live", "c-of-dead-pod"})
    assert removed == 3
    assert set(cache.keys()) == {
        NODE_CPU,
        SeriesKey.of(MetricKind.POD_CPU_USAGE, pod_uid="live"),
        _container_key("live", "c-live"),
    }
    assert cache.keys(MetricKind.POD_CPU_USAGE) == [SeriesKey.of(MetricKind.POD_CPU_USAGE, pod_uid="live")]


def test_static_kv_holds_node_information() -> None:
    cache = MetricCache()
    assert cache.get_kv("node_cpu_info") is None
    cache.set_kv("node_cpu_info", {"cpus": 2})
    assert cache.get_kv("node_cpu_info") == {"cpus": 2}


def test_one_writer_and_readers_in_threads_see_consistent_windows() -> None:
    cache = MetricCache(default_capacity=50, capacity_by_kind={})
    stop = threading.Event()
    problems: list[str] = []

    def reader() -> None:
        while not stop.is_set():
            agg = cache.query(NODE_CPU, 0.0, 1e9)
            if agg is None:
                continue
            # value == timestamp for every sample, so a torn window would break these identities
            if agg.last != agg.last_timestamp or agg.count != agg.time_range_duration + 1:
                problems.append(f"torn window {agg.first_timestamp}..{agg.last_timestamp} n={agg.count}")

    readers = [threading.Thread(target=reader) for _ in range(3)]
    for thread in readers:
        thread.start()
    try:
        for t in range(20000):
            cache.append(NODE_CPU, float(t), float(t))
    finally:
        stop.set()
        for thread in readers:
            thread.join(timeout=5)
    assert not problems, problems[:3]


def _cache_bytes() -> int:
    snapshot = tracemalloc.take_snapshot().filter_traces([tracemalloc.Filter(True, "*koordlet/metriccache/*")])
    return sum(stat.size for stat in snapshot.statistics("filename"))


def test_memory_after_a_simulated_day_equals_memory_once_every_ring_wrapped() -> None:
    """150 containers × 3 kinds + their pods + node kinds, 1 s samples, timestamps fed (no real time).

    The whole population runs until its 10 min pod and container rings have wrapped; the node series
    and one container series run on for the full simulated day at 1 s (their 30 min rings wrap 48
    times). Rings grow as samples arrive, so the comparison starts once every ring is full. A full day
    of all 603 series would be 52 M appends (over a minute of Python) and exercises nothing more: once a
    ring has wrapped, an append only overwrites two slots.
    """
    pods = [f"pod-{p}" for p in range(50)]
    containers = [(pods[c % 50], f"ctr-{c}") for c in range(150)]
    kinds = (MetricKind.CONTAINER_CPU_USAGE, MetricKind.CONTAINER_MEMORY_USAGE, MetricKind.CONTAINER_CPU_THROTTLED)
    pod_kinds = (MetricKind.POD_CPU_USAGE, MetricKind.POD_MEMORY_USAGE, MetricKind.POD_CPU_THROTTLED)
    node_kinds = (MetricKind.NODE_CPU_USAGE, MetricKind.NODE_MEMORY_USAGE, MetricKind.SYS_CPU_USAGE)
    population = (
        [SeriesKey.of(kind, pod_uid=pod, container_id=ctr) for pod, ctr in containers for kind in kinds]
        + [SeriesKey.of(kind, pod_uid=pod) for pod in pods for kind in pod_kinds]
        + [SeriesKey.of(kind) for kind in node_kinds]
    )
    long_lived = [SeriesKey.of(kind) for kind in node_kinds] + [
        SeriesKey.of(MetricKind.CONTAINER_CPU_USAGE, pod_uid="pod-0", container_id="ctr-0")
    ]
    day = 24 * 3600
    tracemalloc.start()
    try:
        cache = MetricCache()
        t0 = 1_700_000_000.0

        def tick(t: int, keys: list[SeriesKey]) -> None:
            for index, key in enumerate(keys):
                cache.append(key, t0 + t, float((t + index) % 97))

        for t in range(630):  # the 10 min pod and container rings fill up and wrap
            tick(t, population)
        for t in range(630, 1830):  # the 30 min node rings fill up and wrap
            tick(t, long_lived)
        after_the_rings_wrapped = _cache_bytes()
        for t in range(1830, day):  # the rest of the day for the longest-lived series
            tick(t, long_lived)
        after_a_day = _cache_bytes()
    finally:
        tracemalloc.stop()
    assert cache.series_count == len(population) == 150 * 3 + 50 * 3 + 3
    agg = cache.query(long_lived[0], t0 + day - 1800, t0 + day)
    assert agg is not None and agg.count == 1800
    # Equal up to the Python ints that hold each ring's write position and fill level (≤ 2 × 32 bytes
    # per series; values above 256 are heap objects whose count changes as positions move).
    assert abs(after_a_day - after_the_rings_wrapped) <= 64 * len(population), (after_the_rings_wrapped, after_a_day)
    # and the size is what the rings say: 16 bytes per slot, about 8.3 MiB for this node
    slots = sum(cache.capacity_of(key.kind) for key in population)
    assert slots * 16 <= after_a_day <= slots * 16 * 1.1


def test_container_churn_with_gc_keeps_memory_flat() -> None:
    tracemalloc.start()
    try:
        cache = MetricCache()
        sizes = []
        for generation in range(4):
            live = {f"ctr-{generation}-{c}" for c in range(150)}
            for t in range(generation * 100, generation * 100 + 100):
                for ctr in sorted(live):
                    cache.append(_container_key("pod", ctr), float(t), 1.0)
            cache.gc(live_pod_uids={"pod"}, live_container_ids=live)
            sizes.append(_cache_bytes())
            # the next generation replaces all containers of this one
            cache.gc(live_pod_uids={"pod"}, live_container_ids=set())
    finally:
        tracemalloc.stop()
    assert cache.series_count == 0
    assert max(sizes) - min(sizes) <= 4096, sizes


def test_rings_grow_as_samples_arrive_and_wrap_at_capacity() -> None:
    """A new series costs what it holds, not its full window; once full it wraps as before."""
    cache = MetricCache()
    key = SeriesKey.of(MetricKind.NODE_CPU_USAGE)
    capacity = cache.capacity_of(key.kind)
    tracemalloc.start()
    try:
        before = _cache_bytes()
        for t in range(10):
            cache.append(key, 1_700_000_000.0 + t, float(t))
        ten_samples = _cache_bytes() - before
    finally:
        tracemalloc.stop()
    assert ten_samples < capacity * 16 // 10, (ten_samples, capacity)
    for t in range(10, capacity + 25):
        cache.append(key, 1_700_000_000.0 + t, float(t))
    agg = cache.query(key, 0, 2_000_000_000.0)
    assert agg is not None and agg.count == capacity
    assert cache.latest(key) == (1_700_000_000.0 + capacity + 24, float(capacity + 24))
    assert cache.query(key, 1_700_000_000.0, 1_700_000_000.0 + 24) is None  # the first 25 were overwritten


def test_a_pod_series_read_once_in_ten_seconds_keeps_ten_minutes_in_a_tenth_of_the_slots() -> None:
    """Pods no strategy reads every tick are read once a fan-out interval (10 s): their rings stop growing once
    they hold 10 min. Read every second later on (a strategy asks for the pod), the ring grows again, between its
    newest and its oldest sample, up to its capacity; queries see every sample in time order throughout."""
    cache = MetricCache()
    key = SeriesKey.of(MetricKind.POD_CPU_USAGE, pod_uid="p")
    t0 = 1_700_000_000.0
    for n in range(200):  # 2000 s at one sample in 10 s
        cache.append(key, t0 + 10 * n, float(n))
    ring = cache._ring(key)
    assert ring is not None and ring.size == 61  # 600 s back from the newest, both ends in
    agg = cache.query(key, 0, 2e9)
    assert agg is not None and agg.count == 61 and agg.first_timestamp == t0 + 1390 and agg.last == 199.0
    last = t0 + 1990
    for n in range(1, 701):  # then every second for 700 s
        cache.append(key, last + n, 1000.0 + n)
    assert ring.size == cache.capacity_of(key.kind) == 600
    window = cache.query(key, last - 100, last + 700)
    assert window is not None and window.count == 600 and window.first_timestamp == last + 101
    assert window.avg == pytest.approx(1000.0 + (101 + 700) / 2)
    # mid-way: while it grew inside the wrapped ring, the 10 s samples and the 1 s ones came out in order
    grown = MetricCache()
    for n in range(100):
        grown.append(key, t0 + 10 * n, float(n))
    for n in range(1, 31):
        grown.append(key, t0 + 990 + n, 100.0 + n)
    mixed = grown.query(key, t0 + 900, t0 + 1020)
    assert mixed is not None and mixed.count == 10 + 30
    assert (mixed.first_timestamp, mixed.last_timestamp, mixed.last) == (t0 + 900, t0 + 1020, 130.0)
    assert list(mixed.sorted_values) == sorted([*map(float, range(90, 100)), *(100.0 + n for n in range(1, 31))])
    ring = grown._ring(key)
    assert ring is not None
    stamps = [ring.timestamps[ring._physical(i)] for i in range(ring.size)]
    assert stamps == sorted(stamps) and stamps[-1] - stamps[0] <= 600  # in order, and no more than 10 min
