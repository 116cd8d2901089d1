"""The rule of the parallel host stage: scripts/test-all.sh runs the host suite with pytest-xdist, a worker per
core, and each worker is a test session of its own (its own containerd, run dir and cgroup root, named by its pid:
tests/support/containerd.py). What a worker cannot have to itself is node state with a fixed name. A test that
touches some says so with a marker (registered in pyproject.toml):

- ``serial``: it writes a fixed host path (SHARED_PATHS: koordlet's and the proxy's host dirs, kubelet's, NRI's
  socket, systemd's unit dirs, /proc/sys, the demo's dirs, the image build's out/image), binds a fixed port
  (FIXED_PORTS) or starts a program that does. The tests marked ``serial`` run one after another in a pytest
  session of their own (``-m serial``), beside the parallel session that runs the rest.
- ``alone``: it measures how much CPU a process gets or needs idle cores (a burner's share, suppression that has
  something to show only when LS burning moves the node's use). It runs in the last pass of the host stage, with
  no other test and no VM of the test command beside it.

The check: while a test runs (fixtures included), an audit hook (``sys.addaudithook``) watches this process's file
writes, socket binds and the command lines it starts. A test not marked ``serial`` that writes under a shared path,
binds a fixed port, or starts a program whose command line names a shared path (or a koordlet or a proxy given a
fixed port, or left on its default socket, port or hook dir) fails with what it touched. Off in the v2 guests, which
run one test at a time.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# Fixed host paths a node's agents (or one test of this run and another) would both write. /var/run is /run.
SHARED_PATHS = (
    "/run/koordlet",  # koordlet's hook socket, checkpoints, pod-resources proxy (the DaemonSet's hostPath)
    "/etc/runtime/hookserver.d",  # the proxy's hook registrations
    "/run/koord-runtimeproxy", "/var/lib/koord-runtimeproxy",  # the proxy's default socket and store
    "/run/nri",  # containerd's NRI socket
    "/var/lib/kubelet", "/run/containerd", "/etc/containerd",
    "/etc/systemd/system", "/run/systemd/system", "/etc/default/kubelet", "/etc/sysconfig/kubelet",
    "/opt/koordlet-py", "/usr/local/vgpu", "/var/log/koordlet",
    "/proc/sys",  # sysctls are the whole node's
    "/run/koordlet-py/demo", "/var/lib/koordlet-py/demo",  # `make demo`'s fixed dirs
    str(REPO / "out" / "image"),  # scripts/build-image.sh's context and archive
)
# Ports with a fixed number: koordlet's -addr, pprof, the proxy's metrics, kubelet's, an API server's, Prometheus'.
FIXED_PORTS = frozenset({9316, 9317, 9318, 10250, 10255, 6443, 9090})
SHARED_HOSTS = frozenset({"", "0.0.0.0", "::", "127.0.0.1", "localhost", "::1"})  # noqa: S104 (addresses judged)
SHARED_SCRIPTS = ("scripts/build-image.sh",)  # writes out/image
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
_PATH_EVENTS = {"os.mkdir": 0, "os.remove": 0, "os.rmdir": 0, "os.rename": 1, "os.symlink": 1, "os.link": 1,
                "shutil.rmtree": 0, "os.truncate": 0}
_EVENTS = frozenset({"open", "socket.bind", "subprocess.Popen", *_PATH_EVENTS})


def normal_path(path: object) -> str | None:
    """``path`` absolute, with /var/run as /run; None for what is no path."""
    if isinstance(path, bytes):
        path = os.fsdecode(path)
    elif isinstance(path, os.PathLike):
        path = os.fspath(path)
    if not isinstance(path, str) or not path:
        return None
    path = os.path.abspath(path)
    return "/run" + path[len("/var/run"):] if path == "/var/run" or path.startswith("/var/run/") else path


def written_by_open(args: tuple) -> object | None:
    """The path an ``open`` audit event (path, mode, flags) opens for writing; None for a read."""
    path, mode, flags = args
    writes = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
        mode is None and isinstance(flags, int) and flags & _WRITE_FLAGS)
    return path if writes else None


def shared_path(path: object) -> str | None:
    """``path`` when it lies under one of SHARED_PATHS, else None."""
    normal = normal_path(path)
    if normal is None:
        return None
    for shared in SHARED_PATHS:
        if normal == shared or normal.startswith(shared + "/"):
            return normal
    # A file at the top of a cgroup v1 hierarchy (its cpu.shares, its tasks) is the whole node's.
    if re.fullmatch(r"/sys/fs/cgroup/[^/]+/[^/]+", normal) and "." in normal.rsplit("/", 1)[1]:
        return normal
    return None


# The flags through which koordlet and the proxy take a socket, a port or a host dir, each with the default it has
# when not given (koordlet/config.py, runtimeproxy/main.py).
KOORDLET_FLAGS = {"addr": ":9316", "runtime-hooks-addr": "/var/run/koordlet/koordlet.sock",
                  "runtime-hooks-config-path": "/etc/runtime/hookserver.d"}
PROXY_FLAGS = {"koord-runtimeproxy-endpoint": "/var/run/koord-runtimeproxy/runtimeproxy.sock",
               "metrics-bind-address": "127.0.0.1:9318", "runtime-hook-config-dir": "/etc/runtime/hookserver.d"}
_NOT_A_SERVER = frozenset({"-h", "-help", "--help", "explain", "version", "-version"})


def _flags(argv: Sequence[str]) -> dict[str, str]:
    """Go's and argparse's ``-name=value``, ``--name value``: the last one given wins, as with both parsers."""
    given: dict[str, str] = {}
    for i, arg in enumerate(argv):
        if not arg.startswith("-") or arg == "-m":
            continue
        name, eq, value = arg.lstrip("-").partition("=")
        if not eq and i + 1 < len(argv) and not argv[i + 1].startswith("-"):
            value = argv[i + 1]
        given[name] = value
    return given


def fixed_port(host: str, port: int) -> bool:
    """A port of FIXED_PORTS on an address every test could bind (a test's own loopback address, such as
    127.61.4.9, is its own; a TEST-NET one never binds)."""
    return port in FIXED_PORTS and host.strip("[]") in SHARED_HOSTS


def _judge(what: str, value: str) -> list[str]:
    if value.startswith("/") and shared_path(value):
        return [f"{what} {value}"]
    host, colon, port = value.rpartition(":")
    if colon and port.isdigit() and fixed_port(host, int(port)):
        return [f"{what} {value} (a fixed port)"]
    return []


def touched_by_command(argv: Sequence[str]) -> list[str]:
    """The shared node state a program started with ``argv`` takes: a koordlet or a proxy by the sockets, ports
    and dirs it is given or left on by default; any other program by the shared paths its command line names."""
    koordlet = {"koordlet.main", "demo.fake_gpu_koordlet"} & set(argv) or argv[:1] and argv[0].endswith("/koordlet")
    server = ({"koordlet": KOORDLET_FLAGS} if koordlet
              else {"the proxy": PROXY_FLAGS} if "runtimeproxy.main" in argv else {})
    if server:
        if _NOT_A_SERVER & set(argv):
            return []
        (name, defaults), = server.items()
        given = _flags(argv)
        return [hit for flag, default in defaults.items()
                for hit in _judge(f"{name}'s -{flag}" + ("" if flag in given else " (its default)"),
                                  given.get(flag, default))]
    if argv and os.path.basename(argv[0]) == "helm" and "template" in argv:
        return []  # renders manifests offline: a host path in a value is text for the pod spec, never opened here
    found = []
    for arg in argv:
        found.extend(f"its command line names {part}" for part in re.split(r"[=,:\s]", arg)
                     if part.startswith("/") and shared_path(part))
        if any(arg.endswith(script) for script in SHARED_SCRIPTS):
            found.append(f"it runs {arg}")
    return found


class _Watch:
    """What the running test touched, gathered by the audit hook (any thread of this process)."""

    def __init__(self) -> None:
        self.touched: list[str] | None = None  # None: no test is running

    def hook(self, event: str, args: tuple) -> None:
        if event not in _EVENTS or self.touched is None:
            return
        try:
            self._see(event, args)
        except Exception:  # noqa: BLE001 (an audit hook must never break the operation it watches)
            return

    def _see(self, event: str, args: tuple) -> None:
        assert self.touched is not None
        if event == "open":
            written = written_by_open(args)
            if written is not None and (hit := shared_path(written)):
                self.touched.append(f"wrote {hit}")
        elif event == "socket.bind":
            address = args[1]
            if isinstance(address, tuple) and len(address) >= 2 and fixed_port(str(address[0]), address[1]):
                self.touched.append(f"bound port {address[1]}")
            elif (hit := shared_path(address)) is not None:
                self.touched.append(f"bound {hit}")
        elif event == "subprocess.Popen":
            argv = args[1]
            argv = [argv] if isinstance(argv, (str, bytes)) else list(argv or ())
            argv = [os.fsdecode(a) if isinstance(a, bytes) else str(a) for a in argv]
            self.touched.extend(f"started {' '.join(argv)[:160]}: {what}" for what in touched_by_command(argv))
        else:
            path = args[_PATH_EVENTS[event]]
            if (hit := shared_path(path)) is not None:
                self.touched.append(f"{event} {hit}")


_WATCH = _Watch()


def _checking(config: pytest.Config) -> bool:
    return os.environ.get("KPY_V2_GUEST") != "1" and not config.getoption("collectonly")


def pytest_configure(config: pytest.Config) -> None:
    if _checking(config):
        sys.addaudithook(_WATCH.hook)  # stays for the process's life; idle (touched is None) between tests


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    # A test of the last pass (``alone``) has nothing beside it either.
    exempt = item.get_closest_marker("serial") or item.get_closest_marker("alone")
    _WATCH.touched = None if exempt else []
    try:
        yield
    finally:
        _WATCH.touched = None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    # What setup and the test touched fails the test itself; what only its teardown touched fails the teardown.
    if call.when == "setup" or not _WATCH.touched:
        return
    touched = sorted(set(_WATCH.touched))
    _WATCH.touched = []
    report.outcome = "failed"
    report.longrepr = ("touches node state other tests of a parallel run share, without @pytest.mark.serial "
                       "(tests/support/nodestate.py, docs/testing.md):\n  " + "\n  ".join(touched))
