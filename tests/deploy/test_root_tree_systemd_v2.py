"""Bare metal with no Python on the node: the proxy and koordlet installed from the image's root tree
(``install-baremetal.sh --rootfs``) and started by real systemd, each running the tree's own Python inside the tree.

Runs in the v2 stage's systemd guest only (systemd 252 as PID 1, scripts/v2-systemd-init.sh), and there on request
only: not in ``make test``, whose stage budget the guest's minutes of emulation do not fit (``V2_DRIVERS=systemd
bash scripts/v2-stage.sh tests/deploy/test_root_tree_systemd_v2.py`` under the heavy lock; v2-stage.sh builds the
tree on the host first, as the guest has no network; docs/testing.md).

One story, each step with the real scripts and no --root: install the tree (``--local``), then the proxy answers CRI
``Version`` through its socket (a gRPC stand-in on containerd's socket answers behind it, tests/support/fakeruntime.py)
and koordlet's metrics endpoint answers; both services' processes have the tree as their root and the tree's
interpreter as their executable, and neither this test's interpreter nor any python3 of the guest's own is what their
PATH finds. A second version (the same tree in other bytes) takes over at install, ``--rollback`` puts the first back,
and ``uninstall.sh --purge`` leaves nothing of them. Each step's seconds and the scripts' output go to
``$KPY_V2_OUT/root_tree.txt``; a failed step shows the units' journal.

The guest's /opt is the host's, read-only: the prefix is the test's own under /var (an overlay there). The module
refuses to run where the proxy or koordlet is laid out already, and removes what it made.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import tomllib
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest

from tests.support.fakeruntime import FakeRuntime
from tests.support.v2guest import journal, main_pid, paths_under, remove_path, skip_unless_systemd_guest, systemctl
from tests.support.waiting import wait_for
from wire import cri_pb2 as cri

pytestmark = [pytest.mark.cgroupv2, pytest.mark.owns_node_paths]  # the real install owns them here

REPO = Path(__file__).resolve().parents[2]
INSTALL = REPO / "scripts" / "install-baremetal.sh"
UNINSTALL = REPO / "scripts" / "uninstall.sh"
VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
ROOTFS = REPO / "out" / "image" / f"koordlet-py-{VERSION}.rootfs.tar.gz"
WORK = Path("/var/lib/kpy-root-tree")  # the test's own: the prefix and the second version's tar
PREFIX = WORK / "koordlet-py"
PROXY, KOORDLET, SOCKET = "koord-runtime-proxy.service", "koordlet.service", "koord-runtime-proxy.socket"
UNITS = (PROXY, KOORDLET)
PROXY_SOCKET = "/run/koord-runtimeproxy/runtimeproxy.sock"
KOORDLET_METRICS = "http://127.0.0.1:9316/metrics"
RUNTIME_DIR = Path("/run/containerd")
# What the install and the services make (any of them there: an install this module must not touch).
INSTALLED_PATHS = ("/etc/systemd/system/koord-runtime-proxy.service", "/etc/systemd/system/koordlet.service",
                   "/etc/systemd/system/koord-runtime-proxy.socket",
                   "/etc/default/koord-runtime-proxy", "/etc/default/koordlet", "/var/lib/koord-runtimeproxy",
                   "/run/koordlet", "/run/koord-runtimeproxy", str(RUNTIME_DIR), str(WORK))
# koordlet's own directories: the guest's /var is the host's under an overlay, where a host-side test may have left
# them; uninstall --purge removes them all the same.
KOORDLET_DIRS = ("/var/lib/koordlet", "/var/log/koordlet", "/etc/koordlet")
MADE_PATHS = ("/etc/runtime", "/etc/systemd/system/kubelet.service.d", "/etc/systemd/system/kubelet.service.wants",
              "/etc/systemd/system/sockets.target.wants", "/etc/systemd/system/multi-user.target.wants",
              "/etc/systemd/system/sockets.target.wants/koord-runtime-proxy.socket",
              "/etc/systemd/system/multi-user.target.wants/koord-runtime-proxy.service",
              "/etc/systemd/system/multi-user.target.wants/koordlet.service")
START_TIMEOUT_S = 240.0  # the tree's Python importing koordlet in the emulated guest
SCRIPT_TIMEOUT_S = 900


def _why() -> str:
    status = systemctl("status", "--no-pager", "-l", SOCKET, *UNITS).stdout
    return f"--- systemctl status\n{status}\n--- journal\n{journal((SOCKET, *UNITS), 80)}"


@pytest.fixture(scope="module")
def node() -> Iterator[FakeRuntime]:
    """The guest as a node with nothing of koordlet-py, containerd's socket answered by the test's runtime."""
    skip_unless_systemd_guest()
    assert ROOTFS.is_file(), f"no {ROOTFS}: v2-stage.sh builds it (scripts/build-image.sh) when this module is named"
    there = [path for path in INSTALLED_PATHS if os.path.lexists(path)]
    if there:
        pytest.fail(f"refusing to run: koordlet-py is laid out here already ({', '.join(there)})")
    made_before = {path for path in (*KOORDLET_DIRS, *MADE_PATHS) if os.path.lexists(path)}
    RUNTIME_DIR.mkdir(mode=0o711)
    runtime = FakeRuntime(str(RUNTIME_DIR / "containerd.sock"))
    try:
        runtime.start()
        WORK.mkdir()
        yield runtime
    finally:
        systemctl("stop", *UNITS, SOCKET)
        runtime.stop()
        for path in (*INSTALLED_PATHS, *KOORDLET_DIRS, *MADE_PATHS):
            if path not in made_before and os.path.lexists(path):
                remove_path(path)
        for unit in ("koord-runtime-proxy.service.d", "koordlet.service.d"):
            remove_path(f"/etc/systemd/system/{unit}")
        systemctl("daemon-reload")
        systemctl("reset-failed", *UNITS, SOCKET)


def _script(script: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], float]:
    started = time.monotonic()
    done = subprocess.run(["bash", str(script), "--prefix", str(PREFIX), *args], capture_output=True, text=True,
                          timeout=SCRIPT_TIMEOUT_S)
    return done, time.monotonic() - started


def _cri_version() -> cri.VersionResponse:
    with grpc.insecure_channel(f"unix://{PROXY_SOCKET}") as channel:
        call = channel.unary_unary("/runtime.v1.RuntimeService/Version",
                                   request_serializer=cri.VersionRequest.SerializeToString,
                                   response_deserializer=cri.VersionResponse.FromString)
        return call(cri.VersionRequest(version="root-tree-test"), timeout=60)


def _koordlet_metrics() -> str:
    try:
        with urllib.request.urlopen(KOORDLET_METRICS, timeout=10) as answer:
            return answer.read().decode()
    except OSError:
        return ""


def _serving(runtime: FakeRuntime, version_dir: Path, pids_before: dict[str, int]) -> dict[str, int]:
    """The proxy forwards CRI Version to the runtime and koordlet's metrics answer; both services run new processes
    (not ``pids_before``) from ``version_dir``'s tree, with its Python and none of the guest's. Their main PIDs."""
    calls = len(runtime.received)
    assert _cri_version() is not None
    assert any(r.method.endswith("/Version") for r in runtime.received[calls:]), "the proxy did not forward Version"
    # koordlet is Type=simple: its start returns once systemd forked it, before the child entered the tree; its
    # metrics answering says it runs
    metrics = wait_for(_koordlet_metrics, START_TIMEOUT_S, step_s=1.0)
    assert "koordlet_start_time" in metrics, f"koordlet's metrics do not answer\n{_why()}"
    pids = {unit: main_pid(unit) for unit in UNITS}
    assert all(pid not in (0, pids_before.get(unit)) for unit, pid in pids.items()), (
        f"not new processes: {pids}, before {pids_before}\n{_why()}")
    tree = version_dir / "root"
    for unit, pid in pids.items():
        assert os.path.samefile(f"/proc/{pid}/root", tree), (
            f"{unit} ({pid}: {os.stat(f'/proc/{pid}/root')}) runs in no {tree} ({os.stat(tree)})\n{_why()}")
        exe = os.readlink(f"/proc/{pid}/exe")
        tree_python = tree / "usr" / "bin" / os.path.basename(exe)
        assert os.path.basename(exe).startswith("python3") and os.path.samefile(f"/proc/{pid}/exe", tree_python), (
            unit, exe)
        environ = dict(line.split("=", 1) for line in
                       Path(f"/proc/{pid}/environ").read_bytes().decode().split("\0") if "=" in line)
        # every python3 the service's PATH finds is the tree's; the guest's own interpreters are not reachable
        for directory in environ.get("PATH", "").split(":"):
            seen = f"/proc/{pid}/root{directory}/python3"
            if os.path.exists(seen):
                assert os.path.samefile(seen, tree_python), (unit, directory)
            host = f"{directory}/python3"
            assert not (os.path.exists(host) and os.path.exists(seen) and os.path.samefile(seen, host)), (unit, host)
        ours = os.path.realpath(sys.executable)
        seen_ours = f"/proc/{pid}/root{ours}"
        assert not (os.path.exists(seen_ours) and os.path.samefile(seen_ours, ours)), (unit, ours)
    assert systemctl("is-active", *UNITS).returncode == 0, _why()
    return pids


def _root_directories() -> set[str]:
    found = set()
    for unit in UNITS:
        text = Path(f"/etc/systemd/system/{unit}.d/50-root-tree.conf").read_text()
        found.update(line.split("=", 1)[1] for line in text.splitlines() if line.startswith("RootDirectory="))
    return found


@pytest.mark.timeout(2400)
def test_proxy_and_koordlet_run_the_trees_python_under_systemd_across_upgrade_rollback_and_purge(
        node: FakeRuntime, record_property: Callable[[str, object], None]) -> None:
    took: dict[str, float] = {}
    outputs: list[str] = []
    unit_files = paths_under("/etc/systemd/system")

    def step(name: str, script: Path, *args: str) -> None:
        done, took[name] = _script(script, *args)
        outputs.append(f"--- {name}: {' '.join(args)}\n{done.stdout}{done.stderr}")
        assert done.returncode == 0, f"{name}: {done.stdout}\n{done.stderr}\n{_why()}"

    try:
        step("install", INSTALL, "--rootfs", str(ROOTFS), "--local")
        first = Path(os.path.realpath(PREFIX / "current"))
        assert _root_directories() == {str(first / "root")}
        started = time.monotonic()
        pids = _serving(node, first, {})
        took["first_serving"] = time.monotonic() - started

        # a second version: the same tree in other bytes (an empty gzip member appended), so another version id
        second_tar = WORK / "second.rootfs.tar.gz"
        shutil.copyfile(ROOTFS, second_tar)
        with open(second_tar, "ab") as tar:
            tar.write(subprocess.run(["gzip", "-c"], input=b"", capture_output=True, check=True).stdout)
        step("upgrade", INSTALL, "--rootfs", str(second_tar))
        second = Path(os.path.realpath(PREFIX / "current"))
        assert second != first and _root_directories() == {str(second / "root")}
        pids = _serving(node, second, pids)

        step("rollback", INSTALL, "--rollback")
        assert Path(os.path.realpath(PREFIX / "current")) == first and _root_directories() == {str(first / "root")}
        _serving(node, first, pids)

        step("uninstall", UNINSTALL, "--purge")
    finally:
        seconds = {key: round(value, 1) for key, value in took.items()}
        record_property("seconds", seconds)
        print(f"root tree under systemd, seconds: {seconds}")
        if out := os.environ.get("KPY_V2_OUT"):
            Path(out, "root_tree.txt").write_text(f"{json.dumps(seconds)}\n" + "".join(outputs) + _why())
    for unit in (*UNITS, SOCKET):
        assert systemctl("show", "-p", "LoadState", "--value", unit).stdout.strip() == "not-found", unit
    assert not PREFIX.exists(), "uninstall --purge removes the versions"
    left = [path for path in (*INSTALLED_PATHS, *KOORDLET_DIRS)
            if os.path.lexists(path) and path not in (str(RUNTIME_DIR), str(WORK))]
    assert left == [], "uninstall --purge leaves nothing of the install"
    assert paths_under("/etc/systemd/system") ^ unit_files == set(), "every unit file and dir the install made is gone"
