"""The parallel host stage's rule (tests/support/nodestate.py): a test that touches node state with a fixed name
without ``@pytest.mark.serial`` fails, saying what it touched; marked, it may."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.support.nodestate import REPO, shared_path, touched_by_command

# Each touch is attempted and refused by the kernel or caught (procfs has no such file, the port may be taken): the
# audit hook sees the attempt, and nothing of the node changes.
SAMPLE = '''
import socket, subprocess
import pytest

def touch_a_sysctl():
    try:
        open("/proc/sys/kpy-nodestate-probe", "w")
    except OSError:
        pass

def bind_a_fixed_port():  # 9317, Go's pprof port: koordlet-py serves nothing there
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", 9317))
        except OSError:
            pass

def test_writes_a_sysctl():
    touch_a_sysctl()

def test_binds_a_fixed_port():
    bind_a_fixed_port()

def test_starts_a_program_on_the_hook_dir():
    subprocess.run(["true", "-runtime-hooks-config-path=/etc/runtime/hookserver.d"], check=True)

def test_starts_a_koordlet_on_its_default_port():
    subprocess.run(["true", "-m", "koordlet.main", "-local-mode", "-runtime-hooks-addr=/tmp/x.sock",
                    "-runtime-hooks-config-path=/tmp/hooks"], check=True)

def test_keeps_to_its_own_paths(tmp_path):
    (tmp_path / "f").write_text("x")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))

@pytest.mark.serial
def test_marked_may_touch_them():
    touch_a_sysctl()
    bind_a_fixed_port()

'''


def _run(tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """The sample module under pytest with the rule's plugin."""
    (tmp_path / "test_sample.py").write_text(SAMPLE)
    env = {**os.environ, "PYTHONPATH": str(REPO), "KPY_V2_GUEST": "0"}
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "tests.support.nodestate",
                           "-o", "markers=serial", "-rA", "test_sample.py"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)


def test_a_test_touching_shared_node_state_without_the_serial_marker_fails_and_says_what(tmp_path: Path) -> None:
    done = _run(tmp_path)
    out = done.stdout
    assert done.returncode == 1, out
    assert "4 failed, 2 passed" in out, out
    assert "FAILED test_sample.py::test_writes_a_sysctl" in out and "wrote /proc/sys/kpy-nodestate-probe" in out, out
    assert "bound port 9317" in out, out
    assert "names /etc/runtime/hookserver.d" in out, out
    assert "koordlet's -addr (its default) :9316 (a fixed port)" in out, out
    for clean in ("test_keeps_to_its_own_paths", "test_marked_may_touch_them"):
        assert f"PASSED test_sample.py::{clean}" in out, out


def test_the_shared_paths_are_matched_by_component_and_var_run_is_run() -> None:
    assert shared_path("/var/run/koordlet/koordlet.sock") == "/run/koordlet/koordlet.sock"
    assert shared_path("/run/koordlet-py/test-42/containerd/containerd.sock") is None  # a session's own dir
    assert shared_path("/run/koordlet-py/demo/containerd") == "/run/koordlet-py/demo/containerd"
    assert shared_path("/sys/fs/cgroup/cpu/cpu.shares") == "/sys/fs/cgroup/cpu/cpu.shares"
    assert shared_path("/sys/fs/cgroup/cpu/koordlet-py-test-42") is None  # a session's cgroup root
    assert shared_path(str(REPO / "out" / "image" / "context")) is not None
    assert shared_path("/tmp/pytest-of-root/x/etc/runtime/hookserver.d") is None


def test_a_command_line_is_judged_by_what_it_names() -> None:
    proxy = [sys.executable, "-m", "runtimeproxy.main", "--koord-runtimeproxy-endpoint", "/tmp/p.sock",
             "--metrics-bind-address", "127.0.0.1:40001", "--runtime-hook-config-dir", "/tmp/hooks"]
    assert touched_by_command(proxy) == []
    assert touched_by_command(proxy[:3]) == [
        "the proxy's -koord-runtimeproxy-endpoint (its default) /var/run/koord-runtimeproxy/runtimeproxy.sock",
        "the proxy's -metrics-bind-address (its default) 127.0.0.1:9318 (a fixed port)",
        "the proxy's -runtime-hook-config-dir (its default) /etc/runtime/hookserver.d"]
    # Koordinator's chart's arguments first, the test's own after them: the last one given is the one used.
    koordlet = [sys.executable, "-m", "koordlet.main", "-addr=0.0.0.0:9316",
                "-runtime-hooks-addr=/var/run/koordlet/koordlet.sock", "-runtime-hooks-config-path=/tmp/hooks",
                "-local-mode", "-addr=127.0.0.1:40002", "-runtime-hooks-addr", "/tmp/k.sock"]
    assert touched_by_command(koordlet) == []
    assert touched_by_command(koordlet[:6]) == [
        "koordlet's -addr 0.0.0.0:9316 (a fixed port)",
        "koordlet's -runtime-hooks-addr /var/run/koordlet/koordlet.sock"]
    assert touched_by_command([sys.executable, "-m", "koordlet.main", "explain", "ns/pod"]) == []
    assert touched_by_command(["curl", "http://127.0.0.1:9316/metrics"]) == []
    # a test's own loopback address, or one this node lacks: nobody else's port
    assert touched_by_command([*proxy[:6], "127.61.4.9:9318", *proxy[7:]]) == []
    assert touched_by_command([*proxy[:6], "192.0.2.1:9318", *proxy[7:]]) == []
    assert touched_by_command([*proxy[:6], "[::]:9318", *proxy[7:]]) == [
        "the proxy's -metrics-bind-address [::]:9318 (a fixed port)"]
    assert touched_by_command(["ctr", "--address", "/run/containerd/containerd.sock", "version"]) == [
        "its command line names /run/containerd/containerd.sock"]
    assert touched_by_command(["/x/.tools/bin/helm", "template", "r", "chart", "--set",
                               "koordlet.tls.certFile=/var/lib/kubelet/pki/kubelet.crt"]) == []
    assert touched_by_command(["helm", "install", "r", "chart", "--set", "hostDir=/var/run/koordlet"]) == [
        "its command line names /var/run/koordlet"]
    assert touched_by_command(["bash", str(REPO / "scripts/build-image.sh")]) == [
        f"it runs {REPO / 'scripts/build-image.sh'}"]
