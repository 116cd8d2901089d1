"""The node lock against a real API server (tests/support/apiserver.py) through koordlet.kubeapi."""

import threading
import time
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kubernetes.client.exceptions import ApiException

from koordlet.api import device as api
from koordlet.nodelock import (
    NodeLock,
    NodeLockConflictError,
    NodeLocker,
    NodeLockError,
    NodeLockHeldError,
    NodeLockValueError,
    parse_lock_value,
)
from tests.koordlet.deviceplugin.kube import gpu_pod, node_annotations, set_node_lock, warning_events

NODE = "node-a"


KEY = api.ANNOTATION_NODE_LOCK


class Clock:
    def __init__(self) -> None:
        self.now = datetime(2026, 11, 23, 7, 0, 0, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now


def test_lock_value_is_rfc3339_namespace_pod() -> None:
    lock = NodeLock(datetime(2026, 11, 23, 7, 0, 0, tzinfo=UTC), "ns", "p")
    assert lock.value() == "2026-11-23T07:00:00Z,ns,p"
    assert parse_lock_value(lock.value()) == lock
    assert parse_lock_value("2026-11-23T15:00:00+08:00,ns,p").acquired_at == lock.acquired_at
    assert parse_lock_value("2026-11-23T07:00:00.123456789Z,ns,p").acquired_at.microsecond == 123456


def test_legacy_timestamp_only_lock_is_read_without_owner() -> None:
    lock = parse_lock_value("2026-11-23T07:00:00Z")
    assert lock.pod == "" and lock.namespace == ""


@pytest.mark.parametrize("value", ["yesterday,ns,p", "2026-11-23T07:00:00Z,ns", "2026-11-23T07:00:00Z,,p",
                                   "2026-11-23T07:00:00"])
def test_garbled_lock_value_is_rejected(value: str) -> None:
    with pytest.raises(NodeLockValueError):
        parse_lock_value(value)


@given(st.text(max_size=60))
def test_any_annotation_value_parses_or_raises_the_value_error(value: str) -> None:
    try:
        lock = parse_lock_value(value)
    except NodeLockValueError:
        return
    assert lock.acquired_at.tzinfo is not None


def test_lock_sets_the_annotation_and_release_removes_it(kube) -> None:
    kube.node(NODE)
    clock = Clock()
    locker = NodeLocker(kube.agent_core, clock=clock)
    taken = locker.lock(NODE, "ns", "p1")
    assert node_annotations(kube, NODE)[KEY] == "2026-11-23T07:00:00Z,ns,p1"
    assert locker.current(NODE) == taken
    assert locker.release(NODE, "ns", "p1") is True
    assert KEY not in node_annotations(kube, NODE)
    assert locker.release(NODE, "ns", "p1") is False, "releasing twice is harmless"


def test_live_lock_of_another_pod_fails_and_same_pod_gets_it_back(kube) -> None:
    kube.node(NODE)
    kube.pod(gpu_pod("p1", node=NODE))
    clock = Clock()
    locker = NodeLocker(kube.agent_core, clock=clock)
    first = locker.lock(NODE, "ns", "p1")
    clock.now += timedelta(minutes=4, seconds=59)
    with pytest.raises(NodeLockHeldError, match="locked by ns/p1"):
        locker.lock(NODE, "ns", "p2")
    assert locker.lock(NODE, "ns", "p1") == first
    assert locker.release(NODE, "ns", "p2") is False, "a pod cannot release another pod's lock"
    assert node_annotations(kube, NODE)[KEY] == first.value()


def test_expired_lock_is_not_handed_over_while_its_owner_still_waits_for_devices(kube) -> None:
    kube.node(NODE)
    kube.pod(gpu_pod("p1", node=NODE))
    clock = Clock()
    locker = NodeLocker(kube.agent_core, clock=clock)
    locker.lock(NODE, "ns", "p1")
    clock.now += timedelta(minutes=6)
    with pytest.raises(NodeLockHeldError, match="still pending on the node"):
        locker.lock(NODE, "ns", "p2")
    # Once its devices are bound the owner no longer needs the (expired) lock.
    kube.core.patch_namespaced_pod(
        "p1", "ns", {"metadata": {"annotations": {api.ANNOTATION_DEVICE_BOUND: '{"main":[0]}'}}}
    )
    assert locker.lock(NODE, "ns", "p2").pod == "p2"


def test_expired_lock_of_a_running_or_deleted_owner_is_taken_over(kube) -> None:
    kube.node(NODE)
    kube.pod(gpu_pod("p1", node=NODE, phase="Running"))
    clock = Clock()
    locker = NodeLocker(kube.agent_core, clock=clock)
    locker.lock(NODE, "ns", "p1")
    clock.now += timedelta(minutes=5, seconds=1)
    assert locker.lock(NODE, "ns", "p2").pod == "p2"
    clock.now += timedelta(minutes=6)
    assert locker.lock(NODE, "ns", "p3").pod == "p3", "p2 does not exist: expired and dangling"


def test_live_lock_of_a_deleted_pod_is_dangling_and_taken_over(kube) -> None:
    kube.node(NODE)
    locker = NodeLocker(kube.agent_core, clock=Clock())
    locker.lock(NODE, "ns", "gone")
    assert locker.lock(NODE, "ns", "p2").pod == "p2"


def test_held_releases_on_every_path(kube) -> None:
    kube.node(NODE)
    locker = NodeLocker(kube.agent_core)
    with pytest.raises(RuntimeError, match="bind failed"), locker.held(NODE, "ns", "p1"):
        assert KEY in node_annotations(kube, NODE)
        raise RuntimeError("bind failed")
    assert KEY not in node_annotations(kube, NODE)


@pytest.mark.alone  # six binders racing with five conflict retries each: a loaded machine lets one run out
def test_concurrent_binds_never_share_the_lock_and_never_lose_a_release(kube) -> None:
    kube.node(NODE)
    pods = [f"p{i}" for i in range(6)]
    for name in pods:
        kube.pod(gpu_pod(name, node=NODE, phase="Running"))
    inside: list[str] = []
    overlaps: list[tuple[str, ...]] = []
    wins: dict[str, int] = dict.fromkeys(pods, 0)
    guard = threading.Lock()
    errors: list[BaseException] = []

    def bind(name: str) -> None:
        locker = NodeLocker(kube.agent_core, backoff_s=0.005)
        try:
            while wins[name] < 3:
                try:
                    locker.lock(NODE, "ns", name)
                except NodeLockHeldError:
                    time.sleep(0.002)
                    continue
                with guard:
                    inside.append(name)
                    if len(inside) > 1:
                        overlaps.append(tuple(inside))
                time.sleep(0.002)
                with guard:
                    inside.remove(name)
                assert locker.release(NODE, "ns", name) is True
                wins[name] += 1
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=bind, args=(name,)) for name in pods]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == []
    assert overlaps == []
    assert wins == dict.fromkeys(pods, 3)
    assert KEY not in node_annotations(kube, NODE)


