"""Every cgroup file of the registry on a real cgroup v2 kernel (the VM stage of `make test`): each writable
resource goes through the executor in v1 terms and is read back from the kernel's v2 file; each read-only one
is read. Fixture trees accept any text; the kernel does not, so this is where a wrong v2 name, conversion or
value format shows. Files only Anolis kernels have must be refused as unsupported, never written elsewhere.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from koordlet.actuator import PlanRunner
from koordlet.executor import (
    InvalidUpdateError,
    PartialWriteError,
    ResourceExecutor,
    ResourceUpdate,
    UnsupportedResourceError,
)
from koordlet.plan import LineRestore, LineWrite, Plan
from koordlet.system.cgroup import CgroupFS, CgroupVersion
from koordlet.system.resources import CGROUP_RESOURCES, ValueKind
from tests.support.v2guest import skip_unless_v2_writable

pytestmark = pytest.mark.cgroupv2

ROOT = Path("/sys/fs/cgroup")
MiB = 1 << 20
CONTROLLERS = ("cpu", "cpuset", "memory", "io", "pids")

# resource: [(v1 value written through the executor, what the v2 file then reads)], applied in order.
WRITES: dict[str, list[tuple[str, str]]] = {
    "cpu.shares": [("1024", "39"), ("2", "1"), ("262144", "10000"), ("512", "20")],
    "cpu.cfs_quota_us": [("150000", "150000 100000"), ("-1", "max 100000"), ("200000", "200000 100000")],
    "cpu.cfs_period_us": [("50000", "200000 50000"), ("100000", "200000 100000")],  # the quota is kept
    "cpu.cfs_burst_us": [("100000", "100000"), ("0", "0")],
    "cpu.idle": [("1", "1"), ("0", "0")],
    "cpuset.cpus": [("0", "0"), ("", "")],  # empty: inherit the parent's (v2 only)
    "cpuset.mems": [("0", "0"), ("", "")],
    "memory.limit_in_bytes": [(str(96 * MiB), str(96 * MiB)), ("-1", "max")],
    "memory.min": [(str(32 * MiB), str(32 * MiB)), ("0", "0")],
    "memory.low": [(str(64 * MiB), str(64 * MiB)), ("0", "0")],
    "memory.high": [(str(80 * MiB), str(80 * MiB)), ("-1", "max")],
    "memory.oom.group": [("1", "1"), ("0", "0")],
}
ANOLIS_ONLY = {"cpu.bvt_warp_ns", "memory.wmark_ratio", "memory.wmark_scale_factor", "memory.wmark_min_adj",
               "memory.priority", "memory.use_priority_oom"}
V1_ONLY = {"net_cls.classid"}
TASKS = {"cgroup.procs", "tasks"}
ACTIONS = {"memory.reclaim"}  # write-only: below
# Per-device files (a device number in every value): written on the guest's attached disk by
# tests/koordlet/qosmanager/test_blkio_v2.py (the io.max keys, the root's io.cost.qos and io.cost.model; io.weight
# only by the host's unit tests), io.weight's default line by tests/koordlet/qosmanager/test_psithrottle_v2.py.
PER_DEVICE = {name for name, r in CGROUP_RESOURCES.items() if r.per_device}


@pytest.fixture
def leaf() -> Iterator[str]:
    """``koordlet-py-registry-<pid>/pod/ctr`` with every controller enabled down to the leaf."""
    skip_unless_v2_writable(CONTROLLERS)
    top = f"koordlet-py-registry-{os.getpid()}"
    made: list[Path] = []
    try:
        for rel in (top, f"{top}/pod", f"{top}/pod/ctr"):
            parent = (ROOT / rel).parent
            (parent / "cgroup.subtree_control").write_text(" ".join(f"+{c}" for c in CONTROLLERS))
            (ROOT / rel).mkdir()
            made.append(ROOT / rel)
        yield f"{top}/pod/ctr"
    finally:
        for d in reversed(made):
            for _ in range(50):
                try:
                    d.rmdir()
                    break
                except OSError:
                    os.sched_yield()


def test_the_table_covers_every_writable_resource() -> None:
    writable = {name for name, r in CGROUP_RESOURCES.items() if r.writable}
    assert PER_DEVICE == {"blkio.throttle.read_bps_device", "blkio.throttle.write_bps_device",
                          "blkio.throttle.read_iops_device", "blkio.throttle.write_iops_device",
                          "blkio.cost.weight", "blkio.cost.qos", "blkio.cost.model", "io.weight.default"}
    assert writable == set(WRITES) | ANOLIS_ONLY | V1_ONLY | TASKS | PER_DEVICE | ACTIONS


def test_memory_reclaim_is_there_and_asking_an_empty_cgroup_is_a_partial_write(leaf: str) -> None:
    """Debian's 6.1 has memory.reclaim (Linux >= 5.19). Nothing to reclaim: the kernel answers EAGAIN, which the
    executor reports as a partial write (not a failure), and asking again writes again (no write cache)."""
    executor = ResourceExecutor(CgroupFS.detect())
    assert executor.has("memory.reclaim", leaf)
    for _ in range(2):
        with pytest.raises(PartialWriteError):
            executor.update(ResourceUpdate.of("memory.reclaim", leaf, 8 * MiB))


def test_every_writable_v2_file_takes_the_executors_value(leaf: str) -> None:
    executor = ResourceExecutor(CgroupFS.detect())
    assert executor.cgroup_fs.version is CgroupVersion.V2
    got: dict[tuple[str, str], str] = {}
    for name, steps in WRITES.items():
        resource = CGROUP_RESOURCES[name]
        for value, _ in steps:
            executor.update(ResourceUpdate.of(name, leaf, value))
            got[(name, value)] = (ROOT / leaf / resource.v2_file).read_text().strip()
    want = {(name, value): file_value for name, steps in WRITES.items() for value, file_value in steps}
    assert got == want, {k: (v, want[k]) for k, v in got.items() if v != want[k]}


def test_io_weights_default_line_is_written_recorded_and_put_back(leaf: str) -> None:
    """BE PSI throttle's line: "default N" through the plan runner's recorded lines, back to what was there."""
    executor = ResourceExecutor(CgroupFS.detect())
    runner = PlanRunner(executor)
    assert executor.has("io.weight.default", leaf)
    runner.run(Plan(lines=(LineWrite("io.weight.default", leaf, "default 25"),)), "test")
    assert (ROOT / leaf / "io.weight").read_text().splitlines()[0] == "default 25"
    assert executor.records.device_lines.get(f"io.weight.default@default@{leaf}") == "default 100"
    runner.run(Plan(lines=(LineRestore("io.weight.default", leaf, "default"),)), "test")
    assert (ROOT / leaf / "io.weight").read_text().splitlines()[0] == "default 100"


def test_anolis_files_are_unsupported_and_v1_only_files_are_refused(leaf: str) -> None:
    executor = ResourceExecutor(CgroupFS.detect())
    for name in sorted(ANOLIS_ONLY):
        value = "0" if CGROUP_RESOURCES[name].kind is ValueKind.INT_RANGE else ""
        with pytest.raises(UnsupportedResourceError):
            executor.update(ResourceUpdate.of(name, leaf, value if name != "memory.wmark_scale_factor" else "50"))
    for name in sorted(V1_ONLY):
        with pytest.raises(InvalidUpdateError):
            executor.update(ResourceUpdate.of(name, leaf, "1"))
    left = {p.name for p in (ROOT / leaf).iterdir()}
    assert not left & (ANOLIS_ONLY | V1_ONLY)  # nothing was created in the cgroup dir


def test_cgroup_procs_and_threads_move_a_real_process(leaf: str) -> None:
    executor = ResourceExecutor(CgroupFS.detect())
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        executor.update(ResourceUpdate.of("cgroup.procs", leaf, str(child.pid)))
        assert Path(f"/proc/{child.pid}/cgroup").read_text().strip() == f"0::/{leaf}"
        assert str(child.pid) in executor.read("cgroup.procs", leaf).split()
        # "tasks" is cgroup.threads on v2: listing works, and naming a thread of a process already there is taken.
        assert str(child.pid) in executor.read("tasks", leaf).split()
        executor.update(ResourceUpdate.of("tasks", leaf, str(child.pid)))
    finally:
        child.kill()
        child.wait(10)


def test_every_readable_v2_file_reads(leaf: str) -> None:
    executor = ResourceExecutor(CgroupFS.detect())
    read = {}
    for name, resource in CGROUP_RESOURCES.items():
        if resource.writable or resource.v2_file is None:
            continue
        read[name] = executor.read(name, leaf)
    assert {"cpu.stat", "memory.stat", "memory.current", "cpu.pressure", "memory.pressure", "io.pressure",
            "cpuset.cpus.effective", "memory.events"} <= {CGROUP_RESOURCES[n].v2_file for n in read}
    assert "usage_usec" in read["cpu.stat"] and "anon " in read["memory.stat"]
    assert read["cpu.pressure"].startswith("some avg10=")
