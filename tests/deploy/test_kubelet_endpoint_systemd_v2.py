"""What a kubelet started by real systemd reads after the installer pointed it at the proxy, and after uninstall.

Runs in the v2 stage's systemd guest only (systemd 252 as PID 1, scripts/v2-systemd-init.sh; no containerd, no pods),
and there on request only: not in ``make test``, whose stage budget one case's ten minutes of emulation do not fit
(``V2_DRIVERS=systemd make v2-check PYTEST_ARGS=tests/deploy/test_kubelet_endpoint_systemd_v2.py``; docs/testing.md).
kubelet is laid out as kubeadm's packages lay it out (tests/support/kubeadmnode.py: kubelet.service,
10-kubeadm.conf, the deb's empty /etc/default/kubelet, /var/lib/kubelet/config.yaml and kubeadm-flags.env) at the
guest's real paths, the package's unit in /run/systemd/system (/usr/lib/systemd/system is the host's, read-only
here; the installer's drop-in goes to /etc/systemd/system/kubelet.service.d as on a node). Its binary is the
stand-in kubelet (``python -m tests.support.kubeadmnode``, this checkout's interpreter and PYTHONPATH), which
resolves the endpoint of the command line systemd gave it with kubelet's precedence and reports it.

kubeadm 1.27 and later (config.yaml's ``containerRuntimeEndpoint``): ``systemctl start kubelet`` -> containerd's
endpoint; the real installer (``--proxy-only --no-venv``, no --root) changes exactly that line, and after ``systemctl
restart kubelet`` the stand-in reports the proxy's endpoint; the real uninstaller (``--purge``) restarts kubelet
itself, which then reports containerd's endpoint again, every file of the layout is byte for byte what it was and
/etc/systemd/system holds what it held before the install. Each case's seconds and the scripts' output go to
``$KPY_V2_OUT/kubelet_endpoint_<case>.txt`` (one case costs ~10 min of the emulated guest on a loaded host).

kubeadm before 1.27 (the flag in kubeadm-flags.env, so the installer's flag in /etc/default/kubelet's
``KUBELET_EXTRA_ARGS``) with the installer's ``--restart-kubelet``: the installer restarts kubelet by systemd and sees
``koord_runtimeproxy_calls_served_total`` grow (the stand-in's ``Version`` and ``ListPodSandbox`` through the proxy);
that file is the one change, and uninstall puts ``KUBELET_EXTRA_ARGS=`` back (one guest run, 2026-12-08: 1 passed,
guest 178 s, install 38 s, uninstall 44 s; ``-k before`` selects it).

So that the installer's proxy starts as on a node, two stand-ins of the test's: the runtime behind the proxy is a
gRPC server on containerd's socket answering every call (tests/support/fakeruntime.py: the proxy probes ``Version``
at start and kubelet calls it; what it answers is not under test), and ``/opt/koordlet-py/current`` (the version
``--no-venv`` leaves to someone else) is a prefix under /run whose ``bin/koord-runtime-proxy`` runs this checkout's
proxy. The proxy's unit gets one drop-in of the test's (in /run): ``ProtectHome=read-only``, since the test's
interpreter may live under /root (a pyenv build), which the shipped ``ProtectHome=yes`` hides (and
``PrivateTmp=no`` when the checkout is under /tmp).

The module refuses to run where kubelet or the proxy is already laid out, and removes what it made.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.support.fakeruntime import FakeRuntime
from tests.support.kubeadmnode import CONTAINERD_ENDPOINT, KubeadmLayout
from tests.support.v2guest import journal, main_pid, paths_under, remove_path, skip_unless_systemd_guest, systemctl
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.cgroupv2]

REPO = Path(__file__).resolve().parents[2]
INSTALL = REPO / "scripts" / "install-baremetal.sh"
UNINSTALL = REPO / "scripts" / "uninstall.sh"
PROXY = "unix:///var/run/koord-runtimeproxy/runtimeproxy.sock"
KUBELET = "kubelet.service"
PROXY_UNITS = ("koord-runtime-proxy.service", "koord-runtime-proxy.socket")
# Where the package's unit goes here (the guest's /usr is the host's, read-only): below /etc, like /usr/lib.
UNIT_DIR = "/run/systemd/system"
WORK = Path("/run/kpy-kubelet-endpoint")  # the test's own: the report, the proxy's prefix
PREFIX = WORK / "koordlet-py"
REPORT = WORK / "kubelet.json"
RUNTIME_DIR = Path("/run/containerd")
PROXY_DROP_IN = Path("/run/systemd/system/koord-runtime-proxy.service.d/50-kpy-test.conf")
# kubelet's files on a node (any of them there: a real kubelet, which this module must not touch), and what the
# installer writes besides (any of them there: an installed proxy).
KUBELET_PATHS = ("/etc/systemd/system/kubelet.service", "/etc/systemd/system/kubelet.service.d",
                 "/run/systemd/system/kubelet.service", "/run/systemd/system/kubelet.service.d",
                 "/usr/lib/systemd/system/kubelet.service", "/lib/systemd/system/kubelet.service",
                 "/etc/default/kubelet", "/etc/sysconfig/kubelet", "/var/lib/kubelet", "/etc/kubernetes")
PROXY_PATHS = ("/etc/systemd/system/koord-runtime-proxy.service", "/etc/systemd/system/koord-runtime-proxy.socket",
               "/etc/default/koord-runtime-proxy", "/var/lib/koord-runtimeproxy", "/run/koord-runtimeproxy",
               str(RUNTIME_DIR), str(WORK), str(PROXY_DROP_IN.parent))
# What the installer and the guest's systemd may make besides (removed at the end when they were not there before).
MADE_PATHS = ("/etc/runtime", "/etc/systemd/system/kubelet.service.wants", "/etc/systemd/system/sockets.target.wants",
              "/etc/systemd/system/sockets.target.wants/koord-runtime-proxy.socket",
              "/etc/systemd/system/multi-user.target.wants/koord-runtime-proxy.service")
START_TIMEOUT_S = 180.0  # a Python process in the emulated guest: ~10 s to import, more on a loaded host
SCRIPT_TIMEOUT_S = 600



def _journal() -> str:
    return journal((KUBELET, *PROXY_UNITS), 40)


@pytest.fixture(scope="module")
def systemd_pid1() -> None:
    skip_unless_systemd_guest()


@pytest.fixture(scope="module")
def node(systemd_pid1: None) -> Iterator[FakeRuntime]:
    """The guest as a node without kubelet or the proxy, but for containerd's socket (the test's runtime) and the
    prefix the proxy's unit runs; refuses to run on a node that has either, and removes what it made."""
    there = [path for path in (*KUBELET_PATHS, *PROXY_PATHS) if os.path.lexists(path)]
    load_state = systemctl("show", "-p", "LoadState", "--value", KUBELET).stdout.strip()
    if there or load_state not in ("not-found", ""):
        pytest.fail(f"refusing to run: kubelet or the proxy is laid out here already ({', '.join(there)}; "
                    f"{KUBELET}: {load_state}); this module lays out kubeadm's kubelet at the real paths")
    made_before = {path for path in MADE_PATHS if os.path.lexists(path)}
    RUNTIME_DIR.mkdir(mode=0o711)
    runtime = FakeRuntime(str(RUNTIME_DIR / "containerd.sock"))
    try:
        runtime.start()
        private_tmp = any(Path(p).resolve().is_relative_to(tmp) for p in (REPO, sys.executable)
                          for tmp in ("/tmp", "/var/tmp"))
        PROXY_DROP_IN.parent.mkdir(parents=True)
        PROXY_DROP_IN.write_text("# the test's interpreter may live under /root (tests/deploy/"
                                 "test_kubelet_endpoint_systemd_v2.py)\n[Service]\nProtectHome=read-only\n"
                                 + ("PrivateTmp=no\n" if private_tmp else ""))
        yield runtime
    finally:
        systemctl("stop", KUBELET, *PROXY_UNITS)
        runtime.stop()
        for path in (*KUBELET_PATHS, *PROXY_PATHS, *MADE_PATHS):
            if path not in made_before and os.path.lexists(path):
                remove_path(path)
        systemctl("daemon-reload")
        systemctl("reset-failed", KUBELET, *PROXY_UNITS)


