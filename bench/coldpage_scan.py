#!/usr/bin/env python3
"""What a page-idle pass of the cold page collector costs on a large node, and what the other collectors see
while it runs.

On files laid out as the kernel writes the page-idle bitmap, ``/proc/kpageflags`` and ``/proc/kpagecgroup``
(tests/support/pageframes.py), for ``--gib`` GiB of page frames (default 512: 128 Mi frames, 8 bytes each in the
two proc files, 2 GiB of files on disk, removed at the end):

1. one pass at full speed (``cpu_share`` 1): wall time, the thread's CPU time, the longest chunk, and the
   memory it allocates (tracemalloc peak; and the process's peak RSS before and after);
2. one pass at the default share beside the node and pod collectors (1 s) on the collectors' thread, as koordlet
   runs them: the longest gap between two node samples, and how many of the QoS snapshot's looks (every 0.25 s)
   found its samples fresh (younger than two intervals);
3. the kernel's side, which a file cannot show: how long this host reads its own ``/proc/kpageflags`` and
   ``/proc/kpagecgroup`` (all its page frames), scaled to ``--gib``. The kernel's cost of marking pages idle
   (an rmap walk per page) is not measurable here (this kernel has no page-idle bitmap).

    .venv/bin/python bench/coldpage_scan.py [--gib 512] [--dir /var/tmp] [--json]

A benchmark, not a test: run it alone (``flock /tmp/kpy-heavy.lock ...``); reading the host's kpageflags needs
root.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from koordlet.executor import ResourceExecutor  # noqa: E402
from koordlet.metriccache import MetricCache, MetricKind, SeriesKey  # noqa: E402
from koordlet.metricsadvisor import CollectorRunner, NodeResourceCollector, PodResourceCollector  # noqa: E402
from koordlet.metricsadvisor.pageidle import DEFAULT_CPU_SHARE, PageIdleScanner  # noqa: E402
from koordlet.qosmanager.snapshot import SnapshotBuilder  # noqa: E402
from koordlet.statesinformer.api import NodeInfo, StaticStates  # noqa: E402
from koordlet.system.cgroup import CgroupFS  # noqa: E402
from koordlet.system.coldpage import CHUNK_PAGES  # noqa: E402
from tests.support.pageframes import PageFrames, write_page_frames  # noqa: E402

GIB_FRAMES = (1 << 30) // os.sysconf("SC_PAGE_SIZE")


def _peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _scanner(frames: PageFrames, share: float) -> PageIdleScanner:
    executor = ResourceExecutor(CgroupFS.detect(), sys_dir=frames.sys_dir, proc_dir=frames.proc_dir)
    return PageIdleScanner(frames.sys_dir, frames.proc_dir, executor.mark_page_idle, cpu_share=share)


def _one_pass(scanner: PageIdleScanner, timeout_s: float) -> None:
    passes = scanner.passes
    scanner.request(count=True)
    deadline = time.monotonic() + timeout_s
    while scanner.passes == passes and time.monotonic() < deadline:
        time.sleep(0.05)
    if scanner.passes == passes:
        raise RuntimeError(f"the pass did not end within {timeout_s} s")


def full_speed(frames: PageFrames) -> dict:
    """One pass timed, then one more under tracemalloc (which slows it down) for what it allocates."""
    scanner = _scanner(frames, 1.0)
    rss_before = _peak_rss_mib()
    try:
        _one_pass(scanner, 600)
        stats = scanner.last_pass
        tracemalloc.start()
        try:
            _one_pass(scanner, 1200)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    finally:
        scanner.stop()
    assert stats is not None and scanner.latest is not None
    if scanner.latest.by_cgroup_inode != frames.file_by_inode:  # the second pass: every frame was marked
        raise RuntimeError("the pass counted something else than the files hold")
    return {"seconds": round(stats.seconds, 2), "cpu_seconds": round(stats.cpu_seconds, 2),
            "longest_chunk_ms": round(stats.longest_chunk_cpu_s * 1000, 2),
            "frames_counted": stats.counted_pages, "frames_marked": stats.marked_pages,
            "python_alloc_peak_mib": round(peak / (1 << 20), 2),
            "process_peak_rss_mib_before": round(rss_before, 1),
            "process_peak_rss_mib_after": round(_peak_rss_mib(), 1)}


def beside_collectors(frames: PageFrames, share: float) -> dict:
    """A pass at ``share`` while the node and pod collectors run every second on the collectors' thread."""
    scanner = _scanner(frames, share)
    cache = MetricCache()
    node = NodeResourceCollector(interval_s=1.0)
    pods = PodResourceCollector(tuple, CgroupFS.detect(), interval_s=1.0, node=node)
    runner = CollectorRunner(cache, [node, pods])
    builder = SnapshotBuilder(StaticStates(node=NodeInfo("node-1")), cache, collect_interval_s=1.0)
    runner.start()
    seen: list[float] = []
    looks = fresh = 0
    try:
        time.sleep(2.5)  # two node samples: CPU usage has a first delta
        passes = scanner.passes
        scanner.request(count=True)
        while scanner.passes == passes:
            time.sleep(0.25)
            snapshot = builder.build()
            looks += 1
            fresh += snapshot is not None and snapshot.node_memory_bytes is not None \
                and snapshot.node_cpu_cores is not None
            latest = cache.latest(SeriesKey.of(MetricKind.NODE_MEMORY_USAGE))
            if latest is not None and (not seen or latest[0] != seen[-1]):
                seen.append(latest[0])
    finally:
        scanner.stop()
        runner.stop()
    stats = scanner.last_pass
    assert stats is not None
    gaps = [b - a for a, b in zip(seen, seen[1:], strict=False)]
    return {"cpu_share": share, "seconds": round(stats.seconds, 1), "cpu_seconds": round(stats.cpu_seconds, 2),
            "node_samples": len(seen), "longest_gap_between_node_samples_s": round(max(gaps), 3) if gaps else None,
            "snapshot_looks": looks, "snapshot_looks_fresh": fresh}


