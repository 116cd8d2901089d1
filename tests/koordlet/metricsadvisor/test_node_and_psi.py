"""Node resource and node PSI collectors on fixture /proc trees and on this machine's /proc."""

from __future__ import annotations

import os
import time
from pathlib import Path

from koordlet.metriccache import Label, MetricKind
from koordlet.metricsadvisor import NodePsiCollector, NodeResourceCollector
from koordlet.system.procfs import clock_ticks_per_second

MEMINFO = b"MemTotal: 1000000 kB\nMemFree: 400000 kB\nMemAvailable: 600000 kB\nBuffers: 0 kB\nCached: 0 kB\n"


def _stat(busy_user: int, idle: int) -> bytes:
    # user nice system idle iowait irq softirq steal guest guest_nice
    return (
        f"cpu  {busy_user} 0 100 {idle} 50 10 5 7 0 0\n"
        f"cpu0 {busy_user} 0 100 {idle} 50 10 5 7 0 0\nintr 1 2 3\nctxt 4\n"
    ).encode()


class FakeMonotonic:
    def __init__(self) -> None:
        self.ns = 10**12

    def __call__(self) -> int:
        return self.ns


def test_first_collection_primes_and_second_gives_cores_from_busy_tick_delta(tmp_path: Path) -> None:
    (tmp_path / "stat").write_bytes(_stat(1000, 50000))
    (tmp_path / "meminfo").write_bytes(MEMINFO)
    clock = FakeMonotonic()
    collector = NodeResourceCollector(proc_dir=str(tmp_path), monotonic_ns=clock)
    try:
        first = {s.key.kind: s.value for s in collector.collect(100.0)}
        assert MetricKind.NODE_CPU_USAGE not in first
        assert first[MetricKind.NODE_MEMORY_USAGE] == (1000000 - 600000) * 1024
        assert first[MetricKind.NODE_MEMORY_USAGE_WITH_PAGE_CACHE] == (1000000 - 400000) * 1024
        # 2 s later: 3 cores' worth of busy ticks (user grew), idle/iowait/steal growth ignored
        hz = clock_ticks_per_second()
        (tmp_path / "stat").write_bytes(_stat(1000 + 6 * hz, 50000 + 10 * hz))
        clock.ns += 2 * 10**9
        second = {s.key.kind: s.value for s in collector.collect(102.0)}
    finally:
        collector.close()
    assert abs(second[MetricKind.NODE_CPU_USAGE] - 3.0) < 1e-9
    assert collector.last_usage is not None and collector.last_usage.cpu_cores == second[MetricKind.NODE_CPU_USAGE]


def test_live_node_usage_is_within_the_machine() -> None:
    collector = NodeResourceCollector()
    try:
        collector.collect(1.0)
        time.sleep(0.2)  # /proc/stat counts in 10 ms ticks: a shorter gap quantises badly
        samples = {s.key.kind: s.value for s in collector.collect(2.0)}
    finally:
        collector.close()
    assert 0.0 <= samples.get(MetricKind.NODE_CPU_USAGE, 0.0) <= (os.cpu_count() or 1) + 0.5
    assert samples[MetricKind.NODE_MEMORY_USAGE] > 0


def test_psi_collector_is_off_without_pressure_files(tmp_path: Path) -> None:
    assert NodePsiCollector(proc_dir=str(tmp_path)).enabled() is False


def test_psi_collector_emits_some_and_full_per_resource_and_window(tmp_path: Path) -> None:
    (tmp_path / "pressure").mkdir()
    (tmp_path / "pressure" / "cpu").write_bytes(b"some avg10=1.50 avg60=0.75 avg300=0.25 total=123\n")
    for name in ("memory", "io"):
        (tmp_path / "pressure" / name).write_bytes(
            b"some avg10=2.00 avg60=1.00 avg300=0.50 total=99\nfull avg10=1.00 avg60=0.50 avg300=0.10 total=9\n"
        )
    collector = NodePsiCollector(proc_dir=str(tmp_path))
    assert collector.enabled()
    samples = collector.collect(5.0)
    assert len(samples) == 3 + 6 + 6  # cpu has no "full" line on this fixture
    by_labels = {
        (s.key.label(Label.PSI_RESOURCE), s.key.label(Label.PSI_PRECISION), s.key.label(Label.PSI_DEGREE)): s.value
        for s in samples
    }
    assert by_labels[("cpu", "avg10", "some")] == 1.5
    assert by_labels[("io", "avg300", "full")] == 0.1
    assert all(s.key.kind == MetricKind.NODE_PSI and s.timestamp == 5.0 for s in samples)


def test_psi_collector_reads_this_kernel_when_it_has_psi() -> None:
    collector = NodePsiCollector()
    if not collector.enabled():
        assert not os.access("/proc/pressure/cpu", os.R_OK)
        return
    samples = collector.collect(1.0)
    assert len(samples) >= 15 and all(0.0 <= s.value <= 100.0 for s in samples)
