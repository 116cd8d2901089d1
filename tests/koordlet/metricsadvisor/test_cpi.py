"""``CPICollector`` and ``Libpfm4``. This machine and the v2 guest have no hardware PMU (perf_event_open of
cycles or instructions answers ENOENT), so:

- the unavailable path: the collector says once that the kernel lacks the counter and stays off;
- the whole path (cgroup dirs, per-CPU cgroup counters, the window, reading, scaling, the cache and Prometheus)
  runs with software counters standing in for (cycles, instructions): ``task-clock`` and ``cpu-clock`` count a
  real busy process in a real cgroup: a private ``perf_event`` cgroup v1 hierarchy on this kernel, and a
  cgroup v2 dir in the guest; once with one counter per event, once grouped with libpfm4's encoding.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import generate_latest

from koordlet.api.pod import ContainerMeta, PodMeta
from koordlet.metriccache import CPI_RESOURCE_CYCLE, CPI_RESOURCE_INSTRUCTION, Label, MetricCache, MetricKind
from koordlet.metrics import KoordletMetrics
from koordlet.metricsadvisor.cpi import CPICollector
from koordlet.metricsadvisor.pods import ContainerCgroup, PodCgroup
from koordlet.statesinformer.api import StaticStates
from koordlet.system.cgroup import CgroupFS, CgroupVersion
from koordlet.system.perf import CPU_CLOCK, CYCLES, INSTRUCTIONS, TASK_CLOCK, PerfError, encode_with_libpfm, probe
from koordlet.system.sysfs import read_online_cpus
from tests.support.v2guest import KERNEL_LACKS

POD_UID = "cpi00000-0000-4000-8000-000000000001"
BUSY_ID = "b" * 64
IDLE_ID = "1" * 64


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class PerfCgroups:
    """A pod with a busy and an idle container in real cgroups that perf can count: ``cgroup_fs`` is the
    collector's view, ``rel`` the pod dir relative to the hierarchy root."""

    def __init__(self, cgroup_fs: CgroupFS, base: str, rel: str) -> None:
        self.cgroup_fs = cgroup_fs
        self._base = base  # absolute dir of the pod in the perf hierarchy
        self.rel = rel
        self._dirs: list[str] = []
        self._children: list[subprocess.Popen[bytes]] = []
        self.container_ids: list[str] = []
        for path in (os.path.dirname(base), base):
            self._make(path)
        self.add(BUSY_ID, IDLE_ID)

    def _make(self, path: str) -> None:
        if not os.path.isdir(path):
            os.mkdir(path)
            self._dirs.append(path)

    def add(self, *container_ids: str) -> None:
        for container_id in container_ids:
            self._make(os.path.join(self._base, container_id))
            self.container_ids.append(container_id)

    def spawn(self, container_id: str, argv: list[str]) -> int:
        child = subprocess.Popen(argv)
        self._children.append(child)
        with open(os.path.join(self._base, container_id, "cgroup.procs"), "w") as f:
            f.write(str(child.pid))
        return child.pid

    def pods(self) -> tuple[PodCgroup, ...]:
        return (PodCgroup(POD_UID, self.rel, tuple(ContainerCgroup(cid, f"{self.rel}/{cid}")
                                                   for cid in self.container_ids), "LS"),)

    def cleanup(self) -> None:
        for child in self._children:
            child.kill()
            child.wait()
        for path in reversed(self._dirs):
            for attempt in range(250):  # a reaped task can keep a cgroup busy for a moment
                try:
                    os.rmdir(path)
                    break
                except OSError as err:
                    if err.errno != errno.EBUSY or attempt == 249:
                        raise
                    time.sleep(0.02)


def _software_counts_here() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root for cgroup perf counters")
    try:
        probe(TASK_CLOCK)
    except PerfError as err:
        pytest.skip(f"{KERNEL_LACKS} software perf events: {err}")


