#!/usr/bin/env python3
"""Two koord-runtime-proxy source trees side by side, with the byte pipe as the floor: a before/after for
a relay change, measured in one run so both see the same machine noise.

One private containerd with N running pods; in front of it a proxy from ``--after`` (default: this tree),
a proxy from ``--before`` (each another source tree, or a commit of this repository, exported with
``git archive``) and bench/bytepipe.py. The same grpc.aio client calls ListContainers through each in turn
(interleaved rounds, before and after in alternating order, 1 and 16 calls in flight) and reads, per call:

  proxy_us      CPU of the proxy (or pipe) process, all threads (/proc/PID/task/*/schedstat, ns exact)
  wakeups       the proxy's voluntary context switches (each a sleep in epoll and a wake-up)
  runtime_us    CPU of containerd behind it

Prints the medians, and the after/before ratio of own CPU paired by round (the two measured back to back);
with --json one object. A benchmark, not a test; needs root (containerd).

    .venv/bin/python bench/proxy_ab.py --before <commit or tree> [--after <commit or tree>] [--pods 20]
        [--calls 5000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import glob
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import grpc  # noqa: E402

from tests.support.containerd import Containerd  # noqa: E402
from tests.support.cri import CriClient, PodFactory  # noqa: E402
from tests.support.proxy import ProxyProcess, wait_for_socket  # noqa: E402
from wire import cri_pb2 as cri  # noqa: E402

CONTAINERD = Containerd(f"/run/koordlet-py/bench-ab-{os.getpid()}/containerd",
                        f"/var/lib/koordlet-py/bench-ab-{os.getpid()}/containerd")
BYTEPIPE = Path(__file__).resolve().parent / "bytepipe.py"


def cpu_s(pid: int) -> float:
    """CPU time of every thread of ``pid`` so far, from the scheduler's own nanosecond account."""
    total = 0
    for path in glob.glob(f"/proc/{pid}/task/*/schedstat"):
        try:
            total += int(Path(path).read_text().split()[0])
        except (OSError, ValueError, IndexError):
            pass  # a thread that ended meanwhile
    return total / 1e9


def wakeups(pid: int) -> int:
    total = 0
    for path in glob.glob(f"/proc/{pid}/task/*/status"):
        try:
            for line in Path(path).read_text().splitlines():
                if line.startswith("voluntary_ctxt_switches:"):
                    total += int(line.split()[1])
        except OSError:
            pass
    return total


async def calls(socket_path: str, count: int, in_flight: int) -> None:
    request = cri.ListContainersRequest().SerializeToString()
    async with grpc.aio.insecure_channel(f"unix://{socket_path}") as channel:
        call = channel.unary_unary("/runtime.v1.RuntimeService/ListContainers")
        for _ in range(20):
            await call(request)

        async def worker() -> None:
            for _ in range(count // in_flight):
                await call(request)

        await asyncio.gather(*(worker() for _ in range(in_flight)))


def measure(pid: int, runtime_pid: int, socket_path: str, count: int, in_flight: int) -> tuple[float, float, float]:
    own, woke, runtime = cpu_s(pid), wakeups(pid), cpu_s(runtime_pid)
    asyncio.run(calls(socket_path, count, in_flight))
    return ((cpu_s(pid) - own) / count * 1e6, (wakeups(pid) - woke) / count,
            (cpu_s(runtime_pid) - runtime) / count * 1e6)


def source_tree(spec: str, scratch: str, side: str) -> str:
    """``spec`` as a source tree: a directory as it is, else a commit of this repository exported below
    ``scratch`` (the proxy needs only its own packages and wire/)."""
    if Path(spec, "runtimeproxy", "relay.py").is_file():
        return str(Path(spec).resolve())
    tree = Path(scratch, f"{side}-tree")
    tree.mkdir()
    archive = subprocess.run(["git", "-C", str(REPO), "archive", spec, "runtimeproxy", "wire"],
                             capture_output=True, check=False)
    if archive.returncode != 0:
        raise SystemExit(f"--{side} {spec}: neither a koordlet-py tree nor a commit: "
                         f"{archive.stderr.decode(errors='replace').strip()}")
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive.stdout, check=True)
    return str(tree)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", required=True, help="the other source tree, or a commit of this repository")
    ap.add_argument("--after", default=str(REPO), help="a source tree or commit (default: this tree)")
    ap.add_argument("--pods", type=int, default=20)
    ap.add_argument("--calls", type=int, default=5000, help="calls per measurement")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    tmp = tempfile.TemporaryDirectory(prefix="kpy-ab-")
    before_tree = source_tree(args.before, tmp.name, "before")
    after_tree = source_tree(args.after, tmp.name, "after")

    CONTAINERD.up()
    after = ProxyProcess(f"{tmp.name}/after/proxy.sock", CONTAINERD.socket, "--log-level", "warning",
                         tree=after_tree)
    before = ProxyProcess(f"{tmp.name}/before/proxy.sock", CONTAINERD.socket, "--log-level", "warning",
                          tree=before_tree)
    pipe_socket = f"{tmp.name}/pipe.sock"
    pods = PodFactory(CriClient(CONTAINERD.socket))
    pipe = None
    try:
        for side in ("after", "before"):
            os.makedirs(f"{tmp.name}/{side}")
        after.start()
        before.start()
        pipe = subprocess.Popen([sys.executable, str(BYTEPIPE), pipe_socket, CONTAINERD.socket])
        wait_for_socket(pipe_socket, 15, pipe)
        for i in range(args.pods):
            pods.start_pod(f"ab-{i}")
        runtime_pid = int(Path(CONTAINERD.run_dir, "containerd.pid").read_text())
        sides = (("pipe", pipe.pid, pipe_socket), ("before", before.proc.pid, before.listen),
                 ("after", after.proc.pid, after.listen))
        result: dict[str, dict[str, float]] = {}
        for in_flight in (1, 16):
            result.update(compare(sides, runtime_pid, args.rounds, args.calls, in_flight))
    finally:
        pods.cleanup()
        if pipe is not None:
            pipe.terminate()
            pipe.wait(10)
        after.terminate()
        before.terminate()
        tmp.cleanup()
        CONTAINERD.down()
        CONTAINERD.remove_dirs()
    if args.json:
        print(json.dumps(result))
        return 0
    report(result, args.pods, args.rounds, args.calls)
    return 0


