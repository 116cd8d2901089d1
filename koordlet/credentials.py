"""koordlet's own service-account token outside a pod (bare metal), kept fresh by koordlet itself.

In a pod, kubelet projects a bound, expiring token and renews it; the kubernetes package's in-cluster configuration
reads it again. On bare metal nobody does: `scripts/install-baremetal.sh --admin-kubeconfig` asks the TokenRequest API
once for a token of koordlet's own service account, bound to the Node and expiring, writes it to a file and a
kubeconfig whose user names that file (``tokenFile``), and koordlet takes it from there:

- :class:`TokenFile` is the token provider both clients ask before every request: the API client (the package's
  ``refresh_api_key_hook``) and, when ``-kubelet-token-file`` names the same file, the kubelet pod source
  (:func:`token_source`). It reads the file again whenever it changed, so every request carries the current token;
- when a token of a service account has lived :data:`RENEW_AT` of its life, the provider asks the TokenRequest API
  (:meth:`koordlet.kubeapi.CoreV1.create_namespaced_service_account_token`) for the next one: the same account,
  audiences, lifetime and bound object (the Node), and writes it to the file (a new file renamed over the old one),
  where the kubelet pod source (``-kubelet-token-file``, read at every request) finds it too. The right to do so is
  its own account's only (deploy/baremetal/: ``create serviceaccounts/token`` with ``resourceNames`` its name).

No thread: the renewal runs in the request that finds the token due, one renewal at a time, and the request that
renews goes out with the token still valid. koordlet asks kubelet for its pods every ``-kubelet-sync-interval`` (10 s),
so a due token is renewed within seconds, whatever the API calls. A refused or failed renewal is logged (a 401/403
also goes to koordlet/access.py, naming the rule) and tried again at the first request :data:`RETRY_S` later, while
the old token lasts.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from koordlet.kubeapi import CoreV1

logger = logging.getLogger(__name__)

RENEW_AT = 0.8  # of a token's life (iat to exp): kubelet renews a projected token at the same point
RETRY_S = 30.0  # between renewal attempts that failed
_ATTRIBUTE = "_koordlet_token_file"  # where an ApiClient carries its TokenFile (see token_source)


@dataclass(frozen=True, slots=True)
class ServiceAccountClaims:
    """What a service-account token says of itself (its JWT claims; the signature is the API server's to check)."""

    namespace: str
    name: str
    audiences: tuple[str, ...]
    issued_at: float
    expires_at: float
    bound_kind: str = ""  # "Node" or "Pod": the object the token dies with
    bound_name: str = ""
    bound_uid: str = ""

    @property
    def lifetime_s(self) -> int:
        return int(self.expires_at - self.issued_at)

    def renew_after(self) -> float:
        return self.issued_at + RENEW_AT * (self.expires_at - self.issued_at)

    def token_request(self) -> dict[str, Any]:
        """The TokenRequest for the next token: the same audiences, lifetime and bound object."""
        spec: dict[str, Any] = {"audiences": list(self.audiences), "expirationSeconds": self.lifetime_s}
        if self.bound_kind:
            spec["boundObjectRef"] = {"kind": self.bound_kind, "apiVersion": "v1", "name": self.bound_name,
                                      **({"uid": self.bound_uid} if self.bound_uid else {})}
        return {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec}


def claims_of(token: str) -> ServiceAccountClaims | None:
    """The claims of a service-account JWT; None for any other token (a static one, a cloud provider's...)."""
    parts = token.split(".")
    if len(parts) != 3:
        return None
    try:
        claims = json.loads(base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4)))
        private = claims["kubernetes.io"]
        account = private["serviceaccount"]
        audiences = claims.get("aud") or ()
        bound = next(((kind, private[kind.lower()]) for kind in ("Node", "Pod") if kind.lower() in private), None)
        return ServiceAccountClaims(
            str(private["namespace"]), str(account["name"]),
            (audiences,) if isinstance(audiences, str) else tuple(str(a) for a in audiences),
            float(claims["iat"]), float(claims["exp"]),
            *((bound[0], str(bound[1].get("name", "")), str(bound[1].get("uid", ""))) if bound else ()))
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


def token_file_of(kubeconfig: str) -> Path | None:
    """The ``tokenFile`` of the kubeconfig's current user (relative to the kubeconfig's dir), if it names one."""
    try:
        config = yaml.safe_load(Path(kubeconfig).read_text()) or {}
        context_name = config.get("current-context")
        context = next(c["context"] for c in config.get("contexts") or () if c.get("name") == context_name)
        user = next(u.get("user") or {} for u in config.get("users") or () if u.get("name") == context.get("user"))
    except (OSError, yaml.YAMLError, StopIteration, AttributeError, TypeError, KeyError):
        return None
    path = user.get("tokenFile") if isinstance(user, dict) and not user.get("token") else None
    return (Path(kubeconfig).parent / path) if isinstance(path, str) and path else None


