"""koord-runtime-proxy restarted by real systemd while kubelet-like traffic runs: the figure issue 34 asks for.

Runs in the v2 stage's systemd guest only (systemd 252 as PID 1, scripts/v2-systemd-init.sh): the proxy's units
from this tree's ``systemd/`` are installed as they ship, with two changes a test must make (the proxy runs from
this checkout, in front of the session's containerd). A client calls ``Version``, ``ListContainers`` and
``PodSandboxStatus`` in a loop on one channel, as kubelet does, while ``systemctl restart`` restarts the proxy
10 times. On the same channel an Evented PLEG subscription (``GetContainerEvents``) stays open, as kubelet's does:
each stop ends it at once (UNAVAILABLE) instead of waiting the drain timeout for it, and it is made again on the
next process. Every call must succeed; the longest wait of a call is the figure that goes with it, and how long
after each restart command the subscription was ended. The figures are written to
``$KPY_V2_OUT/proxy_restart.json`` (the guest's results dir) and recorded as junit properties.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.support.callloop import CallLoop
from tests.support.containerd import REPO
from tests.support.cri import CriClient, PodFactory, sandbox_config
from tests.support.subscriber import EventSubscriber
from tests.support.v2guest import journal, main_pid, skip_unless_systemd_guest, systemctl
from tests.support.waiting import wait_for
from wire import cri_pb2 as cri

pytestmark = [pytest.mark.cgroupv2, pytest.mark.containerd]

RESTARTS = 10
SERVICE = "koord-runtime-proxy.service"
SOCKET_UNIT = "koord-runtime-proxy.socket"
# The guest's own systemd: units written here are gone with the guest (its /run is a tmpfs).
UNIT_DIR = Path("/run/systemd/system")
START_TIMEOUT_S = 120.0  # the emulated guest imports the proxy's Python in seconds, more on a loaded host
CALLS_BETWEEN_RESTARTS = 30  # served by each new process before the next restart
DRAIN_TIMEOUT_S = 10.0  # the unit's: runtimeproxy/main.py's --drain-timeout default
DRAIN_END = "koord-runtime-proxy is restarting: subscribe again"  # the status a drain ends a subscription with



def _journal() -> str:
    return journal((SERVICE, SOCKET_UNIT), 60)


def _render(unit: str, backend: str) -> str:
    """The shipped unit, running this checkout's proxy (the installer's venv does not exist here) against the
    session's containerd; everything else (paths, sandbox, ordering, type) as it ships, but for two things: the
    test's interpreter may live under /root (a pyenv build), which ``ProtectHome=yes`` hides, so home dirs stay
    readable; and a checkout under /tmp or /var/tmp (a fresh clone there) would be hidden by ``PrivateTmp=yes``,
    which then goes for this run."""
    text = unit
    text = re.sub(r"^ExecStart=\S*/bin/koord-runtime-proxy",
                  f"Environment=PYTHONPATH={REPO}\nExecStart={sys.executable} -m runtimeproxy.main",
                  text, flags=re.M)
    text = re.sub(r"^ProtectHome=yes$", "ProtectHome=read-only", text, flags=re.M)
    if any(Path(p).resolve().is_relative_to(tmp) for p in (REPO, sys.executable) for tmp in ("/tmp", "/var/tmp")):
        text = re.sub(r"^PrivateTmp=yes$", "PrivateTmp=no", text, flags=re.M)
    return text.replace("/var/run/containerd/containerd.sock", backend)


def _listen_path(units: dict[str, str]) -> str:
    socket_unit = units.get(SOCKET_UNIT)
    if socket_unit is not None:
        return re.search(r"^ListenStream=(\S+)", socket_unit, flags=re.M).group(1)
    return re.search(r"--koord-runtimeproxy-endpoint=(\S+)", units[SERVICE]).group(1)


@pytest.fixture(scope="module")
def systemd_pid1() -> None:
    skip_unless_systemd_guest()


@pytest.fixture(scope="module")
def installed(systemd_pid1: None, containerd_socket: str) -> Iterator[str]:
    """This tree's proxy units in the guest's systemd, started; yields the CRI socket path."""
    names = [name for name in (SOCKET_UNIT, SERVICE) if (REPO / "systemd" / name).exists()]
    units = {name: _render((REPO / "systemd" / name).read_text(), containerd_socket) for name in names}
    for name, text in units.items():
        (UNIT_DIR / name).write_text(text)
    try:
        assert systemctl("daemon-reload").returncode == 0
        for name in names:
            started = systemctl("start", name, timeout=START_TIMEOUT_S + 60)
            assert started.returncode == 0, f"{name}: {started.stderr}\n{_journal()}"
        yield _listen_path(units)
    finally:
        systemctl("stop", *names)
        for name in names:
            (UNIT_DIR / name).unlink(missing_ok=True)
        systemctl("daemon-reload")
        systemctl("reset-failed", *names)


def _sandbox(name: str) -> cri.PodSandboxConfig:
    """A pod sandbox's config, in kubelet's systemd slice where the guest's containerd uses the systemd driver."""
    sandbox = sandbox_config(name)
    if os.environ.get("KPY_CGROUP_DRIVER") == "systemd":
        sandbox.linux.cgroup_parent = f"kubepods-besteffort-pod{sandbox.metadata.uid.replace('-', '_')}.slice"
    return sandbox


