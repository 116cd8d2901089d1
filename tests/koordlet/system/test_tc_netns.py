"""Network QoS on a real kernel: HTB + u32 on a veth pair between two network namespaces this test creates.

Addresses are 10.213.0.x on that veth only, inside the namespaces; nothing is routed off the host.
The namespaces (and with them the veth pair and every qdisc) are deleted in a finally.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from koordlet.api.qos import QoSClass
from koordlet.netqos.plan import ClassRates, NetPod, NetQoSSpec, classid, plan
from koordlet.system.tc import AddFilter, ChangeClass, DeleteClass, DeleteFilter, apply, read_link, remove

MBIT = 1_000_000
SENDER_IF, RECEIVER_IF = "kq-up", "kq-peer"
RECEIVER_IP, BE_IP, LS_IP = "10.213.0.1", "10.213.0.2", "10.213.0.3"


@dataclass(frozen=True)
class Pair:
    sender_ns: str
    receiver_ns: str


def _netns_usable() -> str | None:
    if os.geteuid() != 0:
        return "needs root to create network namespaces"
    return None


@pytest.fixture
def veth_pair() -> Iterator[Pair]:
    reason = _netns_usable()
    if reason:
        pytest.skip(reason)
    from pyroute2 import NetNS, netns

    pair = Pair(f"kpy-netqos-{os.getpid()}-s", f"kpy-netqos-{os.getpid()}-r")
    created: list[str] = []
    try:
        for name in (pair.sender_ns, pair.receiver_ns):
            try:
                netns.create(name)
            except OSError as exc:  # no CAP_SYS_ADMIN / no /var/run/netns mount: an environment limit
                pytest.skip(f"cannot create network namespace {name}: {exc}")
            created.append(name)
        with NetNS(pair.sender_ns) as sender:
            sender.link(
                "add", ifname=SENDER_IF, kind="veth", peer={"ifname": RECEIVER_IF, "net_ns_fd": pair.receiver_ns}
            )
            index = sender.link_lookup(ifname=SENDER_IF)[0]
            for ip in (BE_IP, LS_IP):
                sender.addr("add", index=index, address=ip, prefixlen=24)
            sender.link("set", index=index, state="up")
        with NetNS(pair.receiver_ns) as receiver:
            index = receiver.link_lookup(ifname=RECEIVER_IF)[0]
            receiver.addr("add", index=index, address=RECEIVER_IP, prefixlen=24)
            receiver.link("set", index=index, state="up")
        yield pair
    finally:
        for name in created:  # deleting a namespace deletes its veth end, the peer and every qdisc
            netns.remove(name)


SPEC = NetQoSSpec(
    total_bps=100 * MBIT,
    system=ClassRates(0, 100 * MBIT),
    ls=ClassRates(60 * MBIT, 100 * MBIT),
    be=ClassRates(0, 10 * MBIT),
)
PODS = [NetPod("batch/be", (BE_IP,), QoSClass.BE), NetPod("web/ls", (LS_IP,), QoSClass.LS)]


def test_apply_builds_the_layout_then_converges_with_only_the_difference(veth_pair: Pair) -> None:
    from pyroute2 import NetNS

    with NetNS(veth_pair.sender_ns) as ns:
        first = plan(SPEC, PODS)
        assert apply(ns, SENDER_IF, first)
        state = read_link(ns, SENDER_IF)
        assert (state.qdisc_kind, state.qdisc_handle, state.default_classid) == ("htb", 0x10000, classid(2))
        assert {(c.classid, c.rate_bytes, c.ceil_bytes) for c in state.classes} == {
            (c.classid, c.rate_bps // 8, c.ceil_bps // 8) for c in first.classes
        }
        assert {(f.ip, f.classid) for f in state.filters} == {(BE_IP, classid(4)), (LS_IP, classid(3))}
        assert apply(ns, SENDER_IF, first) == []  # idempotent

        # The BE pod gets its own 5M cap; the LS pod leaves; the BE class ceiling rises.
        second_spec = NetQoSSpec(SPEC.total_bps, SPEC.system, SPEC.ls, ClassRates(0, 20 * MBIT))
        second = plan(second_spec, [NetPod("batch/be", (BE_IP,), QoSClass.BE, egress_limit_bps=5 * MBIT)])
        ops = apply(ns, SENDER_IF, second)
        assert sorted(type(op).__name__ for op in ops) == sorted(
            ["DeleteFilter", "DeleteFilter", "ChangeClass", "AddClass", "AddFilter"]
        )
        assert [op.spec.classid for op in ops if isinstance(op, ChangeClass)] == [classid(4)]
        state = read_link(ns, SENDER_IF)
        assert {(f.ip, f.classid) for f in state.filters} == {(BE_IP, classid(0x100))}
        assert apply(ns, SENDER_IF, second) == []

        # Back to the first plan: the pod's leaf class goes after its filter.
        ops = apply(ns, SENDER_IF, plan(SPEC, PODS))
        kinds = [type(op) for op in ops]
        assert kinds.index(DeleteFilter) < kinds.index(DeleteClass) < kinds.index(AddFilter)
        assert classid(0x100) not in {c.classid for c in read_link(ns, SENDER_IF).classes}

        assert remove(ns, SENDER_IF, 0x10000) is True
        assert read_link(ns, SENDER_IF).qdisc_kind != "htb"
        assert remove(ns, SENDER_IF, 0x10000) is False


_RECEIVER = textwrap.dedent(
    """
    import json, selectors, socket, sys, time
    host, port, warmup, window = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
    server = socket.create_server((host, port))
    print("ready", flush=True)
    sel = selectors.DefaultSelector()
    sel.register(server, selectors.EVENT_READ)
    counted = {}
    start = None
    while start is None or time.monotonic() < start + warmup + window:
        for key, _ in sel.select(timeout=0.2):
            if key.fileobj is server:
                conn, (peer, _port) = server.accept()
                conn.setblocking(False)
                sel.register(conn, selectors.EVENT_READ, peer)
                start = start or time.monotonic()
                continue
            data = key.fileobj.recv(1 << 16)
            if not data:
                sel.unregister(key.fileobj)
                continue
            now = time.monotonic()
            if start + warmup <= now < start + warmup + window:
                counted[key.data] = counted.get(key.data, 0) + len(data)
    print(json.dumps({ip: n * 8 / window for ip, n in counted.items()}), flush=True)
    """
)

_SENDER = textwrap.dedent(
    """
    import socket, sys, threading, time
    host, port, seconds, sources = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4:]
    chunk = b"x" * 65536
    def blast(source):
        s = socket.create_connection((host, port), source_address=(source, 0))
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            s.send(chunk)
        s.close()
    threads = [threading.Thread(target=blast, args=(src,)) for src in sources]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    """
)


def _in_netns(name: str, argv: list[str]) -> subprocess.Popen[str]:
    from pyroute2 import netns

    return subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: netns.setns(name),  # the child alone enters the namespace
    )


def _measure(pair: Pair, warmup_s: float = 0.7, window_s: float = 2.0) -> dict[str, float]:
    """Both sources blast TCP at the receiver at once; bits/s per source over a window after warm-up."""
    procs: list[subprocess.Popen[str]] = []
    try:
        receiver = _in_netns(
            pair.receiver_ns, [sys.executable, "-c", _RECEIVER, RECEIVER_IP, "5201", str(warmup_s), str(window_s)]
        )
        procs.append(receiver)
        assert receiver.stdout is not None
        assert receiver.stdout.readline().strip() == "ready"
        sender = _in_netns(
            pair.sender_ns,
            [sys.executable, "-c", _SENDER, RECEIVER_IP, "5201", str(warmup_s + window_s + 0.3), BE_IP, LS_IP],
        )
        procs.append(sender)
        out, err = receiver.communicate(timeout=warmup_s + window_s + 10)
        assert receiver.returncode == 0, err
        sender.wait(timeout=10)
        return json.loads(out.strip().splitlines()[-1])
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


@pytest.mark.timeout(60)
def test_be_flow_is_held_near_its_ceiling_while_ls_takes_the_rest(veth_pair: Pair) -> None:
    from pyroute2 import NetNS

    # BE: 10M guaranteed and 10M ceiling, so it should sit at 10M whatever LS does.
    spec = NetQoSSpec(SPEC.total_bps, SPEC.system, SPEC.ls, ClassRates(10 * MBIT, 10 * MBIT))
    with NetNS(veth_pair.sender_ns) as ns:
        apply(ns, SENDER_IF, plan(spec, PODS))
    rates = _measure(veth_pair)
    be, ls = rates.get(BE_IP, 0.0), rates.get(LS_IP, 0.0)
    print(f"BE {be / MBIT:.1f} Mbit/s (class 10), LS {ls / MBIT:.1f} Mbit/s (total 100)")
    assert 8 * MBIT <= be <= 11.5 * MBIT
    assert ls >= 60 * MBIT  # at least its guarantee: it borrows what BE may not
    assert be + ls <= 105 * MBIT  # the root class caps the link
