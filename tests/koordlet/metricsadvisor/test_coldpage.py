"""``ColdPageCollector``: kidled on a tree laid out as Anolis kernels write it (``kernel/mm/kidled/*`` and each
memory cgroup's ``memory.idle_page_stats``), the page-idle bitmap's counting on files laid out as the kernel
writes ``page_idle/bitmap``, ``kpageflags`` and ``kpagecgroup``, and on the real page-idle bitmap of the v2
guest's kernel (Debian builds it with ``CONFIG_IDLE_PAGE_TRACKING``; this host's kernel has neither source);
the "neither" case says so once; NodeMetric reports the usage with hot page cache under
``usageWithHotPageCache``."""

from __future__ import annotations

import json
import logging
import os
import shutil
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from koordlet import audit
from koordlet.api.pod import PodMeta
from koordlet.collector import CollectorConfig, NodeStateCollector
from koordlet.executor import InvalidUpdateError, ResourceExecutor
from koordlet.executor.metrics import update_count
from koordlet.metriccache import Label, MetricCache, MetricKind, SeriesKey
from koordlet.metricsadvisor import CollectorRunner, NodeResourceCollector
from koordlet.metricsadvisor.coldpage import SOURCE_KIDLED, SOURCE_PAGE_IDLE, ColdPageCollector, restore_kidled
from koordlet.metricsadvisor.pageidle import PageIdleScanner
from koordlet.metricsadvisor.pods import ContainerCgroup, HostAppCgroup, PodCgroup
from koordlet.qosmanager import QoSManagerConfig, new_qos_manager
from koordlet.qosmanager.snapshot import SnapshotBuilder
from koordlet.reporters.nodemetric import CollectPolicy, StatusBuilder
from koordlet.statesinformer.api import NodeInfo, StaticStates
from koordlet.system.cgroup import CgroupFS, CgroupVersion
from koordlet.system.coldpage import (
    CHUNK_PAGES,
    PAGE_SIZE,
    IdleScan,
    idle_file_pages,
    page_idle_present,
    parse_idle_page_stats,
)
from koordlet.system.kubepods import KubeCgroupLayout
from tests.support.pageframes import write_page_frames
from tests.support.v2guest import KERNEL_LACKS
from tests.support.waiting import wait_for

# memory.idle_page_stats as an Anolis kernel prints it (bytes per age bucket, ages in scan periods).
IDLE_PAGE_STATS = """# version: 1.0
# page_scans: 24
# slab_scans: 0
# scan_period_in_seconds: 5
# use_hierarchy: 1
# buckets: 1,2,5,15,30,60,120,240
#
#   _-----=> clean/dirty
#  / _----=> swap/file
# | / _---=> evict/unevict
# || / _--=> inactive/active
# ||| / _-=> slab
# |||| /
# |||||             [1,2)          [2,5)         [5,15)        [15,30)        [30,60)       [60,120)      [120,240)     [240,+inf)
  csei            2613248        4657152       18182144      293683200              0              0              0              0
  dsei            2568192        5140480       15306752       48648192              0              0              0              0
  cfei            2633728        4640768       66531328      340172800              0        8192000              0        4096000
  dfei                  0              0           4096              0              0        1024000              0              0
  csui                  0              0              0              0              0              0              0              0
  dsui                  0              0              0              0              0              0              0              0
  cfui                  0              0              0              0              0              0         409600              0
  dfui                  0              0              0              0              0              0              0         {cold}
  csea             765952        1044480        3784704       52834304              0              0              0              0
  dsea             286720         270336        1564672        5390336              0              0              0              0
  cfea            9273344       16609280      152109056      315121664              0       99999999              0              0
  dfea                  0              0              0              0              0              0              0              0
  csua                  0              0              0              0              0              0              0              0
  dsua                  0              0              0              0              0              0              0              0
  cfua                  0              0              0              0              0              0              0              0
  dfua                  0              0              0              0              0              0              0              0
  slab                  0              0              0              0              0              0              0              0
"""  # noqa: E501 - the kernel's layout
COLD = 8192000 + 4096000 + 1024000 + 409600  # cfei/dfei/cfui/dfui buckets [60,120) and up (boundary 5)
MEMINFO = b"MemTotal: 8000000 kB\nMemFree: 2000000 kB\nMemAvailable: 5000000 kB\n"
POD_UID, CONTAINER_ID = "cold0000-0000-4000-8000-000000000001", "c" * 64
POD_DIR = f"kubepods/besteffort/pod{POD_UID}"


