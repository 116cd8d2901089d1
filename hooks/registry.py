"""The one place plugins are registered, and the runner that calls them in order.

Within a level, plugins run in alphabetical order of name (docs/koordinator.md §3.1) and each
later plugin's settings win per field. A plugin that raises, whether its input is malformed
(``AnnotationError``) or it has a bug (any other exception), is reported to ``on_error`` (which logs and
counts it) and skipped for that pod; the others' answers stand.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from koordlet.api.annotations import AnnotationError

from . import validate
from .protocol import NO_CHANGES, Changes, ContainerContext, NodeContext, PodContext

log = logging.getLogger(__name__)


class Stage(enum.StrEnum):
    """Hook stages a plugin answers at (runtime.v1alpha1 hook types)."""

    PRE_RUN_POD_SANDBOX = "PreRunPodSandbox"
    PRE_CREATE_CONTAINER = "PreCreateContainer"
    PRE_UPDATE_CONTAINER_RESOURCES = "PreUpdateContainerResources"
    # a pod-level resize (the CRI UpdatePodSandboxResources through the proxy, NRI's UpdatePodSandbox): kubelet has
    # just written the pod dir's values, so the pod-level answers are written again (koordlet-py's extension)
    PRE_UPDATE_POD_SANDBOX_RESOURCES = "PreUpdatePodSandboxResources"


@dataclass(frozen=True, slots=True)
class Plugin:
    name: str
    gate: str  # koordlet feature gate (docs/koordinator.md §9.2)
    rule: Callable[[NodeContext], object]
    pod: Callable[[PodContext, object], Changes] | None = None
    container: Callable[[ContainerContext, object], Changes] | None = None
    stages: frozenset[Stage] = frozenset()


PLUGINS: dict[str, Plugin] = {}


@dataclass(frozen=True, slots=True)
class PluginAnswer:
    """What one plugin answered for one pod or container: its changes, or the error it was skipped for."""

    plugin: str
    changes: Changes | None
    error: str = ""


@dataclass(slots=True)
class Trace:
    """Filled by :func:`run_pod` / :func:`run_container` when given: each plugin's answer in order, and the values
    the check dropped (what ``/debug/pods`` shows of a pod's creation)."""

    answers: list[PluginAnswer] = field(default_factory=list)
    rejected: list[validate.Rejected] = field(default_factory=list)


ErrorReporter = Callable[[str, str, Exception], None]  # (plugin, pod key, error)
# What malformed input raises in a plugin; anything else is a bug in it (logged with its traceback).
EXPECTED_ERRORS = (AnnotationError, ValueError, KeyError, TypeError)
RejectReporter = Callable[[list["validate.Rejected"]], None]  # the values validate.check dropped


def register(plugin: Plugin) -> Plugin:
    if plugin.name in PLUGINS:
        raise ValueError(f"hook plugin {plugin.name!r} registered twice")
    PLUGINS[plugin.name] = plugin
    return plugin


def all_plugins() -> list[Plugin]:
    """Every registered plugin by name, the built-in ones loaded first (out-of-tree ones once
    koordlet/extensions.py registered them)."""
    load_builtin()
    return [PLUGINS[name] for name in sorted(PLUGINS)]


def enabled(gates: Mapping[str, bool]) -> list[Plugin]:
    return [plugin for plugin in all_plugins() if gates.get(plugin.gate, False)]


def stages(gates: Mapping[str, bool]) -> list[Stage]:
    """Stages with at least one enabled plugin (what koordlet registers with the proxy, docs/koordinator.md §2.4)."""
    wanted = set().union(*(p.stages for p in enabled(gates)))
    return [s for s in Stage if s in wanted]


def _run(plugins: list[Plugin], node: NodeContext, pod_key: str, call, on_error: ErrorReporter | None,
         trace: Trace | None = None) -> Changes:
    result = NO_CHANGES
    for plugin in plugins:
        try:
            changes = call(plugin, plugin.rule(node))
        except Exception as err:  # one plugin's failure must not cost the others' answers
            if trace is not None:
                trace.answers.append(PluginAnswer(plugin.name, None, f"{type(err).__name__}: {err}"))
            if on_error is not None:
                on_error(plugin.name, pod_key, err)
            else:
                log.warning("hook plugin %s skipped for %s: %s", plugin.name, pod_key, err,
                            exc_info=not isinstance(err, EXPECTED_ERRORS))
            continue
        if trace is not None:
            trace.answers.append(PluginAnswer(plugin.name, changes))
        if changes:
            result = result.merged(changes)
    return result


def run_pod(plugins: list[Plugin], node: NodeContext, ctx: PodContext,
            on_error: ErrorReporter | None = None, on_reject: RejectReporter | None = None,
            parent_quota: validate.ParentQuota = None, trace: Trace | None = None) -> Changes:
    """The enabled plugins' merged answer for a pod, checked (validate.check): values the kernel or the node
    would refuse are dropped and handed to ``on_reject``. ``parent_quota``: the pod's QoS dir quota; ``trace``:
    filled with each plugin's answer and the values dropped."""
    changes = _run([p for p in plugins if p.pod is not None], node, ctx.pod.key,
                   lambda plugin, rule: plugin.pod(ctx, rule), on_error, trace)
    return _checked(changes, node, parent_quota, on_reject, trace)


def run_container(plugins: list[Plugin], node: NodeContext, ctx: ContainerContext,
                  on_error: ErrorReporter | None = None, on_reject: RejectReporter | None = None,
                  parent_quota: validate.ParentQuota = None, trace: Trace | None = None) -> Changes:
    """As :func:`run_pod`, for a container; ``parent_quota``: its pod dir's quota."""
    changes = _run([p for p in plugins if p.container is not None], node, f"{ctx.pod.key}/{ctx.name}",
                   lambda plugin, rule: plugin.container(ctx, rule), on_error, trace)
    return _checked(changes, node, parent_quota, on_reject, trace)


def _checked(changes: Changes, node: NodeContext, parent_quota: validate.ParentQuota,
             on_reject: RejectReporter | None, trace: Trace | None) -> Changes:
    if not changes:
        return changes
    kept, rejected = validate.check(changes, node, parent_quota)
    if rejected and trace is not None:
        trace.rejected.extend(rejected)
    if rejected and on_reject is not None:
        on_reject(rejected)
    return kept


def load_builtin() -> None:
    """Register the built-in plugins (importing a plugin module registers it); out-of-tree ones come through
    koordlet/extensions.py (entry points ``koordlet.hook_plugins``)."""
    from . import (  # noqa: F401
        batchresource,
        coresched,
        cpunormalization,
        cpuset,
        gpu,
        groupidentity,
        oomscore,
        rdma,
        resctrl,
    )
