"""The certificates of the project's test control plane, made with the ``openssl`` CLI (the ``cryptography`` package
is no dependency of the project).

As kubeadm sets a cluster up, one CA signs everything: the API server's serving certificate, kubelet's, and every
client certificate (the admin's ``system:masters`` one, a node's ``system:node:<name>`` in ``system:nodes``), and
both servers trust it for clients (the API server's ``--client-ca-file``, kubelet's
``authentication.x509.clientCAFile``).
A client certificate names its user in CN and its groups in O, one O per group.

One CA serves a whole test process (made on first use in a private temporary directory, removed at exit): making
certificates is the slow part of a server's start, and no test needs two clusters that distrust each other.
Certificates are cached by what they say, so a second request for the same identity costs nothing.
"""

from __future__ import annotations

import atexit
import ipaddress
import shutil
import subprocess
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

_CURVE = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
_DAYS = "3"  # longer than any test run; a certificate's expiry is not what any test is about
SERVING_SANS = ("IP:127.0.0.1", "IP:::1", "DNS:localhost")


def serving_sans(host: str) -> tuple[str, ...]:
    """The names a server listening on ``host`` answers to: loopback, and ``host`` itself."""
    if host in ("", "0.0.0.0", "::", "127.0.0.1", "::1", "localhost"):
        return SERVING_SANS
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return (*SERVING_SANS, f"DNS:{host}")
    return (*SERVING_SANS, f"IP:{host}")


@dataclass(frozen=True, slots=True)
class KeyPair:
    """A certificate and its private key, as PEM files."""

    cert: Path
    key: Path


class PkiError(RuntimeError):
    """openssl is missing or refused to make a certificate."""


class ClusterCA:
    """A CA in ``directory`` and the certificates it issued, cached by subject (and SANs)."""

    def __init__(self, directory: Path) -> None:
        if shutil.which("openssl") is None:
            raise PkiError("the openssl CLI is not installed: the test control plane needs it for its certificates")
        self.directory = directory
        self.ca = KeyPair(directory / "ca.crt", directory / "ca.key")
        self._lock = threading.Lock()
        self._issued: dict[tuple[str, tuple[str, ...], tuple[str, ...], str], KeyPair] = {}
        self._openssl("req", "-x509", *_CURVE, "-subj", "/CN=kubernetes", "-days", _DAYS,
                      "-keyout", str(self.ca.key), "-out", str(self.ca.cert),
                      "-addext", "basicConstraints=critical,CA:TRUE",
                      "-addext", "keyUsage=critical,keyCertSign,cRLSign")

    def client(self, user: str, groups: tuple[str, ...] = ()) -> KeyPair:
        """A client certificate of ``user`` (CN) in ``groups`` (one O each)."""
        return self._issue(user, tuple(groups), (), "clientAuth")

    def serving(self, name: str, sans: tuple[str, ...] = SERVING_SANS) -> KeyPair:
        """A serving certificate of ``name`` for ``sans`` (``IP:...``/``DNS:...``)."""
        return self._issue(name, (), tuple(sans), "serverAuth")

    def _issue(self, common_name: str, organizations: tuple[str, ...], sans: tuple[str, ...], usage: str) -> KeyPair:
        key = (common_name, organizations, sans, usage)
        with self._lock:
            if key in self._issued:
                return self._issued[key]
            stem = self.directory / f"{usage}-{len(self._issued)}"
            pair = KeyPair(stem.with_suffix(".crt"), stem.with_suffix(".key"))
            subject = "".join(f"/O={_escaped(o)}" for o in organizations) + f"/CN={_escaped(common_name)}"
            extensions = ["-addext", "basicConstraints=critical,CA:FALSE",
                          "-addext", "keyUsage=critical,digitalSignature,keyEncipherment",
                          "-addext", f"extendedKeyUsage={usage}"]
            if sans:
                extensions += ["-addext", "subjectAltName=" + ",".join(sans)]
            self._openssl("req", "-x509", *_CURVE, "-subj", subject, "-days", _DAYS, "-CA", str(self.ca.cert),
                          "-CAkey", str(self.ca.key), "-keyout", str(pair.key), "-out", str(pair.cert), *extensions)
            self._issued[key] = pair
            return pair

    @staticmethod
    def _openssl(*args: str) -> None:
        done = subprocess.run(["openssl", *args], capture_output=True, text=True, timeout=30, check=False)
        if done.returncode != 0:
            raise PkiError(f"openssl {args[0]} failed: {done.stderr.strip()}")


def _escaped(value: str) -> str:
    """A value for openssl's ``-subj`` (``/`` and ``+`` separate fields there)."""
    return value.replace("\\", "\\\\").replace("/", "\\/").replace("+", "\\+")


_CA: ClusterCA | None = None
_CA_LOCK = threading.Lock()


def cluster_ca() -> ClusterCA:
    """The test process's CA, made on first use."""
    global _CA
    with _CA_LOCK:
        if _CA is None:
            directory = Path(tempfile.mkdtemp(prefix="koordlet-py-pki-"))
            atexit.register(shutil.rmtree, directory, True)
            _CA = ClusterCA(directory)
        return _CA


def subject_fields(peer_cert: dict) -> tuple[str, tuple[str, ...]]:
    """(CN, every O) of a certificate as ``ssl.SSLSocket.getpeercert()`` gives it."""
    common_name, organizations = "", []
    for rdn in peer_cert.get("subject", ()):
        for field_name, value in rdn:
            if field_name == "commonName":
                common_name = value
            elif field_name == "organizationName":
                organizations.append(value)
    return common_name, tuple(organizations)
