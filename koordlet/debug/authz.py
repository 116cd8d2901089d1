"""Who may read ``/events`` and ``/debug/*``: a caller the API server authorizes, as kubelet decides for its API.

With an API server, a request must carry ``Authorization: Bearer <token>``. koordlet asks the API server who the
token belongs to (a ``TokenReview``), then whether that user may ``get`` the ``proxy`` subresource of this node
(a ``SubjectAccessReview`` on ``nodes/proxy``, name = the node). That is kubelet's mapping for every path of its API
that is not ``/stats``, ``/metrics``, ``/logs`` or ``/spec`` (Kubernetes docs, "Kubelet authentication/
authorization"; the verb is the HTTP method's: GET is ``get``), so a role that may read a node's kubelet API may
read koordlet's debug endpoints, and nothing less may. Answers: 401 without a token or with one the API server does
not know, 403 when the user is not allowed, 503 when the API server cannot be asked (closed: nothing is served),
429 when too many unknown tokens arrive at once.

What a caller learns is the decision, never the API server's words: a 401 or 503 goes to callers nobody has
authenticated, so its body is a fixed reason, and the API server's error (which may name koordlet's own service
account and the rules it lacks) goes to the log.

Decisions are cached by the token's digest. kubelet caches a TokenReview for 2 minutes
(``--authentication-token-webhook-cache-ttl``) and a SubjectAccessReview for 5 minutes when allowed and 30 seconds
when not (``--authorization-webhook-cache-authorized-ttl`` / ``-unauthorized-ttl``); a decision here rests on both,
so an allowed one is kept 2 minutes (the shorter) and a refused one 30 seconds. An API server that could not answer
(503, 429, unreachable, or koordlet's API budget holding the review back) is remembered for
:data:`UNAVAILABLE_TTL_S`, so a caller retrying at once does not send another review.

At fleet scale (and against a caller who floods a node with tokens):

- the caches are LRU, allowed decisions apart from refused ones, so a flood of refused tokens never pushes an
  allowed user's decision out;
- concurrent requests with one token send one review; the others wait for its answer;
- at most :data:`MAX_IN_FLIGHT` reviews are out at once (each holds a request thread for up to
  :data:`REQUEST_TIMEOUT_S`); more get 503;
- a token the cache has never seen allowed may start a review only within a token bucket
  (:data:`UNKNOWN_PER_S` a second, :data:`UNKNOWN_BURST` at once); more get 429. A token allowed before is known,
  and its review when the decision expires is not held back.

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

from koordlet.kubeapi import AuthV1, Throttled, section
from koordlet.kubeclient.budget import is_pushback
from koordlet.metrics import Reply, Request

logger = logging.getLogger(__name__)

ALLOWED_TTL_S = 120.0
DENIED_TTL_S = 30.0
UNAVAILABLE_TTL_S = 5.0
CACHE_SIZE = 1024  # each of the allowed and the refused LRU
MAX_IN_FLIGHT = 4
UNKNOWN_PER_S = 2.0
UNKNOWN_BURST = 10
REQUEST_TIMEOUT_S = 5.0
RESOURCE, SUBRESOURCE, VERB = "nodes", "proxy", "get"

UNAUTHENTICATED = "the API server did not authenticate this bearer token"
UNAVAILABLE = "cannot check authorization with the API server now; try again later"
BUSY = "too many authorization checks in flight; try again later"
TOO_MANY_TOKENS = "too many new bearer tokens; try again later"


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


class _Flight:
    """One review in flight and the requests waiting for it."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.decision = Decision(503, UNAVAILABLE)


