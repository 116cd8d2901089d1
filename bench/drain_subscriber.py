#!/usr/bin/env python3
"""How long a proxy restart takes with kubelet's Evented PLEG subscription open, two source trees side by side.

kubelet (feature gate EventedPLEG) keeps one ``GetContainerEvents`` stream open on its runtime connection, which
never ends by itself. One private containerd; in front of it, through a systemd stand-in's socket (as the units
run it), a proxy from ``--before`` and one from ``--after`` in turn (each a source tree or a commit of this
repository, as bench/proxy_ab.py takes them). kubelet's traffic: CallLoop's calls and the subscription on one
channel. Each round makes a pod (an event the subscription receives), sends SIGTERM and measures

  stop_s         SIGTERM to the process's exit (the drain)
  sub_end_s      SIGTERM to the client seeing its subscription end, and with what status
  again_s        SIGTERM to the first event received on the subscription made again (the next process started
                 at once, as systemd's Restart= does; a pod made every 0.5 s for the event)

and the calls that failed meanwhile. A benchmark, not a test; needs root (containerd).

    .venv/bin/python bench/drain_subscriber.py --before <commit or tree> [--after <commit or tree>]
        [--rounds 3] [--drain-timeout 10]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.proxy_ab import source_tree  # noqa: E402
from tests.support.callloop import CallLoop  # noqa: E402
from tests.support.containerd import Containerd  # noqa: E402
from tests.support.cri import CriClient, PodFactory, sandbox_config  # noqa: E402
from tests.support.proxy import ProxyProcess  # noqa: E402
from tests.support.sdactivation import SystemdStandIn  # noqa: E402
from tests.support.subscriber import EventSubscriber  # noqa: E402

CONTAINERD = Containerd(f"/run/koordlet-py/bench-drain-{os.getpid()}/containerd",
                        f"/var/lib/koordlet-py/bench-drain-{os.getpid()}/containerd")


def one_side(tree: str, scratch: str, side: str, rounds: int, drain_timeout: float, pods: PodFactory,
             sandbox: str) -> dict[str, object]:
    state = Path(scratch, side)
    state.mkdir()
    systemd = SystemdStandIn(str(state / "cri.sock"))
    processes: list[ProxyProcess] = []

    def proxy() -> ProxyProcess:
        process = ProxyProcess(systemd.path, CONTAINERD.socket, "--drain-timeout", str(drain_timeout),
                               "--log-level", "warning", log_path=str(state / f"proxy-{len(processes)}.log"),
                               state_dir=str(state), systemd=systemd, tree=tree)
        processes.append(process)
        return process.start()

    current = proxy()
    loop = CallLoop(systemd.path, sandbox).start()
    subscriber = EventSubscriber(loop.client).start()
    stop_s: list[float] = []
    sub_end_s: list[float] = []
    again_s: list[float] = []
    statuses: list[str] = []
    try:
        def pod() -> None:
            pods.run_pod(sandbox_config(f"drain-{side}"))

        for _ in range(rounds):
            if subscriber.provoke(pod, max(subscriber.subscriptions, 1), 60) is None:
                raise SystemExit(f"{side}: no event reached the subscription: {subscriber.ends[-3:]}")
            ends = len(subscriber.ends)
            started = time.monotonic()
            current.terminate(timeout_s=drain_timeout + 30)
            stop_s.append(time.monotonic() - started)
            current = proxy()
            if not subscriber.wait(lambda s, k=ends: len(s.ends) > k, 60):
                raise SystemExit(f"{side}: the subscription never ended")
            end = subscriber.ends[ends]
            sub_end_s.append(end.at - started)
            statuses.append(f"{end.code}: {end.details}")
            again = subscriber.provoke(pod, end.subscription + 1, 60, every_s=0.5)
            if again is None:
                raise SystemExit(f"{side}: no event on the subscription made again")
            again_s.append(again - started)
    finally:
        subscriber.stop()
        figures = loop.stop()
        for process in processes:
            if process.proc is not None and process.proc.poll() is None:
                process.terminate()
        systemd.close()
    return {"stop_s": stop_s, "sub_end_s": sub_end_s, "again_s": again_s, "statuses": sorted(set(statuses)),
            "calls": figures.calls, "failed": figures.failed}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", required=True, help="the other source tree, or a commit of this repository")
    ap.add_argument("--after", default=str(REPO), help="a source tree or commit (default: this tree)")
    ap.add_argument("--rounds", type=int, default=3, help="restarts per side")
    ap.add_argument("--drain-timeout", type=float, default=10.0, help="the proxies' --drain-timeout (default 10)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    tmp = tempfile.TemporaryDirectory(prefix="kpy-drain-")
    trees = {"before": source_tree(args.before, tmp.name, "before"),
             "after": source_tree(args.after, tmp.name, "after")}
    CONTAINERD.up()
    client = CriClient(CONTAINERD.socket)
    pods = PodFactory(client)
    results: dict[str, dict[str, object]] = {}
    try:
        sandbox = pods.run_pod(sandbox_config("drain-bench"))
        for side in ("before", "after"):
            results[side] = one_side(trees[side], tmp.name, side, args.rounds, args.drain_timeout, pods, sandbox)
    finally:
        pods.cleanup()
        client.close()
        CONTAINERD.down()
        CONTAINERD.remove_dirs()
        tmp.cleanup()
    if args.json:
        print(json.dumps(results, indent=1))
        return 0
    print(f"proxy restart with a GetContainerEvents subscription, --drain-timeout {args.drain_timeout:g} s, "
          f"{args.rounds} restarts a side (median / max, seconds)")
    print(f"{'':8}{'stop':>14}{'sub ended':>14}{'sub again':>14}{'calls':>8}{'failed':>8}  subscription's end")
    for side, figures in results.items():
        cells = [f"{statistics.median(figures[k]):6.2f} /{max(figures[k]):6.2f}"  # type: ignore[arg-type]
                 for k in ("stop_s", "sub_end_s", "again_s")]
        print(f"{side:8}" + "".join(f"{c:>14}" for c in cells)
              + f"{figures['calls']:>8}{figures['failed']:>8}  {'; '.join(figures['statuses'])}")  # type: ignore[arg-type]
    return 0


if __name__ == "__main__":
    sys.exit(main())
