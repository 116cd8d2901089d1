"""Core scheduling's SCHED_IDLE part (docs/koordinator.md §3.3 CoreSched).

With NodeSLO ``policies.cpuPolicy: coreSched`` a pod's ``cpu.idle`` is its class's ``cpuQOS.schedIdle`` where
that class's ``cpuQOS.enable`` is on, else 0.

Koordinator writes ``cpu.idle`` on the kubeQoS dirs; here it is written on the pod dir (same effect for the pod's
tasks, and it keeps the reconciler per pod). Reconciler only: CoreSched answers no proxy stage
(docs/koordinator.md §3.3). The prctl core-scheduling cookies are not part of this plugin. SYSTEM pods are
excluded.
"""

from __future__ import annotations

from dataclasses import dataclass

from koordlet.api.nodeslo import CPU_POLICY_CORE_SCHED
from koordlet.api.qos import KubeQoS, QoSClass

from .protocol import NO_CHANGES, Changes, NodeContext, PodContext
from .registry import Plugin, register


@dataclass(frozen=True, slots=True)
class Rule:
    enabled: bool
    lsr: int
    ls: int
    be: int


def rule(node: NodeContext) -> Rule:
    strategy = node.node_slo.resource_qos_strategy
    idle = lambda cls: cls.cpu_qos.sched_idle if cls.cpu_qos.enable else 0  # noqa: E731
    return Rule(enabled=strategy.policies.cpu_policy == CPU_POLICY_CORE_SCHED,
                lsr=idle(strategy.lsr_class), ls=idle(strategy.ls_class), be=idle(strategy.be_class))


def pod(ctx: PodContext, r: Rule) -> Changes:
    if not r.enabled:
        return NO_CHANGES
    qos = ctx.pod.qos_label
    if qos is QoSClass.SYSTEM:
        return NO_CHANGES
    if qos in (QoSClass.LSE, QoSClass.LSR):
        return Changes(cpu_idle=r.lsr)
    if qos is QoSClass.LS:
        return Changes(cpu_idle=r.ls)
    if qos is QoSClass.BE:
        return Changes(cpu_idle=r.be)
    kube_qos = ctx.pod.effective_kube_qos
    if kube_qos is KubeQoS.BESTEFFORT:
        return Changes(cpu_idle=r.be)
    if kube_qos in (KubeQoS.GUARANTEED, KubeQoS.BURSTABLE):
        return Changes(cpu_idle=r.ls)
    return NO_CHANGES


PLUGIN = register(Plugin("coresched", "CoreSched", rule, pod=pod))