class ApiAuthorizer:
    """The guard with an API server: TokenReview, then SubjectAccessReview on ``nodes/proxy`` of ``node_name``."""

    def __init__(self, auth_api: AuthV1, node_name: str, clock: Callable[[], float] = time.monotonic) -> None:
        self._api = auth_api
        self._node_name = node_name
        self._clock = clock
        self._allowed: OrderedDict[str, tuple[float, Decision]] = OrderedDict()  # kept after expiry: a known token
        self._refused: OrderedDict[str, tuple[float, Decision]] = OrderedDict()
        self._flights: dict[str, _Flight] = {}
        self._lock = threading.Lock()
        self._tokens = float(UNKNOWN_BURST)
        self._refilled_at = clock()
        self.reviews = 0  # TokenReviews sent (the cache saves the rest)
        self.held_back = 0  # requests answered 429 or 503 without a review

    def __call__(self, request: Request) -> Reply | None:
        token = _bearer(request)
        if not token:
            return Reply.text(401, f"{request.path} needs a bearer token (Authorization: Bearer <token>) of a user "
                                   f"allowed to get nodes/proxy of {self._node_name}")
        decision = self.decide(token)
        if decision.status == 200:
            return None
        status = 503 if decision.status == 500 else decision.status  # the API server failed: not the caller's fault
        reply = Reply.text(status, decision.message)
        if status in (429, 503):
            return Reply(reply.status, reply.content_type, reply.body, {"Retry-After": "1"})
        return reply

    def decide(self, token: str) -> Decision:
        key = hashlib.sha256(token.encode()).hexdigest()
        with self._lock:
            now = self._clock()
            cached = self._cached(key, now)
            if cached is not None:
                return cached
            flight = self._flights.get(key)
            leader = flight is None
            if leader:
                refusal = self._admit(key, now)
                if refusal is not None:
                    self.held_back += 1
                    return refusal
                flight = self._flights[key] = _Flight()
        if not leader:
            flight.done.wait(REQUEST_TIMEOUT_S * 2)  # the leader's review is bounded by its request timeouts
            return flight.decision
        decision = flight.decision  # 503 unless the review answers
        try:
            decision = self._review(token)
        finally:
            with self._lock:
                self._flights.pop(key, None)
                self._remember(key, decision, self._clock())
            flight.decision = decision
            flight.done.set()
        return decision

    # ------------------------------------------------------------------------------------ the caches

    def _cached(self, key: str, now: float) -> Decision | None:
        for table in (self._allowed, self._refused):
            entry = table.get(key)
            if entry is not None and entry[0] > now:
                table.move_to_end(key)
                return entry[1]
        return None

    def _admit(self, key: str, now: float) -> Decision | None:
        """None when a review may go out now; else the refusal (held back, not cached)."""
        if len(self._flights) >= MAX_IN_FLIGHT:
            return Decision(503, BUSY)
        if key in self._allowed:
            return None  # allowed before: known, its decision expired
        self._tokens = min(float(UNKNOWN_BURST), self._tokens + (now - self._refilled_at) * UNKNOWN_PER_S)
        self._refilled_at = now
        if self._tokens < 1.0:
            return Decision(429, TOO_MANY_TOKENS)
        self._tokens -= 1.0
        return None

    def _remember(self, key: str, decision: Decision, now: float) -> None:
        if decision.status == 500:
            return  # the API server failed this once: the next request asks again
        if decision.status == 200:
            table, ttl = self._allowed, ALLOWED_TTL_S
            self._refused.pop(key, None)
        else:
            table, ttl = self._refused, UNAVAILABLE_TTL_S if decision.status == 503 else DENIED_TTL_S
        table[key] = (now + ttl, decision)
        table.move_to_end(key)
        while len(table) > CACHE_SIZE:
            table.popitem(last=False)

    # ------------------------------------------------------------------------------------ the review

    def _review(self, token: str) -> Decision:
        self.reviews += 1
        try:
            review = self._api.create_token_review(
                {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": token}},
                _request_timeout=REQUEST_TIMEOUT_S)
            status = section(review, "status")
            if not status.get("authenticated"):
                if status.get("error"):
                    logger.info("debug request: the API server did not authenticate a token: %s", status["error"])
                return Decision(401, UNAUTHENTICATED)
            user = section(status, "user")
            username = str(user.get("username") or "")
            spec = {"user": username, "uid": str(user.get("uid") or ""), "groups": list(user.get("groups") or []),
                    "extra": dict(user.get("extra") or {}),
                    "resourceAttributes": {"verb": VERB, "group": "", "version": "v1", "resource": RESOURCE,
                                           "subresource": SUBRESOURCE, "name": self._node_name}}
            access = self._api.create_subject_access_review(
                {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": spec},
                _request_timeout=REQUEST_TIMEOUT_S)
        except Throttled as held:
            logger.info("debug request: review held back by koordlet's API budget (%s)", held.why)
            return Decision(503, UNAVAILABLE)
        except ApiException as err:
            logger.warning("cannot check a debug request's token with the API server: %s %s: %s", err.status,
                           err.reason, (err.body or "")[:500])
            return Decision(503 if is_pushback(err.status or 0) else 500, UNAVAILABLE)
        except (urllib3.exceptions.HTTPError, OSError, ValueError) as err:
            logger.warning("cannot check a debug request's token with the API server: %s", err)
            return Decision(503, UNAVAILABLE)
        allowed = section(access, "status")
        if allowed.get("allowed") and not allowed.get("denied"):
            return Decision(200, "allowed", username)
        if allowed.get("reason"):
            logger.info("debug request of %s refused: %s", username, allowed["reason"])
        return Decision(403, f'user "{username}" cannot {VERB} resource "{RESOURCE}/{SUBRESOURCE}" of node '
                             f'"{self._node_name}"', username)