def _memory_stat(with_cache: int) -> str:
    # v1 memory.stat: usage with page cache = anon (active+inactive) + unevictable + file (active+inactive)
    return (f"total_inactive_anon {with_cache // 4}\ntotal_active_anon {with_cache // 4}\ntotal_unevictable 0\n"
            f"total_inactive_file {with_cache // 4}\ntotal_active_file {with_cache // 4}\n")


def _kidled_node(root: Path) -> tuple[CgroupFS, str, str]:
    sys_dir, proc_dir = root / "sys", root / "proc"
    kidled = sys_dir / "kernel/mm/kidled"
    kidled.mkdir(parents=True)
    (kidled / "scan_period_in_seconds").write_text("0\n")
    (kidled / "use_hierarchy").write_text("0\n")
    proc_dir.mkdir()
    (proc_dir / "meminfo").write_bytes(MEMINFO)
    memory = root / "cgroup/memory"
    for rel, cold, total in (("", 40960000, 3 << 30), (POD_DIR, 0, 600 << 20), (f"{POD_DIR}/{CONTAINER_ID}", 0,
                                                                                   500 << 20),
                             ("host-apps/nginx", 4096, 100 << 20)):
        (memory / rel).mkdir(parents=True, exist_ok=True)
        (memory / rel / "memory.idle_page_stats").write_text(IDLE_PAGE_STATS.format(cold=cold))
        (memory / rel / "memory.stat").write_text(_memory_stat(total))
    return CgroupFS(str(root / "cgroup"), CgroupVersion.V1), str(sys_dir), str(proc_dir)


def _executor(fs: CgroupFS, sys_dir: str, proc_dir: str, record: Path | None = None) -> ResourceExecutor:
    return ResourceExecutor(fs, sys_dir=sys_dir, proc_dir=proc_dir, originals_file=str(record) if record else None)


def _pods() -> tuple[PodCgroup, ...]:
    return (PodCgroup(POD_UID, POD_DIR, (ContainerCgroup(CONTAINER_ID, f"{POD_DIR}/{CONTAINER_ID}"),), "BE"),)


def test_kidled_stats_give_the_cold_file_bytes_from_the_boundary() -> None:
    assert parse_idle_page_stats(IDLE_PAGE_STATS.format(cold=0)) == COLD
    assert parse_idle_page_stats(IDLE_PAGE_STATS.format(cold=1000)) == COLD + 1000
    with pytest.raises(ValueError):
        parse_idle_page_stats("# version: 1.0\n  cfei 1 2 3\n")


def test_kidled_is_started_and_every_level_gets_cold_and_hot_usage(tmp_path: Path) -> None:
    fs, sys_dir, proc_dir = _kidled_node(tmp_path)
    collector = ColdPageCollector(_pods, fs, host_apps=lambda: (HostAppCgroup("nginx", "host-apps/nginx"),),
                                  proc_dir=proc_dir, sys_dir=sys_dir, executor=_executor(fs, sys_dir, proc_dir))
    assert collector.enabled() and collector.source == SOURCE_KIDLED
    kidled = Path(sys_dir) / "kernel/mm/kidled"
    assert (kidled / "scan_period_in_seconds").read_text() == "5"  # Koordinator's settings
    assert (kidled / "use_hierarchy").read_text() == "1"
    values = {(s.key.kind, s.key.labels): s.value for s in collector.collect(100.0)}
    node_cold = COLD + 40960000
    assert values[(MetricKind.NODE_MEMORY_COLD_PAGE_SIZE, ())] == node_cold
    assert values[(MetricKind.NODE_MEMORY_WITH_HOT_PAGE_USAGE, ())] == (8000000 - 2000000) * 1024 - node_cold
    pod = ((Label.POD_UID.value, POD_UID),)
    assert values[(MetricKind.POD_MEMORY_COLD_PAGE_SIZE, pod)] == COLD
    assert values[(MetricKind.POD_MEMORY_WITH_HOT_PAGE_USAGE, pod)] == (600 << 20) - COLD
    container = ((Label.CONTAINER_ID.value, CONTAINER_ID),)
    assert values[(MetricKind.CONTAINER_MEMORY_WITH_HOT_PAGE_USAGE, container)] == (500 << 20) - COLD
    app = ((Label.HOST_APP_NAME.value, "nginx"),)
    assert values[(MetricKind.HOST_APP_MEMORY_COLD_PAGE_SIZE, app)] == COLD + 4096