def _proxy_version() -> None:
    """The version the proxy's unit runs (PREFIX/current, which ``--no-venv`` leaves to someone else and
    ``uninstall --purge`` removes): this checkout's proxy."""
    binary = PREFIX / "current" / "bin" / "koord-runtime-proxy"
    binary.parent.mkdir(parents=True, exist_ok=True)
    binary.write_text(f"#!/bin/sh\nPYTHONPATH={REPO} exec {sys.executable} -m runtimeproxy.main \"$@\"\n")
    binary.chmod(0o755)


def _layout(flag_in_kubeadm_args: bool) -> KubeadmLayout:
    binary = (f"/usr/bin/env PYTHONPATH={REPO} KUBELET_STANDIN_REPORT={REPORT} {sys.executable} "
              "-m tests.support.kubeadmnode")
    return KubeadmLayout(Path("/"), binary=binary, unit_dir=UNIT_DIR, flag_in_kubeadm_args=flag_in_kubeadm_args)


def _report(after_pid: int) -> dict[str, object]:
    """The stand-in's report of the kubelet process systemd runs now, a new one (not ``after_pid``)."""
    def fresh() -> dict[str, object] | None:
        pid = main_pid(KUBELET)
        try:
            report = json.loads(REPORT.read_text())
        except (OSError, ValueError):
            return None
        return report if pid not in (0, after_pid) and report["pid"] == pid else None

    report = wait_for(fresh, START_TIMEOUT_S, step_s=0.5)
    assert report, f"no report of a new kubelet (MainPID {main_pid(KUBELET)}, was {after_pid})\n{_journal()}"
    return report


