"""PLEG on the real kernel (cgroup v1's cpu hierarchy on this host, v2 in the VM stage), under a private prefix."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from koordlet.statesinformer.pleg import PodCgroupWatcher
from koordlet.system.cgroup import CgroupDriver, CgroupFS, CgroupVersion
from koordlet.system.kubepods import KubeCgroupLayout
from tests.koordlet.metricsadvisor.v1cgroups import V1TestCgroups
from tests.koordlet.qosmanager.realnode import BOTH_VERSIONS, cgroups_of_version
from tests.support.waiting import wait_for


@pytest.fixture(params=BOTH_VERSIONS)
def qos_dirs(request: pytest.FixtureRequest) -> Iterator[V1TestCgroups]:
    """kubelet's QoS dirs under a private cgroup root (v1: the cpu hierarchy, which PLEG watches)."""
    for groups in cgroups_of_version(request.param, "pleg", ("cpu",)):
        for rel in ("kubepods/burstable", "kubepods/besteffort"):
            groups.make(rel)
        yield groups


def test_new_pod_dir_under_a_qos_dir_is_reported(qos_dirs: V1TestCgroups) -> None:
    added: list[str] = []
    layout = KubeCgroupLayout(CgroupDriver.CGROUPFS, f"/{qos_dirs.prefix}")
    watcher = PodCgroupWatcher(CgroupFS.detect(), layout, added.append)
    watcher.start()
    try:
        assert len(watcher.watched) == 3
        uid, guaranteed = str(uuid.uuid4()), str(uuid.uuid4())
        for rel in (f"kubepods/besteffort/pod{uid}", f"kubepods/pod{guaranteed}", "kubepods/besteffort/not-a-pod"):
            qos_dirs.make(rel)  # as kubelet (runc, systemd) makes them: mkdir
        assert wait_for(lambda: len(added) >= 2)
        assert sorted(added) == sorted([uid, guaranteed])
    finally:
        watcher.stop()


def test_missing_qos_dirs_are_skipped(tmp_path: Path) -> None:
    cgroup_fs = CgroupFS(str(tmp_path / "sys/fs/cgroup"), CgroupVersion.V1)
    watcher = PodCgroupWatcher(cgroup_fs, KubeCgroupLayout(), lambda uid: None)
    watcher.start()
    try:
        assert watcher.watched == []
    finally:
        watcher.stop()
