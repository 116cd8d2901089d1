"""NetQoSManager: NodeSLO + pods from a StaticStates provider kept on a real veth link, in a network namespace.

The namespace (and with it the veth pair and every qdisc) is this test's own and is deleted in a finally;
the pod addresses exist only as tc filter keys, nothing is routed.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from koordlet.api.nodeslo import parse_node_slo_spec
from koordlet.api.pod import PodMeta
from koordlet.config import parse_config
from koordlet.netqos.manager import (
    STATUS_ERROR,
    STATUS_REMOVED,
    STATUS_UNCHANGED,
    NetQoSManager,
)
from koordlet.netqos.plan import classid
from koordlet.statesinformer.api import StaticStates
from koordlet.system.tc import read_link
from tests.support.waiting import wait_for

UPLINK, PEER = "kqm-up", "kqm-peer"
BE_IP, LS_IP = "10.214.0.2", "10.214.0.3"


@pytest.fixture
def namespace() -> Iterator[str]:
    if os.geteuid() != 0:
        pytest.skip("needs root to create network namespaces")
    from pyroute2 import NetNS, netns

    name = f"kpy-netqos-mgr-{os.getpid()}"
    try:
        netns.create(name)
    except OSError as exc:  # no CAP_SYS_ADMIN / no /var/run/netns mount: an environment limit
        pytest.skip(f"cannot create network namespace {name}: {exc}")
    try:
        with NetNS(name) as ns:
            ns.link("add", ifname=UPLINK, kind="veth", peer={"ifname": PEER})
            for ifname in (UPLINK, PEER):
                ns.link("set", index=ns.link_lookup(ifname=ifname)[0], state="up")
        yield name
    finally:
        netns.remove(name)  # takes the veth pair and its qdiscs with it


def _slo(enabled: bool) -> Any:
    return parse_node_slo_spec({
        "systemStrategy": {"totalNetworkBandwidth": "100M"},
        "resourceQOSStrategy": {
            "lsClass": {"networkQOS": {"enable": enabled, "egressRequest": 50, "egressLimit": 100}},
            "beClass": {"networkQOS": {"enable": enabled, "egressRequest": 0, "egressLimit": "10M"}},
        },
    })


def _pod(name: str, qos: str, ips: tuple[str, ...], phase: str = "Running") -> PodMeta:
    return PodMeta(name=name, namespace="default", uid=f"uid-{name}", labels={"koordinator.sh/qosClass": qos},
                   phase=phase, ips=ips)


def _link(name: str) -> Any:
    from pyroute2 import NetNS

    with NetNS(name) as ns:
        return read_link(ns, UPLINK)


def _count(registry: CollectorRegistry, status: str) -> float:
    return registry.get_sample_value("koordlet_netqos_apply_total", {"status": status}) or 0.0


def test_manager_follows_node_slo_and_pods_on_a_real_link(namespace: str, tmp_path: Path) -> None:
    from pyroute2 import NetNS

    states = StaticStates(node_slo=_slo(False))
    registry = CollectorRegistry()
    # A long interval: every change below must come through the callbacks, not the timer.
    manager = NetQoSManager(states, uplink=UPLINK, interval_s=60.0, ipr_factory=lambda: NetNS(namespace),
                            sys_dir=str(tmp_path), registry=registry)
    manager.start()
    stopped = False
    try:
        assert wait_for(lambda: manager.syncs >= 1)
        assert _link(namespace).qdisc_kind != "htb"  # off: nothing of ours appears

        states.set_node_slo(_slo(True))
        state = wait_for(lambda: (s := _link(namespace)).qdisc_kind == "htb" and len(s.classes) == 4 and s)
        assert state and state.qdisc_handle == 0x10000 and state.default_classid == classid(2)
        be_class = next(c for c in state.classes if c.classid == classid(4))
        assert be_class.ceil_bytes == 10_000_000 // 8

        # A BE pod with an IP gets its filter; a pod without one or one that finished gets none.
        states.set_pods([_pod("be", "BE", (BE_IP,)), _pod("pending", "BE", ()),
                         _pod("done", "LS", (LS_IP,), phase="Succeeded")])
        filters = wait_for(lambda: _link(namespace).filters)
        assert [(f.ip, f.classid) for f in filters] == [(BE_IP, classid(4))]

        states.set_pods([])
        assert wait_for(lambda: not _link(namespace).filters)

        states.set_node_slo(_slo(False))
        assert wait_for(lambda: _link(namespace).qdisc_kind != "htb")
        assert wait_for(lambda: _count(registry, STATUS_REMOVED) == 1)
        assert _count(registry, "applied") >= 3 and _count(registry, STATUS_ERROR) == 0
    finally:
        stopped = manager.stop()
    assert stopped


def test_a_foreign_root_qdisc_is_left_alone_when_network_qos_is_off(namespace: str, tmp_path: Path) -> None:
    from pyroute2 import NetNS

    with NetNS(namespace) as ns:
        ns.tc("add", "tbf", ns.link_lookup(ifname=UPLINK)[0], 0x20000, rate="1mbit", latency="50ms", burst=10000)
    manager = NetQoSManager(StaticStates(node_slo=_slo(False)), uplink=UPLINK, ipr_factory=lambda: NetNS(namespace),
                            sys_dir=str(tmp_path))
    assert manager.sync_once() == STATUS_UNCHANGED
    state = _link(namespace)
    assert (state.qdisc_kind, state.qdisc_handle) == ("tbf", 0x20000)


def test_sync_failures_are_counted_not_raised(namespace: str, tmp_path: Path) -> None:
    from pyroute2 import NetNS

    registry = CollectorRegistry()
    missing = NetQoSManager(StaticStates(node_slo=_slo(True)), uplink="kqm-absent",
                            ipr_factory=lambda: NetNS(namespace), sys_dir=str(tmp_path), registry=registry)
    assert missing.sync_once() == STATUS_ERROR
    # Percentages with neither totalNetworkBandwidth nor a link speed: an error too, and nothing applied.
    no_total = parse_node_slo_spec({"resourceQOSStrategy": {"beClass": {"networkQOS": {"enable": True}}}})
    unknown = NetQoSManager(StaticStates(node_slo=no_total), uplink=UPLINK, ipr_factory=lambda: NetNS(namespace),
                            sys_dir=str(tmp_path), registry=CollectorRegistry())
    assert unknown.sync_once() == STATUS_ERROR
    assert _link(namespace).qdisc_kind != "htb"
    assert _count(registry, STATUS_ERROR) == 1


def test_timer_resyncs_and_stop_is_prompt(namespace: str, tmp_path: Path) -> None:
    from pyroute2 import NetNS

    registry = CollectorRegistry()
    manager = NetQoSManager(StaticStates(node_slo=_slo(True)), uplink="kqm-absent", interval_s=0.05,
                            ipr_factory=lambda: NetNS(namespace), sys_dir=str(tmp_path), registry=registry)
    manager.start()
    stopped = False
    try:
        assert wait_for(lambda: manager.syncs >= 3)  # no callback fired: the timer drives these
    finally:
        stopped = manager.stop(timeout_s=2.0)
    assert stopped and _count(registry, STATUS_ERROR) >= 3


def test_link_speed_stands_in_for_total_bandwidth(namespace: str, tmp_path: Path) -> None:
    from pyroute2 import NetNS

    speed = tmp_path / "class" / "net" / UPLINK / "speed"
    speed.parent.mkdir(parents=True)
    speed.write_text("1000\n")
    no_total = parse_node_slo_spec({"resourceQOSStrategy": {"beClass": {"networkQOS": {
        "enable": True, "egressLimit": 20}}}})
    manager = NetQoSManager(StaticStates(node_slo=no_total), uplink=UPLINK, ipr_factory=lambda: NetNS(namespace),
                            sys_dir=str(tmp_path))
    assert manager.sync_once() == "applied"
    ceilings = {c.classid: c.ceil_bytes for c in _link(namespace).classes}
    assert ceilings[classid(1)] == 1_000_000_000 // 8 and ceilings[classid(4)] == 200_000_000 // 8


def test_daemon_adds_the_manager_only_with_the_tc_network_qos_gate(tmp_path: Path) -> None:
    from koordlet.agent.context import host_dirs
    from koordlet.agent.parts import default_components
    from koordlet.agent.wiring.network import netqos

    assert netqos in default_components()
    env = {"NODE_NAME": "node-1"}
    ctx = SimpleNamespace(states=StaticStates(), metrics=SimpleNamespace(registry=CollectorRegistry()))
    ctx.config = parse_config([], env)
    ctx.dirs = host_dirs(ctx.config)
    assert netqos(ctx) is None  # type: ignore[arg-type]
    ctx.config = parse_config(["-feature-gates=TCNetworkQoS=true", "-netqos-uplink=kqm-x"], env)
    manager = netqos(ctx)  # type: ignore[arg-type]
    assert isinstance(manager, NetQoSManager) and manager._uplink == "kqm-x"
