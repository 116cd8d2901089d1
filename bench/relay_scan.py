#!/usr/bin/env python3
"""The relay's frame scanners of two source trees side by side, in one process: what a relayed unary call
costs in ``KubeletSide.data_received`` and ``RuntimeSide.data_received`` alone, without sockets, the event
loop or containerd, so that a change of a few hundred nanoseconds per call shows above the machine's noise
(bench/proxy_ab.py measures the whole proxy, where such a change is within the noise of a shared machine).

Each tree's ``runtimeproxy`` package is loaded under its own name; the same byte streams (kubelet's HEADERS and
DATA in one read, the runtime's HEADERS, DATA and trailers in one read, grpc-go's BDP PING every fourth call and
connection credit as grpc-go sends it) are fed to each in alternation, and the thread's CPU time per call is
read. Prints the medians and the after/before ratio paired by round. Needs no root.

    .venv/bin/python bench/relay_scan.py --before <commit or tree> [--after <commit or tree>] [--rounds 40]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType

from hpack import Encoder

sys.path.insert(0, str(Path(__file__).resolve().parent))
from proxy_ab import REPO, source_tree  # noqa: E402

PATH = b"/runtime.v1.RuntimeService/ListContainers"


class NullTransport:
    """A transport that takes everything and keeps nothing."""

    def write(self, data: bytes) -> None:
        pass

    def is_closing(self) -> bool:
        return False

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def close(self) -> None:
        pass


def load(tree: str) -> tuple[ModuleType, ModuleType]:
    """(relay, h2) of ``tree``, kept under names of their own so that the next tree loads fresh."""
    def ours() -> list[str]:
        return [name for name in sys.modules if name == "runtimeproxy" or name.startswith("runtimeproxy.")]

    for name in ours():
        del sys.modules[name]
    sys.path.insert(0, tree)
    try:
        relay, h2 = importlib.import_module("runtimeproxy.relay"), importlib.import_module("runtimeproxy.h2")
    finally:
        sys.path.remove(tree)
    for name in ours():
        sys.modules[f"{tree}:{name}"] = sys.modules.pop(name)
    return relay, h2


def joined(relay: ModuleType, loop: asyncio.AbstractEventLoop):
    conn = relay.Relay("/nonexistent", None, frozenset({"/runtime.v1.RuntimeService/CreateContainer"}))
    if hasattr(relay, "HopFlow"):
        down = relay.KubeletSide(conn, NullTransport(), loop=loop)
        up = relay.RuntimeSide(down, NullTransport())
        down.join(up)
        return down, up
    # trees before the constructor seam (commit 015f308 and older)
    down = relay.KubeletSide(conn)
    down.transport, down._loop = NullTransport(), loop
    up = relay.RuntimeSide(down)
    up.transport = NullTransport()
    down.up, down._up_transport, down._pending_up = up, up.transport, None
    return down, up


def calls(h2: ModuleType, count: int, body_size: int) -> tuple[bytes, bytes, list[tuple[bytes, bytes, bytes]]]:
    """(kubelet's first call, the runtime's answer to it, then per call: kubelet's read, the runtime's read,
    kubelet's credit or b"")."""
    encoder = Encoder()
    headers = [(b":method", b"POST"), (b":scheme", b"http"), (b":path", PATH), (b":authority", b"localhost"),
               (b"content-type", b"application/grpc"), (b"te", b"trailers"), (b"grpc-timeout", b"1999m")]
    request = h2.frame(h2.DATA, h2.FLAG_END_STREAM, 1, b"\0\0\0\0\2ab")
    first = h2.frame(h2.HEADERS, h2.FLAG_END_HEADERS, 1, encoder.encode(headers)) + request
    block = encoder.encode(headers)  # indexed from now on: the same bytes every call, as kubelet's
    out = []
    body = bytes(body_size)
    for i in range(count):
        sid = 3 + 2 * i
        kubelet = h2.frame(h2.HEADERS, h2.FLAG_END_HEADERS, sid, block) + h2.frame(
            h2.DATA, h2.FLAG_END_STREAM, sid, b"\0\0\0\0\2ab")
        runtime = (h2.frame(h2.HEADERS, h2.FLAG_END_HEADERS, sid, b"\x88\x5f\x10application/grpc")
                   + h2.frame(h2.DATA, 0, sid, body)
                   + h2.frame(h2.HEADERS, h2.FLAG_END_HEADERS | h2.FLAG_END_STREAM, sid, b"\x40\x0bgrpc-status\x010"))
        if i % 4 == 0:
            runtime = h2.frame(h2.PING, 0, 0, bytes(8)) + runtime
        if i % 2000 == 1999:  # grpc-go credits a quarter of the window at a time
            runtime = h2.window_update(0, 7 * 2000) + runtime
        credit = h2.window_update(0, body_size * 6) if i % 6 == 5 else b""
        out.append((kubelet, runtime, credit))
    return first, h2.frame(h2.HEADERS, h2.FLAG_END_HEADERS | h2.FLAG_END_STREAM, 1, b"\x88"), out


def cost_us(relay: ModuleType, h2: ModuleType, loop: asyncio.AbstractEventLoop, count: int, body: int) -> float:
    down, up = joined(relay, loop)
    first, answer, stream = calls(h2, count, body)
    down.data_received(h2.PREFACE + h2.frame(h2.SETTINGS, 0, 0))
    up.data_received(h2.frame(h2.SETTINGS, 0, 0) + h2.frame(h2.SETTINGS, h2.FLAG_ACK, 0))
    down.data_received(first)
    up.data_received(answer)
    kubelet_read, runtime_read = down.data_received, up.data_received
    started = time.thread_time()
    for kubelet, runtime, credit in stream:
        kubelet_read(kubelet)
        runtime_read(runtime)
        if credit:
            kubelet_read(credit)
    spent = time.thread_time() - started
    if down._closed or down.inflight:
        raise SystemExit("the stream did not relay cleanly")
    return spent / count * 1e6


async def run(args: argparse.Namespace, trees: dict[str, str]) -> dict[str, list[float]]:
    loaded = {side: load(tree) for side, tree in trees.items()}
    loop = asyncio.get_running_loop()
    samples: dict[str, list[float]] = {side: [] for side in trees}
    for round_no in range(args.rounds):
        order = list(loaded) if round_no % 2 == 0 else list(reversed(loaded))
        for side in order:
            samples[side].append(cost_us(*loaded[side], loop, args.calls, args.body))
    return samples


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", required=True, help="a source tree, or a commit of this repository")
    ap.add_argument("--after", default=str(REPO), help="a source tree or commit (default: this tree)")
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--calls", type=int, default=2000, help="relayed calls per measurement")
    ap.add_argument("--body", type=int, default=3000, help="bytes of each answer")
    args = ap.parse_args()
    logging.disable(logging.CRITICAL)
    with tempfile.TemporaryDirectory(prefix="kpy-scan-") as scratch:
        trees = {"before": source_tree(args.before, scratch, "before"),
                 "after": source_tree(args.after, scratch, "after")}
        samples = asyncio.run(run(args, trees))
    ratios = [a / b for a, b in zip(samples["after"], samples["before"], strict=True)]
    quartiles = statistics.quantiles(ratios, n=4)
    print(f"relay scanners, one relayed call ({args.body}-byte answer), {args.rounds} rounds of {args.calls} calls")
    for side in ("before", "after"):
        print(f"{side:<8} median {statistics.median(samples[side]):7.3f} µs CPU per call, "
              f"least {min(samples[side]):7.3f}")
    print(f"after/before, paired by round: {statistics.median(ratios):.3f} "
          f"(quartiles {quartiles[0]:.3f}-{quartiles[2]:.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
