"""The reflector's list-watch discipline, its loop driven step by step on a fake clock through koordlet's own API
client (koordlet.kubeapi, its budget included) over scripted answers: list at resourceVersion 0 once, watch from
the last version or bookmark with a random 5-10 minute timeout, resume after a watch ends or breaks, list again
only on 410, back off with full jitter and reset only after a watch lived a minute, honour Retry-After."""

from __future__ import annotations

import json
import random
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import kubernetes.client
import pytest
import urllib3

from koordlet.kubeapi import CoreV1, KubeClient
from koordlet.kubeclient.budget import PROBATION_S, Budget
from koordlet.kubeclient.reflector import HEALTHY_WATCH_S, NextLine, Reflector, Sleep
from tests.koordlet.kubeclient.clock import FakeClock
from tests.support.fleetserver import Answer as Reply

NODE = "n1"


@dataclass
class Stream:
    """An open watch: its lines, how long it stays open, and how it ends (None: the server's timeout)."""

    lines: list[dict] = field(default_factory=list)
    lives_s: float = 400.0
    ends_with: BaseException | None = None


@dataclass
class Answer:
    status: int = 200
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)


class ScriptedApiClient(kubernetes.client.ApiClient):
    """The real ApiClient (URL, query and body built by the library) whose transport answers from a script."""

    def __init__(self) -> None:
        super().__init__(kubernetes.client.Configuration())
        self.script: deque[Answer] = deque()
        self.sent: list[tuple[float, dict[str, str]]] = []
        self.clock: FakeClock | None = None

    def call_api(self, method: str, url: str, header_params: Any = None, body: Any = None, post_params: Any = None,
                 _request_timeout: Any = None) -> Reply:
        assert self.clock is not None
        answer = self.script.popleft()
        self.sent.append((self.clock.now, dict(parse_qsl(urlsplit(url).query))))
        if isinstance(answer.body, Stream):
            return Reply(answer.status, b"", answer.headers, stream=answer.body)  # type: ignore[arg-type]
        return Reply(answer.status, json.dumps(answer.body).encode(), answer.headers)


def node_list(version: str, present: bool = True) -> Answer:
    items = [{"metadata": {"name": NODE, "resourceVersion": version}}] if present else []
    return Answer(body={"kind": "NodeList", "metadata": {"resourceVersion": version}, "items": items})


def event(kind: str, version: str, **extra: Any) -> dict:
    return {"type": kind, "object": {"metadata": {"name": NODE, "resourceVersion": version}, **extra}}


def gone() -> dict:
    return {"type": "ERROR", "object": {"kind": "Status", "code": 410, "reason": "Expired",
                                        "message": "too old resource version"}}


class Harness:
    def __init__(self, seed: int = 1, **budget: float) -> None:
        self.clock = FakeClock()
        self.api = ScriptedApiClient()
        self.api.clock = self.clock
        self.budget = Budget(clock=self.clock, rng=random.Random(seed), sleep=self.clock.sleep, **budget)
        self.seen: list[dict | None] = []
        core = CoreV1(KubeClient(self.api, self.budget)).essential()
        self.reflector = Reflector("node", core.list_node, NODE, self.seen.append, self.budget, clock=self.clock,
                                   rng=random.Random(seed))
        self.sleeps: list[float] = []
        self._steps = self.reflector.run()
        self._reply: Any = None
        self._error: BaseException | None = None
        self._lines: Iterator[dict] | None = None
        self._stream: Stream | None = None

    def run(self, steps: int = 1000) -> None:
        """Drive the loop until the script is used up (or ``steps``): sleeps move the clock; a stream gives its
        lines, then lives out its time and ends."""
        for _ in range(steps):
            try:
                step = self._steps.throw(self._error) if self._error else self._steps.send(self._reply)
            except IndexError:  # the next request found the script empty
                return
            self._reply, self._error = None, None
            if isinstance(step, Sleep):
                self.sleeps.append(step.seconds)
                self.clock.now += step.seconds
                continue
            assert isinstance(step, NextLine)
            if step.response is not self._stream:
                self._stream, self._lines = step.response, iter(step.response.lines)
            line = next(self._lines, None)
            if line is not None:
                self._reply = json.dumps(line)
                continue
            self.clock.now += self._stream.lives_s
            self._error = self._stream.ends_with

    def queries(self) -> list[dict[str, str]]:
        return [query for _, query in self.api.sent]


def test_lists_once_at_version_0_then_resumes_watches_from_the_last_bookmark() -> None:
    h = Harness()
    h.api.script.extend([node_list("10"),
                         Answer(body=Stream([event("BOOKMARK", "15")])),
                         Answer(body=Stream([event("MODIFIED", "21", spec={"x": 1})])),
                         Answer(body=Stream())])
    h.run()
    lists = [q for q in h.queries() if "watch" not in q]
    watches = [q for q in h.queries() if q.get("watch") == "true"]
    assert lists == [{"fieldSelector": "metadata.name=n1", "resourceVersion": "0"}]  # the watch cache, once
    assert [w["resourceVersion"] for w in watches] == ["10", "15", "21"]
    assert all(w["allowWatchBookmarks"] == "true" and 300 <= int(w["timeoutSeconds"]) <= 600 for w in watches)
    assert h.sleeps == []  # a watch that ends at its timeout is resumed at once
    assert [obj["metadata"]["resourceVersion"] for obj in h.seen if obj] == ["10", "21"]  # bookmarks are not objects


