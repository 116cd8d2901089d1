"""The reference client of the fleet bench: what Koordinator's koordlet (Go, client-go) sends, per node.

Written from their code (read at koordinator-sh/koordinator main a7a1b76, v1.8.0's successor, and
kubernetes/client-go tools/cache), not from ours; it runs on the same virtual time and transport as koordlet-py's
nodes in bench/fleet.py, so the two stand side by side. Every loop is a generator of the steps of
koordlet.kubeclient.reflector (:class:`Sleep`, :class:`NextLine`), driven by the bench.

- **Informers** (pkg/koordlet/statesinformer/impl/states_node.go, states_nodeslo.go, states_nodemetric.go,
  states_noderesourcetopology.go): Node, NodeSLO, NodeMetric and NodeResourceTopology, each a
  ``cache.NewSharedIndexInformer`` on a ``ListWatch`` with a ``metadata.name`` field selector. The reflector
  (client-go tools/cache/reflector.go): ``wait.BackoffUntil`` around ``ListAndWatch`` with the delay handler
  ``Backoff{Duration: 800ms, Cap: 30s, Factor: 2, Jitter: 1.0}.DelayWithReset(clock, 2min)`` (a delay d is drawn
  from [d, 2d), and the next d doubles; no delay asked for 2 minutes resets it); the list at
  ``relistResourceVersion()``: "0" first, then the last version seen, and "" (etcd) after a list answered 410;
  watches from the last version with ``AllowWatchBookmarks`` and ``timeoutSeconds`` random in [5, 10) minutes; a
  watch that ends or breaks after living a second is watched again at once; one that ends sooner with no event,
  or ends with an ERROR (410 included), returns to ``ListAndWatch``; a watch request answered 429 (or refused)
  backs off and watches again, any other error lists again.
- **The REST client** (client-go rest/request.go, with/without Retry-After): a token bucket of
  ``-kube-api-qps`` 20 and ``-kube-api-burst`` 30 (cmd/koordlet/options/options.go), waited for; an answer 429 or
  5xx carrying ``Retry-After`` is retried after that many seconds, up to ``maxRetries`` 10; one HTTP/2 connection.
- **NodeMetric** (states_nodemetric.go): once the informers synced, ``syncNodeMetricWorker`` waits
  ``time.After(reportInterval)`` (the spec's ``reportIntervalSeconds``, at least 30, default 60) and reports,
  again and again, with no jitter; ``retry.RetryOnConflict(retry.DefaultBackoff, ...)`` takes the object from the
  informer's lister, goes through the status updater's ``rate.NewLimiter(0.1, 2)`` and PUTs it with
  ``UpdateStatus``; ``DefaultBackoff`` is ``{Duration: 10ms, Factor: 5, Jitter: 0.1, Steps: 4}``.
- **NodeResourceTopology** (states_noderesourcetopology.go): ``wait.Until(reportNodeTopology, 3s)`` compares the
  computed topology with the informer's copy and sends an ``Update`` only when it changed; the bench's nodes do
  not change, so the tick sends nothing and is not simulated.
- **Device** (states_device_linux.go, gate ``Accelerators``): ``wait.Until(reportDevice, 3s)``, each a ``Get``
  with ``ResourceVersion: "0"`` under ``util.RetryOnConflictOrTooManyRequests``, then an ``Update`` only when
  the devices changed.
- **Evictions** (pkg/koordlet/qosmanager/helpers evictor): the Eviction API's ``create``, then an Event through
  client-go's recorder (one per eviction: their messages differ).
"""

from __future__ import annotations

import copy
import json
import random
from collections.abc import Callable, Generator
from typing import Any
from urllib.parse import urlencode

import urllib3

from koordlet.kubeclient.reflector import NextLine, Sleep
from tests.support.fleetserver import Answer, FleetServer

Step = Sleep | NextLine
MIN_WATCH_TIMEOUT_S = 300.0
BACKOFF_INIT_S, BACKOFF_CAP_S, BACKOFF_RESET_S = 0.8, 30.0, 120.0
MAX_RETRIES = 10  # client-go rest.Request maxRetries
STATUS_UPDATE_QPS, STATUS_UPDATE_BURST = 0.1, 2
CONFLICT_BACKOFF_S = (0.01, 0.05, 0.25)  # retry.DefaultBackoff: 10 ms × 5ⁿ, 4 steps, before each retry


