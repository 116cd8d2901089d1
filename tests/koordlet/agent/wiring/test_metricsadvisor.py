"""The metrics advisor's wiring on a fixture node with kidled (files laid out as an Anolis kernel has them): building
the collector list writes nothing on the node; what an earlier koordlet with gate ``ColdPageCollector`` on left in
kidled's settings goes back in the start of a part of its own, once the gate is off."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from koordlet.agent.context import AgentContext
from koordlet.agent.parts import agent_parts
from koordlet.agent.wiring.executor import executor
from koordlet.agent.wiring.metricsadvisor import collectors, kidled_restore, metric_cache
from koordlet.agent.wiring.states import states_informer_built
from koordlet.config import parse_config
from koordlet.executor import ResourceExecutor
from koordlet.metrics import KoordletMetrics
from koordlet.metricsadvisor.coldpage import ColdPageCollector
from koordlet.system.cgroup import CgroupFS, CgroupVersion

NODE = "wiring-node"


def _kidled(root: Path) -> tuple[str, str]:
    kidled = root / "sys/kernel/mm/kidled"
    return (kidled / "scan_period_in_seconds").read_text().strip(), (kidled / "use_hierarchy").read_text().strip()


def _originals(root: Path) -> dict[str, str]:
    return json.loads((root / "run/originals.json").read_text())["originals"]


@pytest.fixture
def node_left_by_a_crash(tmp_path: Path) -> Path:
    """kidled as the node had it (0, 0), started by a koordlet with the gate on (5, 1, recorded), which then died
    without putting it back."""
    kidled = tmp_path / "sys/kernel/mm/kidled"
    kidled.mkdir(parents=True)
    (kidled / "scan_period_in_seconds").write_text("0\n")
    (kidled / "use_hierarchy").write_text("0\n")
    (tmp_path / "proc").mkdir()
    (tmp_path / "cgroup/memory").mkdir(parents=True)
    fs = CgroupFS(str(tmp_path / "cgroup"), CgroupVersion.V1)
    earlier = ResourceExecutor(fs, sys_dir=str(tmp_path / "sys"), proc_dir=str(tmp_path / "proc"),
                               originals_file=str(tmp_path / "run/originals.json"))
    assert ColdPageCollector(tuple, fs, executor=earlier, sys_dir=str(tmp_path / "sys"),
                             proc_dir=str(tmp_path / "proc")).enabled()
    assert _kidled(tmp_path) == ("5", "1")
    assert _originals(tmp_path) == {"kidled_scan_period_in_seconds": "0", "kidled_use_hierarchy": "0"}
    return tmp_path


@contextmanager
def _context(root: Path, *flags: str) -> Iterator[AgentContext]:
    """The agent's context on the fixture node, built by the real factories up to the states informer."""
    config = parse_config(["-local-mode", f"-node-slo-file={root / 'slo.yaml'}", f"-cri-endpoint={root / 'cri.sock'}",
                           f"-sys-root-dir={root / 'sys'}", f"-proc-root-dir={root / 'proc'}",
                           f"-cgroup-root-dir={root / 'cgroup'}", f"-report-dir={root}",
                           f"-system-config-record-file={root / 'run/originals.json'}", *flags], {"NODE_NAME": NODE})
    ctx = AgentContext(config, KoordletMetrics(NODE))
    for factory in (executor, metric_cache, states_informer_built):
        assert factory(ctx) is None
    try:
        yield ctx
    finally:
        ctx.pod_source.close()


def test_building_the_collectors_writes_nothing_and_the_gate_off_puts_kidled_back_when_its_part_starts(
        node_left_by_a_crash: Path) -> None:
    root = node_left_by_a_crash
    with _context(root) as ctx:
        built = collectors(ctx)
        assert not any(isinstance(collector, ColdPageCollector) for collector in built)
        assert _kidled(root) == ("5", "1")  # building wrote nothing...
        assert _originals(root) == {"kidled_scan_period_in_seconds": "0", "kidled_use_hierarchy": "0"}
        part = kidled_restore(ctx)
        assert part is not None and _kidled(root) == ("5", "1")  # ...nor did building the part
        part.start()
        assert _kidled(root) == ("0", "0") and _originals(root) == {}
        assert part.stop(1.0)


def test_with_the_gate_on_the_cold_page_collector_is_built_without_starting_kidled_and_no_part_restores_it(
        node_left_by_a_crash: Path) -> None:
    root = node_left_by_a_crash
    (root / "sys/kernel/mm/kidled/use_hierarchy").write_text("0\n")  # the operator's change since
    with _context(root, "-feature-gates=ColdPageCollector=true") as ctx:
        assert kidled_restore(ctx) is None
        assert any(isinstance(collector, ColdPageCollector) for collector in collectors(ctx))
        assert _kidled(root) == ("5", "0")  # kidled is started by the collector's own start (enabled()), not here


def test_kidled_is_put_back_before_the_metrics_advisor_starts() -> None:
    names = [part.name for part in agent_parts([])]
    assert names.index("kidled restore") + 1 == names.index("metrics advisor")
