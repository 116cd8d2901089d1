"""The /debug guard at fleet scale, on a fake clock with the API server's reviews answered by a stand-in that can
hold them: one review for concurrent requests with one token, a bound on reviews in flight, a 503 remembered
briefly, LRU caches with allowed users apart, unknown tokens rate-limited, and callers told no API server text. The
flood test runs against the project's API server."""

from __future__ import annotations

import secrets
import threading
import time
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from koordlet.debug import authz
from koordlet.debug.authz import ApiAuthorizer
from koordlet.kubeapi import AuthV1, KubeClient
from koordlet.metrics import Request
from tests.support.apiserver import ApiServer, kube_api_client

NODE = "n1"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Reviews:
    """Answers TokenReviews and SubjectAccessReviews: ``users`` maps a token to a user, ``allowed`` the users that
    may get nodes/proxy; ``gate`` (when set) holds every TokenReview until it is set; ``fail`` answers an error."""

    def __init__(self, users: dict[str, str], allowed: set[str]) -> None:
        self.users = users
        self.allowed = allowed
        self.gate: threading.Event | None = None
        self.fail: ApiException | None = None
        self.token_reviews = 0
        self.waiting = 0
        self._lock = threading.Lock()

    def create_token_review(self, body: dict, **_: Any) -> dict:
        with self._lock:
            self.token_reviews += 1
            self.waiting += 1
        if self.gate is not None:
            self.gate.wait(5)
        with self._lock:
            self.waiting -= 1
        if self.fail is not None:
            raise self.fail
        user = self.users.get(body["spec"]["token"])
        if user is None:
            return {"status": {"authenticated": False, "error": "token signed by a key koordlet-sa may not read"}}
        return {"status": {"authenticated": True, "user": {"username": user, "groups": ["system:authenticated"]}}}

    def create_subject_access_review(self, body: dict, **_: Any) -> dict:
        allowed = body["spec"]["user"] in self.allowed
        return {"status": {"allowed": allowed, "reason": "" if allowed else "RBAC: koordlet-sa lacks nodes/proxy"}}


def request(token: str) -> Request:
    return Request("/debug/nodeslo", {}, {"Authorization": f"Bearer {token}"}, "192.0.2.7")


def guard(reviews: Reviews, clock: Clock) -> ApiAuthorizer:
    return ApiAuthorizer(reviews, NODE, clock=clock)  # type: ignore[arg-type]


def test_concurrent_requests_with_one_token_send_one_review() -> None:
    reviews = Reviews({"bob-token": "bob"}, {"bob"})
    reviews.gate = threading.Event()
    checker = guard(reviews, Clock())
    answers: list[object] = []
    threads = [threading.Thread(target=lambda: answers.append(checker(request("bob-token")))) for _ in range(8)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 5
    while reviews.waiting < 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.1)  # the other seven are waiting for the leader's answer by now
    reviews.gate.set()
    for thread in threads:
        thread.join(5)
    assert answers == [None] * 8 and reviews.token_reviews == 1


def test_reviews_in_flight_are_bounded() -> None:
    users = {f"t{i}": f"u{i}" for i in range(authz.MAX_IN_FLIGHT + 2)}
    reviews = Reviews(users, set(users.values()))
    reviews.gate = threading.Event()
    checker = guard(reviews, Clock())
    held = [threading.Thread(target=checker, args=(request(f"t{i}"),)) for i in range(authz.MAX_IN_FLIGHT)]
    for thread in held:
        thread.start()
    deadline = time.monotonic() + 5
    while reviews.waiting < authz.MAX_IN_FLIGHT and time.monotonic() < deadline:
        time.sleep(0.01)
    reply = checker(request(f"t{authz.MAX_IN_FLIGHT}"))
    assert reply is not None and reply.status == 503 and reply.headers["Retry-After"] == "1"
    assert reviews.token_reviews == authz.MAX_IN_FLIGHT
    reviews.gate.set()
    for thread in held:
        thread.join(5)
    assert checker(request(f"t{authz.MAX_IN_FLIGHT}")) is None  # room again


def test_an_unavailable_api_server_is_remembered_briefly() -> None:
    reviews = Reviews({"bob-token": "bob"}, {"bob"})
    reviews.fail = ApiException(status=503, reason="Service Unavailable")
    clock = Clock()
    checker = guard(reviews, clock)
    for _ in range(5):
        reply = checker(request("bob-token"))
        assert reply is not None and reply.status == 503
    assert reviews.token_reviews == 1  # not a review per retry
    reviews.fail = None
    clock.now += authz.UNAVAILABLE_TTL_S
    assert checker(request("bob-token")) is None and reviews.token_reviews == 2


def test_callers_learn_the_decision_never_the_api_servers_words() -> None:
    reviews = Reviews({"alice-token": "alice"}, set())
    checker = guard(reviews, Clock())
    unknown = checker(request("forged"))
    assert unknown is not None and unknown.status == 401
    assert b"key" not in unknown.body and b"koordlet-sa" not in unknown.body  # the TokenReview's error text
    refused = checker(request("alice-token"))
    assert refused is not None and refused.status == 403 and b"RBAC" not in refused.body
    reviews.fail = ApiException(status=403, reason="Forbidden")
    reviews.fail.body = 'tokenreviews.authentication.k8s.io is forbidden: User "system:serviceaccount:koordlet-sa"'
    failed = checker(request("other"))
    assert failed is not None and failed.status == 503 and b"serviceaccount" not in failed.body