def test_watch_timeouts_are_random_between_5_and_10_minutes() -> None:
    h = Harness(seed=4)
    h.api.script.extend([node_list("1")] + [Answer(body=Stream()) for _ in range(300)])
    h.run()
    timeouts = [int(q["timeoutSeconds"]) for q in h.queries() if q.get("watch")]
    assert min(timeouts) >= 300 and max(timeouts) <= 600 and max(timeouts) - min(timeouts) > 200


def test_a_broken_watch_is_resumed_after_a_backoff_without_a_list_and_tells_the_budget() -> None:
    h = Harness()
    h.api.script.extend([node_list("10"),
                         Answer(body=Stream([event("MODIFIED", "12")], lives_s=5.0,
                                            ends_with=urllib3.exceptions.ProtocolError("Connection broken"))),
                         Answer(body=Stream(lives_s=1.0))])
    h.run()
    assert [q.get("resourceVersion") for q in h.queries()] == ["0", "10", "12"]
    assert 0.0 <= h.sleeps[0] <= 0.8  # the first retry: anywhere in the first window
    # a broken-off watch made the re-watch a probe: the request after it waits out the probation
    assert h.sleeps[1:] == [pytest.approx(PROBATION_S - 1.0)]


def test_only_a_410_lists_again_at_the_last_version_and_a_gone_version_then_at_the_newest() -> None:
    h = Harness()
    h.api.script.extend([node_list("10"),
                         Answer(body=Stream([event("BOOKMARK", "30"), gone()])),  # 410 in the stream
                         Answer(410, {"kind": "Status", "code": 410, "reason": "Expired"}),  # relist at 30: gone
                         node_list("55"),  # the newest, from etcd
                         Answer(body=Stream())])
    h.run()
    queries = h.queries()
    assert [(q.get("watch"), q.get("resourceVersion"), q.get("resourceVersionMatch")) for q in queries] == [
        (None, "0", None), ("true", "10", None), (None, "30", "NotOlderThan"), (None, None, None),
        ("true", "55", None)]


def test_a_watch_that_answers_410_at_once_lists_again() -> None:
    h = Harness()
    h.api.script.extend([node_list("10"), Answer(410, {"kind": "Status", "code": 410}), node_list("11"),
                         Answer(body=Stream())])
    h.run()
    assert [(q.get("watch"), q.get("resourceVersion")) for q in h.queries()] == [
        (None, "0"), ("true", "10"), (None, "10"), ("true", "11")]


def test_backoff_grows_while_watches_die_young_and_resets_only_after_one_lived_a_minute() -> None:
    h = Harness(seed=9, probation_s=0.0)  # the budget's probation is pinned apart (test_budget.py)
    cut = urllib3.exceptions.ProtocolError("cut")
    h.api.script.append(node_list("1"))
    h.api.script.extend(Answer(body=Stream(lives_s=10.0, ends_with=cut)) for _ in range(6))
    h.api.script.append(Answer(body=Stream(lives_s=HEALTHY_WATCH_S + 1, ends_with=cut)))
    h.api.script.extend(Answer(body=Stream(lives_s=10.0, ends_with=cut)) for _ in range(2))
    h.run()
    windows = [0.8 * 2 ** n for n in range(6)]
    assert all(s <= w for s, w in zip(h.sleeps[:6], windows, strict=False))
    assert h.reflector.backoff.failures == 3  # reset by the watch that lived a minute; its cut and two more since
    assert h.sleeps[6] <= 0.8  # the first retry after the reset draws from the first window again


def test_retry_after_of_a_429_holds_the_next_request_back() -> None:
    h = Harness()
    h.api.script.extend([node_list("10"), Answer(429, {"kind": "Status", "code": 429}, {"Retry-After": "50"}),
                         Answer(body=Stream())])
    h.run()
    (_, first), (at_429, _), (at_next, next_query) = h.api.sent
    assert next_query["watch"] == "true" and next_query["resourceVersion"] == "10"
    assert at_next - at_429 >= 50.0  # the server's Retry-After, through the koordlet's budget


def test_a_missing_object_is_handed_over_as_none() -> None:
    h = Harness()
    h.api.script.extend([node_list("3", present=False), Answer(body=Stream([event("ADDED", "4")])),
                         Answer(body=Stream([event("DELETED", "5")])), Answer(body=Stream())])
    h.run()
    assert [None if obj is None else obj["metadata"]["resourceVersion"] for obj in h.seen] == [None, "4", None]
    assert h.reflector.synced.is_set()


@pytest.mark.parametrize("line", ["not json", json.dumps({"type": "ERROR", "object": {"code": 500}})])
def test_a_bad_line_or_error_event_ends_the_watch_and_it_resumes_after_a_backoff(line: str) -> None:
    h = Harness()
    h.api.script.extend([node_list("10"), Answer(body=Stream()), Answer(body=Stream())])
    h.run(1)  # listed; the watch is open
    steps = h._steps  # noqa: SLF001
    step = steps.send(None)
    assert isinstance(step, NextLine)
    step = steps.send(line)
    assert isinstance(step, Sleep) and h.reflector.failures == 1
