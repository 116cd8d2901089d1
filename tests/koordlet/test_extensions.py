"""Out-of-tree QoS strategies and hook plugins from Python entry points (koordlet/extensions.py), switched by
``-qos-extension-plugins``: a small package built here (its files written to a temp dir, installed with pip into a
temp target, no network), its extensions picked up, held to the built-in ones' shape test, named at start, run by
the agent when switched on; the bad ones (import error, wrong shape, impure, a koordlet gate, a taken name)
refused with a clear reason while the agent goes on."""

from __future__ import annotations

import importlib
import logging
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from hooks import registry
from koordlet.agent.lifecycle import Koordlet
from koordlet.agent.wiring.hooks import runtime_hooks
from koordlet.agent.wiring.qos import qos_manager
from koordlet.config import parse_config
from koordlet.extensions import HOOK_PLUGINS_GROUP, LOADED, QOS_STRATEGIES_GROUP, REFUSED, load_extensions
from koordlet.metrics import exposition
from koordlet.qosmanager import STRATEGIES
from koordlet.qosmanager.metrics import STRATEGY_RUNS
from koordlet.shape import plugin_problems, strategy_problems
from tests.koordlet.qosmanager import test_registry

PACKAGE = "kpy_ext_demo"
FILES = {
    "pyproject.toml": f"""
        [build-system]
        requires = ["setuptools"]
        build-backend = "setuptools.build_meta"

        [project]
        name = "koordlet-ext-demo"
        version = "0.1.0"

        [project.entry-points."{QOS_STRATEGIES_GROUP}"]
        demo-guard = "{PACKAGE}.strategy:STRATEGY"
        broken-import = "{PACKAGE}.broken:STRATEGY"
        bad-shape = "{PACKAGE}.badshape:STRATEGY"
        takes-a-gate = "{PACKAGE}.strategy:CLAIMS_A_GATE"
        cpuburst = "{PACKAGE}.strategy:TAKES_A_NAME"

        [project.entry-points."{HOOK_PLUGINS_GROUP}"]
        demo-env = "{PACKAGE}.hook:PLUGIN"
        not-a-plugin = "{PACKAGE}.hook:NOT_A_PLUGIN"
        counting = "{PACKAGE}.hook:IMPURE"
        uses-os = "{PACKAGE}.oshook:PLUGIN"

        [tool.setuptools]
        packages = ["{PACKAGE}"]
        """,
    f"{PACKAGE}/__init__.py": "",
    f"{PACKAGE}/strategy.py": """
        from dataclasses import dataclass

        from koordlet.api.nodeslo import NodeSLOSpec
        from koordlet.plan import Plan
        from koordlet.qosmanager.framework import QoSManagerConfig, Strategy
        from koordlet.qosmanager.snapshot import Needs, Snapshot


        @dataclass(frozen=True, slots=True)
        class Config:
            enabled: bool
            needs: Needs

            @classmethod
            def from_node_slo(cls, spec: NodeSLOSpec, flags: QoSManagerConfig) -> "Config":
                return cls(True, Needs())


        def decide(snapshot: Snapshot, config: Config) -> Plan:
            return Plan(why=f"{len(snapshot.pods)} pods looked at")


        STRATEGY = Strategy("demo-guard", "demo-guard", Config, decide)
        CLAIMS_A_GATE = Strategy("gate-thief", "CPUBurst", Config, decide)
        TAKES_A_NAME = Strategy("cpuburst", "cpuburst", Config, decide)
        """,
    f"{PACKAGE}/broken.py": "import kpy_no_such_module_at_all\n",
    f"{PACKAGE}/badshape.py": """
        from koordlet.plan import Plan
        from koordlet.qosmanager.framework import Strategy
        from kpy_ext_demo.strategy import Config


        def decide(snapshot) -> Plan:
            return Plan()


        STRATEGY = Strategy("bad-shape", "bad-shape", Config, decide)
        """,
    f"{PACKAGE}/hook.py": """
        from hooks.protocol import Changes
        from hooks.registry import Plugin, Stage


        def rule(node):
            return node.node_slo.resource_used_threshold_with_be.enable


        def container(ctx, rule):
            return Changes(envs={"DEMO_EXTENSION": "1"})


        SEEN = []


        def counting(ctx, rule):
            SEEN.append(ctx.name)
            return Changes(envs={"CALLS": str(len(SEEN))})


        PLUGIN = Plugin("demo-env", "demo-env", rule, container=container,
                        stages=frozenset({Stage.PRE_CREATE_CONTAINER}))
        NOT_A_PLUGIN = {"name": "not-a-plugin"}
        IMPURE = Plugin("counting", "counting", rule, container=counting)
        """,
    f"{PACKAGE}/oshook.py": """
        import os

        from hooks.protocol import Changes
        from hooks.registry import Plugin


        def pod(ctx, rule):
            return Changes(envs={"PID": str(os.getpid())})


        PLUGIN = Plugin("uses-os", "uses-os", lambda node: None, pod=pod)
        """,
}


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The package written and installed with pip into a target dir (no index, no build isolation: offline)."""
    root = tmp_path_factory.mktemp("ext")
    source, target = root / "src", root / "site"
    for name, text in FILES.items():
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        (source / name).write_text(textwrap.dedent(text).lstrip())
    done = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index",
                           "--no-build-isolation", "--disable-pip-version-check", "--target", str(target), str(source)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert any(target.glob("koordlet_ext_demo-0.1.0.dist-info/entry_points.txt"))
    yield target


@pytest.fixture
def on_path(installed: Path) -> Iterator[Path]:
    """The installed package importable, then gone again (modules, path, the hook plugins it registered)."""
    builtin = set(registry.PLUGINS)
    sys.path.insert(0, str(installed))
    importlib.invalidate_caches()
    try:
        yield installed
    finally:
        sys.path.remove(str(installed))
        for name in [m for m in sys.modules if m == PACKAGE or m.startswith(PACKAGE + ".")]:
            del sys.modules[name]
        for name in set(registry.PLUGINS) - builtin:
            del registry.PLUGINS[name]


def test_the_packages_extensions_are_taken_or_refused_with_their_reason(on_path: Path) -> None:
    found = {(e.group, e.name): e for e in load_extensions({"demo-guard": True}).found}
    status = {key: e.status for key, e in found.items()}
    assert status == {
        (QOS_STRATEGIES_GROUP, "demo-guard"): LOADED, (QOS_STRATEGIES_GROUP, "broken-import"): REFUSED,
        (QOS_STRATEGIES_GROUP, "bad-shape"): REFUSED, (QOS_STRATEGIES_GROUP, "gate-thief"): REFUSED,
        (QOS_STRATEGIES_GROUP, "cpuburst"): REFUSED, (HOOK_PLUGINS_GROUP, "demo-env"): LOADED,
        (HOOK_PLUGINS_GROUP, "not-a-plugin"): REFUSED, (HOOK_PLUGINS_GROUP, "counting"): REFUSED,
        (HOOK_PLUGINS_GROUP, "uses-os"): REFUSED,
    }
    problem = {name: e.problem for (_, name), e in found.items()}
    assert "ModuleNotFoundError" in problem["broken-import"] and "kpy_no_such_module_at_all" in problem["broken-import"]
    assert problem["bad-shape"] == "decide must take (snapshot, config), takes ('snapshot',)"
    assert "is a koordlet feature gate" in problem["gate-thief"] or "its gate must be its own name" in problem[
        "gate-thief"]
    assert "taken by a built-in" in problem["cpuburst"]
    assert problem["not-a-plugin"] == "not a hooks.registry.Plugin: dict"
    assert problem["counting"] == "its container handler is not pure"
    assert problem["uses-os"] == "kpy_ext_demo.oshook imports os"
    assert found[(QOS_STRATEGIES_GROUP, "demo-guard")].distribution == "koordlet-ext-demo 0.1.0"
    assert found[(QOS_STRATEGIES_GROUP, "demo-guard")].enabled and not found[(HOOK_PLUGINS_GROUP, "demo-env")].enabled
    # the hook plugin is in the registry behind its own switch
    assert [p.name for p in registry.enabled({"demo-env": True})] == ["demo-env"]
    assert registry.enabled({"demo-env": False}) == []


def test_the_out_of_tree_strategy_passes_the_built_in_ones_shape_test(on_path: Path) -> None:
    """tests/koordlet/qosmanager/test_registry.py's checks, run on the loaded strategy as on each built-in one."""
    strategy = load_extensions({}).strategies[0]
    assert strategy.name == "demo-guard"
    test_registry.test_strategy_has_the_one_shape(strategy)
    test_registry.test_decide_is_pure_same_input_same_plan_input_untouched(strategy)
    test_registry.test_strategy_module_never_touches_the_executor_the_evictor_or_files(strategy)