def test_refused_tokens_never_push_an_allowed_users_decision_out(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(authz, "UNKNOWN_BURST", 10 * authz.CACHE_SIZE)  # the bucket out of the way: the caches alone
    users = {f"r{i}": f"r{i}" for i in range(authz.CACHE_SIZE * 2)} | {"bob-token": "bob"}
    reviews = Reviews(users, {"bob"})
    checker = guard(reviews, Clock())
    assert checker(request("bob-token")) is None
    for i in range(authz.CACHE_SIZE * 2):  # twice what a cache holds, all refused
        reply = checker(request(f"r{i}"))
        assert reply is not None and reply.status == 403
    before = reviews.token_reviews
    assert checker(request("bob-token")) is None and reviews.token_reviews == before  # still from the cache
    assert checker(request("r0")).status == 403 and reviews.token_reviews == before + 1  # type: ignore[union-attr]


def test_the_caches_are_lru() -> None:
    users = {f"a{i}": f"a{i}" for i in range(authz.CACHE_SIZE + 1)}
    reviews = Reviews(users, set(users.values()))
    checker = guard(reviews, Clock())
    for i in range(authz.CACHE_SIZE):
        checker(request(f"a{i}"))
        if i % authz.UNKNOWN_BURST == 0:
            checker._tokens = float(authz.UNKNOWN_BURST)  # noqa: SLF001 - refill: the bucket is tested apart
    assert checker(request("a0")) is None  # used again: now the most recent
    checker._tokens = float(authz.UNKNOWN_BURST)  # noqa: SLF001
    checker(request(f"a{authz.CACHE_SIZE}"))  # one more: the least recently used goes, a1, not a0
    before = reviews.token_reviews
    assert checker(request("a0")) is None and reviews.token_reviews == before
    assert checker(request("a1")) is None and reviews.token_reviews == before + 1


def test_a_known_users_expired_decision_is_reviewed_again_even_during_a_flood() -> None:
    reviews = Reviews({"bob-token": "bob"}, {"bob"})
    clock = Clock()
    checker = guard(reviews, clock)
    assert checker(request("bob-token")) is None
    for _ in range(authz.UNKNOWN_BURST):
        checker(request(secrets.token_hex(8)))  # the unknown-token bucket is empty now
    assert checker(request(secrets.token_hex(8))).status == 429  # type: ignore[union-attr]
    clock.now += authz.ALLOWED_TTL_S + 0.01
    assert checker(request("bob-token")) is None  # known: not held back with the unknown ones


@pytest.fixture
def flooded() -> Any:
    with ApiServer() as server:
        with kube_api_client(server) as api:  # the reviews sent as the admin (the agent's own rights: test_rbac)
            server.add_token("bob-token", "bob", ("system:authenticated",))
            server.seed({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                         "metadata": {"name": "node-debug"},
                         "rules": [{"apiGroups": [""], "resources": ["nodes/proxy"], "verbs": ["get"]}]})
            server.seed({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                         "metadata": {"name": "node-debug"},
                         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                     "name": "node-debug"},
                         "subjects": [{"kind": "User", "name": "bob"}]})
            yield server, ApiAuthorizer(AuthV1(KubeClient(api)), NODE)


def test_a_flood_of_10000_random_tokens_while_an_allowed_user_is_served_from_cache(flooded: Any) -> None:
    server, checker = flooded
    assert checker(request("bob-token")) is None
    started = time.monotonic()
    bob: list[object] = []
    statuses: dict[int, int] = {}
    lock = threading.Lock()

    def flood(count: int) -> None:
        for _ in range(count):
            reply = checker(request(secrets.token_urlsafe(24)))
            with lock:
                statuses[reply.status] = statuses.get(reply.status, 0) + 1

    def reader(stop: threading.Event) -> None:
        while not stop.is_set():
            bob.append(checker(request("bob-token")))
            time.sleep(0.001)

    stop = threading.Event()
    bob_thread = threading.Thread(target=reader, args=(stop,))
    bob_thread.start()
    flooders = [threading.Thread(target=flood, args=(2500,)) for _ in range(4)]
    for thread in flooders:
        thread.start()
    for thread in flooders:
        thread.join(60)
    stop.set()
    bob_thread.join(5)
    elapsed = time.monotonic() - started
    assert sum(statuses.values()) == 10_000
    assert statuses.get(429, 0) >= 9_000  # held back without a review
    assert set(statuses) <= {401, 429, 503}
    assert bob and all(answer is None for answer in bob)  # the allowed user: served all along, from the cache
    reviews = len(server.requests("POST", r"/tokenreviews$"))
    assert reviews <= 1 + authz.UNKNOWN_BURST + authz.UNKNOWN_PER_S * elapsed + 1
    assert len(server.requests("POST", r"/subjectaccessreviews$")) == 1  # random tokens never get that far
