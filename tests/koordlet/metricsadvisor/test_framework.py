"""CollectorRunner: intervals, metrics about itself, failures, disabled collectors, stopping."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Sequence

import pytest

from koordlet.metriccache import MetricCache, MetricKind, Sample, SeriesKey
from koordlet.metricsadvisor import CollectorRunner

KEY = SeriesKey.of(MetricKind.NODE_CPU_USAGE)


class CountingCollector:
    """A plug-in for the runner: counts its calls and emits one sample per call."""

    def __init__(self, name: str, interval_s: float, fail_times: int = 0, is_enabled: bool = True) -> None:
        self.name = name
        self.interval_s = interval_s
        self.calls: list[float] = []
        self._fail_times = fail_times
        self._enabled = is_enabled
        self.called = threading.Event()

    def enabled(self) -> bool:
        return self._enabled

    def collect(self, now: float) -> Sequence[Sample]:
        self.calls.append(now)
        self.called.set()
        if len(self.calls) <= self._fail_times:
            raise OSError("file vanished")
        return [Sample(SeriesKey.of(MetricKind.NODE_CPU_USAGE, collector=self.name), now, float(len(self.calls)))]


def _clock() -> Callable[[], float]:
    """A wall clock that advances one second per reading, so every sample is newer than the last."""
    return itertools.count(1.0).__next__


def test_tick_runs_each_collector_when_due_and_returns_the_next_due_time() -> None:
    fast, slow = CountingCollector("fast", 1.0), CountingCollector("slow", 10.0)
    runner = CollectorRunner(MetricCache(), [fast, slow], wall_clock=_clock())
    assert runner.tick(0.0) == 1.0
    assert runner.tick(1.0) == 2.0
    runner.tick(2.0)
    assert (len(fast.calls), len(slow.calls)) == (3, 1)
    runner.tick(10.0)  # fast fell behind by more than an interval: runs once, no catch-up burst
    assert (len(fast.calls), len(slow.calls)) == (4, 2)
    assert runner.tick(10.5) == 11.0


def test_samples_land_in_the_cache_and_durations_are_recorded() -> None:
    cache = MetricCache()
    collector = CountingCollector("c", 1.0)
    runner = CollectorRunner(cache, [collector], wall_clock=_clock())
    runner.tick(0.0)
    runner.tick(1.0)
    key = SeriesKey.of(MetricKind.NODE_CPU_USAGE, collector="c")
    assert cache.latest(key) is not None and cache.latest(key)[1] == 2.0  # type: ignore[index]
    count = runner.registry.get_sample_value("koordlet_collector_duration_seconds_count", {"collector": "c"})
    assert count == 2.0


def test_a_failing_collector_is_counted_and_retried_without_stopping_others() -> None:
    cache = MetricCache()
    bad, good = CountingCollector("bad", 1.0, fail_times=2), CountingCollector("good", 1.0)
    runner = CollectorRunner(cache, [bad, good], wall_clock=_clock())
    for t in range(4):
        runner.tick(float(t))
    assert runner.registry.get_sample_value("koordlet_collector_errors_total", {"collector": "bad"}) == 2.0
    assert len(good.calls) == 4 and len(bad.calls) == 4
    assert cache.latest(SeriesKey.of(MetricKind.NODE_CPU_USAGE, collector="bad")) is not None


def test_disabled_collectors_never_run() -> None:
    off = CountingCollector("off", 1.0, is_enabled=False)
    runner = CollectorRunner(MetricCache(), [off, CountingCollector("on", 1.0)], wall_clock=_clock())
    runner.tick(0.0)
    assert runner.active_collectors == ["on"] and off.calls == []


def test_duplicate_names_and_bad_intervals_are_refused() -> None:
    with pytest.raises(ValueError, match="unique"):
        CollectorRunner(MetricCache(), [CountingCollector("a", 1.0), CountingCollector("a", 2.0)])
    with pytest.raises(ValueError, match="positive"):
        CollectorRunner(MetricCache(), [CountingCollector("a", 0.0)])


def test_thread_runs_on_interval_and_stops_promptly() -> None:
    collector = CountingCollector("c", 0.05)
    runner = CollectorRunner(MetricCache(), [collector])
    runner.start()
    try:
        assert collector.called.wait(2.0)
        time.sleep(0.3)
    finally:
        started = time.monotonic()
        runner.stop()
        stop_s = time.monotonic() - started
    calls = len(collector.calls)
    assert 3 <= calls <= 9, calls
    assert stop_s < 0.5
    time.sleep(0.1)
    assert len(collector.calls) == calls
    runner.start()
    try:
        with pytest.raises(RuntimeError, match="already started"):
            runner.start()
    finally:
        runner.stop()


def test_run_collector_runs_one_by_name() -> None:
    collector = CountingCollector("c", 60.0)
    runner = CollectorRunner(MetricCache(), [collector])
    assert runner.run_collector("c", now=5.0) == 1
    assert collector.calls == [5.0]
    with pytest.raises(KeyError):
        runner.run_collector("missing")


def test_a_collector_that_cannot_read_the_node_says_so_in_one_line_once_and_a_bug_keeps_its_traceback(
        tmp_path, caplog: pytest.LogCaptureFixture) -> None:
    """The node info collector on a host without the DaemonSet's /host-sys: a reading error is the node's answer,
    not a crash, so it is one line naming the path (no traceback), once while it keeps failing; an exception that is
    not a reading error is a bug and keeps its traceback."""
    import logging

    from koordlet.metricsadvisor.nodeinfo import NodeInfoCollector

    caplog.set_level(logging.INFO, logger="koordlet.metricsadvisor.framework")
    missing = tmp_path / "host-sys"
    runner = CollectorRunner(MetricCache(), [NodeInfoCollector(MetricCache(), str(missing), 60.0)],
                             wall_clock=_clock())
    for minute in range(3):
        runner.tick(minute * 60.0)
    lines = [r for r in caplog.records if r.name == "koordlet.metricsadvisor.framework"]
    assert [(r.levelname, r.exc_info) for r in lines] == [("WARNING", None)]
    assert f"{missing}/devices/system/cpu/online" in lines[0].getMessage()
    assert runner.registry.get_sample_value("koordlet_collector_errors_total", {"collector": "node_info"}) == 3.0

    class Broken(CountingCollector):
        def collect(self, now: float) -> Sequence[Sample]:
            raise KeyError("a bug")

    caplog.clear()
    CollectorRunner(MetricCache(), [Broken("broken", 1.0)], wall_clock=_clock()).tick(0.0)
    (line,) = [r for r in caplog.records if r.name == "koordlet.metricsadvisor.framework"]
    assert line.exc_info is not None