def test_the_shape_checks_accept_every_built_in_strategy_and_plugin() -> None:
    registry.load_builtin()
    assert {s.name: strategy_problems(s) for s in STRATEGIES if strategy_problems(s)} == {}
    assert {p.name: plugin_problems(p) for p in registry.PLUGINS.values() if plugin_problems(p)} == {}


def test_no_entry_points_and_an_unknown_switch_leave_the_agent_as_it_was(caplog: pytest.LogCaptureFixture) -> None:
    from koordlet.extensions import report
    from koordlet.metrics import KoordletMetrics

    extensions = load_extensions({"nowhere": True}, entry_points=lambda group: ())
    assert extensions.found == () and extensions.unknown == ("nowhere",) and dict(extensions.gates) == {}
    with caplog.at_level(logging.ERROR, logger="koordlet.extensions"):
        report(extensions, KoordletMetrics("n1").registry, "n1")
    assert "-qos-extension-plugins names 'nowhere', which no installed extension is; known: none" in caplog.text


def test_the_agent_names_them_at_start_and_runs_the_switched_on_strategy(
        on_path: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture, containerd_socket: str) -> None:
    """koordlet in local mode over the real containerd of the tests (its pods: whatever runs there)."""
    config = parse_config([
        "-local-mode", f"-report-dir={tmp_path / 'reports'}", f"-cri-endpoint={containerd_socket}",
        f"-node-slo-file={tmp_path / 'slo.yaml'}", f"-cgroup-root-dir={tmp_path / 'cgroup'}", "-addr=127.0.0.1:0",
        "-sys-root-dir=/sys/", "-enable-node-metric-report=false", "-enable-nri-runtime-hook=false",
        f"-runtime-hooks-addr={tmp_path / 'koordlet.sock'}", f"-runtime-hooks-config-path={tmp_path / 'hooks.d'}",
        "-qos-extension-plugins=demo-guard=true,demo-env=true,bad-shape=true,nope=false"], {"NODE_NAME": "n1"})
    before = STRATEGY_RUNS.labels(strategy="demo-guard", status="ok")._value.get()
    agent = Koordlet(config, extra_components=[qos_manager, runtime_hooks], states_sync_timeout_s=10)
    with caplog.at_level(logging.INFO):
        try:
            agent.start()
            deadline = time.monotonic() + 10
            while (STRATEGY_RUNS.labels(strategy="demo-guard", status="ok")._value.get() == before
                   and time.monotonic() < deadline):
                time.sleep(0.1)
            text = exposition([agent.metrics.registry]).decode()
        finally:
            agent.stop(5.0)
    assert STRATEGY_RUNS.labels(strategy="demo-guard", status="ok")._value.get() > before  # the manager ran it
    served = {(s.labels["group"], s.labels["name"], s.labels["status"]): s.value
              for family in text_string_to_metric_families(text) if family.name == "koordlet_extension_plugin"
              for s in family.samples}
    assert served[(QOS_STRATEGIES_GROUP, "demo-guard", LOADED)] == 1
    assert served[(HOOK_PLUGINS_GROUP, "demo-env", LOADED)] == 1
    assert served[(QOS_STRATEGIES_GROUP, "bad-shape", REFUSED)] == 0  # switched on, but refused
    assert "extension koordlet.qos_strategies demo-guard (kpy_ext_demo.strategy:STRATEGY, koordlet-ext-demo " \
           "0.1.0) loaded, on" in caplog.text
    assert ("extension koordlet.qos_strategies bad-shape (kpy_ext_demo.badshape:STRATEGY, koordlet-ext-demo 0.1.0) "
            "refused although -qos-extension-plugins turns it on: decide must take") in caplog.text
    assert "-qos-extension-plugins names 'nope'" in caplog.text
    assert any("runtime hooks: plugins" in r.getMessage() and "demo-env" in r.getMessage() for r in caplog.records)
