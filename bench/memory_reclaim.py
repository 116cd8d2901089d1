"""BE memory reclaim (``memory.reclaim``) against eviction alone, in the cgroup v2 VM (docs/colocation.md "Memory QoS
on stock kernels"): one guest, one run, the same scenario with reclaim off and on.

A real node (tests/koordlet/qosmanager/realnode.py, cgroup v2), koordlet's collectors and QoS manager with
``BEMemoryEvict`` (evictions go to the project's API server; an evicted pod's processes are then killed, as kubelet
would) and the reclaim strategy switched by NodeSLO ``extensions.beMemoryReclaimStrategy.enable``:

1. a BE pod fills the page cache by reading the attached disk (``--cache-mib``), another BE pod holds anonymous
   memory (``--anon-mib``, compressible pages: the guest swaps to a zram device, so that BE anonymous memory is
   reclaimable at all; kubelet's NoSwap / LimitedSwap would keep a BestEffort pod off swap, leaving page cache only);
2. a few seconds later the LS pod allocates ``--ls-mib`` and holds it; together the pods want more than the guest
   has, so without reclaim the LS pod's allocation waits for the kernel to reclaim page cache, and it takes the
   node (MemTotal − MemAvailable) over the eviction threshold unless BE memory was freed. The thresholds come from
   the guest's memory at the start: eviction where the LS allocation is half done on top of the BE pods'
   anonymous memory; reclaim (MemTotal − MemFree) just above what the LS pod alone will use, and down to a
   quarter GiB above the start, so that reclaim makes room for the LS pod before it asks;
3. ``--observe`` seconds of sampling every 0.25 s.

Reported per setting: BE pods evicted, the LS pod's memory PSI (peak ``some avg10`` and the stall time it accumulated,
from its ``memory.pressure``), how long its allocation took, and how long the node stayed at or above the eviction
threshold and the reclaim threshold. ``.venv/bin/python bench/memory_reclaim.py [--json]`` boots the guest
(V2_BENCH; a disk of ``--cache-mib`` + 64 MiB); ``--v2-guest`` is its part inside.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import pytest  # noqa: E402

from koordlet.api.nodeslo import parse_node_slo_spec  # noqa: E402
from koordlet.api.qos import KubeQoS, QoSClass  # noqa: E402
from koordlet.eviction import Evictor  # noqa: E402
from koordlet.qosmanager import QoSManagerConfig  # noqa: E402
from koordlet.system.procfs import parse_meminfo, parse_psi  # noqa: E402
from tests.koordlet.qosmanager.realnode import RealNode, skip_unless_v2_writable  # noqa: E402
from tests.support.apiserver import ApiServer, kube_api_client  # noqa: E402
from tests.support.v2guest import attached_disk, run_bench_in_v2_guest  # noqa: E402

MiB = 1 << 20
PODS = (("ls", QoSClass.LS, KubeQoS.BURSTABLE), ("be-cache", QoSClass.BE, KubeQoS.BESTEFFORT),
        ("be-anon", QoSClass.BE, KubeQoS.BESTEFFORT))
GATES = {"BEMemoryEvict": True, "CgroupReconcile": True, "BECPUSuppress": False, "CPUBurst": False,
         "RdtResctrl": False}
ZRAM = "/sys/block/zram0"

READ_DISK = """
import os, time
fd = os.open({disk!r}, os.O_RDONLY)
os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
left = {size}
while left > 0:
    left -= len(os.read(fd, min(left, 1 << 20))) or left
print('held', flush=True)
time.sleep(3600)
"""
# Pages that differ (so zram stores each) but compress well, as most anonymous memory does.
HOLD_ANON = """
import time
data = bytearray({size})
for offset in range(0, len(data), 4096):
    data[offset:offset + 8] = offset.to_bytes(8, 'little')