def test_conflicts_are_retried_for_lock_and_release(kube) -> None:
    kube.node(NODE)
    sleeps: list[float] = []
    locker = NodeLocker(kube.agent_core, sleep=sleeps.append)
    kube.server.fail_next("PATCH", rf"/nodes/{NODE}$", status=409, count=2)
    assert locker.lock(NODE, "ns", "p1").pod == "p1"
    kube.server.fail_next("PATCH", rf"/nodes/{NODE}$", status=409, count=4)
    assert locker.release(NODE, "ns", "p1") is True
    assert KEY not in node_annotations(kube, NODE)
    assert len(sleeps) == 6
    assert 0.1 <= sleeps[0] <= 0.15 and 0.2 <= sleeps[1] <= 0.3, "backoff starts at 100 ms and doubles"


def test_stale_resource_version_is_a_conflict_not_a_lost_update(kube) -> None:
    kube.node(NODE)
    stale = kube.core.read_node(NODE).metadata.resource_version
    kube.core.patch_node(NODE, {"metadata": {"labels": {"touched": "yes"}}})
    with pytest.raises(ApiException) as info:
        kube.core.patch_node(NODE, {"metadata": {"resourceVersion": stale, "annotations": {KEY: "x"}}})
    assert info.value.status == 409, "the API server must enforce the optimistic lock the node lock relies on"


def test_conflict_on_every_try_is_a_clear_error(kube) -> None:
    kube.node(NODE)
    locker = NodeLocker(kube.agent_core, sleep=lambda _s: None)
    kube.server.fail_next("PATCH", rf"/nodes/{NODE}$", status=409, count=5)
    with pytest.raises(NodeLockConflictError, match="conflict on every one of 5 tries"):
        locker.lock(NODE, "ns", "p1")
    assert KEY not in node_annotations(kube, NODE)


def test_api_errors_other_than_conflict_are_not_retried(kube) -> None:
    kube.node(NODE)
    locker = NodeLocker(kube.agent_core, sleep=lambda _s: pytest.fail("must not retry"))
    kube.server.fail_next("PATCH", rf"/nodes/{NODE}$", status=403)
    with pytest.raises(NodeLockError, match="403"):
        locker.lock(NODE, "ns", "p1")
    with pytest.raises(NodeLockError, match="404"):
        locker.lock("no-such-node", "ns", "p1")


# -- both lock formats; locks nobody can use (issue #16) ------------------------------------------------


