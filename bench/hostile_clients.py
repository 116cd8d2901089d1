"""Hostile clients on the proxy socket: what the proxy does with each, its peak RSS, and a bystander's latency.

Runs every attack of tests/support/hostile.py against a real proxy process in front of a private containerd,
one after the other, while a well-behaved client calls Version through the same proxy every 50 ms.

    python bench/hostile_clients.py [--tree DIR] [--json]

``--tree``: run the proxy from another source tree (e.g. a checkout of an older commit) for before/after
figures; the attacks and the measurements stay this tree's.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support import hostile  # noqa: E402
from tests.support.containerd import Containerd  # noqa: E402
from tests.support.proxy import ProxyProcess  # noqa: E402

BENCH_CONTAINERD = Containerd("/run/koordlet-py/bench-hostile/containerd",
                              "/var/lib/koordlet-py/bench-hostile/containerd")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tree", default=None, help="source tree the proxy runs from (default: this one)")
    ap.add_argument("--json", action="store_true", help="print the outcomes as JSON")
    args = ap.parse_args()
    BENCH_CONTAINERD.up()
    outcomes: list[hostile.Outcome] = []
    try:
        with tempfile.TemporaryDirectory(prefix="hostile-") as state:
            proxy = ProxyProcess(f"{state}/proxy.sock", BENCH_CONTAINERD.socket, state_dir=state, tree=args.tree)
            proxy.start()
            try:
                assert proxy.proc is not None
                for case, run in hostile.CASES.items():
                    if proxy.proc.poll() is not None:
                        outcomes.append(hostile.Outcome(case, "proxy died", 0.0, 0.0))
                        break
                    outcomes.append(hostile.attack(case, proxy.listen, proxy.proc.pid, run))
                silent = hostile.attack("silent_15s", proxy.listen, proxy.proc.pid,
                                        lambda conn: hostile.silent(conn, 15))
                outcomes.append(silent)
            finally:
                proxy.terminate()
    finally:
        BENCH_CONTAINERD.down()
        BENCH_CONTAINERD.remove_dirs()
    if args.json:
        print(json.dumps([asdict(o) for o in outcomes], indent=1))
    else:
        print(f"hostile clients against koord-runtime-proxy from {args.tree or 'this tree'}")
        for outcome in outcomes:
            print(outcome.line())
    return 0


if __name__ == "__main__":
    sys.exit(main())