print('held', flush=True)
time.sleep(3600)
"""
# The LS pod's allocation in one C-level fill: without room it waits for the kernel's reclaim (a slow fill gives
# kswapd time to make room in the background, and the LS pod never stalls).
HOLD_LS = """
import time
data = b'\\x01' * {size}
print('held', flush=True)
time.sleep(3600)
"""


def meminfo() -> tuple[int, int, int]:
    """(MemTotal, MemTotal − MemAvailable, MemTotal − MemFree)."""
    with open("/proc/meminfo", "rb") as f:
        info = parse_meminfo(f.read())
    return info.mem_total_bytes, info.used_bytes, info.used_with_page_cache_bytes


def _zram(size_mib: int) -> None:
    subprocess.run(["modprobe", "zram"], check=True)
    with open(f"{ZRAM}/disksize", "w") as f:
        f.write(f"{size_mib}M")
    subprocess.run(["mkswap", "/dev/zram0"], check=True, stdout=subprocess.DEVNULL)
    subprocess.run(["swapon", "/dev/zram0"], check=True)


def _zram_off() -> None:
    subprocess.run(["swapoff", "/dev/zram0"], check=False)
    if os.path.exists(f"{ZRAM}/reset"):
        with open(f"{ZRAM}/reset", "w") as f:
            f.write("1")


def _psi(node: RealNode, cgroup_dir: str) -> tuple[float, int]:
    """(some avg10 %, some total µs) of a cgroup's memory.pressure."""
    some = parse_psi(node.read("memory", cgroup_dir, "memory.pressure").encode()).some
    return some.avg10, some.total_us