@pytest.fixture(scope="module")
def pods(containerd_socket: str) -> Iterator[PodFactory]:
    """Pods made on containerd directly, removed at the end."""
    client = CriClient(containerd_socket)
    factory = PodFactory(client)
    try:
        yield factory
    finally:
        factory.cleanup()
        client.close()


@pytest.fixture(scope="module")
def sandbox_id(pods: PodFactory) -> str:
    """One pod sandbox for PodSandboxStatus."""
    return pods.run_pod(_sandbox("restart"), timeout=START_TIMEOUT_S)


# Ten restarts of a Python process in an emulated guest: about 4 min unloaded (each new process imports the proxy
# in 8-10 s, the first ones more), past the suite's 300 s default on a busy host.
@pytest.mark.timeout(600)
@pytest.mark.alone  # each restart's import time decides whether a call waits past its deadline: not beside the host
def test_ten_systemctl_restarts_fail_no_kubelet_call(
        installed: str, sandbox_id: str, pods: PodFactory, record_property: Callable[[str, object], None]) -> None:
    socket_path = installed
    loop = CallLoop(socket_path, sandbox_id).start()
    subscriber = EventSubscriber(loop.client).start()  # Evented PLEG's subscription, on kubelet's one connection
    restart_s: list[float] = []
    ended_after_s: list[float] = []  # from each restart command to the end of the subscription it met
    try:
        assert loop.wait_served(CALLS_BETWEEN_RESTARTS, START_TIMEOUT_S), _journal()
        # containerd's events reach the subscription: it is open end to end
        assert subscriber.provoke(lambda: pods.run_pod(_sandbox("evented"), timeout=START_TIMEOUT_S), 1,
                                  START_TIMEOUT_S, every_s=5.0), subscriber.ends
        inode = os.stat(socket_path).st_ino
        for _ in range(RESTARTS):
            before = main_pid(SERVICE)
            started = time.monotonic()
            done = systemctl("restart", SERVICE, timeout=START_TIMEOUT_S + 60)
            restart_s.append(time.monotonic() - started)
            assert done.returncode == 0, f"{done.stderr}\n{_journal()}"
            assert wait_for(lambda old=before: main_pid(SERVICE) not in (0, old), START_TIMEOUT_S), \
                "no new proxy process"
            ends = [end for end in subscriber.ends if end.at >= started]
            assert ends and (ends[0].code, ends[0].details) == ("UNAVAILABLE", DRAIN_END), subscriber.ends[-3:]
            ended_after_s.append(ends[0].at - started)
            # the new process serves before the next restart
            assert loop.wait_served(CALLS_BETWEEN_RESTARTS, START_TIMEOUT_S), _journal()
    finally:
        subscriber.stop()
        figures = loop.stop()
    same_socket = os.path.exists(socket_path) and os.stat(socket_path).st_ino == inode
    result = {"restarts": len(restart_s), "calls": figures.calls, "failed": figures.failed,
              "longest_wait_ms": round(figures.longest_wait_s * 1000),
              "longest_gap_ms": round(figures.longest_gap_s * 1000),
              "restart_ms": [round(s * 1000) for s in restart_s], "same_socket_inode": same_socket,
              "subscription_ended_after_ms": [round(s * 1000) for s in ended_after_s],
              "subscriptions": subscriber.subscriptions, "failures": list(figures.failures)}
    for key, value in result.items():
        record_property(key, value)
    out = os.environ.get("KPY_V2_OUT")
    if out:
        Path(out, "proxy_restart.json").write_text(json.dumps(result, indent=1) + "\n")
    print(f"proxy restart under systemd: {json.dumps(result)}")
    assert figures.failed == 0, f"{figures.line()}\n{_journal()}"
    # The listening socket is systemd's, the same one across every restart: no process ever unlinked it.
    assert same_socket
    # Each stop ended the subscription at its start: before the unit's drain timeout (10 s) was even over, which is
    # when a drain that waited for it would have ended it (the restart command's own time in the guest included).
    assert max(ended_after_s) < DRAIN_TIMEOUT_S, result
