"""A process in which the kernel refuses IPv6 sockets, as a kernel without IPv6 does.

A kernel built without IPv6, or booted with ``ipv6.disable=1``, answers ``socket(AF_INET6, ...)`` with
EAFNOSUPPORT. This host's kernel has IPv6, and a network namespace with IPv6 switched off by sysctl still creates
AF_INET6 sockets, so :func:`refuse_ipv6_sockets` installs a seccomp filter in the calling process that makes the
kernel give that same answer to exactly that call, and to no other. It cannot be undone: call it in a child
process only (:func:`run_without_ipv6`).
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import socket
import struct
import subprocess
import sys
from pathlib import Path

_PR_SET_NO_NEW_PRIVS, _PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 38, 22, 2
_RET_ALLOW, _RET_ERRNO = 0x7FFF0000, 0x00050000
_LD_ABS_W, _JEQ_K, _RET_K = 0x20, 0x15, 0x06
# seccomp_data: nr (u32) at 0, arch (u32) at 4, args[0] (u64, its low half first on these little-endian arches) at 16
_ARCHES = {"x86_64": (0xC000003E, 41), "aarch64": (0xC00000B7, 198)}  # AUDIT_ARCH_*, __NR_socket

ROOT = Path(__file__).resolve().parents[2]


def supported() -> bool:
    return platform.machine() in _ARCHES


def refuse_ipv6_sockets() -> None:
    """From now on ``socket(AF_INET6, ...)`` fails with EAFNOSUPPORT in this process and its children."""
    arch, socket_nr = _ARCHES[platform.machine()]
    program = [
        (_LD_ABS_W, 0, 0, 4), (_JEQ_K, 0, 5, arch),
        (_LD_ABS_W, 0, 0, 0), (_JEQ_K, 0, 3, socket_nr),
        (_LD_ABS_W, 0, 0, 16), (_JEQ_K, 0, 1, socket.AF_INET6),
        (_RET_K, 0, 0, _RET_ERRNO | errno.EAFNOSUPPORT),
        (_RET_K, 0, 0, _RET_ALLOW),
    ]
    filters = ctypes.create_string_buffer(b"".join(struct.pack("HBBI", *insn) for insn in program))

    class _Program(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    prog = _Program(len(program), ctypes.cast(filters, ctypes.c_void_p))
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 or \
            libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "seccomp filter refused")
    try:
        socket.socket(socket.AF_INET6, socket.SOCK_STREAM).close()
    except OSError as err:
        if err.errno == errno.EAFNOSUPPORT:
            return
        raise
    raise RuntimeError("the seccomp filter let an AF_INET6 socket through")


def run_without_ipv6(code: str, timeout_s: float = 60.0) -> subprocess.CompletedProcess[str]:
    """``python -c code`` in a child whose kernel refuses IPv6 sockets (the repository on its import path)."""
    script = f"from tests.support.noipv6 import refuse_ipv6_sockets\nrefuse_ipv6_sockets()\n{code}"
    return subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout_s, env={**os.environ, "PYTHONPATH": str(ROOT)})
