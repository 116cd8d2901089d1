"""Start and stop a real koord-runtime-proxy process for tests and benchmarks."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from .containerd import REPO
from .sdactivation import SystemdStandIn


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_until_accepting(family: int, address: str | tuple[str, int], what: str, timeout_s: float,
                          proc: subprocess.Popen | None) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before {what} answered")
        with socket.socket(family) as s:
            try:
                s.connect(address)
                return
            except OSError:
                pass
        time.sleep(0.02)
    raise TimeoutError(f"{what} did not come up within {timeout_s} s")


def wait_for_socket(path: str, timeout_s: float, proc: subprocess.Popen | None = None) -> None:
    """Until something accepts on the unix socket ``path``."""
    _wait_until_accepting(socket.AF_UNIX, path, path, timeout_s, proc)


def wait_for_port(port: int, timeout_s: float, proc: subprocess.Popen | None = None, host: str = "127.0.0.1") -> None:
    """Until something accepts on ``host``:``port``."""
    _wait_until_accepting(socket.AF_INET, (host, port), f"{host}:{port}", timeout_s, proc)


class ProxyProcess:
    """koord-runtime-proxy in a child process, stopped by PID."""

    def __init__(self, listen: str, backend: str, *extra: str, log_path: str | None = None,
                 state_dir: str | None = None, tree: str | None = None,
                 systemd: SystemdStandIn | None = None, metrics_address: tuple[str, int] | None = None) -> None:
        """``systemd``: start it as systemd starts the unit (its socket passed, its notifications read).
        ``metrics_address``: (IPv4 host, port) of its metrics endpoint; a free port on 127.0.0.1 by default."""
        self.listen = listen
        self.systemd = systemd
        self.tree = tree or str(REPO)  # the source tree the proxy runs from (another one: before/after figures)
        self.backend = backend
        self.metrics_host, self.metrics_port = metrics_address or ("127.0.0.1", free_port())
        # Registrations and the store checkpoint live next to the socket, never in /etc or /var/lib.
        state = state_dir or os.path.dirname(listen)
        self.hook_dir = os.path.join(state, "hookserver.d")
        self.checkpoint = os.path.join(state, "store.json")
        self.args = [
            sys.executable, "-m", "runtimeproxy.main",
            "--koord-runtimeproxy-endpoint", listen,
            "--remote-runtime-service-endpoint", backend,
            "--metrics-bind-address", f"{self.metrics_host}:{self.metrics_port}",
            "--runtime-hook-config-dir", self.hook_dir,
            "--store-checkpoint-path", self.checkpoint,
            *extra,
        ]
        self.log_path = log_path or f"{listen}.log"
        self.proc: subprocess.Popen | None = None

    def start(self, wait: bool = True, timeout_s: float = 15) -> ProxyProcess:
        """Start it; with ``wait``, until its socket and metrics port answer (killed again if they do not in
        ``timeout_s``)."""
        log = open(self.log_path, "ab")
        args, env, fds = self.args, {**os.environ, "PYTHONPATH": self.tree}, ()
        if self.systemd is not None:
            args, env, fds = self.systemd.exec_args(args), {**env, **self.systemd.environment()}, self.systemd.fds()
        self.proc = subprocess.Popen(args, cwd=self.tree, env=env, stdout=log, stderr=subprocess.STDOUT,
                                     pass_fds=fds)
        log.close()
        if wait:
            try:
                # The CRI socket is up before the metrics endpoint: a test that reads metrics first must not race it.
                wait_for_socket(self.listen, timeout_s, self.proc)
                wait_for_port(self.metrics_port, timeout_s, self.proc, self.metrics_host)
            except (TimeoutError, RuntimeError) as exc:
                self.kill()
                raise RuntimeError(f"{exc}; proxy log:\n{self.log()[-2000:]}") from exc
        return self

    def log(self) -> str:
        return Path(self.log_path).read_text(errors="replace") if os.path.exists(self.log_path) else ""

    def terminate(self, timeout_s: float = 15) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait(5)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)

    def __enter__(self) -> ProxyProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.terminate()
