"""The shape check of QoS strategies and hook plugins, built-in or out-of-tree (koordlet/extensions.py).

A QoS strategy (koordlet/qosmanager/framework.py): a :class:`~koordlet.qosmanager.framework.Strategy` whose config
is a frozen dataclass built by ``from_node_slo(spec, flags)`` with a bool ``enabled`` and a ``Needs``, and whose
``decide(snapshot, config) -> Plan`` is pure: the same snapshot gives the same plan and is left untouched. A hook
plugin (hooks/registry.py): a :class:`~hooks.registry.Plugin` with a rule ``(NodeContext)`` and pod or container
handlers ``(context, rule) -> Changes``, pure the same way. Neither module may import the writers (executor,
evictor, plan runner), the cgroup reader, ``os``, ``subprocess``, clocks or randomness, nor call ``open``; a hook
plugin's module imports no part of koordlet but ``koordlet.api`` (the layering rule of hooks/).

Each check returns the problems found (empty: the shape holds), so a bad out-of-tree plugin is refused with a
message naming what is wrong; tests run the same checks on every built-in one.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import re
import sys
from collections.abc import Callable
from typing import Any

from hooks.protocol import Changes, ContainerContext, NodeContext, PodContext
from hooks.registry import Plugin, Stage
from koordlet.api.nodeslo import default_node_slo_spec
from koordlet.api.pod import ContainerMeta, PodMeta
from koordlet.metriccache import MetricCache
from koordlet.plan import Plan
from koordlet.qosmanager.framework import QoSManagerConfig, Strategy
from koordlet.qosmanager.snapshot import Needs, SnapshotBuilder
from koordlet.statesinformer.api import NodeInfo, StaticStates

# Modules a strategy or plugin module must not import (a name or a dotted prefix).
FORBIDDEN_IMPORTS = ("koordlet.executor", "koordlet.eviction", "koordlet.actuator", "koordlet.system.cgroup", "os",
                     "subprocess", "socket", "shutil", "random", "time")
_PLUGIN_NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]*$")
_PROBE_NODE = NodeInfo("shape-probe", capacity={"cpu": 8000, "memory": 16 << 30},
                       allocatable={"cpu": 8000, "memory": 16 << 30})
_PROBE_POD = PodMeta(name="probe", namespace="shape", uid="00000000-0000-4000-8000-000000000001",
                     labels={"koordinator.sh/qosClass": "LS"}, cgroup_parent="/kubepods/burstable/pod0",
                     containers=(ContainerMeta("app", container_id="c" * 64, requests={"cpu": 1000},
                                               limits={"cpu": 2000}),))


def module_problems(obj: Callable[..., Any], allowed_koordlet: tuple[str, ...] | None = None) -> list[str]:
    """What the module defining ``obj`` imports or calls that a strategy or plugin must not; with
    ``allowed_koordlet`` every ``koordlet.*`` import outside those prefixes is a problem too."""
    module = sys.modules.get(getattr(obj, "__module__", "") or "")
    try:
        source = inspect.getsource(module) if module is not None else None
    except (OSError, TypeError):
        source = None
    if source is None:
        return [f"the source of {getattr(obj, '__module__', '?')} cannot be read, so it cannot be checked"]
    problems = []
    for node in ast.walk(ast.parse(source)):
        names: list[str] = []
        if isinstance(node, ast.ImportFrom) and node.level == 0:
            names = [node.module or ""]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "open":
            problems.append(f"{module.__name__} calls open()")
        for name in names:
            if any(name == bad or name.startswith(bad + ".") for bad in FORBIDDEN_IMPORTS):
                problems.append(f"{module.__name__} imports {name}")
            elif allowed_koordlet is not None and name.startswith("koordlet.") and not name.startswith(
                    allowed_koordlet):
                problems.append(f"{module.__name__} imports {name} (a hook plugin imports only koordlet.api)")
    return problems


def _parameters(fn: Callable[..., Any]) -> list[str]:
    try:
        return list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return []


def strategy_problems(strategy: object) -> list[str]:
    """Why ``strategy`` does not have the one shape of a QoS strategy (empty when it has)."""
    if not isinstance(strategy, Strategy):
        return [f"not a koordlet.qosmanager.framework.Strategy: {type(strategy).__name__}"]
    if not isinstance(strategy.name, str) or not strategy.name:
        return ["its name must be a non-empty string"]
    config_type = strategy.config
    if not (dataclasses.is_dataclass(config_type) and config_type.__dataclass_params__.frozen):  # type: ignore
        return [f"its config {getattr(config_type, '__name__', config_type)!r} is not a frozen dataclass"]
    if _parameters(strategy.decide) != ["snapshot", "config"]:
        return [f"decide must take (snapshot, config), takes {tuple(_parameters(strategy.decide))}"]
    if inspect.signature(strategy.decide).return_annotation not in ("Plan", Plan):
        return ["decide must be annotated to return a Plan"]
    problems = module_problems(strategy.decide)
    try:
        config = strategy.configure(default_node_slo_spec(), QoSManagerConfig())
        if not isinstance(config, config_type):
            return problems + [f"from_node_slo gave a {type(config).__name__}, not its config"]
        if not isinstance(config.enabled, bool) or not isinstance(config.needs, Needs):
            return problems + ["its config needs a bool 'enabled' and a Needs 'needs'"]
        snapshot = SnapshotBuilder(StaticStates(node=_PROBE_NODE, pods=(_PROBE_POD,)), MetricCache()).build(
            config.needs, now=1_700_000_000.0)
        before = repr(snapshot)
        first = strategy.decide(snapshot, config)  # type: ignore[arg-type]
        again = strategy.decide(snapshot, config)  # type: ignore[arg-type]
    except Exception as exc:  # an out-of-tree strategy may raise anything: that is the answer here
        return problems + [f"configure/decide on a probe snapshot raised {type(exc).__name__}: {exc}"]
    if not isinstance(first, Plan):
        problems.append(f"decide returned a {type(first).__name__}, not a Plan")
    elif first != again or repr(snapshot) != before:
        problems.append("decide is not pure: the same snapshot gave another plan, or was changed")
    return problems


def _plugin_form(plugin: Plugin) -> str:
    """The first thing wrong with the plugin's fields and signatures ("" when none)."""
    if not isinstance(plugin.name, str) or not _PLUGIN_NAME.match(plugin.name):
        return f"its name {plugin.name!r} must be lower-case letters, digits, '_', '.' or '-'"
    if not isinstance(plugin.gate, str) or not plugin.gate:
        return "its gate must be a non-empty string"
    if plugin.pod is None and plugin.container is None:
        return "it has neither a pod nor a container handler"
    if not set(plugin.stages) <= set(Stage):
        return f"unknown stages {sorted(map(str, set(plugin.stages) - set(Stage)))}"
    if len(_parameters(plugin.rule)) != 1:
        return "its rule must take (node)"
    for name, fn in (("pod", plugin.pod), ("container", plugin.container)):
        if fn is not None and len(_parameters(fn)) != 2:
            return f"its {name} handler must take (context, rule)"
    return ""


