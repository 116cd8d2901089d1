"""Who owns what in a relayed connection (runtimeproxy/relay.py): each hop's connection flow control is a
HopFlow the connection owns, and the runtime side only asks it and the connection; it never sets a field
of the kubelet side. The transports enter through the constructors and ``join``."""

from __future__ import annotations

import asyncio
import sys

from runtimeproxy import h2
from runtimeproxy.relay import HookedRequest, HopFlow, KubeletSide, Relay, RuntimeSide
from tests.runtimeproxy.test_read_boundaries import HOOKED, RELAYED, Recorder, _runtime_stream

_CONN_WINDOW = 65535


def test_hop_flow_hands_over_what_it_holds_and_no_more() -> None:
    hop = HopFlow()
    assert (hop.window, hop.held, hop.due(), hop.flush()) == (_CONN_WINDOW, 0, False, b"")
    hop.spent(20000)
    hop.hold(100)
    assert not hop.due() and hop.flush() == b""  # a small credit while the sender has more than half its window
    hop.spent(20000)  # now below half: the credit held must go at once
    assert hop.short() and hop.due()
    frame = hop.flush()
    assert frame == h2.window_update(0, 100)
    assert (hop.window, hop.held, hop.short()) == (_CONN_WINDOW - 40000 + 100, 0, False)
    hop.hold(_CONN_WINDOW // 4)  # a quarter of the window is worth a frame of its own whatever the window
    assert hop.due() and hop.take() == h2.window_update(0, _CONN_WINDOW // 4)


class _Watched(KubeletSide):
    """A kubelet side that records the fields code of the runtime side sets on it (its own methods, which the
    runtime side may call, change it as they must)."""

    set_by_runtime_side: list[str]

    def __setattr__(self, name: str, value: object) -> None:
        if isinstance(sys._getframe(1).f_locals.get("self"), RuntimeSide):
            self.set_by_runtime_side.append(name)
        super().__setattr__(name, value)


def test_the_runtime_side_never_sets_a_field_of_the_kubelet_side() -> None:
    loop = asyncio.new_event_loop()
    try:
        relay = Relay("/nonexistent", lambda req: None, frozenset({HOOKED}))
        down = _Watched(relay, Recorder(), loop=loop)
        down.set_by_runtime_side = []
        up = RuntimeSide(down, Recorder())
        down.join(up)
        down.data_received(h2.PREFACE + h2.frame(h2.SETTINGS, 0, 0))
        down.inflight[1] = down.inflight[5] = (RELAYED, 0.0)
        down.hooked[3] = HookedRequest(3, HOOKED, [])
        runtime_window, kubelet_credit = down.runtime_hop.window, down.kubelet_hop.held
        stream = _runtime_stream() + h2.frame(h2.SETTINGS, 0, 0, bytes((0, 5, 0, 1, 0, 0)))  # frames up to 64 KiB
        for start in range(0, len(stream), 700):  # reads that end inside frames, too
            up.data_received(stream[start : start + 700])
        assert down.set_by_runtime_side == []
        # ...and yet the connection's state moved: the runtime's DATA used its window, its credit is held for
        # kubelet, both relayed calls ended, the SETTINGS raised the frame size kubelet may send
        assert down.runtime_hop.window < runtime_window and down.kubelet_hop.held > kubelet_credit
        assert down.inflight == {} and down.max_frame == 1 << 16
    finally:
        loop.close()


def test_transports_enter_through_the_constructors_and_join() -> None:
    relay = Relay("/nonexistent", lambda req: None, frozenset())
    kubelet, runtime = Recorder(), Recorder()
    down = KubeletSide(relay, kubelet)
    down.data_received(h2.PREFACE)  # before the runtime connection exists: held for it
    up = RuntimeSide(down, runtime)
    down.join(up)
    assert (down.transport, up.transport, down.up) == (kubelet, runtime, up)
    assert runtime.data == h2.PREFACE
