"""``ResctrlCollector`` on a resctrl tree laid out as the kernel writes it on an Intel RDT machine with two L3
domains (no RDT on this machine): ``info/L3_MON/mon_features``, each QoS group's ``mon_data/mon_L3_0{0,1}``
counters; LLC occupancy stored as read, memory bandwidth as rates from counter deltas, across a reset, a wrap
and an ``Unavailable`` read; exported under Koordinator's metric names."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest
from prometheus_client import generate_latest

from koordlet.metriccache import Label, MetricCache, MetricKind
from koordlet.metrics import KoordletMetrics
from koordlet.metricsadvisor.resctrl import ResctrlCollector, counter_delta
from koordlet.statesinformer.api import StaticStates
from koordlet.system.resctrl import MonDomain, read_mon_data, read_mon_features

MON_FEATURES = "llc_occupancy\nmbm_total_bytes\nmbm_local_bytes\n"


def resctrl_tree(root: Path, groups: tuple[str, ...] = ("LSR", "LS", "BE"), domains: tuple[int, ...] = (0, 1),
                 mon_features: str | None = MON_FEATURES) -> Path:
    """``/sys/fs/resctrl`` of a two-socket Xeon with CAT, MBA and CMT/MBM: what ``mount -t resctrl`` shows and
    the kernel makes in each ``mkdir``-ed control group."""
    (root / "info" / "L3").mkdir(parents=True)
    (root / "info" / "L3" / "cbm_mask").write_text("7ff\n")
    (root / "info" / "L3" / "num_closids").write_text("16\n")
    if mon_features is not None:
        (root / "info" / "L3_MON").mkdir()
        (root / "info" / "L3_MON" / "mon_features").write_text(mon_features)
        (root / "info" / "L3_MON" / "num_rmids").write_text("224\n")
        (root / "info" / "L3_MON" / "max_threshold_occupancy").write_text("1441792\n")
    schemata = "    L3:" + ";".join(f"{d}=7ff" for d in domains) + "\n    MB:" + ";".join(f"{d}=100" for d in domains)
    for group in ("", *groups):
        directory = root / group
        directory.mkdir(exist_ok=True)
        (directory / "schemata").write_text(schemata + "\n")
        (directory / "tasks").write_text("")
        (directory / "cpus").write_text("ffff\n")
        if mon_features is None:
            continue
        for domain in domains:
            mon = directory / "mon_data" / f"mon_L3_{domain:02d}"
            mon.mkdir(parents=True)
            for event in mon_features.split():
                (mon / event).write_text("0\n")
    return root


def set_counters(root: Path, group: str, domain: int, **values: int | str) -> None:
    for event, value in values.items():
        (root / group / "mon_data" / f"mon_L3_{domain:02d}" / event).write_text(f"{value}\n")


class _Clock:
    def __init__(self) -> None:
        self.now = 500.0

    def __call__(self) -> float:
        return self.now


def _by(samples, kind: str) -> dict[tuple[str, str, str | None], float]:
    return {(s.key.label(Label.QOS), s.key.label(Label.CACHE_ID), s.key.label(Label.RESCTRL_MB_TYPE)): s.value
            for s in samples if s.key.kind == kind}


def test_the_kernels_mon_data_is_read_per_domain(tmp_path: Path) -> None:
    root = resctrl_tree(tmp_path / "resctrl")
    set_counters(root, "LS", 1, llc_occupancy=1441792, mbm_total_bytes=9000, mbm_local_bytes="Unavailable")
    assert read_mon_features(str(root)) == {"llc_occupancy", "mbm_total_bytes", "mbm_local_bytes"}
    domains = read_mon_data(str(root), "LS")
    assert [d.cache_id for d in domains] == [0, 1]
    assert domains[1] == MonDomain(1, (("llc_occupancy", 1441792), ("mbm_total_bytes", 9000),
                                       ("mbm_local_bytes", None)))
    assert read_mon_data(str(root), "absent") == ()


def test_llc_as_read_and_bandwidth_as_rates_per_group_and_domain(tmp_path: Path) -> None:
    root = resctrl_tree(tmp_path / "resctrl")
    clock = _Clock()
    collector = ResctrlCollector(str(root), monotonic=clock)
    assert collector.enabled()
    set_counters(root, "BE", 0, llc_occupancy=2 << 20, mbm_total_bytes=10**9, mbm_local_bytes=4 * 10**8)
    first = collector.collect(100.0)
    assert _by(first, MetricKind.RESCTRL_LLC)[("BE", "0", None)] == 2 << 20
    assert _by(first, MetricKind.RESCTRL_MB) == {}  # a rate needs two reads
    clock.now += 10.0
    set_counters(root, "BE", 0, llc_occupancy=3 << 20, mbm_total_bytes=10**9 + 5 * 10**9, mbm_local_bytes=4 * 10**8
                 + 10**9)
    second = collector.collect(110.0)
    mb = _by(second, MetricKind.RESCTRL_MB)
    assert mb[("BE", "0", "mbm_total_bytes")] == pytest.approx(5 * 10**8)
    assert mb[("BE", "0", "mbm_local_bytes")] == pytest.approx(10**8)
    assert mb[("LSR", "1", "mbm_total_bytes")] == 0.0
    assert len(mb) == 3 * 2 * 2 and len(_by(second, MetricKind.RESCTRL_LLC)) == 3 * 2
    key = next(s.key for s in second if s.key.label(Label.RESCTRL_MB_TYPE) == "mbm_total_bytes")
    assert key.label(Label.RESCTRL_TYPE) == "mb"


def test_a_reset_a_wrap_and_an_unavailable_read(tmp_path: Path) -> None:
    root = resctrl_tree(tmp_path / "resctrl", groups=("LS",), domains=(0,))
    clock = _Clock()
    collector = ResctrlCollector(str(root), monotonic=clock)
    assert collector.enabled()

    def tick(total: int | str) -> float | None:
        clock.now += 10.0
        set_counters(root, "LS", 0, mbm_total_bytes=total)
        return _by(collector.collect(clock.now), MetricKind.RESCTRL_MB).get(("LS", "0", "mbm_total_bytes"))

    assert tick(5000) is None
    assert tick(6000) == pytest.approx(100.0)
    assert tick(1000) is None  # the group was made again: reset, no rate
    assert tick(3000) == pytest.approx(200.0)
    assert tick((1 << 64) - 500) is not None
    assert tick(500) == pytest.approx(100.0)  # 1000 bytes across the wrap at 2^64
    assert tick("Unavailable") is None
    assert tick(900) is None  # restarts after a value the kernel did not have
    assert tick(1900) == pytest.approx(100.0)
    assert counter_delta(10, 4) is None and counter_delta((1 << 64) - 1, 0) == 1


def test_without_monitoring_it_says_so_once_and_stays_off(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    root = resctrl_tree(tmp_path / "resctrl", mon_features=None)
    with caplog.at_level(logging.INFO, logger="koordlet.metricsadvisor.resctrl"):
        assert ResctrlCollector(str(root)).enabled() is False
        assert ResctrlCollector(str(tmp_path / "no-resctrl")).enabled() is False
    assert sum("resctrl collector off" in r.message for r in caplog.records) == 2


def test_exported_under_koordinators_names(tmp_path: Path) -> None:
    root = resctrl_tree(tmp_path / "resctrl", groups=("BE",), domains=(0,))
    clock = _Clock()
    collector = ResctrlCollector(str(root), monotonic=clock)
    collector.enabled()
    cache = MetricCache()
    set_counters(root, "BE", 0, llc_occupancy=1 << 20, mbm_total_bytes=0, mbm_local_bytes=0)
    cache.append_samples(collector.collect(time.time() - 1))
    clock.now += 2.0
    set_counters(root, "BE", 0, llc_occupancy=1 << 20, mbm_total_bytes=2000, mbm_local_bytes=1000)
    cache.append_samples(collector.collect(time.time()))
    text = generate_latest(KoordletMetrics("node-1", cache=cache, states=StaticStates()).registry).decode()
    assert 'koordlet_resctrl_llc_occupancy{cache_id="0",node="node-1",qos="BE"} 1.048576e+06' in text
    assert ('koordlet_resctrl_memory_bandwidth{cache_id="0",mb_type="mbm_total_bytes",node="node-1",qos="BE"} '
            "1000.0") in text
    assert 'mb_type="mbm_local_bytes",node="node-1",qos="BE"} 500.0' in text
