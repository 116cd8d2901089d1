"""Group identity (Anolis ``cpu.bvt_warp_ns``; docs/koordinator.md §3.3 GroupIdentity).

LS pods preempt BE pods on a shared CPU.

Rule: on when the kernel has the file and ``policies.cpuPolicy`` is groupIdentity; a class's value is its
``cpuQOS.groupIdentity`` when its ``cpuQOS.enable`` (defaults LSR/LS 2, BE −1), else 0. The file exists only
on Anolis kernels: elsewhere the plugin has no opinion and nothing is written.
"""

from __future__ import annotations

from dataclasses import dataclass

from koordlet.api.annotations import parse_cpu_qos
from koordlet.api.keys import ANNOTATION_CPU_QOS
from koordlet.api.nodeslo import CPU_POLICY_GROUP_IDENTITY
from koordlet.api.qos import KubeQoS, QoSClass

from .protocol import NO_CHANGES, Changes, NodeContext, PodContext
from .registry import Plugin, Stage, register


@dataclass(frozen=True, slots=True)
class Rule:
    enabled: bool
    lsr: int
    ls: int
    be: int
    lsr_enabled: bool


def rule(node: NodeContext) -> Rule:
    strategy = node.node_slo.resource_qos_strategy
    value = lambda cls: cls.cpu_qos.group_identity if cls.cpu_qos.enable else 0
    return Rule(
        enabled=node.group_identity_supported and strategy.policies.cpu_policy in ("", CPU_POLICY_GROUP_IDENTITY),
        lsr=value(strategy.lsr_class), ls=value(strategy.ls_class), be=value(strategy.be_class),
        lsr_enabled=strategy.lsr_class.cpu_qos.enable,
    )


def pod_bvt(ctx: PodContext, r: Rule) -> int:
    pod = ctx.pod
    qos = pod.qos_label
    if qos in (QoSClass.LSE, QoSClass.LSR):
        return r.lsr
    if qos is QoSClass.LS:
        raw = pod.annotations.get(ANNOTATION_CPU_QOS)
        if raw:  # only honoured for LS pods (docs/koordinator.md §3.3)
            override = parse_cpu_qos(raw)
            return override.group_identity if override.enable else 0
        return r.ls
    if qos is QoSClass.BE:
        return r.be
    if qos is QoSClass.SYSTEM:
        return 0
    kube_qos = pod.effective_kube_qos
    if kube_qos is KubeQoS.GUARANTEED:
        return r.lsr if r.lsr_enabled else r.ls
    if kube_qos is KubeQoS.BURSTABLE:
        return r.ls
    if kube_qos is KubeQoS.BESTEFFORT:
        return r.be
    return 0


def pod(ctx: PodContext, r: Rule) -> Changes:
    if not r.enabled:
        return NO_CHANGES
    return Changes(bvt_warp_ns=pod_bvt(ctx, r))


PLUGIN = register(Plugin("groupidentity", "GroupIdentity", rule, pod=pod,
                         stages=frozenset({Stage.PRE_RUN_POD_SANDBOX})))
