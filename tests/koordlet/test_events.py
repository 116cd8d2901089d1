"""koordlet's Event recorder against the project's API server, on a fake clock: a repeat within 10 minutes is one
Event counted up by a PATCH, as client-go's recorder; a flood on one object is cut by the spam filter; a koordlet
that restarts sends nothing for the condition it had already reported."""

from __future__ import annotations

from pathlib import Path

import kubernetes.client
import pytest

from koordlet.events import AGGREGATION_WINDOW_S, SPAM_BURST, SPAM_REFILL_S, EventRecorder, InvolvedObject
from koordlet.kubeapi import CoreV1, KubeClient
from tests.koordlet.kubeclient.clock import FakeClock
from tests.support.apiserver import ApiServer

NODE = "n1"
POD = InvolvedObject("Pod", "web-0", "shop", "uid-1")


@pytest.fixture
def core(api_client: kubernetes.client.ApiClient) -> CoreV1:
    return CoreV1(KubeClient(api_client))


def recorder(core: CoreV1, clock: FakeClock, state: Path | None = None) -> EventRecorder:
    return EventRecorder(core, NODE, str(state) if state else None, clock)


def events(server: ApiServer) -> list[dict]:
    return server.list_objects("events", "shop")


def test_a_repeat_within_ten_minutes_counts_up_one_event(server: ApiServer, core: CoreV1) -> None:
    clock = FakeClock()
    events_out = recorder(core, clock)
    for _ in range(3):
        events_out.record(POD, "Warning", "KoordletHookValueRejected", "cpu quota 5 refused")
        clock.now += 60
    (event,) = events(server)
    assert event["count"] == 3 and event["reason"] == "KoordletHookValueRejected"
    assert event["involvedObject"]["uid"] == "uid-1" and event["source"] == {"component": "koordlet", "host": NODE}
    assert [r.verb for r in server.requests(path_regex=r"/events")] == ["POST", "PATCH", "PATCH"]
    assert event["lastTimestamp"] > event["firstTimestamp"]
    events_out.record(POD, "Warning", "KoordletHookValueRejected", "another message")  # not the same: its own
    assert len(events(server)) == 2


def test_after_ten_minutes_a_repeat_is_a_new_event(server: ApiServer, core: CoreV1) -> None:
    clock = FakeClock()
    events_out = recorder(core, clock)
    events_out.record(POD, "Warning", "Evicted", "memory")
    clock.now += AGGREGATION_WINDOW_S + 1
    events_out.record(POD, "Warning", "Evicted", "memory")
    assert sorted(e["count"] for e in events(server)) == [1, 1]


def test_an_event_gone_from_the_server_is_created_again(server: ApiServer, core: CoreV1) -> None:
    clock = FakeClock()
    events_out = recorder(core, clock)
    events_out.record(POD, "Warning", "Evicted", "memory")
    (event,) = events(server)
    kubernetes.client.CoreV1Api(core.api_client).delete_namespaced_event(event["metadata"]["name"], "shop")
    events_out.record(POD, "Warning", "Evicted", "memory")
    assert [e["count"] for e in events(server)] == [1]


def test_the_spam_filter_cuts_a_flood_on_one_object(server: ApiServer, core: CoreV1) -> None:
    clock = FakeClock()
    events_out = recorder(core, clock)
    for i in range(SPAM_BURST + 10):
        events_out.record(POD, "Warning", "Flood", f"message {i}")
    assert len(events(server)) == SPAM_BURST and events_out.dropped == 10
    clock.now += SPAM_REFILL_S
    events_out.record(POD, "Warning", "Flood", "one more after five minutes")
    assert len(events(server)) == SPAM_BURST + 1
    other = InvolvedObject("Pod", "web-1", "shop", "uid-2")
    events_out.record(other, "Warning", "Flood", "another object has its own bucket")
    assert len(events(server)) == SPAM_BURST + 2


def test_a_restarted_koordlet_sends_nothing_for_what_it_had_reported(server: ApiServer, core: CoreV1,
                                                                      tmp_path: Path) -> None:
    clock = FakeClock()
    state = tmp_path / "events-sent.json"
    recorder(core, clock, state).record(POD, "Warning", "InvalidNodeSLO", "catRangeStartPercent > end")
    clock.now += 30  # the koordlet restarts and finds the same condition
    restarted = recorder(core, clock, state)
    server.clear_requests()
    restarted.record(POD, "Warning", "InvalidNodeSLO", "catRangeStartPercent > end")
    assert server.requests() == [] and [e["count"] for e in events(server)] == [1]
    clock.now += 60  # found again later in this run: a repeat, counted up
    restarted.record(POD, "Warning", "InvalidNodeSLO", "catRangeStartPercent > end")
    assert [e["count"] for e in events(server)] == [2]
    clock.now += AGGREGATION_WINDOW_S + 1  # a restart after the window: a new occurrence, a new Event
    recorder(core, clock, state).record(POD, "Warning", "InvalidNodeSLO", "catRangeStartPercent > end")
    assert sorted(e["count"] for e in events(server)) == [1, 2]


def test_an_unreadable_state_file_is_logged_and_ignored(server: ApiServer, core: CoreV1, tmp_path: Path,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    state = tmp_path / "events-sent.json"
    state.write_text("{not json")
    recorder(core, FakeClock(), state).record(POD, "Warning", "Evicted", "memory")
    assert "unreadable" in caplog.text and len(events(server)) == 1
    assert state.read_text().startswith("[")  # written again whole

