"""The executor on the real cgroup v1 hierarchies of this kernel, under a private prefix.

Shows the ordering rules the leveled update exists for (a v1 child's CFS quota may not exceed its
parent's; a child's cpuset must be a subset of its parent's) by first letting a naive write fail.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator

import pytest

from koordlet.executor import (
    CgroupNotFoundError,
    InvalidUpdateError,
    ResourceExecutor,
    ResourceUpdate,
    UnsafePathError,
    WriteFailedError,
)
from koordlet.executor.metrics import STATUS_INVALID, STATUS_SKIPPED, STATUS_WRITTEN, update_count
from koordlet.system.cgroup import CgroupFS, CgroupVersion, detect_cgroup_version

CGROUP_MOUNT = "/sys/fs/cgroup"


class PrivateCgroups:
    """``<mount>/<ctrl>/koordlet-py-test-<pid>-<name>/...`` dirs, removed deepest first."""

    def __init__(self, controller: str, name: str) -> None:
        self.controller = controller
        self.prefix = f"koordlet-py-test-{os.getpid()}-{name}"
        self.created: list[str] = []

    def path(self, rel: str = "") -> str:
        return os.path.join(CGROUP_MOUNT, self.controller, self.prefix, rel).rstrip("/")

    def rel(self, rel: str = "") -> str:
        return f"{self.prefix}/{rel}".rstrip("/")

    def make(self, rel: str = "") -> None:
        parts = [p for p in rel.split("/") if p]
        for depth in range(len(parts) + 1):
            path = self.path("/".join(parts[:depth]))
            if not os.path.isdir(path):
                os.mkdir(path)
                self.created.append(path)

    def read(self, rel: str, filename: str) -> str:
        with open(os.path.join(self.path(rel), filename)) as f:
            return f.read().strip()

    def cleanup(self) -> None:
        for path in sorted(self.created, key=len, reverse=True):
            try:
                os.rmdir(path)
            except FileNotFoundError:
                pass


def _private(controller: str, name: str) -> Iterator[PrivateCgroups]:
    if os.geteuid() != 0:
        pytest.skip("needs root to create cgroup v1 dirs")
    if detect_cgroup_version() is not CgroupVersion.V1:
        pytest.skip("host is not on cgroup v1")
    if not os.path.isfile(os.path.join(CGROUP_MOUNT, controller, "cgroup.procs")):
        pytest.skip(f"cgroup v1 hierarchy {controller} is not mounted at {CGROUP_MOUNT}/{controller}")
    cgroups = PrivateCgroups(controller, name)
    try:
        yield cgroups
    finally:
        cgroups.cleanup()


@pytest.fixture
def cpu_cgroups() -> Iterator[PrivateCgroups]:
    yield from _private("cpu", "executor")


@pytest.fixture
def cpuset_cgroups() -> Iterator[PrivateCgroups]:
    yield from _private("cpuset", "executor")


@pytest.fixture
def executor() -> ResourceExecutor:
    return ResourceExecutor(CgroupFS(version=CgroupVersion.V1))


def _quota(rel: str, value: int) -> ResourceUpdate:
    return ResourceUpdate.of("cpu.cfs_quota_us", rel, value)


def test_leveled_update_raises_parent_quota_before_a_larger_child_quota(
    cpu_cgroups: PrivateCgroups, executor: ResourceExecutor
) -> None:
    cpu_cgroups.make("pod/container")
    pod, container = cpu_cgroups.rel("pod"), cpu_cgroups.rel("pod/container")
    assert executor.leveled_update([_quota(container, 20000), _quota(pod, 50000)]).ok

    # The kernel refuses a child quota above its parent's: naive child-first order fails.
    with pytest.raises(WriteFailedError) as info:
        executor.update(_quota(container, 80000))
    assert info.value.errno == errno.EINVAL

    result = executor.leveled_update([_quota(container, 80000), _quota(pod, 100000)])
    assert result.ok, result.failures
    assert cpu_cgroups.read("pod", "cpu.cfs_quota_us") == "100000"
    assert cpu_cgroups.read("pod/container", "cpu.cfs_quota_us") == "80000"


def test_leveled_update_lowers_child_quota_before_parent(
    cpu_cgroups: PrivateCgroups, executor: ResourceExecutor
) -> None:
    cpu_cgroups.make("pod/container")
    pod, container = cpu_cgroups.rel("pod"), cpu_cgroups.rel("pod/container")
    assert executor.leveled_update([_quota(pod, 100000), _quota(container, 80000)]).ok
    with pytest.raises(WriteFailedError):  # parent below its child: refused by the kernel
        executor.update(_quota(pod, 30000))

    result = executor.leveled_update([_quota(pod, 30000), _quota(container, 20000)])
    assert result.ok, result.failures
    assert cpu_cgroups.read("pod", "cpu.cfs_quota_us") == "30000"
    assert cpu_cgroups.read("pod/container", "cpu.cfs_quota_us") == "20000"


def test_leveled_update_three_levels_unlimited_to_limited_and_back(
    cpu_cgroups: PrivateCgroups, executor: ResourceExecutor
) -> None:
    cpu_cgroups.make("qos/pod/container")
    dirs = [cpu_cgroups.rel("qos"), cpu_cgroups.rel("qos/pod"), cpu_cgroups.rel("qos/pod/container")]
    assert executor.leveled_update([_quota(d, v) for d, v in zip(dirs, (200000, 100000, 50000), strict=True)]).ok
    assert executor.leveled_update([_quota(d, -1) for d in reversed(dirs)]).ok
    assert [cpu_cgroups.read(d.split("/", 1)[1], "cpu.cfs_quota_us") for d in dirs] == ["-1", "-1", "-1"]


def test_an_unchanged_leveled_update_touches_no_file_until_verify_or_the_cache_window_ends(
    cpu_cgroups: PrivateCgroups
) -> None:
    """The QoS tick repeats the same leveled updates every second: values the write cache holds are neither
    read (pass 1) nor written (pass 2). A hand change is put back by a verifying caller (the reconciler) at
    once, and by anyone once the cache window ends."""
    now = [0.0]
    executor = ResourceExecutor(CgroupFS(version=CgroupVersion.V1), force_update_seconds=60.0, clock=lambda: now[0])
    cpu_cgroups.make("pod/container")
    pod, container = cpu_cgroups.rel("pod"), cpu_cgroups.rel("pod/container")
    updates = [_quota(container, 20000), _quota(pod, 50000)]
    assert executor.leveled_update(updates).written == 2
    with open(os.path.join(cpu_cgroups.path("pod"), "cpu.cfs_quota_us"), "w") as f:
        f.write("40000")  # by hand, tighter: pass 1 would have loosened it back had it read the file
    now[0] = 1.0
    result = executor.leveled_update(updates)
    assert (result.written, result.skipped) == (0, 2)
    assert cpu_cgroups.read("pod", "cpu.cfs_quota_us") == "40000"
    assert executor.leveled_update(updates, verify=True).written >= 1
    assert cpu_cgroups.read("pod", "cpu.cfs_quota_us") == "50000"
    with open(os.path.join(cpu_cgroups.path("pod"), "cpu.cfs_quota_us"), "w") as f:
        f.write("40000")
    now[0] = 62.0
    assert executor.leveled_update(updates).ok
    assert cpu_cgroups.read("pod", "cpu.cfs_quota_us") == "50000"


def _cpus(rel: str, cpus: str) -> ResourceUpdate:
    return ResourceUpdate.of("cpuset.cpus", rel, cpus)


def test_leveled_cpuset_shrink_grow_and_shift(cpuset_cgroups: PrivateCgroups, executor: ResourceExecutor) -> None:
    with open(os.path.join(CGROUP_MOUNT, "cpuset", "cpuset.cpus")) as f:
        all_cpus = f.read().strip()
    if all_cpus in ("0", ""):
        pytest.skip("needs at least two CPUs in the root cpuset")
    cpuset_cgroups.make("be/pod")
    # New v1 cpuset dirs start empty; give the private top dir every CPU as kubelet does for kubepods.
    assert executor.update(_cpus(cpuset_cgroups.rel(), all_cpus))
    be, pod = cpuset_cgroups.rel("be"), cpuset_cgroups.rel("be/pod")
    assert executor.leveled_update([_cpus(pod, "0-1"), _cpus(be, "0-1")]).ok

    with pytest.raises(WriteFailedError):  # shrinking a parent below its child's CPUs is refused
        executor.update(_cpus(be, "1"))
    assert executor.leveled_update([_cpus(be, "1"), _cpus(pod, "1")]).ok  # shrink: child first
    assert (cpuset_cgroups.read("be", "cpuset.cpus"), cpuset_cgroups.read("be/pod", "cpuset.cpus")) == ("1", "1")

    with pytest.raises(WriteFailedError):  # a child outside its parent's CPUs is refused
        executor.update(_cpus(pod, "0-1"))
    assert executor.leveled_update([_cpus(pod, "0-1"), _cpus(be, "0-1")]).ok  # grow: parent first
    assert cpuset_cgroups.read("be/pod", "cpuset.cpus") == "0-1"

    assert executor.leveled_update([_cpus(pod, "0"), _cpus(be, "0")]).ok  # shift: union first, then exact
    assert (cpuset_cgroups.read("be", "cpuset.cpus"), cpuset_cgroups.read("be/pod", "cpuset.cpus")) == ("0", "0")
    assert executor.leveled_update([_cpus(pod, "1"), _cpus(be, "1")]).ok
    assert (cpuset_cgroups.read("be", "cpuset.cpus"), cpuset_cgroups.read("be/pod", "cpuset.cpus")) == ("1", "1")
    assert executor.update(_cpus(pod, ""))  # an empty value really reaches the kernel and clears the set
    assert cpuset_cgroups.read("be/pod", "cpuset.cpus") == ""


def test_unchanged_value_is_written_once_until_the_cache_expires(cpu_cgroups: PrivateCgroups) -> None:
    now = [1000.0]
    executor = ResourceExecutor(CgroupFS(version=CgroupVersion.V1), clock=lambda: now[0])
    cpu_cgroups.make("pod")
    update = ResourceUpdate.of("cpu.shares", cpu_cgroups.rel("pod"), 512)
    written_before = update_count("cpu.shares", STATUS_WRITTEN)
    skipped_before = update_count("cpu.shares", STATUS_SKIPPED)

    assert executor.update(update) is True
    assert executor.update(update) is False
    now[0] += 30
    assert executor.update(update) is False
    now[0] += 31  # 61 s after the write: force it again
    assert executor.update(update) is True
    assert executor.update(ResourceUpdate.of("cpu.shares", cpu_cgroups.rel("pod"), 1024)) is True

    assert update_count("cpu.shares", STATUS_WRITTEN) - written_before == 3
    assert update_count("cpu.shares", STATUS_SKIPPED) - skipped_before == 2
    assert cpu_cgroups.read("pod", "cpu.shares") == "1024"


def test_reads_through_kept_descriptors_follow_a_removed_and_recreated_cgroup(cpu_cgroups: PrivateCgroups) -> None:
    """The QoS snapshot's reads (``read(every_tick=True)``) go through kept descriptors: after the pod's cgroup
    is removed the read says so (kernfs answers ENODEV on the old descriptor), a re-created cgroup is read
    afresh, and descriptors left idle are closed so they do not pin removed cgroups in the kernel. One-off
    reads (the hooks', read-before-write) keep none."""
    now = [1000.0]
    executor = ResourceExecutor(CgroupFS(version=CgroupVersion.V1), clock=lambda: now[0])
    cpu_cgroups.make("pod")
    rel = cpu_cgroups.rel("pod")
    fds_at_start = len(os.listdir("/proc/self/fd"))
    executor.update(ResourceUpdate.of("cpu.cfs_quota_us", rel, 50000))
    assert executor.update(ResourceUpdate.of("cpu.cfs_quota_us", rel, 50000), verify=True) is False
    assert executor.read("cpu.cfs_quota_us", rel) == "50000"
    assert len(os.listdir("/proc/self/fd")) == fds_at_start
    assert executor.read("cpu.cfs_quota_us", rel, every_tick=True) == "50000"
    assert len(os.listdir("/proc/self/fd")) == fds_at_start + 1

    os.rmdir(cpu_cgroups.path("pod"))
    with pytest.raises(CgroupNotFoundError):
        executor.read("cpu.cfs_quota_us", rel, every_tick=True)
    os.mkdir(cpu_cgroups.path("pod"))  # kubelet made it again: a fresh cgroup, quota unlimited
    assert executor.read("cpu.cfs_quota_us", rel, every_tick=True) == "-1"
    # The write cache still holds 50000 but verify reads the new file and writes again.
    assert executor.update(ResourceUpdate.of("cpu.cfs_quota_us", rel, 50000), verify=True) is True
    assert cpu_cgroups.read("pod", "cpu.cfs_quota_us") == "50000"

    fds = len(os.listdir("/proc/self/fd"))
    now[0] += 10  # nothing read for longer than the idle time: the next read sweeps
    cpu_cgroups.make("other")
    assert executor.read("cpu.shares", cpu_cgroups.rel("other"), every_tick=True) == "1024"
    assert len(os.listdir("/proc/self/fd")) == fds  # one closed (the pod's), one kept (other's)


def test_a_removed_cgroup_is_reported_by_verify_at_once_and_by_the_next_forced_write(
    cpu_cgroups: PrivateCgroups,
) -> None:
    """A cached write is skipped without touching the file system; reading back (verify) or the forced
    rewrite after force-update-seconds finds the cgroup gone and says so."""
    now = [1000.0]
    executor = ResourceExecutor(CgroupFS(version=CgroupVersion.V1), clock=lambda: now[0])
    cpu_cgroups.make("pod")
    update = ResourceUpdate.of("cpu.shares", cpu_cgroups.rel("pod"), 256)
    assert executor.update(update) is True
    os.rmdir(cpu_cgroups.path("pod"))
    with pytest.raises(CgroupNotFoundError):
        executor.update(update, verify=True)
    assert executor.update(update) is False  # still within force-update-seconds: skipped
    now[0] += 61
    with pytest.raises(CgroupNotFoundError):
        executor.update(update)


def test_invalid_value_is_rejected_counted_and_not_written(
    cpu_cgroups: PrivateCgroups, executor: ResourceExecutor
) -> None:
    cpu_cgroups.make("pod")
    before = cpu_cgroups.read("pod", "cpu.shares")
    invalid_before = update_count("cpu.shares", STATUS_INVALID)
    with pytest.raises(InvalidUpdateError, match=r"cpu\.shares"):
        executor.update(ResourceUpdate.of("cpu.shares", cpu_cgroups.rel("pod"), 1))
    assert cpu_cgroups.read("pod", "cpu.shares") == before
    assert update_count("cpu.shares", STATUS_INVALID) - invalid_before == 1


@pytest.mark.parametrize("escape", ["../", "../../memory", "/../cpuset", "pod/../../..", "pod/./x"])
def test_dot_dot_paths_are_refused_on_the_real_hierarchy(
    cpu_cgroups: PrivateCgroups, executor: ResourceExecutor, escape: str
) -> None:
    cpu_cgroups.make("pod")
    root_shares = open(os.path.join(CGROUP_MOUNT, "cpu", "cpu.shares")).read()
    with pytest.raises(UnsafePathError):
        executor.update(ResourceUpdate.of("cpu.shares", f"{cpu_cgroups.rel()}/{escape}", 2))
    assert open(os.path.join(CGROUP_MOUNT, "cpu", "cpu.shares")).read() == root_shares
    assert cpu_cgroups.read("pod", "cpu.shares") == "1024"