def host_kernel_read(gib: float) -> dict | None:
    """This host's own kpageflags and kpagecgroup, read in the pass's chunk size, scaled to ``gib``."""
    paths = ("/proc/kpageflags", "/proc/kpagecgroup")
    if not all(os.access(path, os.R_OK) for path in paths):
        return None
    frames = os.sysconf("SC_PHYS_PAGES")
    out: dict = {"host_gib": round(frames / GIB_FRAMES, 1)}
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        started, cpu = time.monotonic(), time.process_time()
        offset = 0
        try:
            while data := os.pread(fd, CHUNK_PAGES * 8, offset):
                offset += len(data)
        finally:
            os.close(fd)
        seconds, cpu_s = time.monotonic() - started, time.process_time() - cpu
        name = os.path.basename(path)
        out[f"{name}_seconds"] = round(seconds, 3)
        out[f"{name}_seconds_at_{gib:g}_gib"] = round(seconds * gib * GIB_FRAMES / (offset // 8), 2)
        out[f"{name}_cpu_seconds_at_{gib:g}_gib"] = round(cpu_s * gib * GIB_FRAMES / (offset // 8), 2)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gib", type=float, default=512, help="the node's memory (page frames) in GiB")
    ap.add_argument("--dir", default="/var/tmp", help="where the files go (removed at the end)")
    ap.add_argument("--share", type=float, default=DEFAULT_CPU_SHARE, help="the pass's CPU share beside the collectors")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    frames_wanted = int(args.gib * GIB_FRAMES) // CHUNK_PAGES * CHUNK_PAGES
    root = Path(tempfile.mkdtemp(prefix="kpy-bench-coldpage-", dir=args.dir))
    try:
        started = time.monotonic()
        frames = write_page_frames(root, frames_wanted)
        built_s = time.monotonic() - started
        size = sum(f.stat().st_size for f in root.rglob("*") if f.is_file())
        result = {"gib": args.gib, "frames": frames.frames, "fixture_bytes": size, "fixture_seconds": round(built_s, 1),
                  "full_speed": full_speed(frames), "beside_collectors": beside_collectors(frames, args.share),
                  "host_kernel_read": host_kernel_read(args.gib)}
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if args.json:
        print(json.dumps(result))
        return 0
    fast, beside, kernel = result["full_speed"], result["beside_collectors"], result["host_kernel_read"]
    print(f"{args.gib:g} GiB node: {frames.frames} page frames, {size / (1 << 30):.2f} GiB of files "
          f"(built in {result['fixture_seconds']} s)")
    print(f"one pass at full speed: {fast['seconds']} s wall, {fast['cpu_seconds']} s CPU, longest chunk "
          f"{fast['longest_chunk_ms']} ms; Python allocations peak {fast['python_alloc_peak_mib']} MiB; process peak "
          f"RSS {fast['process_peak_rss_mib_before']} -> {fast['process_peak_rss_mib_after']} MiB")
    print(f"one pass at {beside['cpu_share']:g} of a CPU beside the collectors (1 s): {beside['seconds']} s wall, "
          f"{beside['cpu_seconds']} s CPU; longest gap between node samples "
          f"{beside['longest_gap_between_node_samples_s']} s; QoS snapshot fresh at {beside['snapshot_looks_fresh']} "
          f"of {beside['snapshot_looks']} looks")
    if kernel:
        print(f"kernel side (this host's {kernel['host_gib']} GiB): {kernel}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
