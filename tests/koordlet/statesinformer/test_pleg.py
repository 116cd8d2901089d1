"""PLEG on the real cgroup v1 cpu hierarchy, under a private prefix."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from koordlet.statesinformer.pleg import PodCgroupWatcher
from koordlet.system.cgroup import CgroupDriver, CgroupFS, CgroupVersion
from koordlet.system.kubepods import KubeCgroupLayout
from tests.support.waiting import wait_for

CPU = Path("/sys/fs/cgroup/cpu")


@pytest.fixture
def prefix() -> Iterator[str]:
    if os.geteuid() != 0:
        pytest.skip("needs root")
    if not (CPU / "cgroup.procs").exists():
        pytest.skip("no cgroup v1 cpu hierarchy")
    name = f"koordlet-py-test-pleg-{os.getpid()}"
    for rel in ("", "kubepods", "kubepods/burstable", "kubepods/besteffort"):
        (CPU / name / rel).mkdir()
    try:
        yield name
    finally:
        for path in sorted((p for p in (CPU / name).rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
            path.rmdir()
        (CPU / name).rmdir()


@pytest.mark.cgroupv1
def test_new_pod_dir_under_a_qos_dir_is_reported(prefix: str) -> None:
    added: list[str] = []
    layout = KubeCgroupLayout(CgroupDriver.CGROUPFS, f"/{prefix}")
    watcher = PodCgroupWatcher(CgroupFS("/sys/fs/cgroup", CgroupVersion.V1), layout, added.append)
    watcher.start()
    try:
        assert len(watcher.watched) == 3
        uid = str(uuid.uuid4())
        (CPU / prefix / "kubepods" / "besteffort" / f"pod{uid}").mkdir()
        guaranteed = str(uuid.uuid4())
        (CPU / prefix / "kubepods" / f"pod{guaranteed}").mkdir()
        (CPU / prefix / "kubepods" / "besteffort" / "not-a-pod").mkdir()
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
