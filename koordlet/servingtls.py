"""The certificate ``-addr`` serves HTTPS with (``-tls-cert-file``, ``-tls-private-key-file``), read again when it
changes.

The intended files are the node's kubelet serving certificate: ``/var/lib/kubelet/pki/kubelet.crt`` and
``kubelet.key`` (self-signed by kubelet), or ``kubelet-server-current.pem`` (certificate and key in one file, a
symlink kubelet moves to each rotated certificate when ``serverTLSBootstrap`` is on). Each accepted connection
checks the two files (their inode, size and change time, through the symlink); when they changed, the pair is
loaded again and new connections get it. A pair that does not load (kubelet between its two writes) leaves the
last good one in use and is logged once.
"""

from __future__ import annotations

import logging
import os
import ssl
import threading

logger = logging.getLogger(__name__)

HANDSHAKE_TIMEOUT_S = 10.0  # a client that stalls in the handshake holds one request thread this long at most


def _stamp(path: str) -> tuple[int, int, int, int]:
    st = os.stat(path)
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


class ServingCertificate:
    """An SSL server context over ``cert_file`` and ``key_file``; raises ``ssl.SSLError``/``OSError`` at
    construction when the pair does not load (koordlet does not start on a certificate it cannot serve)."""

    def __init__(self, cert_file: str, key_file: str) -> None:
        self.cert_file, self.key_file = cert_file, key_file
        self._lock = threading.Lock()
        self._stamps = (_stamp(cert_file), _stamp(key_file))
        self._context = self._load()
        self._refused: tuple[object, ...] | None = None  # the stamps of a pair that did not load (logged once)
        self.loads = 1

    def _load(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2  # as Go's servers (kubelet's too) since Go 1.22
        context.load_cert_chain(self.cert_file, self.key_file)
        return context

    def context(self) -> ssl.SSLContext:
        """The context for a new connection: the files' current pair, or the last good one."""
        with self._lock:
            try:
                stamps = (_stamp(self.cert_file), _stamp(self.key_file))
            except OSError as err:
                self._refuse(("missing", str(err)), f"cannot read it: {err}")
                return self._context
            if stamps != self._stamps and stamps != self._refused:
                try:
                    self._context = self._load()
                except (OSError, ssl.SSLError) as err:
                    self._refuse(stamps, str(err))
                else:
                    self._stamps, self._refused = stamps, None
                    self.loads += 1
                    logger.info("serving certificate %s loaded again (it changed)", self.cert_file)
            return self._context

    def _refuse(self, stamps: tuple[object, ...], why: str) -> None:
        if stamps != self._refused:
            logger.warning("serving certificate %s / %s changed but does not load (%s); serving the previous one",
                           self.cert_file, self.key_file, why)
            self._refused = stamps
