"""Who may read ``/events`` and ``/debug/*``: a caller the API server authorizes, as kubelet decides for its API.

With an API server, a request must carry ``Authorization: Bearer <token>``. koordlet asks the API server who the
token belongs to (a ``TokenReview``), then whether that user may ``get`` the ``proxy`` subresource of this node
(a ``SubjectAccessReview`` on ``nodes/proxy``, name = the node). That is kubelet's mapping for every path of its API
that is not ``/stats``, ``/metrics``, ``/logs`` or ``/spec`` (Kubernetes docs, "Kubelet authentication/
authorization"; the verb is the HTTP method's: GET is ``get``), so a role that may read a node's kubelet API may
read koordlet's debug endpoints, and nothing less may. Answers: 401 without a token or with one the API server does
not know, 403 when the user is not allowed, 503 when the API server cannot be asked (closed: nothing is served).

Decisions are cached by the token's digest (kubelet's webhook defaults: an allowed answer 2 minutes, a refused one
30 seconds), at most :data:`CACHE_SIZE` tokens.

Without an API server (``-local-mode``) there is nobody to ask: the endpoints answer only requests from the
loopback address.
"""

from __future__ import annotations

import hashlib
import ipaddress
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import urllib3
from kubernetes.client.exceptions import ApiException

from koordlet.kubeapi import AuthV1, section
from koordlet.metrics import Reply, Request

logger = logging.getLogger(__name__)

ALLOWED_TTL_S = 120.0
DENIED_TTL_S = 30.0
CACHE_SIZE = 1024
REQUEST_TIMEOUT_S = 5.0
RESOURCE, SUBRESOURCE, VERB = "nodes", "proxy", "get"


@dataclass(frozen=True, slots=True)
class Decision:
    status: int  # 200 allowed, else the refusal's status
    message: str
    user: str = ""


def loopback_only(request: Request) -> Reply | None:
    """The guard of local mode: requests from a loopback address pass, every other one is refused (403)."""
    try:
        if ipaddress.ip_address(request.client.split("%")[0]).is_loopback:
            return None
    except ValueError:
        pass
    return Reply.text(403, f"{request.path} answers only on the loopback address in local mode")


def _bearer(request: Request) -> str:
    scheme, _, token = (request.headers.get("Authorization") or "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


class ApiAuthorizer:
    """The guard with an API server: TokenReview, then SubjectAccessReview on ``nodes/proxy`` of ``node_name``."""

    def __init__(self, auth_api: AuthV1, node_name: str, clock: Callable[[], float] = time.monotonic) -> None:
        self._api = auth_api
        self._node_name = node_name
        self._clock = clock
        self._cache: OrderedDict[str, tuple[float, Decision]] = OrderedDict()
        self._lock = threading.Lock()
        self.reviews = 0  # TokenReviews sent (the cache saves the rest)

    def __call__(self, request: Request) -> Reply | None:
        token = _bearer(request)
        if not token:
            return Reply.text(401, f"{request.path} needs a bearer token (Authorization: Bearer <token>) of a user "
                                   f"allowed to get nodes/proxy of {self._node_name}")
        decision = self.decide(token)
        if decision.status == 200:
            return None
        return Reply.text(decision.status, decision.message)

    def decide(self, token: str) -> Decision:
        key = hashlib.sha256(token.encode()).hexdigest()
        now = self._clock()
        with self._lock:
            cached = self._cache.get(key)
            if cached is not None and cached[0] > now:
                return cached[1]
        decision = self._review(token)
        if decision.status == 503:
            return decision  # not cached: the next request asks again
        ttl = ALLOWED_TTL_S if decision.status == 200 else DENIED_TTL_S
        with self._lock:
            self._cache[key] = (now + ttl, decision)
            self._cache.move_to_end(key)
            while len(self._cache) > CACHE_SIZE:
                self._cache.popitem(last=False)
        return decision

    def _review(self, token: str) -> Decision:
        self.reviews += 1
        try:
            review = self._api.create_token_review(
                {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": token}},
                _request_timeout=REQUEST_TIMEOUT_S)
            status = section(review, "status")
            if not status.get("authenticated"):
                return Decision(401, "the API server does not know this token" +
                                (f": {status['error']}" if status.get("error") else ""))
            user = section(status, "user")
            username = str(user.get("username") or "")
            spec = {"user": username, "uid": str(user.get("uid") or ""), "groups": list(user.get("groups") or []),
                    "extra": dict(user.get("extra") or {}),
                    "resourceAttributes": {"verb": VERB, "group": "", "version": "v1", "resource": RESOURCE,
                                           "subresource": SUBRESOURCE, "name": self._node_name}}
            access = self._api.create_subject_access_review(
                {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": spec},
                _request_timeout=REQUEST_TIMEOUT_S)
        except (ApiException, urllib3.exceptions.HTTPError, ValueError) as err:
            logger.warning("cannot check a debug request's token with the API server: %s", err)
            return Decision(503, f"cannot check authorization with the API server: {str(err)[:200]}")
        allowed = section(access, "status")
        if allowed.get("allowed") and not allowed.get("denied"):
            return Decision(200, "allowed", username)
        reason = str(allowed.get("reason") or "")
        return Decision(403, f'user "{username}" cannot {VERB} resource "{RESOURCE}/{SUBRESOURCE}" of node '
                             f'"{self._node_name}"' + (f": {reason}" if reason else ""), username)