def _kidled(sys_dir: str) -> tuple[str, str]:
    kidled = Path(sys_dir) / "kernel/mm/kidled"
    return ((kidled / "scan_period_in_seconds").read_text().strip(), (kidled / "use_hierarchy").read_text().strip())


def test_kidled_settings_are_recorded_audited_and_put_back_when_koordlet_stops(tmp_path: Path) -> None:
    fs, sys_dir, proc_dir = _kidled_node(tmp_path)
    record = tmp_path / "run/originals.json"
    auditor = audit.Auditor(audit.AuditConfig(log_dir=str(tmp_path / "audit")))
    audit.install(auditor)
    try:
        collector = ColdPageCollector(_pods, fs, proc_dir=proc_dir, sys_dir=sys_dir,
                                      executor=_executor(fs, sys_dir, proc_dir, record))
        assert collector.enabled() and _kidled(sys_dir) == ("5", "1")
        assert json.loads(record.read_text())["originals"] == {"kidled_scan_period_in_seconds": "0",
                                                               "kidled_use_hierarchy": "0"}
        collector.close()
    finally:
        audit.install(None)
        auditor.close()
    assert _kidled(sys_dir) == ("0", "0") and json.loads(record.read_text())["originals"] == {}
    lines = [(e.reason, e.message) for e in reversed(audit.read_events(str(tmp_path / "audit")))]
    assert lines[0] == ("ColdPageCollector", "kidled_scan_period_in_seconds to 5 by coldpage: Koordinator's kidled "
                                             "settings for the cold page collector")
    assert [reason for reason, _ in lines] == ["ColdPageCollector"] * 4  # two writes, two put back
    assert "the value found before koordlet's first write" in lines[3][1]


def test_after_a_crash_the_gate_off_puts_kidled_back_and_a_value_koordlet_never_wrote_is_never_reset(
        tmp_path: Path) -> None:
    fs, sys_dir, proc_dir = _kidled_node(tmp_path)
    kidled = Path(sys_dir) / "kernel/mm/kidled"
    (kidled / "scan_period_in_seconds").write_text("5\n")  # the operator's own, already Koordinator's value
    record = tmp_path / "run/originals.json"
    first = ColdPageCollector(_pods, fs, proc_dir=proc_dir, sys_dir=sys_dir,
                              executor=_executor(fs, sys_dir, proc_dir, record))
    assert first.enabled() and _kidled(sys_dir) == ("5", "1")
    assert json.loads(record.read_text())["originals"] == {"kidled_use_hierarchy": "0"}
    # koordlet dies without closing; the operator sets the scan period meanwhile
    (kidled / "scan_period_in_seconds").write_text("120\n")
    restarted = _executor(fs, sys_dir, proc_dir, record)  # a new koordlet, gate ColdPageCollector off
    # the system config strategy (gate off too) puts back only its own records
    new_qos_manager(StaticStates(node=NodeInfo("node-1")), MetricCache(), restarted, KubeCgroupLayout(),
                    config=QoSManagerConfig(), cpus=())
    assert _kidled(sys_dir) == ("120", "1")
    done = restore_kidled(restarted, "feature gate ColdPageCollector is off")
    assert done.system_written == 1 and done.system_errors == ()
    assert _kidled(sys_dir) == ("120", "0")  # the operator's scan period stays
    assert json.loads(record.read_text())["originals"] == {}
    assert restore_kidled(restarted, "again").system_written == 0  # nothing recorded: nothing reset


