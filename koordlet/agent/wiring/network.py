"""Network QoS: tc's HTB classes on the uplink (gate ``TCNetworkQoS``) and Terway's QoS files (gate
``TerwayQoS``), both from the NodeSLO's netQOSPolicy."""

from __future__ import annotations

from koordlet.agent.context import AgentContext, Component


def netqos(ctx: AgentContext) -> Component | None:
    """The tc network QoS manager, only with the ``TCNetworkQoS`` gate on."""
    if not ctx.config.gate("TCNetworkQoS"):
        return None
    from koordlet.netqos.manager import NetQoSManager

    config = ctx.config
    dirs = ctx.dirs
    return NetQoSManager(ctx.states, uplink=config.netqos_uplink, proc_dir=dirs.proc_dir,
                         sys_dir=dirs.sys_dir, registry=ctx.metrics.registry)


def terway_qos(ctx: AgentContext) -> Component | None:
    """Terway's QoS files (gate ``TerwayQoS``), written while NodeSLO's netQOSPolicy is terway-qos."""
    if not ctx.config.gate("TerwayQoS"):
        return None
    from koordlet.runtimehooks.terwayqos import TerwayQoSWriter

    return TerwayQoSWriter(ctx.states, ctx.layout, ctx.config.terway_qos_dir)