def compare(sides, runtime_pid: int, rounds: int, calls: int, in_flight: int) -> dict[str, dict[str, float]]:
    """Medians per side, and the after/before ratio of own CPU paired by round (the two measured back to back,
    in alternating order, so drift of the machine between rounds cancels out)."""
    rows: dict[str, list[tuple[float, float, float]]] = {name: [] for name, _, _ in sides}
    for round_no in range(rounds):
        order = sides if round_no % 2 == 0 else (sides[0], sides[2], sides[1])
        for name, pid, sock in order:
            rows[name].append(measure(pid, runtime_pid, sock, calls, in_flight))
    result = {f"{name}_{in_flight}": {
        "proxy_us": round(statistics.median(s[0] for s in samples), 1),
        "wakeups": round(statistics.median(s[1] for s in samples), 2),
        "runtime_us": round(statistics.median(s[2] for s in samples), 1),
    } for name, samples in rows.items()}
    ratios = [a[0] / b[0] for a, b in zip(rows["after"], rows["before"], strict=True)]
    quartiles = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratios[0]] * 3
    result[f"paired_{in_flight}"] = {"after_over_before": round(statistics.median(ratios), 3),
                                     "q1": round(quartiles[0], 3), "q3": round(quartiles[2], 3)}
    return result


def report(result: dict[str, dict[str, float]], pods: int, rounds: int, calls: int) -> None:
    print(f"ListContainers with {pods} pods, medians of {rounds} interleaved rounds of {calls} calls")
    print(f"{'':<10}{'in flight':>10}{'own CPU µs':>12}{'x pipe':>8}{'wake-ups':>10}{'containerd µs':>15}")
    for in_flight in (1, 16):
        floor = result[f"pipe_{in_flight}"]["proxy_us"]
        for name in ("pipe", "before", "after"):
            row = result[f"{name}_{in_flight}"]
            print(f"{name:<10}{in_flight:>10}{row['proxy_us']:>12}{row['proxy_us'] / floor:>8.2f}"
                  f"{row['wakeups']:>10}{row['runtime_us']:>15}")
    for in_flight in (1, 16):
        paired = result[f"paired_{in_flight}"]
        print(f"after/before own CPU, paired by round, {in_flight:>2} in flight: {paired['after_over_before']:.3f} "
              f"(quartiles {paired['q1']:.3f}-{paired['q3']:.3f})")


if __name__ == "__main__":
    sys.exit(main())
