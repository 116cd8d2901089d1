"""Dropped hook values are reported: counted every time, logged once per (pod, container, key, value), and a
Warning Event on the pod the first time, written to the project's API server."""

from __future__ import annotations

import logging

import kubernetes.client
import pytest
from prometheus_client import REGISTRY

from hooks.validate import Rejected
from koordlet.api.pod import PodMeta
from koordlet.events import PodEvents
from koordlet.runtimehooks.apply import RejectedValues
from tests.support.apiserver import ApiServer

POD = PodMeta(name="job", namespace="default", uid="uid-1", labels={}, annotations={})


def _counted(key: str) -> float:
    return REGISTRY.get_sample_value("koordlet_runtime_hook_value_rejected_total", {"key": key}) or 0.0


def test_dropped_values_are_counted_logged_once_and_reported_as_one_warning_event(
        server: ApiServer, api_client: kubernetes.client.ApiClient, caplog: pytest.LogCaptureFixture) -> None:
    rejects = RejectedValues(PodEvents("node-1", api_client).warning)
    report = rejects.reporter(POD, "job")
    dropped = [Rejected("cpuset_cpus", "0-63", "CPUs [2, 3] are not online on this node")]
    before = _counted("cpuset_cpus")
    with caplog.at_level(logging.WARNING, logger="koordlet.runtimehooks.apply"):
        for _ in range(5):  # the reconciler sees the same pod every pass
            report(dropped)
    assert _counted("cpuset_cpus") == before + 5
    lines = [r.getMessage() for r in caplog.records if "hook values dropped" in r.getMessage()]
    assert len(lines) == 1 and "default/job/job" in lines[0] and "cpuset_cpus='0-63'" in lines[0]
    (event,) = server.list_objects("events", "default")
    assert event["type"] == "Warning" and event["reason"] == "KoordletHookValueRejected"
    assert event["involvedObject"]["uid"] == "uid-1" and "0-63" in event["message"]
    report([Rejected("cpuset_cpus", "64", "CPUs [64] are not online on this node")])  # a new value: reported
    assert len(server.list_objects("events", "default")) == 2


def test_without_an_api_server_values_are_still_logged_and_counted(caplog: pytest.LogCaptureFixture) -> None:
    rejects = RejectedValues()
    before = _counted("memory_limit_bytes")
    with caplog.at_level(logging.WARNING, logger="koordlet.runtimehooks.apply"):
        rejects.report(POD, "", [Rejected("memory_limit_bytes", 1, "below one page (4096 bytes)")])
    assert _counted("memory_limit_bytes") == before + 1
    assert any("default/job" in r.getMessage() for r in caplog.records)