def _script(script: Path, *args: str, **env: str) -> tuple[subprocess.CompletedProcess[str], float]:
    started = time.monotonic()
    done = subprocess.run(["bash", str(script), "--prefix", str(PREFIX), *args], capture_output=True, text=True,
                          timeout=SCRIPT_TIMEOUT_S, env={**os.environ, **env})
    return done, time.monotonic() - started


def _changed(layout: KubeadmLayout, before: dict[str, bytes]) -> dict[str, tuple[str, str]]:
    return {path: (before[path].decode(), now.decode()) for path, now in layout.contents().items()
            if now != before[path]}


@pytest.fixture
def kubelet(node: FakeRuntime, request: pytest.FixtureRequest) -> Iterator[tuple[KubeadmLayout, dict[str, bytes]]]:
    """kubeadm's kubelet (``request.param``: the flag in kubeadm-flags.env, before 1.27), started by systemd on
    containerd's endpoint; stopped and its files removed after."""
    _proxy_version()
    layout = _layout(request.param)
    before = layout.write()
    try:
        assert systemctl("daemon-reload").returncode == 0
        started = systemctl("start", KUBELET)
        assert started.returncode == 0, started.stderr
        report = _report(0)
        assert report["endpoint"] == CONTAINERD_ENDPOINT, report
        assert report["source"] == ("flag --container-runtime-endpoint" if request.param
                                    else "config /var/lib/kubelet/config.yaml"), report
        yield layout, before
    finally:
        systemctl("stop", KUBELET)
        REPORT.unlink(missing_ok=True)
        layout.remove()
        systemctl("daemon-reload")
        systemctl("reset-failed", KUBELET)


# (the flag in kubeadm-flags.env: kubeadm before 1.27, how kubelet is restarted onto the proxy)
CASES = [pytest.param(False, False, id="kubeadm-1.27-config-systemctl-restart"),
         pytest.param(True, True, id="kubeadm-before-1.27-flag-restart-kubelet")]
