"""The two systemd service protocols a daemon speaks without libsystemd: socket activation (sd_listen_fds(3))
and readiness notification (sd_notify(3)).

Socket activation: systemd opens the listening socket, keeps it across restarts of the service, and passes it
to each process it starts as fd 3 onwards, with ``LISTEN_PID`` (the process the fds are for), ``LISTEN_FDS``
(how many) and ``LISTEN_FDNAMES`` (their ``FileDescriptorName=``, ':'-separated). The fds are taken only when
``LISTEN_PID`` is this process, and the variables are removed either way, so that a child never takes them
for its own (sd_listen_fds with ``unset_environment``).

Notification: a datagram of ``KEY=VALUE`` lines to the unix socket named by ``NOTIFY_SOCKET`` (a path, or an
abstract name written with a leading ``@``). The variable is read once and removed from the environment; a
process started without it (the demo, the tests) sends nothing.
"""

from __future__ import annotations

import logging
import os
import socket
import stat
from collections.abc import MutableMapping
from dataclasses import dataclass

log = logging.getLogger(__name__)

LISTEN_FDS_START = 3  # SD_LISTEN_FDS_START
_SEND_TIMEOUT_S = 0.5


@dataclass(frozen=True, slots=True)
class ListenFd:
    fd: int
    name: str  # FileDescriptorName= of the socket unit (systemd's default: the socket unit's name)


def listen_fds(environ: MutableMapping[str, str] | None = None) -> list[ListenFd]:
    """The fds systemd passed to this process (none when it was not socket-activated), marked close-on-exec.
    ``LISTEN_PID``, ``LISTEN_FDS`` and ``LISTEN_FDNAMES`` are removed from ``environ`` (default: os.environ)."""
    env = os.environ if environ is None else environ
    pid, count, names = env.pop("LISTEN_PID", ""), env.pop("LISTEN_FDS", ""), env.pop("LISTEN_FDNAMES", "")
    if not pid or not count:
        return []
    try:
        if int(pid) != os.getpid():
            log.info("LISTEN_PID=%s is not this process (%d): the fds are not ours", pid, os.getpid())
            return []
        n = int(count)
    except ValueError:
        log.warning("ignoring malformed LISTEN_PID=%r LISTEN_FDS=%r", pid, count)
        return []
    labels = names.split(":") if names else []
    fds = []
    for i in range(max(n, 0)):
        fd = LISTEN_FDS_START + i
        os.set_inheritable(fd, False)
        fds.append(ListenFd(fd, labels[i] if i < len(labels) else "unknown"))
    return fds


def listening_unix_socket(fd: ListenFd) -> socket.socket:
    """The passed fd as a socket object; ValueError unless it is a listening AF_UNIX stream socket."""
    if not stat.S_ISSOCK(os.fstat(fd.fd).st_mode):
        raise ValueError(f"fd {fd.fd} ({fd.name}) is not a socket")
    sock = socket.socket(fileno=fd.fd)
    if sock.family != socket.AF_UNIX or sock.type != socket.SOCK_STREAM:
        sock.detach()
        raise ValueError(f"fd {fd.fd} ({fd.name}) is not a unix stream socket")
    if not sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
        sock.detach()
        raise ValueError(f"fd {fd.fd} ({fd.name}) is not listening")
    return sock


class Notifier:
    """sd_notify: ``send("READY=1", "STATUS=...")``. Without ``NOTIFY_SOCKET`` it does nothing."""

    def __init__(self, environ: MutableMapping[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        address = env.pop("NOTIFY_SOCKET", "")
        self.address: str | bytes | None = None
        if address.startswith("@"):
            self.address = b"\0" + address[1:].encode()
        elif address.startswith("/"):
            self.address = address
        elif address:
            log.warning("NOTIFY_SOCKET=%r is neither a path nor an abstract socket: not notifying", address)

    @property
    def enabled(self) -> bool:
        return self.address is not None

    def send(self, *fields: str) -> bool:
        """Send the fields as one message; False (logged) when it could not be sent."""
        if self.address is None:
            return False
        message = "\n".join(fields).encode()
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            # A datagram waits for room in the receiver's queue; a service manager that does not read it must
            # not stall the caller's event loop for longer than this.
            sock.settimeout(_SEND_TIMEOUT_S)
            try:
                sock.sendto(message, self.address)
            except OSError as err:
                log.warning("could not notify systemd (%s): %s", fields[0] if fields else "", err)
                return False
        return True