@pytest.mark.parametrize(
    "value, expected",
    [
        # Go's time.RFC3339 (docs/node-lock.md: "value is the system timestamp") and RFC3339Nano forms.
        ("2026-11-23T07:00:00Z", datetime(2026, 11, 23, 7, 0, 0, tzinfo=UTC)),
        ("2026-11-23T15:00:00+08:00", datetime(2026, 11, 23, 7, 0, 0, tzinfo=UTC)),
        ("2026-11-23T02:00:00-05:00", datetime(2026, 11, 23, 7, 0, 0, tzinfo=UTC)),
        ("2026-11-23T07:00:00.5Z", datetime(2026, 11, 23, 7, 0, 0, 500000, tzinfo=UTC)),
        ("2026-11-23T15:00:00.123456789+08:00", datetime(2026, 11, 23, 7, 0, 0, 123456, tzinfo=UTC)),
    ],
)
def test_bare_rfc3339_lock_in_every_form_go_writes_is_read_with_its_raw_value(value: str, expected) -> None:
    lock = parse_lock_value(value)
    assert (lock.acquired_at, lock.namespace, lock.pod) == (expected, "", "")
    assert lock.shown == value, "messages show the value as it is on the node"
    assert parse_lock_value(f"{value},ns,p").shown == f"{value},ns,p"


@pytest.mark.parametrize("value", ["2026-11-23 07:00:00Z", "20261123T070000Z", "2026-11-23T07:00Z",
                                   "2026-11-23T07:00:00+0800", "2026-11-23T07:00:00.Z", "2026-11-23T07:00:00z"])
def test_timestamps_go_would_not_parse_as_rfc3339_are_unreadable_and_quoted_raw(value: str) -> None:
    with pytest.raises(NodeLockValueError) as info:
        parse_lock_value(value)
    assert info.value.value == value
    assert repr(value) in str(info.value)


def test_held_lock_error_shows_the_raw_value_not_a_reformatted_one(kube) -> None:
    kube.node(NODE)
    kube.pod(gpu_pod("p1", node=NODE))
    raw = "2026-11-23T15:00:00.250+08:00,ns,p1"
    set_node_lock(kube, NODE, raw)
    locker = NodeLocker(kube.agent_core, clock=Clock())
    with pytest.raises(NodeLockHeldError, match="locked by ns/p1") as info:
        locker.lock(NODE, "ns", "p2")
    assert repr(raw) in str(info.value)


def test_release_stale_removes_only_that_raw_value_with_a_warning_event(kube) -> None:
    kube.node(NODE)
    raw = "2026-11-23T07:00:00.123456789Z,ns"
    set_node_lock(kube, NODE, raw)
    locker = NodeLocker(kube.agent_core)
    assert locker.release_stale(NODE, "2026-11-23T07:00:00Z", "test") is False, "another value: left alone"
    assert node_annotations(kube, NODE)[KEY] == raw
    assert warning_events(kube) == []
    assert locker.release_stale(NODE, raw, "unreadable", pod="ns/p9") is True
    assert KEY not in node_annotations(kube, NODE)
    (event,) = warning_events(kube)
    assert event["involvedObject"]["kind"] == "Node" and event["involvedObject"]["name"] == NODE
    assert repr(raw) in event["message"] and NODE in event["message"] and "ns/p9" in event["message"]
    assert locker.release_stale(NODE, raw, "again") is False


def test_release_stale_is_a_guarded_patch_retried_on_conflict(kube) -> None:
    kube.node(NODE)
    set_node_lock(kube, NODE, "junk")
    locker = NodeLocker(kube.agent_core, sleep=lambda _s: None)
    kube.server.clear_requests()
    kube.server.fail_next("PATCH", rf"/nodes/{NODE}$", status=409, count=2)
    assert locker.release_stale(NODE, "junk", "unreadable") is True
    patches = kube.server.requests("PATCH", rf"/nodes/{NODE}$")
    assert len(patches) == 3 and all(r.body["metadata"]["resourceVersion"] for r in patches)
    assert KEY not in node_annotations(kube, NODE)


@pytest.mark.parametrize("raw, pod", [("not a lock, at all", ""), ("2026-11-23T07:00:00+08:00,ns,gone", "ns/gone")])
def test_lock_replacing_an_unreadable_or_orphaned_lock_records_a_warning_event_with_the_raw_value(
    kube, raw: str, pod: str
) -> None:
    kube.node(NODE)
    set_node_lock(kube, NODE, raw)
    assert NodeLocker(kube.agent_core, clock=Clock()).lock(NODE, "ns", "p2").pod == "p2"
    (event,) = warning_events(kube)
    assert repr(raw) in event["message"] and NODE in event["message"] and pod in event["message"]


def test_bare_lock_is_released_by_whoever_is_served_only_while_it_is_unchanged(kube) -> None:
    kube.node(NODE)
    set_node_lock(kube, NODE, "2026-11-23T07:00:00Z")
    locker = NodeLocker(kube.agent_core)
    assert locker.release(NODE, "", "", value="2026-11-23T07:00:01Z") is False
    assert locker.release(NODE, "", "", value="2026-11-23T07:00:00Z") is True
    assert KEY not in node_annotations(kube, NODE)
