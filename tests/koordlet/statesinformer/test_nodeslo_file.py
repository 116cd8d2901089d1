from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from prometheus_client import REGISTRY

from koordlet.api.nodeslo import default_node_slo_spec
from koordlet.statesinformer.informer import StatesInformer
from koordlet.statesinformer.nodeslo_file import NodeSLOFileError, NodeSLOFileWatcher, load_node_slo_file
from tests.support.waiting import wait_for

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


def _alias_bomb(levels: int = 8, width: int = 9) -> str:
    """The billion-laughs shape: 8 levels of 9 aliases (~400 bytes naming 9**9 strings), aimed at a field
    the spec parser walks."""
    lines = [f"a0: &a0 [{', '.join(['x'] * width)}]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * width)}]" for i in range(1, levels + 1)]
    return "\n".join(lines) + f"\nresourceQOSStrategy: *a{levels}\n"


HOSTILE = {
    "alias_bomb.yaml": _alias_bomb(),
    "nested_lists.yaml": "[" * 20000 + "]" * 20000 + "\n",
    "huge_integer.yaml": "resourceUsedThresholdWithBE: {enable: true, cpuSuppressThresholdPercent: "
                         + "9" * 5000 + "}\n",
    "python_tag.yaml": "spec: !!python/object/apply:os.system ['true']\n",
    "not_utf8.yaml": b"resourceUsedThresholdWithBE:\n  enable: \xff\xfe\n",
    "binary.yaml": bytes(range(256)) * 4,
    "tab_indent.yaml": "a:\n\t- b\n",
    "spec_is_a_list.yaml": "kind: NodeSLO\napiVersion: v1\nspec: [1, 2]\n",
    "kind_is_a_number.yaml": "kind: 5\napiVersion: v1\nspec: {}\n",
    "thresholds_list.yaml": "resourceUsedThresholdWithBE: [1, 2]\n",
    "too_large.yaml": "# " + "x" * (1 << 20) + "\n",
    "deep_mapping.yaml": "x:\n" + "".join("  " * (i + 1) + f"k{i}:\n" for i in range(200)),
    # values PyYAML's constructors refuse with ValueError (each once ended in a logged traceback)
    "bad_month.yaml": "resourceUsedThresholdWithBE: {enable: 2026-13-45}\n",
    "february_30.yaml": "resourceUsedThresholdWithBE: {enable: 2026-02-30}\n",
    "hour_25.yaml": "resourceUsedThresholdWithBE: {enable: 2026-01-01 25:00:00}\n",
    "int_tag_not_a_number.yaml": "resourceUsedThresholdWithBE: {cpuSuppressThresholdPercent: !!int abc}\n",
    "float_tag_not_a_number.yaml": "resourceUsedThresholdWithBE: {cpuSuppressThresholdPercent: !!float abc}\n",
    "nul_byte.yaml": "resourceUsedThresholdWithBE:\n  enable: \x00\n",
}


def _rss_kib() -> int:
    with open("/proc/self/status", encoding="ascii") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_file_is_one_bounded_rejection(tmp_path: Path, name: str) -> None:
    path = tmp_path / name
    content = HOSTILE[name]
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    before = _rss_kib()
    started = time.perf_counter()
    with pytest.raises(NodeSLOFileError) as caught:
        load_node_slo_file(str(path))
    elapsed = time.perf_counter() - started
    assert elapsed < 2.0, f"{name}: rejected after {elapsed:.2f}s"
    assert _rss_kib() - before < 16 * 1024, f"{name}: RSS grew by {(_rss_kib() - before) // 1024} MiB"
    message = str(caught.value)
    assert "\n" not in message and str(path) in message and len(message) < 400
    assert caught.value.reason in {"alias", "too_deep", "syntax", "encoding", "shape", "invalid", "too_large"}


def test_rejections_are_counted_by_reason_and_the_last_good_spec_stays(tmp_path: Path) -> None:
    path = tmp_path / "slo.yaml"
    path.write_text(GOOD)
    errors: list[str] = []
    informer = StatesInformer(NoPods(), count_error=errors.append, needs_node=False)
    watcher = NodeSLOFileWatcher(str(path), informer)
    assert watcher.reload()
    counted = lambda reason: REGISTRY.get_sample_value(  # noqa: E731
        "koordlet_node_slo_file_rejected_total", {"reason": reason}) or 0.0
    for name, reason in (("alias_bomb.yaml", "alias"), ("nested_lists.yaml", "too_deep"),
                         ("spec_is_a_list.yaml", "invalid")):
        before = counted(reason)
        path.write_text(HOSTILE[name])
        assert not watcher.reload()
        assert counted(reason) == before + 1, name
        assert informer.node_slo().resource_used_threshold_with_be.cpu_suppress_threshold_percent == 55
    assert errors.count("nodeslo") == 3