class TokenBucket:
    """golang.org/x/time/rate / client-go flowcontrol: ``reserve`` returns how long to wait for the token."""

    def __init__(self, qps: float, burst: int, now: float) -> None:
        self.qps, self.burst = qps, burst
        self._tokens, self._at = float(burst), now

    def _refill(self, now: float) -> None:
        self._tokens = min(float(self.burst), self._tokens + (now - self._at) * self.qps)
        self._at = now

    def reserve(self, now: float) -> float:
        self._refill(now)
        self._tokens -= 1.0
        return max(-self._tokens / self.qps, 0.0)

    def allow(self, now: float) -> bool:
        self._refill(now)
        if self._tokens < 1.0:
            return False
        self._tokens -= 1.0
        return True


class DelayWithReset:
    """wait.Backoff{800ms, Cap 30s, Factor 2, Jitter 1.0}.DelayWithReset(clock, 2min)."""

    def __init__(self, now: Callable[[], float], rng: random.Random) -> None:
        self._now, self._rng = now, rng
        self._duration = BACKOFF_INIT_S
        self._last = -1e18

    def __call__(self) -> float:
        now = self._now()
        if now - self._last > BACKOFF_RESET_S:
            self._duration = BACKOFF_INIT_S
        self._last = now
        delay = self._duration + self._rng.random() * self._duration  # Jitter 1.0: [d, 2d)
        self._duration = min(self._duration * 2.0, BACKOFF_CAP_S)
        return delay


class RestClient:
    """One node's client-go REST client over the fleet bench's transport."""

    def __init__(self, fleet: FleetServer, node: str, token: str | None = None) -> None:
        self._fleet = fleet
        self.node = node
        self._headers = {"Accept": "application/json", "User-Agent": "koordlet/v1.8.0"}
        if token:
            self._headers["Authorization"] = f"Bearer {token}"
        self._bucket = TokenBucket(20.0, 30, fleet.loop.now)

    def do(self, method: str, path: str, query: dict[str, Any] | None = None,
           body: Any = None) -> Generator[Step, Any, Answer]:
        url = path + ("?" + urlencode({k: v for k, v in (query or {}).items() if v is not None}) if query else "")
        headers = dict(self._headers)
        if body is not None:
            headers["Content-Type"] = "application/json"
        for retry in range(MAX_RETRIES + 1):
            wait = self._bucket.reserve(self._fleet.loop.now)
            if wait > 0:
                yield Sleep(wait)
            answer = self._fleet.request(self.node, method, url, headers, body)
            after = answer.headers.get("Retry-After")
            if after is None or retry == MAX_RETRIES or not (answer.status == 429 or answer.status >= 500):
                return answer
            yield Sleep(float(after))
        raise AssertionError("unreachable")


def _ok(answer: Answer) -> bool:
    return 200 <= answer.status < 300


class Informer:
    """A SharedIndexInformer's reflector for one named object; ``store`` holds it (the lister)."""

    def __init__(self, rest: RestClient, path: str, name: str, now: Callable[[], float], rng: random.Random) -> None:
        self._rest = rest
        self._path = path
        self._selector = f"metadata.name={name}"
        self._now = now
        self._rng = rng
        self._delay = DelayWithReset(now, rng)
        self.store: dict[str, Any] | None = None
        self.synced = False
        self.watching = False
        self._last_version = ""
        self._version_unavailable = False

    def run(self) -> Generator[Step, Any, None]:
        while True:  # wait.BackoffUntil(..., sliding=true): ListAndWatch, then the delay
            yield from self._list_and_watch()
            yield Sleep(self._delay())

    def _relist_version(self) -> str:
        if self._version_unavailable:
            return ""
        return self._last_version or "0"

    def _list_and_watch(self) -> Generator[Step, Any, None]:
        answer = yield from self._rest.do("GET", self._path, {"fieldSelector": self._selector,
                                                              "resourceVersion": self._relist_version()})
        if answer.status == 410:
            self._version_unavailable = True
            return
        if not _ok(answer):
            return
        listed = json.loads(answer.data)
        self._version_unavailable = False
        self._last_version = str(listed["metadata"].get("resourceVersion") or "")
        items = listed.get("items") or []
        self.store = items[0] if items else None
        self.synced = True
        while True:
            timeout = int(MIN_WATCH_TIMEOUT_S + self._rng.random() * MIN_WATCH_TIMEOUT_S)
            answer = yield from self._rest.do("GET", self._path, {
                "fieldSelector": self._selector, "resourceVersion": self._last_version, "timeoutSeconds": timeout,
                "allowWatchBookmarks": "true", "watch": "true"})
            if not _ok(answer):
                if answer.status == 429:  # isWatchErrorRetriable: back off and watch again
                    yield Sleep(self._delay())
                    continue
                return
            started = self._now()
            events, ended_with_error = yield from self._read(answer.response)
            if ended_with_error or (self._now() - started < 1.0 and events == 0):
                return  # back to ListAndWatch, after the delay
            # otherwise: watch again at once from the last version


    def _read(self, stream: Any) -> Generator[Step, Any, tuple[int, bool]]:
        """handleWatch: the events until the stream ends, breaks or says ERROR; (events, whether an ERROR)."""
        events = 0
        self.watching = True
        try:
            while True:
                try:
                    line = yield NextLine(stream)
                except (OSError, urllib3.exceptions.HTTPError):
                    return events, False  # the stream broke: its watcher closes its channel, as if it had ended
                if line is None:
                    return events, False
                event = json.loads(line)
                if event["type"] == "ERROR":
                    return events, True
                events += 1
                self._last_version = str(event["object"]["metadata"].get("resourceVersion") or self._last_version)
                if event["type"] in ("ADDED", "MODIFIED"):
                    self.store = event["object"]
                elif event["type"] == "DELETED":
                    self.store = None
        finally:
            self.watching = False
            stream.close()