def test_the_node_state_collector_with_system_config_off_leaves_the_kidled_settings_of_a_running_collector(
        tmp_path: Path) -> None:
    """kidled's settings and SystemConfig's sysctls share one record: the collector's pass (gate SystemConfig off)
    puts back only the sysctls it owns, so kidled keeps scanning with Koordinator's settings."""
    fs, sys_dir, proc_dir = _kidled_node(tmp_path)
    record = tmp_path / "run/originals.json"
    executor = _executor(fs, sys_dir, proc_dir, record)
    collector = ColdPageCollector(_pods, fs, proc_dir=proc_dir, sys_dir=sys_dir, executor=executor)
    assert collector.enabled() and _kidled(sys_dir) == ("5", "1")
    node_state = NodeStateCollector(CollectorConfig(system_config=False), StaticStates(node=NodeInfo("node-1")),
                                    executor)
    assert node_state.collect_once() == 0
    assert _kidled(sys_dir) == ("5", "1")
    assert json.loads(record.read_text())["originals"] == {"kidled_scan_period_in_seconds": "0",
                                                           "kidled_use_hierarchy": "0"}
    collector.close()
    assert _kidled(sys_dir) == ("0", "0")  # still its own to put back


def test_kidled_that_cannot_be_started_leaves_the_collector_off_and_kidled_as_it_was(tmp_path: Path) -> None:
    fs, sys_dir, proc_dir = _kidled_node(tmp_path)
    use_hierarchy = Path(sys_dir) / "kernel/mm/kidled/use_hierarchy"
    use_hierarchy.unlink()
    use_hierarchy.mkdir()  # present as a name, but not a file the executor can write
    (use_hierarchy / "x").write_text("")
    executor = _executor(fs, sys_dir, proc_dir)
    assert not ColdPageCollector(_pods, fs, proc_dir=proc_dir, sys_dir=sys_dir, executor=executor).enabled()
    assert (Path(sys_dir) / "kernel/mm/kidled/scan_period_in_seconds").read_text().strip() == "0"  # put back
    assert executor.originals.keys() == frozenset()


def test_nodemetric_reports_usage_with_hot_page_cache(tmp_path: Path) -> None:
    fs, sys_dir, proc_dir = _kidled_node(tmp_path)
    collector = ColdPageCollector(_pods, fs, proc_dir=proc_dir, sys_dir=sys_dir,
                                  executor=_executor(fs, sys_dir, proc_dir))
    assert collector.enabled()
    cache = MetricCache()
    now = time.time()
    for t in range(3):
        cache.append_samples(collector.collect(now - 10 + t))
        cache.append(SeriesKey.of(MetricKind.NODE_MEMORY_USAGE), now - 10 + t, 111.0)
        cache.append(SeriesKey.of(MetricKind.POD_MEMORY_USAGE, **{Label.POD_UID: POD_UID}), now - 10 + t, 222.0)
    pods = (PodMeta("spark", "batch", POD_UID), PodMeta("other", "batch", "no-cold-samples"))
    cache.append(SeriesKey.of(MetricKind.POD_MEMORY_USAGE, **{Label.POD_UID: "no-cold-samples"}), now - 5, 333.0)
    hot = StatusBuilder(cache).build(pods, CollectPolicy(memory_policy="usageWithHotPageCache"), now)
    node_hot = (8000000 - 2000000) * 1024 - COLD - 40960000
    assert hot["nodeMetric"]["nodeUsage"]["resources"]["memory"] == str(node_hot)
    by_name = {p["name"]: p["podUsage"]["resources"]["memory"] for p in hot["podsMetric"]}
    assert by_name == {"spark": str((600 << 20) - COLD), "other": "333"}  # no cold samples: the default series
    default = StatusBuilder(cache).build(pods, CollectPolicy(), now)
    assert default["nodeMetric"]["nodeUsage"]["resources"]["memory"] == "111"


