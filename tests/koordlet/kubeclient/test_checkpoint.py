"""The API checkpoint (koordlet/kubeclient/checkpoint.py): what it gives back after a restart, and what it refuses."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest

from koordlet.kubeclient.checkpoint import MAX_FILE_BYTES, ApiCheckpoint


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def monotonic(self) -> float:
        return self.now

    def time(self) -> float:
        return self.now


OBJ = {"apiVersion": "slo.koordinator.sh/v1alpha1", "kind": "NodeMetric",
       "metadata": {"name": "node-1", "resourceVersion": "42"}, "spec": {}}


def test_an_object_put_is_taken_back_once_by_the_next_process_while_young(tmp_path: Path) -> None:
    clock, path = Clock(), str(tmp_path / "c.json")
    ApiCheckpoint(path, clock=clock, max_age_s=600).put("nodemetrics/node-1", OBJ)
    assert oct(os.stat(path).st_mode & 0o777) == "0o600"
    clock.now += 599
    again = ApiCheckpoint(path, clock=clock, max_age_s=600)
    assert again.take("nodemetrics/node-1", "node-1") == OBJ
    assert again.take("nodemetrics/node-1", "node-1") is None  # once
    clock.now += 2
    assert ApiCheckpoint(path, clock=clock, max_age_s=600).take("nodemetrics/node-1", "node-1") is None  # too old


def test_another_nodes_object_or_one_without_a_version_is_not_taken(tmp_path: Path) -> None:
    clock, path = Clock(), str(tmp_path / "c.json")
    first = ApiCheckpoint(path, clock=clock)
    first.put("a", OBJ)
    first.put("b", {**OBJ, "metadata": {"name": "node-1"}})
    first.put("c", {**OBJ, "metadata": {"name": "node-1", "resourceVersion": ""}})
    again = ApiCheckpoint(path, clock=clock)
    assert again.take("a", "node-2") is None
    assert again.take("b", "node-1") is None and again.take("c", "node-1") is None
    clock.now -= 10  # a clock that went back: the record is from the future, not used
    assert ApiCheckpoint(path, clock=clock).take("a", "node-1") is None


def test_a_file_that_cannot_be_written_is_logged_once_and_never_raised(tmp_path: Path,
                                                                         caplog: pytest.LogCaptureFixture) -> None:
    checkpoint = ApiCheckpoint(str(tmp_path / "missing-dir" / "c.json"), clock=Clock())
    with caplog.at_level(logging.WARNING, logger="koordlet.kubeclient.checkpoint"):
        checkpoint.put("a", OBJ)
        checkpoint.put("a", OBJ)
    assert len([r for r in caplog.records if "not written" in r.getMessage()]) == 1
    assert checkpoint.take("a", "node-1") == OBJ  # kept in memory all the same


def test_an_oversized_file_is_ignored(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"a": {"at": 1, "object": OBJ}, "pad": "x" * MAX_FILE_BYTES}))
    with caplog.at_level(logging.WARNING, logger="koordlet.kubeclient.checkpoint"):
        assert ApiCheckpoint(str(path), clock=Clock()).take("a", "node-1") is None
    assert "ignored" in caplog.text


def test_an_empty_path_keeps_nothing_on_disk(tmp_path: Path) -> None:
    checkpoint = ApiCheckpoint("", clock=Clock())
    checkpoint.put("a", OBJ)
    assert checkpoint.path is None and list(tmp_path.iterdir()) == []