def test_watcher_reads_an_unchanged_file_once_and_reloads_only_on_new_content(tmp_path: Path) -> None:
    path = tmp_path / "slo.yaml"
    path.write_text(GOOD)
    informer = StatesInformer(NoPods(), count_error=lambda source: None, needs_node=False)
    applied: list[int] = []
    set_node_slo = informer.set_node_slo

    def counting(spec, origin=None):  # type: ignore[no-untyped-def]
        applied.append(spec.resource_used_threshold_with_be.cpu_suppress_threshold_percent)
        set_node_slo(spec, origin)

    informer.set_node_slo = counting  # type: ignore[method-assign]
    watcher = NodeSLOFileWatcher(str(path), informer, settle_s=0.05)
    watcher.start()
    try:
        time.sleep(3.0)  # its own reads (open, close without write) must not look like changes
        assert (watcher.reloads, applied) == (1, [55])
        path.write_text(GOOD)  # written, same bytes: read, not applied again
        time.sleep(0.5)
        assert (watcher.reloads, applied) == (1, [55])
        path.write_text(GOOD.replace("55", "61"))
        assert wait_for(lambda: applied == [55, 61])
        tmp = tmp_path / ".slo.yaml.new"
        tmp.write_text(GOOD.replace("55", "62"))
        os.replace(tmp, path)
        assert wait_for(lambda: applied == [55, 61, 62])
        time.sleep(1.0)
        assert watcher.reloads == 3
    finally:
        watcher.stop()


def test_every_hostile_file_through_the_watcher_is_one_counted_line_and_no_traceback(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    thread_errors: list[str] = []
    monkeypatch.setattr("threading.excepthook", lambda args: thread_errors.append(repr(args.exc_value)))
    path = tmp_path / "slo.yaml"
    path.write_text(GOOD)
    informer = StatesInformer(NoPods(), count_error=lambda source: None, needs_node=False)
    watcher = NodeSLOFileWatcher(str(path), informer, settle_s=0.05)
    watcher.start()
    try:
        for name in sorted(HOSTILE):
            path.write_text(GOOD.replace("55", "56"))
            assert wait_for(lambda: informer.node_slo().resource_used_threshold_with_be
                            .cpu_suppress_threshold_percent == 56), name
            path.write_text(GOOD)
            assert wait_for(lambda: informer.node_slo().resource_used_threshold_with_be
                            .cpu_suppress_threshold_percent == 55), name
            rejections = watcher.rejections
            caplog.clear()
            content = HOSTILE[name]
            path.write_bytes(content if isinstance(content, bytes) else content.encode())
            assert wait_for(lambda expected=rejections + 1: watcher.rejections == expected), name
            time.sleep(0.3)  # long enough for a second (wrong) reload to show
            lines = [r for r in caplog.records if "NodeSLO rejected" in r.getMessage()]
            assert len(lines) == 1 and watcher.rejections == rejections + 1, (name, caplog.text)
            assert str(path) in lines[0].getMessage() and "\n" not in lines[0].getMessage()
            assert not [r for r in caplog.records if r.exc_info], (name, caplog.text)
            assert informer.node_slo().resource_used_threshold_with_be.cpu_suppress_threshold_percent == 55
        assert thread_errors == []
    finally:
        watcher.stop()


def test_a_configmap_symlink_swap_is_applied(tmp_path: Path) -> None:
    """kubelet updates a ConfigMap volume by writing a new timestamped directory and renaming a ``..data``
    symlink onto it; the file the agent names is a symlink through ``..data`` that never changes itself."""
    def publish(version: str, text: str) -> None:
        (tmp_path / version).mkdir()
        (tmp_path / version / "slo.yaml").write_text(text)
        (tmp_path / "..data_tmp").symlink_to(version)
        os.rename(tmp_path / "..data_tmp", tmp_path / "..data")

    publish("..2026_11_24_00_00_00.1", GOOD)
    (tmp_path / "slo.yaml").symlink_to("..data/slo.yaml")
    informer = StatesInformer(NoPods(), count_error=lambda source: None, needs_node=False)
    watcher = NodeSLOFileWatcher(str(tmp_path / "slo.yaml"), informer, settle_s=0.05)
    watcher.start()
    try:
        threshold = lambda: informer.node_slo().resource_used_threshold_with_be.cpu_suppress_threshold_percent  # noqa: E731
        assert threshold() == 55
        publish("..2026_11_24_00_01_00.2", GOOD.replace("55", "63"))
        assert wait_for(lambda: threshold() == 63)
        publish("..2026_11_24_00_02_00.3", GOOD.replace("55", "64"))
        assert wait_for(lambda: threshold() == 64)
        assert watcher.reloads == 3
    finally:
        watcher.stop()
