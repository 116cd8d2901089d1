"""systemd's side of socket activation and sd_notify, for host tests (this machine has no systemd as PID 1; the v2
stage's systemd guest runs the proxy under the real one, tests/runtimeproxy/test_restart_systemd_v2.py).

:class:`SystemdStandIn` does what systemd does for ``koord-runtime-proxy.socket`` and its ``Type=notify``
service, as sd_listen_fds(3) and sd_notify(3) describe it: it binds and listens on the socket itself and keeps
it across processes; each process gets it as fd 3 with ``LISTEN_FDS=1``, ``LISTEN_FDNAMES`` and ``LISTEN_PID``
set to that process's own PID (bash exports its ``$$`` and execs the command, which keeps the PID), and a
``NOTIFY_SOCKET`` (an abstract datagram socket, as systemd's own) whose messages it collects.
"""

from __future__ import annotations

import os
import shlex
import socket
import threading
import time
from dataclasses import dataclass

from wire.sockets import SOCKET_MODE


@dataclass(frozen=True, slots=True)
class Notification:
    pid: int  # the sender, from the datagram's credentials (systemd checks it against the main PID)
    fields: dict[str, str]


class SystemdStandIn:
    def __init__(self, path: str, fd_name: str = "cri", listening: bool = True) -> None:
        """``listening=False``: pass a bound socket that does not listen (what a broken unit could pass)."""
        self.path = path
        self.fd_name = fd_name
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(path)
        os.chmod(path, SOCKET_MODE)
        if listening:
            self.listener.listen(1024)
        self.notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.notify.bind(f"\0kpy-notify-{os.getpid()}-{id(self)}")
        self.notify.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        self.notify.settimeout(0.1)
        self._received: list[Notification] = []
        self._lock = threading.Lock()
        self._closed = threading.Event()
        # read at once, as systemd does: a full queue would hold the sender
        self._reader = threading.Thread(target=self._read, name="notify-reader", daemon=True)
        self._reader.start()
        self.listen_pid: str | None = None  # None: the started process's own PID (a test may pass another)

    def fds(self) -> tuple[int, ...]:
        return (self.listener.fileno(),)

    def environment(self) -> dict[str, str]:
        address = self.notify.getsockname()
        name = address.decode() if isinstance(address, bytes) else address
        return {"LISTEN_FDS": "1", "LISTEN_FDNAMES": self.fd_name, "NOTIFY_SOCKET": "@" + name.lstrip("\0")}

    def exec_args(self, argv: list[str]) -> list[str]:
        """``argv`` run with the socket as fd 3 and LISTEN_PID its own PID."""
        fd = self.listener.fileno()
        moves = "" if fd == 3 else f" 3<&{fd} {fd}<&-"
        pid = shlex.quote(self.listen_pid) if self.listen_pid is not None else "$$"
        return ["bash", "-c", f'export LISTEN_PID={pid}; exec "$@"{moves}', "bash", *argv]

    def _read(self) -> None:
        while not self._closed.is_set():
            try:
                data, ancillary, _, _ = self.notify.recvmsg(4096, socket.CMSG_SPACE(12))
            except TimeoutError:
                continue
            except OSError:
                return  # closed
            pid = 0
            for level, kind, payload in ancillary:
                if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
                    pid = int.from_bytes(payload[:4], "little")
            fields = dict(line.split("=", 1) for line in data.decode().splitlines() if "=" in line)
            with self._lock:
                self._received.append(Notification(pid, fields))

    @property
    def received(self) -> list[Notification]:
        with self._lock:
            return list(self._received)

    def wait_for(self, key: str, value: str, timeout_s: float) -> Notification | None:
        """The first notification with ``key=value``, waiting up to ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while True:
            for note in self.received:
                if note.fields.get(key) == value:
                    return note
            if time.monotonic() > deadline:
                return None
            time.sleep(0.02)

    def close(self) -> None:
        self._closed.set()
        self._reader.join(5)
        self.listener.close()
        self.notify.close()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