@pytest.fixture
def v1_perf(tmp_path: Path) -> Iterator[PerfCgroups]:
    """A private mount of this kernel's perf_event cgroup v1 controller (not mounted by the host)."""
    _software_counts_here()
    mount_dir = tmp_path / "cgroup"
    perf_dir = mount_dir / "perf_event"
    perf_dir.mkdir(parents=True)
    result = subprocess.run(["mount", "-t", "cgroup", "-o", "perf_event", "koordlet-py-test-perf", str(perf_dir)],
                            capture_output=True, text=True)
    if result.returncode != 0:
        pytest.skip(f"cannot mount the perf_event cgroup v1 controller: {result.stderr.strip()}")
    rel = f"kubepods-test-{os.getpid()}/pod{POD_UID}"
    try:
        groups = PerfCgroups(CgroupFS(str(mount_dir), CgroupVersion.V1), str(perf_dir / rel), rel)
        try:
            yield groups
        finally:
            groups.cleanup()
    finally:
        deadline = time.monotonic() + 10.0  # the removed cgroups are released after their last reference
        while time.monotonic() < deadline and _perf_cgroups() > 1:
            time.sleep(0.05)
        subprocess.run(["umount", str(perf_dir)], check=True)
        _release_perf_hierarchy(perf_dir)


def _perf_line() -> list[str]:
    with open("/proc/cgroups") as f:
        return next(line.split() for line in f if line.startswith("perf_event\t"))


def _perf_hierarchy() -> int:
    return int(_perf_line()[1])


def _perf_cgroups() -> int:
    return int(_perf_line()[2])


def _release_perf_hierarchy(mount_point: Path) -> None:
    """Wait until the unmounted hierarchy is released back to the unified one: while perf_event stays bound
    without a mount, containerd's cgroup v1 stats find it in every /proc/<pid>/cgroup and fail. A hierarchy
    unmounted while a (dying) child was left stays bound: mounting it again, now childless, and unmounting
    releases it."""
    for attempt in range(2):
        # The kernel frees an unmounted childless hierarchy asynchronously: seconds on a busy machine.
        deadline = time.monotonic() + 30.0
        while time.monotonic() < deadline and _perf_hierarchy() != 0 and not _mounted_elsewhere():
            time.sleep(0.1)
        if _perf_hierarchy() == 0 or _mounted_elsewhere() or attempt == 1:
            break
        subprocess.run(["mount", "-t", "cgroup", "-o", "perf_event", "koordlet-py-test-perf", str(mount_point)],
                       check=True)
        subprocess.run(["umount", str(mount_point)], check=True)
    assert _perf_hierarchy() == 0 or _mounted_elsewhere(), \
        "the perf_event cgroup v1 hierarchy of the test stays bound after its unmount"


def _mounted_elsewhere() -> bool:
    """Someone else has perf_event mounted: then it stays bound, and rightly so."""
    with open("/proc/self/mountinfo") as f:
        return any(" - cgroup " in line and "perf_event" in line.rsplit(" - ", 1)[1] for line in f)


@pytest.fixture
def v2_perf() -> Iterator[PerfCgroups]:
    """A cgroup v2 dir (perf_event is implicit on the unified hierarchy): the v2 guest."""
    _software_counts_here()
    root = "/sys/fs/cgroup"
    try:
        with open(os.path.join(root, "cgroup.controllers")):
            pass
    except OSError:
        pytest.skip("/sys/fs/cgroup is not cgroup v2 (this machine has cgroup v1)")
    # The kernel gives new cgroups the implicit perf_event css only once the root's subtree_control has been
    # written (until then perf_event_open on a child cgroup is ENOENT): systemd and kubelet always have on a
    # node; virtme-ng's init has not, so do what they do.
    with open(os.path.join(root, "cgroup.subtree_control"), "w") as f:
        f.write("+cpu")
    rel = f"koordlet-py-test-{os.getpid()}-cpi/pod{POD_UID}"
    groups = PerfCgroups(CgroupFS(root, CgroupVersion.V2), os.path.join(root, rel), rel)
    try:
        yield groups
    finally:
        groups.cleanup()


def _collect_one_window(collector: CPICollector, clock: _Clock, seconds: float) -> list:
    assert collector.collect(time.time()) == []  # opens and starts the counters
    time.sleep(seconds)
    clock.now += collector.interval_s
    return collector.collect(time.time())


def _by_container(samples) -> dict[tuple[str, str], float]:
    return {(s.key.label(Label.CONTAINER_ID), s.key.label(Label.CPI_RESOURCE)): s.value for s in samples
            if s.key.kind == MetricKind.CONTAINER_CPI}


def _asleep(pid: int) -> bool:
    """Whether ``pid`` sits in nanosleep or clock_nanosleep (x86-64 syscalls 35, 230): its exec is over, which under
    emulation costs tens of ms of CPU that the idle container's window must not count."""
    try:
        return Path(f"/proc/{pid}/syscall").read_text().split()[0] in ("35", "230")
    except (OSError, IndexError):
        return False


