"""Pod and container PSI: fixture v2 / Anolis v1 / hybrid trees, and real cgroup2 pressure files on this kernel."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from koordlet.metriccache import Label, MetricKind, Sample, SeriesKey
from koordlet.metricsadvisor import ContainerCgroup, PodCgroup, PodPsiCollector
from koordlet.system.cgroup import CgroupFS, CgroupVersion
from tests.koordlet.metricsadvisor.v1cgroups import V1TestCgroups, v1_cgroups

POD = PodCgroup("uid-1", "kubepods/burstable/poduid-1",
                (ContainerCgroup("ctr-a", "kubepods/burstable/poduid-1/ctr-a"),), "LS")
CPU_NO_FULL = b"some avg10=1.50 avg60=0.75 avg300=0.25 total=123\n"
WITH_FULL = b"some avg10=2.00 avg60=1.00 avg300=0.50 total=99\nfull avg10=1.00 avg60=0.50 avg300=0.10 total=9\n"


def _fs(tmp_path: Path, version: int) -> CgroupFS:
    return CgroupFS(mount_dir=str(tmp_path / "cgroup"), version=CgroupVersion(version))


def _pressure(directory: Path, cpu: bytes = CPU_NO_FULL, other: bytes = WITH_FULL) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "cpu.pressure").write_bytes(cpu)
    (directory / "memory.pressure").write_bytes(other)
    (directory / "io.pressure").write_bytes(other)


def _by_labels(samples: list[Sample]) -> dict[tuple[str, str | None, str | None, str | None, str | None], float]:
    return {
        (s.key.kind, s.key.label(Label.CONTAINER_ID) or s.key.label(Label.POD_UID), s.key.label(Label.PSI_RESOURCE),
         s.key.label(Label.PSI_PRECISION), s.key.label(Label.PSI_DEGREE)): s.value
        for s in samples
    }


def test_v2_reads_every_pod_and_container_dir(tmp_path: Path) -> None:
    _pressure(tmp_path / "cgroup" / POD.cgroup_dir)
    _pressure(tmp_path / "cgroup" / POD.containers[0].cgroup_dir, cpu=WITH_FULL)
    collector = PodPsiCollector(lambda: [POD], _fs(tmp_path, 2))
    samples = collector.collect(7.0)
    # pod: cpu some (3) + memory and io some and full (12); container: every line (18)
    assert len(samples) == 15 + 18
    got = _by_labels(samples)
    assert got[(MetricKind.POD_PSI, "uid-1", "cpu", "avg10", "some")] == 1.5
    assert (MetricKind.POD_PSI, "uid-1", "cpu", "avg10", "full") not in got
    assert got[(MetricKind.CONTAINER_PSI, "ctr-a", "cpu", "avg10", "full")] == 1.0
    assert got[(MetricKind.CONTAINER_PSI, "ctr-a", "io", "avg300", "full")] == 0.1
    container_keys = [s.key for s in samples if s.key.kind == MetricKind.CONTAINER_PSI]
    assert all(key.label(Label.POD_UID) == "uid-1" for key in container_keys)
    assert all(s.timestamp == 7.0 for s in samples)
    assert collector.open_files == 6
    collector.close()
    assert collector.open_files == 0


def test_v1_prefers_the_anolis_cpuacct_files_then_the_hybrid_unified_dir(tmp_path: Path) -> None:
    root = tmp_path / "cgroup"
    _pressure(root / "cpuacct" / POD.cgroup_dir, cpu=b"some avg10=9.00 avg60=0 avg300=0 total=1\n")
    _pressure(root / "unified" / POD.cgroup_dir, cpu=b"some avg10=1.00 avg60=0 avg300=0 total=1\n")
    _pressure(root / "unified" / POD.containers[0].cgroup_dir, cpu=b"some avg10=4.00 avg60=0 avg300=0 total=1\n")
    got = _by_labels(PodPsiCollector(lambda: [POD], _fs(tmp_path, 1)).collect(1.0))
    assert got[(MetricKind.POD_PSI, "uid-1", "cpu", "avg10", "some")] == 9.0
    assert got[(MetricKind.CONTAINER_PSI, "ctr-a", "cpu", "avg10", "some")] == 4.0


def test_no_pressure_files_means_no_samples_and_one_log_line(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "cgroup" / "cpu" / POD.cgroup_dir).mkdir(parents=True)
    collector = PodPsiCollector(lambda: [POD], _fs(tmp_path, 1))
    with caplog.at_level(logging.INFO, logger="koordlet.metricsadvisor.psi"):
        assert collector.collect(1.0) == []
        assert collector.collect(2.0) == []
    lines = [r.getMessage() for r in caplog.records if "pod PSI" in r.getMessage()]
    assert len(lines) == 1 and "no cpu.pressure in any of 2" in lines[0] and "unified" in lines[0]
    # A pod whose files show up later (created after the agent) is picked up on the next tick.
    _pressure(tmp_path / "cgroup" / "unified" / POD.cgroup_dir)
    assert len(collector.collect(3.0)) == 15


def test_bad_file_is_counted_and_the_rest_still_read_and_gone_pods_are_forgotten(tmp_path: Path) -> None:
    other = PodCgroup("uid-2", "kubepods/poduid-2", (), "LS")
    _pressure(tmp_path / "cgroup" / POD.cgroup_dir)
    (tmp_path / "cgroup" / POD.cgroup_dir / "memory.pressure").write_bytes(b"some avg10=NaN? total\n")
    _pressure(tmp_path / "cgroup" / other.cgroup_dir)
    listed = [POD, other]
    collector = PodPsiCollector(lambda: listed, _fs(tmp_path, 2))
    got = _by_labels(collector.collect(1.0))
    assert collector.read_errors == 1
    assert (MetricKind.POD_PSI, "uid-1", "memory", "avg10", "some") not in got
    assert got[(MetricKind.POD_PSI, "uid-1", "io", "avg10", "some")] == 2.0
    assert got[(MetricKind.POD_PSI, "uid-2", "cpu", "avg10", "some")] == 1.5
    listed.remove(POD)
    collector.collect(2.0)
    assert collector.open_files == 3  # only uid-2's files stay open
    collector.close()


# ------------------------------------------------------------------------------- this kernel, for real

UNIFIED = "/sys/fs/cgroup/unified"


@pytest.fixture
def hybrid() -> Iterator[V1TestCgroups]:
    if not os.path.isfile(os.path.join(UNIFIED, "cpu.pressure")):
        pytest.skip(f"no hybrid cgroup2 mount with PSI at {UNIFIED}")
    yield from v1_cgroups("psi", ("cpu", "cpuacct", "unified"))


@pytest.mark.cgroupv1
def test_real_cpu_contention_shows_as_pod_and_container_cpu_pressure(hybrid: V1TestCgroups) -> None:
    hybrid.make("podpsi/ctr")
    pod = PodCgroup("psi", f"{hybrid.prefix}/podpsi", (ContainerCgroup("ctr-psi", f"{hybrid.prefix}/podpsi/ctr"),),
                    "BE")
    # One burner more than there are CPUs: some burner is always waiting for one.
    for _ in range((os.cpu_count() or 1) + 1):
        hybrid.spawn("podpsi/ctr", "while True: pass")
    collector = PodPsiCollector(lambda: [pod], CgroupFS.detect())
    container_key = SeriesKey.of(MetricKind.CONTAINER_PSI, pod_uid="psi", container_id="ctr-psi",
                                 psi_resource="cpu", psi_precision="avg10", psi_degree="some")
    pod_key = SeriesKey.of(MetricKind.POD_PSI, pod_uid="psi", psi_resource="cpu", psi_precision="avg10",
                           psi_degree="some")
    deadline = time.monotonic() + 10.0  # the kernel recomputes the averages every 2 s
    try:
        while True:
            samples = {s.key: s.value for s in collector.collect(time.time())}
            if (samples.get(container_key, 0.0) > 0 and samples.get(pod_key, 0.0) > 0) or time.monotonic() > deadline:
                break
            time.sleep(0.5)
    finally:
        collector.close()
    assert container_key in samples and pod_key in samples, "the hybrid unified dirs were not read"
    assert samples[container_key] > 0.0
    assert samples[pod_key] >= samples[container_key] * 0.5  # the pod dir includes its container's stalls
    assert all(0.0 <= value <= 100.0 for value in samples.values())