def test_without_kidled_or_page_idle_it_says_so_once_and_stays_off(tmp_path: Path,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "sys").mkdir()
    (tmp_path / "proc").mkdir()
    fs, sys_dir, proc_dir = CgroupFS(str(tmp_path / "cgroup")), str(tmp_path / "sys"), str(tmp_path / "proc")
    collector = ColdPageCollector(tuple, fs, proc_dir=proc_dir, sys_dir=sys_dir,
                                  executor=_executor(fs, sys_dir, proc_dir))
    with caplog.at_level(logging.INFO, logger="koordlet.metricsadvisor.coldpage"):
        assert collector.enabled() is False
    assert [r.getMessage() for r in caplog.records] == [
        "cold page collector off: this kernel has neither kidled (Anolis) nor the page-idle bitmap "
        "(CONFIG_IDLE_PAGE_TRACKING)"]


def _flags(*bits: int) -> int:
    return sum(1 << bit for bit in bits)


KPF_LRU, KPF_ANON, KPF_SWAPBACKED, KPF_BUDDY = 5, 12, 14, 10


def test_idle_file_pages_are_counted_by_owner_on_the_kernels_file_layout(tmp_path: Path) -> None:
    """70 000 page frames (more than one scan chunk): the bitmap (u64 words, bit i = frame i), kpageflags and
    kpagecgroup (one u64 per frame)."""
    frames = 70_000
    idle = {5, 6, 7, 100, 65_600, 69_999}
    flags = [_flags(KPF_BUDDY)] * frames
    owners = [0] * frames
    for frame in (5, 6, 100, 65_600, 69_999):
        flags[frame] = _flags(KPF_LRU)  # a file page on the LRU
    flags[7] = _flags(KPF_LRU, KPF_ANON, KPF_SWAPBACKED)  # idle, but anonymous: not page cache
    flags[8] = _flags(KPF_LRU)  # page cache, but touched since the mark
    owners[5] = owners[6] = owners[7] = owners[8] = 4242
    owners[100] = 77
    owners[65_600] = 4242
    bitmap = bytearray((frames + 63) // 64 * 8)
    for frame in idle:
        bitmap[frame // 8] |= 1 << (frame % 8)
    sys_dir, proc_dir = tmp_path / "sys", tmp_path / "proc"
    (sys_dir / "kernel/mm/page_idle").mkdir(parents=True)
    (sys_dir / "kernel/mm/page_idle/bitmap").write_bytes(bytes(bitmap))
    proc_dir.mkdir()
    (proc_dir / "kpageflags").write_bytes(struct.pack(f"={frames}Q", *flags))
    (proc_dir / "kpagecgroup").write_bytes(struct.pack(f"={frames}Q", *owners))
    assert page_idle_present(str(sys_dir), str(proc_dir))
    counted = idle_file_pages(str(sys_dir), str(proc_dir))
    assert counted.by_cgroup_inode == {4242: 3, 77: 1, 0: 1} and counted.total == 5


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _cold_after_one_age(collector: ColdPageCollector, clock: _Clock) -> dict[str | None, float]:
    """Cold bytes by pod after a pass that marks and, 5 s later, one that counts."""
    try:
        assert collector.collect(time.time()) == []  # asks for the first pass, which marks every page idle
        assert wait_for(lambda: collector.scanner.passes == 1, 60.0)
        time.sleep(5)
        clock.now += 5.0
        assert collector.collect(time.time()) == []  # asks for the pass that counts
        assert wait_for(lambda: collector.scanner.passes == 2, 60.0)
        return {s.key.label(Label.POD_UID): s.value for s in collector.collect(time.time())
                if s.key.kind == MetricKind.POD_MEMORY_COLD_PAGE_SIZE}
    finally:
        collector.close()


@pytest.mark.cgroupv2
def test_the_page_idle_bitmap_finds_a_cgroups_untouched_page_cache(tmp_path: Path) -> None:
    """A cgroup v2 dir reads a 64 MiB file into its page cache and leaves it; another keeps reading its own
    file: after one cold age the first one's pages are cold, the second one's are not."""
    if os.geteuid() != 0:
        pytest.skip("needs root for the page-idle bitmap")
    if not page_idle_present():
        pytest.skip(f"{KERNEL_LACKS} the page-idle bitmap (CONFIG_IDLE_PAGE_TRACKING) or kpagecgroup")
    root = "/sys/fs/cgroup"
    if not os.path.exists(os.path.join(root, "cgroup.controllers")):
        pytest.skip("/sys/fs/cgroup is not cgroup v2 (this machine has cgroup v1)")
    base = f"koordlet-py-test-{os.getpid()}-cold"
    dirs = [os.path.join(root, base), os.path.join(root, base, "idle"), os.path.join(root, base, "busy")]
    files = {name: tmp_path / f"{name}.data" for name in ("idle", "busy")}
    children: list[subprocess.Popen[bytes]] = []
    try:
        with open(os.path.join(root, "cgroup.subtree_control"), "w") as f:
            f.write("+memory")
        os.mkdir(dirs[0])
        with open(os.path.join(dirs[0], "cgroup.subtree_control"), "w") as f:
            f.write("+memory")
        for path in dirs[1:]:
            os.mkdir(path)
        for name, path in files.items():
            path.write_bytes(os.urandom(64 << 20))
            os.posix_fadvise(os.open(path, os.O_RDONLY), 0, 0, os.POSIX_FADV_DONTNEED)
            keep = "while True:\n    data = open(sys.argv[1], 'rb').read()\n    time.sleep(0.2)\n"
            once = "data = open(sys.argv[1], 'rb').read()\ntime.sleep(120)\n"
            code = "import sys, time\nsys.stdin.readline()\n" + (keep if name == "busy" else once)
            child = subprocess.Popen([sys.executable, "-c", code, str(path)], stdin=subprocess.PIPE)
            children.append(child)
            with open(os.path.join(root, base, name, "cgroup.procs"), "w") as f:
                f.write(str(child.pid))
            assert child.stdin is not None
            child.stdin.write(b"go\n")
            child.stdin.flush()
        time.sleep(3)  # both read their file into the page cache of their own cgroup
        pods = (PodCgroup("idle", f"{base}/idle", (), "BE"), PodCgroup("busy", f"{base}/busy", (), "LS"))
        clock = _Clock()
        fs = CgroupFS(root, CgroupVersion.V2)
        collector = ColdPageCollector(lambda: pods, fs, cold_age_s=5.0, monotonic=clock, cpu_share=1.0,
                                      executor=ResourceExecutor(fs, sys_dir="/sys", proc_dir="/proc"))
        assert collector.enabled() and collector.source == SOURCE_PAGE_IDLE
        cold = _cold_after_one_age(collector, clock)
    finally:
        for child in children:
            child.kill()
            child.wait()
        for path in reversed(dirs):
            if os.path.isdir(path):
                os.rmdir(path)
    assert cold["idle"] >= 48 << 20, cold  # most of the 64 MiB it read and left
    assert cold["busy"] <= 8 << 20, cold  # what it keeps reading is hot
    assert cold["idle"] % PAGE_SIZE == 0


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.parametrize("missing", ["kpageflags", "kpagecgroup"])
def test_a_scan_whose_second_or_third_file_cannot_be_opened_leaves_no_descriptor_open(
        tmp_path: Path, missing: str) -> None:
    frames = write_page_frames(tmp_path, CHUNK_PAGES)
    (Path(frames.proc_dir) / missing).unlink()
    before = _open_fds()
    for _ in range(20):
        with pytest.raises(FileNotFoundError):
            IdleScan(frames.sys_dir, frames.proc_dir)
        with pytest.raises(FileNotFoundError):
            idle_file_pages(frames.sys_dir, frames.proc_dir)
    assert _open_fds() == before


def test_a_pass_counts_by_owner_then_marks_every_frame_idle_through_the_executor(tmp_path: Path) -> None:
    frames = write_page_frames(tmp_path, 3 * CHUNK_PAGES)
    executor = ResourceExecutor(CgroupFS(str(tmp_path / "cgroup")), sys_dir=frames.sys_dir, proc_dir=frames.proc_dir)
    before = update_count("page_idle.bitmap", "written")
    scanner = PageIdleScanner(frames.sys_dir, frames.proc_dir, executor.mark_page_idle, cpu_share=1.0)
    try:
        assert scanner.request(count=True) and not scanner.request(count=True)  # one pass at a time
        assert wait_for(lambda: scanner.passes == 1, 10.0)
        assert scanner.latest is not None and scanner.latest.by_cgroup_inode == frames.idle_file_by_inode
        bitmap = (Path(frames.sys_dir) / "kernel/mm/page_idle/bitmap").read_bytes()
        assert bitmap == b"\xff" * (3 * CHUNK_PAGES // 8)  # every frame marked, nothing written past the end
        assert update_count("page_idle.bitmap", "written") == before + 3  # a chunk per write
        assert scanner.last_pass is not None and scanner.last_pass.marked_pages == 3 * CHUNK_PAGES
        assert scanner.request(count=True) and wait_for(lambda: scanner.passes == 2, 10.0)
        assert scanner.latest.by_cgroup_inode == frames.file_by_inode  # untouched since the mark: all idle
    finally:
        assert scanner.stop(5.0)
    with pytest.raises(InvalidUpdateError):
        executor.mark_page_idle(3, 64)  # not a whole u64 word


def test_a_page_idle_pass_over_a_large_node_leaves_the_collectors_and_the_qos_snapshot_fresh(tmp_path: Path) -> None:
    """A 16 GiB node's files (64 chunks), paced at 5 % of a CPU so the pass lasts seconds: the node collector
    (1 s) keeps its interval meanwhile and the QoS snapshot takes its samples at every look; after the pass the
    cold bytes are the page cache the pass found idle."""
    frames = write_page_frames(tmp_path, 64 * CHUNK_PAGES)
    shutil.copy("/proc/meminfo", Path(frames.proc_dir) / "meminfo")
    fs = CgroupFS(str(tmp_path / "cgroup"))
    executor = ResourceExecutor(fs, sys_dir=frames.sys_dir, proc_dir=frames.proc_dir)
    cold = ColdPageCollector(tuple, fs, 1.0, executor=executor, proc_dir=frames.proc_dir, sys_dir=frames.sys_dir,
                             cold_age_s=1.0, cpu_share=0.05)
    node = NodeResourceCollector(interval_s=1.0)
    cache = MetricCache()
    runner = CollectorRunner(cache, [node, cold])
    assert runner.active_collectors == ["node_resource", "coldpage"]
    builder = SnapshotBuilder(StaticStates(node=NodeInfo("node-1")), cache, collect_interval_s=1.0)
    looks_while_busy = 0
    sampled_at: list[float] = []  # the node collector's sample times, as seen every 0.25 s
    runner.start()
    try:
        assert wait_for(lambda: cache.latest(SeriesKey.of(MetricKind.NODE_CPU_USAGE)) is not None, 5.0)
        deadline = time.monotonic() + 60
        while cold.scanner.passes < 2 and time.monotonic() < deadline:
            time.sleep(0.25)
            busy = cold.scanner.busy
            snapshot = builder.build()
            assert snapshot is not None and snapshot.node_memory_bytes is not None
            assert snapshot.node_cpu_cores is not None
            looks_while_busy += busy
            latest = cache.latest(SeriesKey.of(MetricKind.NODE_MEMORY_USAGE))
            if latest is not None and (not sampled_at or latest[0] != sampled_at[-1]):
                sampled_at.append(latest[0])
        assert cold.scanner.passes >= 2
        stats = cold.scanner.last_pass
        assert wait_for(lambda: cache.latest(SeriesKey.of(MetricKind.NODE_MEMORY_COLD_PAGE_SIZE)) is not None, 5.0)
    finally:
        assert runner.stop(10.0)
    assert not cold.scanner.busy
    assert looks_while_busy >= 8  # the passes took seconds, and every look found fresh samples
    assert stats is not None and stats.seconds > 5 * stats.cpu_seconds  # paced
    gaps = [b - a for a, b in zip(sampled_at, sampled_at[1:], strict=False)]
    assert len(gaps) >= 4 and max(gaps) < 1.5, gaps  # never a missed tick
    _, cold_bytes = cache.latest(SeriesKey.of(MetricKind.NODE_MEMORY_COLD_PAGE_SIZE))
    assert cold_bytes == sum(frames.file_by_inode.values()) * PAGE_SIZE