def _whole_path(groups: PerfCgroups, *, group: bool, libpfm: bool) -> None:
    groups.spawn(BUSY_ID, [sys.executable, "-c", "while True: pass"])
    idle = groups.spawn(IDLE_ID, ["sleep", "60"])
    deadline = time.monotonic() + 30
    while not _asleep(idle) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _asleep(idle), Path(f"/proc/{idle}/syscall").read_text()
    clock = _Clock()
    cpus = read_online_cpus()
    collector = CPICollector(groups.pods, groups.cgroup_fs, cpus, cpi_interval_s=60.0, window_s=10.0,
                             events=(TASK_CLOCK, CPU_CLOCK), group=group, libpfm=libpfm, monotonic=clock)
    assert collector.enabled()
    samples = _collect_one_window(collector, clock, 1.0)
    counts = _by_container(samples)
    assert set(counts) == {(cid, res) for cid in (BUSY_ID, IDLE_ID)
                           for res in (CPI_RESOURCE_CYCLE, CPI_RESOURCE_INSTRUCTION)}
    busy_ns = counts[(BUSY_ID, CPI_RESOURCE_CYCLE)]  # task-clock: ns the busy container ran
    assert 0.15e9 < busy_ns < 1.3e9, busy_ns  # ~1 s of one core on a shared 2-core machine
    assert counts[(BUSY_ID, CPI_RESOURCE_INSTRUCTION)] == pytest.approx(busy_ns, rel=0.1)  # cpu-clock: the same
    assert counts[(IDLE_ID, CPI_RESOURCE_CYCLE)] < 0.02e9
    assert collector.collect(time.time()) == []  # the next window starts only after the interval
    clock.now += 60.0
    assert collector.collect(time.time()) == []  # a new window: started
    collector.close()
    cache = MetricCache()
    cache.append_samples(samples)
    pod = PodMeta("web", "ns", POD_UID, containers=(ContainerMeta("busy", BUSY_ID), ContainerMeta("idle", IDLE_ID)))
    text = generate_latest(KoordletMetrics("node-1", cache=cache, states=StaticStates(pods=(pod,))).registry).decode()
    line = next(li for li in text.splitlines() if li.startswith("koordlet_container_cpi{")
                and 'cpi_field="cycles"' in li and 'container_name="busy"' in li)
    assert f'container_id="{BUSY_ID}"' in line and 'pod_name="web"' in line and 'pod_namespace="ns"' in line
    assert float(line.split()[-1]) == busy_ns


@pytest.mark.cgroupv1
def test_whole_path_with_software_counters_on_a_v1_perf_event_cgroup(v1_perf: PerfCgroups) -> None:
    _whole_path(v1_perf, group=False, libpfm=False)


@pytest.mark.cgroupv1
def test_grouped_counters_encoded_by_libpfm4_on_a_v1_perf_event_cgroup(v1_perf: PerfCgroups) -> None:
    try:
        encode_with_libpfm(["task-clock", "cpu-clock"])
    except PerfError as err:
        pytest.skip(f"libpfm4 unusable here: {err}")
    _whole_path(v1_perf, group=True, libpfm=True)


@pytest.mark.cgroupv2
@pytest.mark.alone  # counts a busy process's share of a core: in the guest, not beside the host stages
def test_whole_path_with_software_counters_on_a_v2_cgroup(v2_perf: PerfCgroups) -> None:
    _whole_path(v2_perf, group=True, libpfm=False)


@pytest.mark.cgroupv2  # also in the v2 guest: its kernel has no PMU either
def test_without_hardware_counters_the_collector_says_so_once_and_stays_off(
        caplog: pytest.LogCaptureFixture) -> None:
    try:
        probe(INSTRUCTIONS)
        probe(CYCLES)
    except PerfError as err:
        assert err.errno == errno.ENOENT  # no PMU: what this machine and the v2 guest answer
    else:
        pytest.skip("this machine has hardware counters: the unavailable path cannot be shown here")
    collector = CPICollector(tuple, CgroupFS(), (0,), window_s=10.0)
    with caplog.at_level(logging.INFO, logger="koordlet.metricsadvisor.cpi"):
        assert collector.enabled() is False
    (record,) = caplog.records
    assert record.levelno == logging.WARNING
    assert record.getMessage().startswith("CPI collector off: the kernel lacks the cycles counter")
    assert "No such file or directory" in record.getMessage()