class NodeMetricWorker:
    """states_nodemetric.go's syncNodeMetricWorker and statusUpdater."""

    def __init__(self, rest: RestClient, name: str, informers: list[Informer], metric: Informer,
                 status: Callable[[], dict[str, Any]], now: Callable[[], float], rng: random.Random) -> None:
        self._rest = rest
        self._rng = rng
        self._name = name
        self._informers = informers
        self._metric = metric
        self._status = status
        self._now = now
        self._limiter = TokenBucket(STATUS_UPDATE_QPS, STATUS_UPDATE_BURST, now())

    def _interval(self) -> float:
        policy = ((self._metric.store or {}).get("spec") or {}).get("metricCollectPolicy") or {}
        return float(max(int(policy.get("reportIntervalSeconds") or 60), 30))

    def run(self) -> Generator[Step, Any, None]:
        while not all(informer.synced for informer in self._informers):  # cache.WaitForCacheSync: 100 ms polls
            yield Sleep(0.1)
        while True:
            yield Sleep(self._interval())  # time.After(reportInterval), measured from the end of the last sync
            yield from self._sync()

    def _sync(self) -> Generator[Step, Any, None]:
        status = self._status()
        for attempt in range(len(CONFLICT_BACKOFF_S) + 1):
            current = self._metric.store
            if current is None:
                return  # "nodeMetric not found, skip"
            if not self._limiter.allow(self._now()):
                return  # "updating status is limited": not a conflict, RetryOnConflict stops
            body = copy.copy(current)
            body["status"] = status
            answer = yield from self._rest.do(
                "PUT", f"/apis/slo.koordinator.sh/v1alpha1/nodemetrics/{self._name}/status", body=body)
            if answer.status != 409 or attempt == len(CONFLICT_BACKOFF_S):
                return
            yield Sleep(CONFLICT_BACKOFF_S[attempt] * (1 + 0.1 * self._rng.random()))


def device_reporter(rest: RestClient, name: str) -> Generator[Step, Any, None]:
    """states_device_linux.go: every 3 s a Get at resourceVersion 0, and nothing more while nothing changed."""
    while True:
        yield from rest.do("GET", f"/apis/scheduling.koordinator.sh/v1alpha1/devices/{name}",
                           {"resourceVersion": "0"})
        yield Sleep(3.0)  # wait.Until: the period after each run


def evict(rest: RestClient, node: str, pod: dict[str, Any], now: float) -> Generator[Step, Any, bool]:
    """The evictor: the Eviction API, then an Event (client-go's recorder; each eviction's message differs)."""
    meta = pod["metadata"]
    answer = yield from rest.do("POST", f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}/eviction",
                                body={"apiVersion": "policy/v1", "kind": "Eviction",
                                      "metadata": {"name": meta["name"], "namespace": meta["namespace"]}})
    if not _ok(answer):
        return False
    stamp = "2026-01-01T00:00:00Z"
    yield from rest.do("POST", f"/api/v1/namespaces/{meta['namespace']}/events", body={
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"name": f"{meta['name']}.{int(now * 1e9):x}", "namespace": meta["namespace"]},
        "involvedObject": {"kind": "Pod", "name": meta["name"], "namespace": meta["namespace"],
                           "uid": meta.get("uid", "")},
        "reason": "evictPodSuccess", "message": f"evict Pod:{meta['name']}, reason: BEMemoryEvict",
        "type": "Normal", "source": {"component": "koordlet", "host": node}, "count": 1,
        "firstTimestamp": stamp, "lastTimestamp": stamp})
    return True
