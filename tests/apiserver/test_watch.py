"""Watches: ADDED/MODIFIED/DELETED in order, resume from a resourceVersion, selectors, stop()."""

from __future__ import annotations

import threading
import time

import kubernetes.client
import pytest
from kubernetes import watch
from kubernetes.client.exceptions import ApiException

from tests.support.apiserver import ApiServer, kube_api_client

SLO = ("slo.koordinator.sh", "v1alpha1", "nodeslos")


def _node(name: str, labels: dict | None = None) -> dict:
    return {"metadata": {"name": name, "labels": labels or {}}}


def test_watch_from_resource_version_delivers_added_modified_deleted(
        core: kubernetes.client.CoreV1Api) -> None:
    start = core.list_node().metadata.resource_version
    core.create_node(_node("node-1"))
    core.patch_node("node-1", {"metadata": {"labels": {"x": "1"}}})
    core.delete_node("node-1")
    seen = []
    watcher = watch.Watch()
    for event in watcher.stream(core.list_node, resource_version=start, timeout_seconds=2):
        seen.append((event["type"], event["object"].metadata.name, event["object"].metadata.labels))
        if len(seen) == 3:
            watcher.stop()
    assert seen == [("ADDED", "node-1", None), ("MODIFIED", "node-1", {"x": "1"}),
                    ("DELETED", "node-1", {"x": "1"})]


def test_watch_without_resource_version_starts_with_current_objects_and_follows_changes(
        server: ApiServer, custom: kubernetes.client.CustomObjectsApi) -> None:
    from tests.apiserver.test_custom_objects import koordinator_node_slo

    custom.create_cluster_custom_object(*SLO, koordinator_node_slo("node-1"))

    def later_change() -> None:  # once the watch has taken its initial snapshot
        deadline = time.monotonic() + 5
        while not [r for r in server.requests("GET", r"/nodeslos$") if r.query.get("watch")]:
            if time.monotonic() > deadline:
                return
            time.sleep(0.02)
        custom.patch_cluster_custom_object(*SLO, "node-1", {"spec": {"cpuBurstStrategy": {"policy": "auto"}}})

    changer = threading.Thread(target=later_change)
    changer.start()
    try:
        seen = []
        watcher = watch.Watch()
        for event in watcher.stream(custom.list_cluster_custom_object, *SLO, timeout_seconds=5):
            seen.append((event["type"], event["object"]["spec"]["cpuBurstStrategy"]["policy"]))
            if len(seen) == 2:
                watcher.stop()
    finally:
        changer.join()
    assert seen == [("ADDED", "none"), ("MODIFIED", "auto")]


def test_label_selector_watch_sees_an_object_leave_as_deleted(core: kubernetes.client.CoreV1Api) -> None:
    start = core.list_node().metadata.resource_version
    core.create_node(_node("node-1", {"pool": "gpu"}))
    core.create_node(_node("node-2", {"pool": "cpu"}))
    core.patch_node("node-1", {"metadata": {"labels": {"pool": "cpu"}}})
    seen = []
    watcher = watch.Watch()
    for event in watcher.stream(core.list_node, label_selector="pool=gpu", resource_version=start,
                                timeout_seconds=1):
        seen.append((event["type"], event["object"].metadata.name))
        if len(seen) == 2:
            watcher.stop()
    assert seen == [("ADDED", "node-1"), ("DELETED", "node-1")]


def test_watch_ends_at_timeout_seconds(core: kubernetes.client.CoreV1Api) -> None:
    began = time.monotonic()
    events = list(watch.Watch().stream(core.list_node, resource_version="1", timeout_seconds=1))
    assert events == [] and 0.9 <= time.monotonic() - began < 5


def test_resuming_from_a_compacted_resource_version_is_410_gone() -> None:
    with ApiServer(watch_log_size=4) as server, kube_api_client(server) as client:
        core = kubernetes.client.CoreV1Api(client)
        for index in range(6):
            core.create_node(_node(f"node-{index}"))
        with pytest.raises(ApiException) as caught:
            list(watch.Watch().stream(core.list_node, resource_version="1", timeout_seconds=1))
        assert caught.value.status == 410


def test_stop_closes_open_watches_and_returns_promptly() -> None:
    server = ApiServer().start()
    client = kube_api_client(server)
    finished = threading.Event()

    def watch_forever() -> None:
        try:
            for _ in watch.Watch().stream(kubernetes.client.CoreV1Api(client).list_node, timeout_seconds=60,
                                          _request_timeout=30):
                pass
        except Exception:  # noqa: BLE001 - any end of the stream is fine here, only its promptness counts
            pass
        finished.set()

    watcher = threading.Thread(target=watch_forever)
    watcher.start()
    try:
        deadline = time.monotonic() + 5
        while not server.requests("GET", r"/api/v1/nodes$") and time.monotonic() < deadline:
            time.sleep(0.02)
        began = time.monotonic()
        server.stop()
        assert time.monotonic() - began < 5
        assert finished.wait(5)
    finally:
        server.stop()
        watcher.join(10)
        client.close()
