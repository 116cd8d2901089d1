"""Soak: N pod lifecycles through the proxy with the koordlet's hooks, on a private containerd.

Prints the proxy's and the koordlet's (the hook server's) open fds and RSS and the proxy's store size at the
start, after a warm-up, at the middle and at the end, and exits 1 when the growth after the warm-up passes the
bounds tests/test_faults.py holds on 60 lifecycles (fds +3, store no larger, RSS +8 MiB proxy, +12 MiB koordlet).

    python bench/soak.py [--lifecycles 300] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support.containerd import Containerd  # noqa: E402
from tests.support.stack import Stack  # noqa: E402

SOAK_CONTAINERD = Containerd("/run/koordlet-py/bench-soak/containerd", "/var/lib/koordlet-py/bench-soak/containerd")
WARM_UP = 10


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lifecycles", type=int, default=300)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    SOAK_CONTAINERD.up()
    points: list[dict] = []
    started = time.monotonic()
    try:
        with tempfile.TemporaryDirectory(prefix="soak-") as state:
            stack = Stack(Path(state), SOAK_CONTAINERD.socket).start()
            try:
                total = WARM_UP + args.lifecycles
                marks = {WARM_UP, WARM_UP + args.lifecycles // 2, total}
                points.append({"lifecycles": 0, "seconds": round(time.monotonic() - started, 1),
                               **asdict(stack.figures())})
                for index in range(total):
                    stack.lifecycle(index)
                    if index + 1 in marks:
                        points.append({"lifecycles": index + 1, "seconds": round(time.monotonic() - started, 1),
                                       **asdict(stack.figures())})
            finally:
                stack.stop()
    finally:
        SOAK_CONTAINERD.down()
        SOAK_CONTAINERD.remove_dirs()
    first, last = points[1], points[-1]  # growth from the end of the warm-up
    flat = (last["proxy_fds"] <= first["proxy_fds"] + 3 and last["koordlet_fds"] <= first["koordlet_fds"] + 3
            and last["proxy_store"] <= first["proxy_store"]
            and last["proxy_rss_mib"] <= first["proxy_rss_mib"] + 8
            and last["koordlet_rss_mib"] <= first["koordlet_rss_mib"] + 12)
    if args.json:
        print(json.dumps({"lifecycles": args.lifecycles, "flat": flat, "points": points}, indent=1))
    else:
        print(f"soak: {args.lifecycles} pod lifecycles through the proxy with koordlet hooks (after {WARM_UP} warm-up)")
        for point in points:
            print(f"{point['lifecycles']:5d} lifecycles {point['seconds']:7.1f} s  "
                  f"proxy {point['proxy_fds']} fds {point['proxy_rss_mib']:.1f} MiB store {point['proxy_store']}  "
                  f"koordlet {point['koordlet_fds']} fds {point['koordlet_rss_mib']:.1f} MiB")
        print(f"growth over {args.lifecycles}: proxy {last['proxy_fds'] - first['proxy_fds']:+d} fds "
              f"{last['proxy_rss_mib'] - first['proxy_rss_mib']:+.1f} MiB "
              f"store {last['proxy_store'] - first['proxy_store']:+d}, "
              f"koordlet {last['koordlet_fds'] - first['koordlet_fds']:+d} fds "
              f"{last['koordlet_rss_mib'] - first['koordlet_rss_mib']:+.1f} MiB: {'flat' if flat else 'NOT FLAT'}")
    return 0 if flat else 1


if __name__ == "__main__":
    sys.exit(main())
