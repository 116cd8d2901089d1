"""Unix-socket hygiene both servers share: the proxy's CRI socket, koordlet's hook server and device
plugin sockets. Before binding, ``prepare_socket``; after binding, ``chmod_socket``; on stop,
``remove_socket``."""

from __future__ import annotations

import errno
import logging
import os
import socket
import stat

log = logging.getLogger(__name__)

SOCKET_MODE = 0o660  # root and the socket's group (kubelet, the proxy); nobody else


class SocketPathError(Exception):
    """The socket path cannot be taken; the message says why, for the operator."""


def prepare_socket(path: str) -> None:
    """Make the socket's directory; refuse a live socket, remove a stale one."""
    os.makedirs(os.path.dirname(path) or ".", mode=0o755, exist_ok=True)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise SocketPathError(f"{path} exists and is not a socket; refusing to replace it")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(1.0)
    try:
        probe.connect(path)
    except OSError as err:
        if err.errno not in (errno.ECONNREFUSED, errno.ENOENT):
            raise SocketPathError(f"cannot check existing socket {path}: {err}") from err
        log.info("removing stale socket %s", path)
        os.unlink(path)
    else:
        raise SocketPathError(f"another process is serving {path}; refusing to start over it")
    finally:
        probe.close()


def chmod_socket(path: str) -> None:
    """Give a freshly bound socket its mode (the bind leaves it to the umask)."""
    os.chmod(path, SOCKET_MODE)


def remove_socket(path: str) -> None:
    """Remove our socket if it is there (on stop, or a leftover of ours before binding again)."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