Renew = Callable[[ServiceAccountClaims], str]  # asks the TokenRequest API, returns the new token


class TokenFile:
    """The bearer token of an API client: the file's content, read again when it changes, renewed when due."""

    def __init__(self, path: Path, renew: Renew | None = None, clock: Callable[[], float] = time.time) -> None:
        self.path = path
        self._renew = renew
        self._clock = clock
        self._lock = threading.RLock()
        self._stat: tuple[int, int, int] | None = None
        self._token = ""
        self._claims: ServiceAccountClaims | None = None
        self._renewing = False
        self._next_try = 0.0
        self.renewals = 0  # tokens this process wrote

    def token(self) -> str:
        """The current token, renewed first when it is due (and this is not the renewing request itself)."""
        with self._lock:
            self._read()
            claims = self._claims
            if (self._renew is None or claims is None or self._renewing or self._clock() < claims.renew_after()
                    or self._clock() < self._next_try):
                return self._token
            self._renewing = True
        try:
            self._renew_now(claims)
        finally:
            with self._lock:
                self._renewing = False
        with self._lock:
            return self._token

    @property
    def claims(self) -> ServiceAccountClaims | None:
        """What the current token says of itself (None: not a service account's)."""
        with self._lock:
            return self._claims

    def _read(self) -> None:
        try:
            stat = self.path.stat()
        except OSError as err:
            if self._stat is not None:
                logger.warning("service-account token %s unreadable (%s): requests keep the last one", self.path, err)
                self._stat = None
            return
        key = (stat.st_ino, stat.st_mtime_ns, stat.st_size)
        if key == self._stat:
            return
        token = self.path.read_text().strip()
        self._stat, self._token, self._claims = key, token, claims_of(token)

    def _renew_now(self, claims: ServiceAccountClaims) -> None:
        assert self._renew is not None
        account = f"{claims.namespace}/{claims.name}"
        try:
            token = self._renew(claims)
        except Exception as err:  # any failure: the old token serves until it expires; the next request tries again
            with self._lock:
                self._next_try = self._clock() + RETRY_S
            left = claims.expires_at - self._clock()
            logger.error("renewing the token of service account %s failed (%s); the current one expires in %.0f s, "
                         "trying again in %.0f s (deploy/baremetal/ grants create serviceaccounts/token for it)",
                         account, err, left, RETRY_S)
            return
        _write_private(self.path, token + "\n")
        with self._lock:
            self._stat = None
            self._read()
            self.renewals += 1
            new = self._claims
        logger.info("renewed the token of service account %s: valid until %s", account,
                    time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(new.expires_at)) if new else "?")

    def refresh_hook(self, configuration: Any) -> None:
        """The kubernetes package's ``Configuration.refresh_api_key_hook``: the token for the next request."""
        token = self.token()
        if token:
            configuration.api_key["BearerToken"] = token
            configuration.api_key_prefix["BearerToken"] = "Bearer"


def _write_private(path: Path, text: str) -> None:
    """``text`` as ``path`` (mode 0600), written to a new file in the same dir and renamed over the old one, so a
    reader sees the old token or the new one, never half of one."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as out:
            out.write(text)
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def attach(api_client: Any, kubeconfig: str, clock: Callable[[], float] = time.time) -> TokenFile | None:
    """Make ``api_client`` (built from ``kubeconfig``) take its token from the kubeconfig's ``tokenFile`` at every
    request, renewing a service account's token through the TokenRequest API. None when the kubeconfig names no
    token file (a client certificate, an inline token, an exec plugin: the package's own handling stays).
    ``clock``: Unix seconds, what a token's life is measured by (the API server's clock, near enough)."""
    path = token_file_of(kubeconfig)
    if path is None:
        return None
    core = CoreV1(api_client)

    def renew(claims: ServiceAccountClaims) -> str:
        answer = core.create_namespaced_service_account_token(claims.name, claims.namespace, claims.token_request(),
                                                              _request_timeout=30)
        return str(answer["status"]["token"])

    provider = TokenFile(path, renew, clock)
    api_client.configuration.refresh_api_key_hook = provider.refresh_hook
    setattr(api_client, _ATTRIBUTE, provider)
    provider.refresh_hook(api_client.configuration)
    claims = provider.claims
    if claims is not None:
        logger.info("API credential: service account %s/%s from %s, renewed from %s on", claims.namespace,
                    claims.name, path, time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(claims.renew_after())))
    return provider


def token_source(api_client: Any, token_file: str) -> Callable[[], str] | None:
    """What kubelet's pod source asks for its bearer token: the API client's provider when ``token_file`` is the
    provider's file (the installer's ``-kubelet-token-file``), so that a pod sync renews a due token too; None
    otherwise (the pod source reads its file itself)."""
    provider: TokenFile | None = getattr(api_client, _ATTRIBUTE, None)
    if provider is None or not token_file or Path(token_file).resolve() != provider.path.resolve():
        return None
    return provider.token
