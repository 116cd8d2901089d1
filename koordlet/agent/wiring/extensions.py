"""Out-of-tree QoS strategies and hook plugins (entry points, koordlet/extensions.py), and the feature gates with
their switches laid over them, which the QoS manager and the runtime hooks read."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from koordlet.agent.context import AgentContext, Component


def extensions(ctx: AgentContext) -> Component | None:
    """Out-of-tree QoS strategies and hook plugins (entry points), named at start, switched by
    ``-qos-extension-plugins`` (koordlet/extensions.py)."""
    from koordlet.extensions import load_extensions, report

    ctx.extensions = load_extensions(ctx.config.qos_extension_plugins)
    report(ctx.extensions, ctx.metrics.registry, ctx.config.node_name, ctx.config.qos_extension_plugins)
    return None


def gates_with_extensions(ctx: AgentContext) -> Mapping[str, bool]:
    """The feature gates with each loaded extension's switch laid over them."""
    extra = ctx.extensions.gates if ctx.extensions is not None else {}
    return MappingProxyType({**ctx.config.feature_gates, **extra})