KUBELET_CHECK_TIMEOUT_S = 180  # the installer's 60 s, raised for a Python stand-in in an emulated guest


@pytest.mark.timeout(1500)
@pytest.mark.parametrize(("kubelet", "restart_kubelet"), CASES, indirect=["kubelet"])
def test_kubelet_restarted_by_systemd_dials_the_proxy_and_containerd_again_after_uninstall(
        kubelet: tuple[KubeadmLayout, dict[str, bytes]], restart_kubelet: bool,
        request: pytest.FixtureRequest, record_property: Callable[[str, object], None]) -> None:
    layout, before = kubelet
    took: dict[str, float] = {}
    unit_files = paths_under("/etc/systemd/system")
    pid = main_pid(KUBELET)
    if restart_kubelet:
        # what an operator runs: the installer restarts kubelet by systemd, then waits for its calls through the proxy
        done, took["install"] = _script(INSTALL, "--proxy-only", "--no-venv", "--restart-kubelet",
                                        KUBELET_CHECK_TIMEOUT=str(KUBELET_CHECK_TIMEOUT_S))
        assert done.returncode == 0, f"{done.stdout}\n{done.stderr}\n{_journal()}"
        assert "kubelet talks to the proxy:" in done.stdout, done.stdout
    else:
        done, took["install"] = _script(INSTALL, "--proxy-only", "--no-venv")
        assert done.returncode == 0, f"{done.stdout}\n{done.stderr}\n{_journal()}"
        assert "kubelet not restarted" in done.stdout
    # exactly one file changed: config.yaml's line (1.27 and later), or the flag appended to KUBELET_EXTRA_ARGS
    # in /etc/default/kubelet, after kubeadm-flags.env's (before 1.27)
    if layout.flag_in_kubeadm_args:
        assert _changed(layout, before) == {"/etc/default/kubelet": (
            "KUBELET_EXTRA_ARGS=\n", f'KUBELET_EXTRA_ARGS="--container-runtime-endpoint={PROXY}"\n')}
    else:
        config = before["/var/lib/kubelet/config.yaml"].decode()
        assert _changed(layout, before) == {"/var/lib/kubelet/config.yaml": (
            config, config.replace(CONTAINERD_ENDPOINT, PROXY))}

    started = time.monotonic()
    if not restart_kubelet:
        assert systemctl("restart", KUBELET).returncode == 0
    report = _report(pid)
    took["kubelet_on_proxy"] = time.monotonic() - started
    assert report["endpoint"] == PROXY, f"{report}\n{done.stdout}"
    assert report["source"] == ("flag --container-runtime-endpoint" if layout.flag_in_kubeadm_args
                                else "config /var/lib/kubelet/config.yaml"), report

    gone, took["uninstall"] = _script(UNINSTALL, "--purge")  # restarts kubelet on containerd, then stops the proxy
    assert gone.returncode == 0, f"{gone.stdout}\n{gone.stderr}\n{_journal()}"
    started = time.monotonic()
    report = _report(report["pid"])
    took["kubelet_on_containerd"] = time.monotonic() - started
    assert report["endpoint"] == CONTAINERD_ENDPOINT, f"{report}\n{gone.stdout}"
    assert layout.contents() == before, "uninstall puts back exactly what was there"
    left = paths_under("/etc/systemd/system") ^ unit_files
    assert left == set(), f"uninstall removes every unit file and dir the install made\n{gone.stdout}"
    assert not [path for path in ("/var/lib/koord-runtimeproxy", "/etc/default/koord-runtime-proxy")
                if os.path.lexists(path)]
    seconds = {key: round(value, 1) for key, value in took.items()}
    record_property("seconds", seconds)
    print(f"kubelet endpoint under systemd, seconds: {seconds}; {done.stdout}")
    if out := os.environ.get("KPY_V2_OUT"):
        Path(out, f"kubelet_endpoint_{request.node.callspec.id}.txt").write_text(
            f"{json.dumps(seconds)}\n--- install\n{done.stdout}--- uninstall\n{gone.stdout}")