def phase(reclaim: bool, args: argparse.Namespace, disk: str) -> dict[str, object]:
    with ApiServer() as server, kube_api_client(server) as api_client:
        node = RealNode(f"reclaim-{'on' if reclaim else 'off'}", PODS, v2=True)
        try:
            for name in ("be-cache", "be-anon"):
                node.put_pod_in_api(name, api_client)
            total, used0, _ = meminfo()
            evict = (used0 + (args.anon_mib + args.ls_mib // 2) * MiB) * 100 // total
            threshold = (used0 + (args.ls_mib + 150) * MiB) * 100 // total
            lower = (used0 + 256 * MiB) * 100 // total
            node.start(parse_node_slo_spec({
                "resourceUsedThresholdWithBE": {"enable": True, "memoryEvictThresholdPercent": int(evict)},
                "extensions": {"beMemoryReclaimStrategy": {
                    "enable": reclaim, "reclaimThresholdPercent": int(threshold), "reclaimLowerPercent": int(lower),
                    "reclaimStepBytes": "64Mi", "reclaimMaxStepBytes": "1Gi"}}}),
                evictor=Evictor("node-1", api_client=api_client), config=QoSManagerConfig(node_name="node-1",
                                                                                          feature_gates=GATES))
            held = {"be-cache": node.spawn("be-cache", READ_DISK.format(disk=disk, size=args.cache_mib * MiB)),
                    "be-anon": node.spawn("be-anon", HOLD_ANON.format(size=args.anon_mib * MiB))}
            for child in held.values():
                assert child.stdout is not None and child.stdout.readline() == b"held\n"
            time.sleep(args.settle)
            ls_dir = node.pod_dir(node.pod("ls"))
            resident_at_ls = meminfo()[2]
            _, stall_before = _psi(node, ls_dir)
            started = time.monotonic()
            ls = node.spawn("ls", HOLD_LS.format(size=args.ls_mib * MiB))
            assert ls.stdout is not None and ls.stdout.readline() == b"held\n"
            allocated_s = time.monotonic() - started
            above_evict = above_reclaim = peak_avg10 = peak_used = 0.0
            evicted: set[str] = set()
            end = time.monotonic() + args.observe
            while time.monotonic() < end:
                for request in server.requests("POST", r"/eviction$"):
                    name = request.path.rsplit("/", 2)[-2]
                    if name not in evicted and name in held:
                        evicted.add(name)
                        held[name].kill()  # what kubelet does with an evicted pod
                _, used, resident = meminfo()
                peak_used = max(peak_used, used * 100 / total)
                above_evict += 0.25 if used * 100 // total >= evict else 0.0
                above_reclaim += 0.25 if resident * 100 // total >= threshold else 0.0
                peak_avg10 = max(peak_avg10, _psi(node, ls_dir)[0])
                time.sleep(0.25)
            _, stall_after = _psi(node, ls_dir)
            return {"reclaim": reclaim, "evicted": sorted(evicted), "evictions": len(evicted),
                    "ls_psi_some_avg10_peak": round(peak_avg10, 2),
                    "ls_memory_stall_ms": round((stall_after - stall_before) / 1000, 1),
                    "ls_allocation_s": round(allocated_s, 2), "resident_at_ls_start_mib": resident_at_ls // MiB,
                    "peak_used_percent": round(peak_used, 1),
                    "seconds_at_or_above_eviction_threshold": above_evict,
                    "seconds_at_or_above_reclaim_threshold": above_reclaim,
                    "eviction_threshold_percent": int(evict), "reclaim_threshold_percent": int(threshold),
                    "reclaim_lower_percent": int(lower)}
        finally:
            node.close()


def in_the_guest(args: argparse.Namespace) -> dict[str, object]:
    disk = attached_disk()
    _zram(args.swap_mib)
    try:
        total, used0, resident0 = meminfo()
        runs = [phase(False, args, disk), phase(True, args, disk)]
    finally:
        _zram_off()
    return {"kernel": os.uname().release, "mem_total_mib": total // MiB, "used_at_start_mib": used0 // MiB,
            "resident_at_start_mib": resident0 // MiB, "be_cache_mib": args.cache_mib, "be_anon_mib": args.anon_mib,
            "ls_mib": args.ls_mib, "zram_swap_mib": args.swap_mib, "observe_s": args.observe, "runs": runs}


def _print(result: dict[str, object]) -> None:
    print(f"kernel {result['kernel']}, {result['mem_total_mib']} MiB, used at start {result['used_at_start_mib']} MiB; "
          f"BE page cache {result['be_cache_mib']} MiB, BE anon {result['be_anon_mib']} MiB, LS allocates "
          f"{result['ls_mib']} MiB; zram swap {result['zram_swap_mib']} MiB; observed {result['observe_s']} s")
    keys = ("evictions", "ls_psi_some_avg10_peak", "ls_memory_stall_ms", "ls_allocation_s", "resident_at_ls_start_mib",
            "peak_used_percent", "seconds_at_or_above_eviction_threshold", "seconds_at_or_above_reclaim_threshold")
    runs = result["runs"]
    assert isinstance(runs, list)
    print(f"  {'':40s} {'reclaim off':>12s} {'reclaim on':>12s}")
    for key in keys:
        print(f"  {key:40s} {runs[0][key]!s:>12s} {runs[1][key]!s:>12s}")
    print(f"  thresholds: eviction {runs[0]['eviction_threshold_percent']}% (MemTotal - MemAvailable), reclaim "
          f"{runs[0]['reclaim_threshold_percent']}% down to {runs[0]['reclaim_lower_percent']}% (MemTotal - MemFree)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache-mib", type=int, default=1800)
    parser.add_argument("--anon-mib", type=int, default=1024)
    parser.add_argument("--ls-mib", type=int, default=1024)
    parser.add_argument("--swap-mib", type=int, default=1280)
    parser.add_argument("--settle", type=float, default=10.0)
    parser.add_argument("--observe", type=float, default=20.0)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--v2-guest", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.v2_guest:
        try:
            skip_unless_v2_writable()
        except pytest.skip.Exception as exc:
            print(f"cannot run: {exc}", file=sys.stderr)
            return 2
        result = in_the_guest(args)
        _print(result)
        with open(os.path.join(os.environ["KPY_V2_OUT"], "bench.json"), "w") as f:
            json.dump(result, f)
        return 0
    forwarded = [f"--{k.replace('_', '-')}={v}" for k, v in vars(args).items() if k not in ("json", "v2_guest")]
    result = run_bench_in_v2_guest("bench/memory_reclaim.py", "v2-bench-memory-reclaim", forwarded, 1200,
                                   {"V2_DISK_MB": str(args.cache_mib + 64)})
    if not isinstance(result, dict):
        return 1
    print(json.dumps(result, indent=2)) if args.json else _print(result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
