"""``PerCPUMetric``: each CPU's usage from the same /proc/stat read as the node's, into the metric cache (ring
capacity bounded) and Prometheus, for at most 256 CPUs; on fixture /proc trees (a 300-CPU machine) and on this
machine's /proc with one CPU kept busy."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from prometheus_client import generate_latest

from koordlet.metriccache import Label, MetricCache, MetricKind
from koordlet.metriccache.cache import PER_CPU_WINDOW_CAPACITY
from koordlet.metrics import KoordletMetrics
from koordlet.metricsadvisor import NodeResourceCollector
from koordlet.metricsadvisor.node import MAX_PER_CPU
from koordlet.system.procfs import clock_ticks_per_second

MEMINFO = b"MemTotal: 1000000 kB\nMemFree: 400000 kB\nMemAvailable: 600000 kB\n"


def _stat(busy: dict[int, int], idle: int = 50000) -> bytes:
    # user nice system idle iowait irq softirq steal guest guest_nice
    total = sum(busy.values())
    lines = [f"cpu  {total} 0 0 {idle * len(busy)} 0 0 0 0 0 0"]
    lines += [f"cpu{cpu} {ticks} 0 0 {idle} 0 0 0 0 0 0" for cpu, ticks in sorted(busy.items())]
    return ("\n".join(lines) + "\nintr 1\nctxt 2\n").encode()


class _Clock:
    def __init__(self) -> None:
        self.ns = 10**12

    def __call__(self) -> int:
        return self.ns


def _per_cpu(samples) -> dict[int, float]:
    return {int(s.key.label(Label.CPU)): s.value for s in samples if s.key.kind == MetricKind.NODE_PER_CPU_USAGE}


def test_each_cpus_usage_from_its_tick_delta_bounded_at_256_cpus(tmp_path: Path,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    hz = clock_ticks_per_second()
    cpus = range(300)
    (tmp_path / "stat").write_bytes(_stat(dict.fromkeys(cpus, 1000)))
    (tmp_path / "meminfo").write_bytes(MEMINFO)
    clock = _Clock()
    collector = NodeResourceCollector(proc_dir=str(tmp_path), monotonic_ns=clock, per_cpu=True)
    try:
        assert _per_cpu(collector.collect(100.0)) == {}  # priming
        # 2 s later: cpu1 fully busy, cpu2 half, cpu7's counter went back (offlined and on again)
        busy = dict.fromkeys(cpus, 1000) | {1: 1000 + 2 * hz, 2: 1000 + hz, 7: 10}
        (tmp_path / "stat").write_bytes(_stat(busy))
        clock.ns += 2 * 10**9
        with caplog.at_level(logging.WARNING, logger="koordlet.metricsadvisor.node"):
            usage = _per_cpu(collector.collect(102.0))
            collector.collect(103.0)
    finally:
        collector.close()
    assert len(usage) == MAX_PER_CPU - 1 and 7 not in usage and max(usage) == 255
    assert usage[1] == pytest.approx(1.0) and usage[2] == pytest.approx(0.5) and usage[0] == 0.0
    assert [r.message for r in caplog.records].count(
        "per-CPU usage kept for the first 256 CPUs only (this node has CPU 256)") == 1


def test_off_by_default_no_per_cpu_series(tmp_path: Path) -> None:
    (tmp_path / "stat").write_bytes(_stat({0: 1, 1: 1}))
    (tmp_path / "meminfo").write_bytes(MEMINFO)
    collector = NodeResourceCollector(proc_dir=str(tmp_path))
    try:
        collector.collect(1.0)
        (tmp_path / "stat").write_bytes(_stat({0: 500, 1: 1}))
        assert _per_cpu(collector.collect(2.0)) == {}
    finally:
        collector.close()


@pytest.mark.alone  # the pinned burner must get most of its CPU: no other test's load beside it
def test_this_machines_busy_cpu_shows_in_the_cache_and_on_prometheus() -> None:
    cpus = sorted(os.sched_getaffinity(0))
    busy_cpu = cpus[-1]
    burner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        os.sched_setaffinity(burner.pid, {busy_cpu})
        cache = MetricCache()
        collector = NodeResourceCollector(per_cpu=True)
        try:
            for second in range(4):
                cache.append_samples(collector.collect(time.time()))
                if second < 3:
                    time.sleep(0.5)
        finally:
            collector.close()
    finally:
        burner.kill()
        burner.wait()
    latest = cache.last_values(MetricKind.NODE_PER_CPU_USAGE, Label.CPU, 0, time.time())
    assert set(map(int, latest)) == set(cpus)
    assert latest[str(busy_cpu)] > 0.6 and all(0.0 <= v <= 1.0 for v in latest.values())
    assert cache.capacity_of(MetricKind.NODE_PER_CPU_USAGE) == PER_CPU_WINDOW_CAPACITY
    metrics = KoordletMetrics("node-1", cache=cache)
    text = generate_latest(metrics.registry).decode()
    line = next(li for li in text.splitlines()
                if li.startswith(f'koordlet_node_used_cpu_cores_per_cpu{{cpu="{busy_cpu}",node="node-1"}}'))
    assert float(line.split()[-1]) > 0.6


def test_share_pool_gauges_and_their_per_cpu_info() -> None:
    metrics = KoordletMetrics("node-1")
    metrics.observe_cpu_pools(frozenset({2, 3}), frozenset({1, 2, 3}), per_cpu=False)
    text = generate_latest(metrics.registry).decode()
    assert 'koordlet_cpuset_share_pool_cpu_cores{node="node-1"} 2.0' in text
    assert 'koordlet_cpuset_be_share_pool_cpu_cores{node="node-1"} 3.0' in text
    assert "koordlet_cpuset_share_pool_info{" not in text
    metrics.observe_cpu_pools(frozenset({2, 3}), frozenset({1, 2, 3}), per_cpu=True)
    metrics.observe_cpu_pools(frozenset({3}), frozenset({1, 3}), per_cpu=True)  # a pod took CPU 2
    text = generate_latest(metrics.registry).decode()
    assert [li for li in text.splitlines() if li.startswith("koordlet_cpuset_share_pool_info{")] == [
        'koordlet_cpuset_share_pool_info{cpu="3",node="node-1"} 1.0']
    assert sum(li.startswith("koordlet_cpuset_be_share_pool_info{") for li in text.splitlines()) == 2
