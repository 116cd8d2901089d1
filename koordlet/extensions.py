"""Out-of-tree QoS strategies and hook plugins, from Python entry points, switched by ``-qos-extension-plugins``.

A package that installs an entry point in group ``koordlet.qos_strategies`` (a
:class:`~koordlet.qosmanager.framework.Strategy`) or ``koordlet.hook_plugins`` (a :class:`~hooks.registry.Plugin`)
is picked up at start. Koordinator's Go binary cannot load plugins: its ``-qos-extension-plugins`` (a
``Name=bool`` map, qosmanager/framework/extension.go) switches QoS extension plugins compiled in. Here it
switches these: an extension is its own switch, named after the strategy or plugin (whose ``feature_gate`` /
``gate`` must be that name), off unless the flag turns it on, as an Alpha gate is.

Every extension found is held to the shape of the built-in ones (koordlet/shape.py) and named at start: one log
line per extension (on, off or refused and why) and ``koordlet_extension_plugin{group, name, distribution,
status}`` on ``/metrics`` (1 on, 0 off or refused). An extension that cannot be imported, has the wrong shape,
takes the name of a built-in strategy or plugin, or claims a koordlet feature gate is refused with that reason, and
the agent goes on without it. A name in ``-qos-extension-plugins`` that no extension has is said once at start.
"""

from __future__ import annotations

import importlib.metadata
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from prometheus_client import CollectorRegistry, Gauge

from hooks import registry
from koordlet import features
from koordlet.qosmanager import STRATEGIES
from koordlet.qosmanager.framework import Strategy
from koordlet.shape import plugin_problems, strategy_problems

logger = logging.getLogger(__name__)

QOS_STRATEGIES_GROUP = "koordlet.qos_strategies"
HOOK_PLUGINS_GROUP = "koordlet.hook_plugins"
LOADED, REFUSED = "loaded", "refused"

EntryPoints = Callable[[str], Iterable[importlib.metadata.EntryPoint]]


def _entry_points(group: str) -> Iterable[importlib.metadata.EntryPoint]:
    return importlib.metadata.entry_points(group=group)


@dataclass(frozen=True, slots=True)
class Extension:
    """One entry point found: where it came from, whether it was taken, and whether the flag turns it on."""

    group: str
    name: str  # the strategy's or plugin's name (the entry point's name while it could not be loaded)
    value: str  # module:attribute of the entry point
    distribution: str
    status: str  # LOADED or REFUSED
    enabled: bool = False
    problem: str = ""
    obj: Strategy | registry.Plugin | None = None


@dataclass(frozen=True, slots=True)
class Extensions:
    found: tuple[Extension, ...] = ()
    unknown: tuple[str, ...] = ()  # names in -qos-extension-plugins no extension has

    @property
    def gates(self) -> Mapping[str, bool]:
        """Each loaded extension's switch, to lay over the feature gates the QoS manager and the hooks read."""
        return MappingProxyType({e.name: e.enabled for e in self.found if e.status == LOADED})

    @property
    def strategies(self) -> tuple[Strategy, ...]:
        return tuple(e.obj for e in self.found
                     if e.status == LOADED and e.group == QOS_STRATEGIES_GROUP and isinstance(e.obj, Strategy))


def _distribution(entry: importlib.metadata.EntryPoint) -> str:
    dist = getattr(entry, "dist", None)
    return f"{dist.name} {dist.version}" if dist is not None else "?"


def _check(group: str, obj: object, taken: set[str]) -> tuple[str, str]:
    """(name, problem) of a loaded object; problem "" when it may be used."""
    checks = strategy_problems if group == QOS_STRATEGIES_GROUP else plugin_problems
    problems = checks(obj)
    name = getattr(obj, "name", "")
    if problems:
        return str(name or ""), "; ".join(problems)
    gates = obj.gates if isinstance(obj, Strategy) else (obj.gate,)  # type: ignore[attr-defined]
    if gates != (name,):
        return name, f"its gate must be its own name {name!r} (the -qos-extension-plugins switch), not {gates}"
    if name in features.BY_NAME:
        return name, f"{name!r} is a koordlet feature gate; an extension has a switch of its own"
    if name in taken:
        return name, f"the name {name!r} is taken by a built-in or an earlier extension"
    return name, ""


def load_extensions(switches: Mapping[str, bool], entry_points: EntryPoints = _entry_points) -> Extensions:
    """Find, check and (hook plugins) register every extension; never raises for a bad one."""
    registry.load_builtin()
    taken = {s.name for s in STRATEGIES} | set(registry.PLUGINS)
    found: list[Extension] = []
    for group in (QOS_STRATEGIES_GROUP, HOOK_PLUGINS_GROUP):
        for entry in sorted(entry_points(group), key=lambda e: e.name):
            dist = _distribution(entry)
            try:
                obj = entry.load()
            except Exception as exc:  # whatever the package's import raises, the agent goes on
                found.append(Extension(group, entry.name, entry.value, dist, REFUSED,
                                       problem=f"cannot load {entry.value}: {type(exc).__name__}: {exc}"))
                continue
            name, problem = _check(group, obj, taken)
            if problem:
                found.append(Extension(group, name or entry.name, entry.value, dist, REFUSED, problem=problem))
                continue
            taken.add(name)
            if group == HOOK_PLUGINS_GROUP:
                registry.register(obj)  # type: ignore[arg-type]
            found.append(Extension(group, name, entry.value, dist, LOADED, bool(switches.get(name, False)), obj=obj))
    return Extensions(tuple(found), tuple(sorted(set(switches) - {e.name for e in found})))


def report(extensions: Extensions, registry_: CollectorRegistry, node: str,
           switches: Mapping[str, bool] | None = None) -> None:
    """At start: one log line per extension and per unknown switch; ``koordlet_extension_plugin``."""
    switched_on = {name for name, on in (switches or {}).items() if on}
    gauge = Gauge("koordlet_extension_plugin", "Out-of-tree QoS strategies and hook plugins found at start (1 on, 0 "
                  "off or refused)", ["node", "group", "name", "distribution", "status"], registry=registry_)
    for ext in extensions.found:
        gauge.labels(node, ext.group, ext.name, ext.distribution, ext.status).set(int(ext.enabled))
        if ext.status == REFUSED:
            logger.error("extension %s %s (%s, %s) refused%s: %s", ext.group, ext.name, ext.value, ext.distribution,
                         " although -qos-extension-plugins turns it on" if ext.name in switched_on else "", ext.problem)
        else:
            logger.info("extension %s %s (%s, %s) loaded, %s", ext.group, ext.name, ext.value, ext.distribution,
                        "on" if ext.enabled else "off (turn it on with -qos-extension-plugins)")
    for name in extensions.unknown:
        logger.error("-qos-extension-plugins names %r, which no installed extension is; known: %s", name,
                     ", ".join(sorted(e.name for e in extensions.found if e.status == LOADED)) or "none")