def plugin_problems(plugin: object) -> list[str]:
    """Why ``plugin`` does not have the one shape of a hook plugin (empty when it has)."""
    if not isinstance(plugin, Plugin):
        return [f"not a hooks.registry.Plugin: {type(plugin).__name__}"]
    form = _plugin_form(plugin)
    if form:
        return [form]
    handlers = [(name, fn) for name, fn in (("pod", plugin.pod), ("container", plugin.container)) if fn is not None]
    problems: list[str] = []
    for fn in (plugin.rule, *(fn for _, fn in handlers)):
        problems += [p for p in module_problems(fn, ("koordlet.api",)) if p not in problems]
    contexts = {"pod": PodContext(_PROBE_POD), "container": ContainerContext(_PROBE_POD, "app", "c" * 64)}
    try:
        rule = plugin.rule(NodeContext())
        for name, fn in handlers:
            before = repr(contexts[name])
            first, again = fn(contexts[name], rule), fn(contexts[name], rule)
            if not isinstance(first, Changes):
                problems.append(f"its {name} handler returned a {type(first).__name__}, not Changes")
            elif first != again or repr(contexts[name]) != before:
                problems.append(f"its {name} handler is not pure")
    except Exception as exc:  # an out-of-tree plugin may raise anything
        problems.append(f"its rule or handlers raised {type(exc).__name__} on a probe pod: {exc}")
    return problems
