"""The fleet layer in front of the project's API server (tests/support/fleetserver.py): what it records, how it
serves watches (the watch cache's window, bookmarks, timeouts), the faults it injects, and koordlet's own client
through its in-process transport."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from koordlet.kubeapi import CoreV1, CustomObjects, KubeClient
from koordlet.kubeclient.budget import Budget
from tests.support.fleetserver import (
    BOOKMARK_EVERY_S,
    WATCH_CACHE_WINDOW_S,
    EventLoop,
    FleetApiServer,
    FleetServer,
    InProcessApiClient,
    VirtualClock,
)

NODE = "n1"
NODES = "/api/v1/nodes"
TOKEN = "fleet-test-admin"  # the server authenticates and authorizes every request: the layer is tested as the admin


@pytest.fixture
def fleet() -> Iterator[FleetServer]:
    api = FleetApiServer()
    api.add_token(TOKEN, "kubernetes-admin", ("system:masters",))
    api.seed({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
    api.seed({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "other"}})
    try:
        yield FleetServer(api, EventLoop())
    finally:
        api.stop()


def ask(fleet: FleetServer, url: str, method: str = "GET", body: object = None) -> object:
    headers = {"Authorization": f"Bearer {TOKEN}"} | ({"Content-Type": "application/json"} if body else {})
    return fleet.request(NODE, method, url, headers, body)


def label(fleet: FleetServer, node: str, value: str) -> None:
    """A change to ``node`` as the admin makes it (a controller's write in the background)."""
    answer = fleet.api.handle("PATCH", f"{NODES}/{node}", "application/merge-patch+json",
                              json.dumps({"metadata": {"labels": {"a": value}}}).encode(),
                              {"Authorization": f"Bearer {TOKEN}"})
    assert answer.code == 200


def watch(fleet: FleetServer, version: str, timeout_s: int = 300, bookmarks: bool = True) -> object:
    query = f"?watch=true&fieldSelector=metadata.name%3D{NODE}&resourceVersion={version}&timeoutSeconds={timeout_s}"
    return ask(fleet, NODES + query + ("&allowWatchBookmarks=true" if bookmarks else "")).response


def drain(stream: object) -> list[tuple[str, object]]:
    out = []
    while True:
        kind, value = stream.take()
        if kind == "wait":
            return out
        out.append((kind, json.loads(value) if kind == "line" else value))
        if kind in ("end", "cut"):
            return out


def test_every_request_is_recorded_with_its_verb_resource_and_consistency(fleet: FleetServer) -> None:
    version = str(fleet.api.resource_version)
    ask(fleet, f"{NODES}/{NODE}")  # a get with no version: etcd
    ask(fleet, f"{NODES}/{NODE}?resourceVersion=0")  # the watch cache
    ask(fleet, f"{NODES}?fieldSelector=metadata.name%3D{NODE}")  # a consistent list
    ask(fleet, f"{NODES}?resourceVersion=0&fieldSelector=metadata.name%3D{NODE}")
    watch(fleet, version)
    ask(fleet, "/api/v1/namespaces/default/events", "POST",
        {"apiVersion": "v1", "kind": "Event", "metadata": {"name": "e1", "namespace": "default"},
         "involvedObject": {"kind": "Node", "name": NODE}, "reason": "R", "message": "m"})
    got = [(r.verb, r.resource, r.consistent, r.status) for r in fleet.records]
    assert got == [("get", "nodes", True, 200), ("get", "nodes", False, 200), ("list", "nodes", True, 200),
                   ("list", "nodes", False, 200), ("watch", "nodes", False, 200), ("create", "events", False, 201)]
    assert all(r.node == NODE and r.bytes_out > 0 for r in fleet.records[:4])
    assert fleet.records[-1].bytes_in > 0


def test_a_watch_gets_its_objects_changes_bookmarks_and_ends_at_its_timeout(fleet: FleetServer) -> None:
    stream = watch(fleet, str(fleet.api.resource_version), timeout_s=150)
    assert fleet.open_watches[NODE] == 1
    label(fleet, "other", "b")
    label(fleet, NODE, "b")
    events = drain(stream)
    assert [(kind, e["type"], e["object"]["metadata"]["name"]) for kind, e in events] == [
        ("line", "MODIFIED", NODE)]  # the other node's change is not this watch's
    fleet.loop.run_until(BOOKMARK_EVERY_S)
    fleet.loop.run_until(150)
    events = drain(stream)
    bookmarks = [e for kind, e in events if kind == "line" and e["type"] == "BOOKMARK"]
    assert len(bookmarks) == 3  # at 60 s, 120 s, and 2 s before the end
    assert all(b["object"]["metadata"]["resourceVersion"] == str(fleet.api.resource_version) for b in bookmarks)
    assert events[-1] == ("end", None) and fleet.open_watches[NODE] == 0
    assert sum(fleet.watch_bytes.values()) > 0


def test_a_version_older_than_the_watch_cache_window_is_gone(fleet: FleetServer) -> None:
    old = str(fleet.api.resource_version)
    label(fleet, NODE, "1")
    assert drain(watch(fleet, old))[0][1]["type"] == "MODIFIED"  # the change is still in the window
    fleet.loop.run_until(WATCH_CACHE_WINDOW_S + 1)
    label(fleet, NODE, "2")
    (error, end) = drain(watch(fleet, old))
    assert error[1]["type"] == "ERROR" and error[1]["object"]["code"] == 410 and end == ("end", None)
    current = drain(watch(fleet, str(fleet.api.resource_version)))
    assert current == []  # open, nothing yet


def test_faults_answer_503_429_with_retry_after_410_and_cut_watches(fleet: FleetServer) -> None:
    stream = watch(fleet, str(fleet.api.resource_version))
    assert fleet.cut_watches() == 1 and stream.take()[0] == "cut"
    fleet.unavailable = True
    assert ask(fleet, f"{NODES}/{NODE}").status == 503
    fleet.unavailable = False
    fleet.reject_fraction, fleet.retry_after_s = 1.0, 5
    throttled = ask(fleet, f"{NODES}/{NODE}")
    assert throttled.status == 429 and throttled.headers["Retry-After"] == "5"
    assert json.loads(throttled.data)["details"]["retryAfterSeconds"] == 5
    fleet.reject_fraction = 0.0
    fleet.watch_gone = True
    (error, _) = drain(watch(fleet, str(fleet.api.resource_version)))
    assert error[1]["object"]["code"] == 410
    assert [r.status for r in fleet.records] == [200, 503, 429, 200]


def test_watches_are_selected_by_name_only(fleet: FleetServer) -> None:
    answer = ask(fleet, f"{NODES}?watch=true&labelSelector=a%3Db")
    assert answer.status == 400


def test_koordlets_client_runs_through_the_in_process_transport(fleet: FleetServer) -> None:
    clock = VirtualClock(fleet.loop)
    client = KubeClient(InProcessApiClient(fleet, NODE, token=TOKEN), Budget(clock=clock, sleep=None), clock=clock)
    core = CoreV1(client)
    assert core.read_node(NODE, resource_version="0")["metadata"]["name"] == NODE
    listed = core.list_node(field_selector=f"metadata.name={NODE}", resource_version="0")
    assert [item["metadata"]["name"] for item in listed["items"]] == [NODE]
    with pytest.raises(Exception) as missing:
        CustomObjects(client).get_cluster_custom_object("slo.koordinator.sh", "v1alpha1", "nodemetrics", NODE)
    assert getattr(missing.value, "status", None) == 404
    assert [(r.verb, r.consistent) for r in fleet.records] == [("get", False), ("list", False), ("get", True)]


def test_the_event_loop_runs_in_time_order_and_skips_what_was_cancelled() -> None:
    loop = EventLoop()
    ran: list[tuple[float, str]] = []
    loop.call_at(5.0, lambda: ran.append((loop.now, "b")))
    loop.call_at(1.0, lambda: ran.append((loop.now, "a")))
    loop.call_at(3.0, lambda: ran.append((loop.now, "never"))).cancel()
    loop.call_later(7.0, lambda: loop.call_later(1.0, lambda: ran.append((loop.now, "c"))))
    loop.run_until(10.0)
    assert ran == [(1.0, "a"), (5.0, "b"), (8.0, "c")] and loop.now == 10.0