def test_libpfm4_encodes_the_generic_events_as_the_kernel_numbers_them() -> None:
    try:
        cycles, instructions, task_clock = encode_with_libpfm(["cycles", "instructions", "task-clock"])
    except PerfError as err:
        pytest.skip(f"libpfm4 unusable here: {err}")
    assert (cycles.type, cycles.config) == (CYCLES.type, CYCLES.config)
    assert (instructions.type, instructions.config) == (INSTRUCTIONS.type, INSTRUCTIONS.config)
    assert (task_clock.type, task_clock.config) == (TASK_CLOCK.type, TASK_CLOCK.config)
    with pytest.raises(PerfError, match="cannot encode 'no-such-event'"):
        encode_with_libpfm(["no-such-event"])


# Run in a process of its own whose soft RLIMIT_NOFILE is argv[1]: three CPI windows over the containers of argv[2]
# (the perf hierarchy's mount dir, the pod's dir, the container ids); prints each window's counted containers and
# the perf descriptors open while it counted.
_LOW_LIMIT = """
import json, os, resource, sys, time
limit, spec = int(sys.argv[1]), json.loads(sys.argv[2])
resource.setrlimit(resource.RLIMIT_NOFILE, (limit, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
from koordlet.metricsadvisor.cpi import CPICollector
from koordlet.metricsadvisor.pods import ContainerCgroup, PodCgroup
from koordlet.system.cgroup import CgroupFS, CgroupVersion
from koordlet.system.perf import CPU_CLOCK, TASK_CLOCK
from koordlet.system.sysfs import read_online_cpus
rel = spec["rel"]
pods = (PodCgroup("p", rel, tuple(ContainerCgroup(c, rel + "/" + c) for c in spec["containers"]), "LS"),)
now = [1000.0]
cpi = CPICollector(lambda: pods, CgroupFS(spec["mount"], CgroupVersion.V1), read_online_cpus(), 60.0, 10.0,
                   events=(TASK_CLOCK, CPU_CLOCK), monotonic=lambda: now[0])
assert cpi.enabled()
def perf_fds():
    links = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            links.append(os.readlink(f"/proc/self/fd/{fd}"))
        except FileNotFoundError:  # the listing's own descriptor
            pass
    return links.count("anon_inode:[perf_event]")
windows = []
for _ in range(3):
    cpi.collect(time.time())
    open_now = perf_fds()
    now[0] += 10.0
    counted = sorted({s.key.label("container_id") for s in cpi.collect(time.time())})
    windows.append({"counted": counted, "perf_fds": open_now, "after": perf_fds()})
    now[0] += 50.0
print(json.dumps({"windows": windows, "per_window": cpi.per_window(len(spec["containers"])),
                  "cpus": len(read_online_cpus())}))
"""


@pytest.mark.cgroupv1
def test_under_a_low_descriptor_limit_cpi_counts_in_turn_within_an_eighth_of_it(v1_perf: PerfCgroups) -> None:
    """Soft RLIMIT_NOFILE 104: the budget is 13 descriptors, so with 2 events on this machine's CPUs only a few
    containers fit a window; the windows take them in turn, every one within three windows, and never hold more
    perf descriptors than the budget."""
    v1_perf.add(*(f"{i:064x}" for i in range(3, 6)))
    mount = str(Path(v1_perf.cgroup_fs.hierarchy_dir("perf_event")).parent)
    spec = {"mount": mount, "rel": v1_perf.rel, "containers": v1_perf.container_ids}
    done = subprocess.run([sys.executable, "-c", _LOW_LIMIT, "104", json.dumps(spec)], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    fit = 12 // (2 * result["cpus"])
    assert result["per_window"] == fit and 0 < fit < 5
    counted = [window["counted"] for window in result["windows"]]
    assert all(len(ids) == fit for ids in counted), counted
    assert all(window["perf_fds"] == fit * 2 * result["cpus"] <= 13 and window["after"] == 0
               for window in result["windows"])
    ordered = sorted(v1_perf.container_ids)
    assert counted[0] == ordered[:fit] and counted[1] == sorted((ordered[fit:] + ordered)[:fit])  # in turn
    assert set().union(*counted) == set(ordered)  # everyone counted within three windows
