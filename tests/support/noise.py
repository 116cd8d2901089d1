"""Load beside the tests: another program on the node that allocates and frees memory and burns CPU, so a run
shows that no test depends on what the rest of the machine does.

    .venv/bin/python -m tests.support.noise [--seconds N] [--max-mib 1024] [--cpu 0.5]

Until ``--seconds`` have passed (default: until SIGTERM or Ctrl-C):

- memory: every 1-4 s it takes a random amount between a quarter of ``--max-mib`` and all of it (every page
  touched, so the kernel counts it used), holds it, then frees it: the machine's used memory moves by up to
  ``--max-mib`` either way, several times a minute;
- CPU: a child process burns in 50 ms slices, at a share that wanders between zero and twice ``--cpu`` (one
  core's worth at most), so the node's CPU use moves too.

It writes nothing to disk and stops its child on every path. A line per minute says what it did.
"""

from __future__ import annotations

import argparse
import logging
import random
import signal
import subprocess
import sys
import time
from types import FrameType

logger = logging.getLogger("noise")

_BURN = """
import random, sys, time
share = float(sys.argv[1])
rng = random.Random(7)
while True:
    target = min(1.0, rng.uniform(0.0, 2 * share))
    for _ in range(40):  # 2 s at this share, in 50 ms slices
        until = time.monotonic() + 0.05 * target
        while time.monotonic() < until:
            pass
        time.sleep(0.05 * (1 - target))
"""


class _Stop(Exception):
    pass


def _stop(signum: int, frame: FrameType | None) -> None:
    raise _Stop


def run(seconds: float | None, max_mib: int, cpu: float, seed: int = 33) -> int:
    """Make noise until ``seconds`` passed (None: until SIGTERM/SIGINT); returns the allocations made."""
    rng = random.Random(seed)
    burner = subprocess.Popen([sys.executable, "-c", _BURN, str(cpu)]) if cpu > 0 else None
    until = None if seconds is None else time.monotonic() + seconds
    allocations = 0
    said = time.monotonic()
    try:
        while until is None or time.monotonic() < until:
            mib = rng.randint(max(max_mib // 4, 1), max(max_mib, 1))
            held = bytearray(mib << 20)
            for offset in range(0, len(held), 4096):  # touch every page: used, not just reserved
                held[offset] = 1
            allocations += 1
            time.sleep(min(rng.uniform(1.0, 4.0), _left(until)))
            del held
            time.sleep(min(rng.uniform(0.5, 2.0), _left(until)))
            if time.monotonic() - said >= 60:
                logger.info("noise: %d allocations so far", allocations)
                said = time.monotonic()
    except _Stop:
        pass
    finally:
        if burner is not None:
            burner.kill()
            burner.wait()
    return allocations


def _left(until: float | None) -> float:
    return 3600.0 if until is None else max(until - time.monotonic(), 0.0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=None, help="stop after this long (default: at SIGTERM)")
    ap.add_argument("--max-mib", type=int, default=1024, help="the largest allocation, MiB")
    ap.add_argument("--cpu", type=float, default=0.5, help="the average CPU burnt, in cores (at most 1)")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    allocations = run(args.seconds, args.max_mib, min(max(args.cpu, 0.0), 1.0))
    logger.info("noise: stopped after %d allocations", allocations)
    return 0


if __name__ == "__main__":
    sys.exit(main())
