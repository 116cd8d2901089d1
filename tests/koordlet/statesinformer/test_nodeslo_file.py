from __future__ import annotations

import os
from pathlib import Path

import pytest

from koordlet.api.nodeslo import default_node_slo_spec
from koordlet.statesinformer.informer import StatesInformer
from koordlet.statesinformer.nodeslo_file import NodeSLOFileError, NodeSLOFileWatcher, load_node_slo_file
from tests.koordlet.statesinformer.waiting import wait_for

GOOD = """\
apiVersion: slo.koordinator.sh/v1alpha1
kind: NodeSLO
metadata: {name: node-1}
spec:
  resourceUsedThresholdWithBE:
    enable: true
    cpuSuppressThresholdPercent: 55
"""


class NoPods:
    name = "none"

    def list_pods(self) -> tuple:
        return ()


def test_object_or_bare_spec_both_load(tmp_path: Path) -> None:
    path = tmp_path / "slo.yaml"
    path.write_text(GOOD)
    assert load_node_slo_file(str(path)).resource_used_threshold_with_be.cpu_suppress_threshold_percent == 55
    path.write_text("resourceUsedThresholdWithBE: {enable: true, cpuSuppressThresholdPercent: 44}\n")
    assert load_node_slo_file(str(path)).resource_used_threshold_with_be.cpu_suppress_threshold_percent == 44


def test_missing_or_empty_file_means_defaults(tmp_path: Path) -> None:
    assert load_node_slo_file(str(tmp_path / "absent.yaml")) == default_node_slo_spec()
    (tmp_path / "empty.yaml").write_text("")
    assert load_node_slo_file(str(tmp_path / "empty.yaml")) == default_node_slo_spec()


@pytest.mark.parametrize("text,match", [
    ("spec: [unclosed", "not YAML"),
    ("- a list\n", "expected a mapping"),
    ("kind: NodeMetric\nspec: {}\n", "is not NodeSLO"),
    ("resourceUsedThresholdWithBE: {cpuSuppressThresholdPercent: 170}\n", "cpuSuppressThresholdPercent"),
])
def test_bad_file_is_rejected_with_reason(tmp_path: Path, text: str, match: str) -> None:
    path = tmp_path / "slo.yaml"
    path.write_text(text)
    with pytest.raises(NodeSLOFileError, match=match):
        load_node_slo_file(str(path))


def test_watcher_follows_edits_and_keeps_last_good_on_bad_edit(tmp_path: Path) -> None:
    path = tmp_path / "slo.yaml"
    path.write_text(GOOD)
    errors: list[str] = []
    informer = StatesInformer(NoPods(), count_error=errors.append, needs_node=False)
    watcher = NodeSLOFileWatcher(str(path), informer)
    watcher.start()
    try:
        threshold = lambda: informer.node_slo().resource_used_threshold_with_be.cpu_suppress_threshold_percent  # noqa: E731
        assert threshold() == 55
        # Replaced atomically, as editors and ConfigMap volumes do.
        tmp = tmp_path / ".slo.yaml.new"
        tmp.write_text(GOOD.replace("55", "60"))
        os.replace(tmp, path)
        assert wait_for(lambda: threshold() == 60)
        path.write_text("resourceUsedThresholdWithBE: {cpuSuppressThresholdPercent: -5}\n")
        assert wait_for(lambda: watcher.rejections >= 1)
        assert threshold() == 60
        assert "nodeslo" in errors
    finally:
        watcher.stop()
