"""Core scheduling's SCHED_IDLE part (docs/koordinator.md §3.3 CoreSched): ``cpu.idle`` per pod.

The stock-kernel stand-in for group identity (Anolis ``cpu.bvt_warp_ns``): a cgroup with ``cpu.idle=1`` is a
SCHED_IDLE group (mainline since 5.15, on cgroup v2 and as a v1 cpu controller file alike), which every
non-idle task preempts at wake-up. The NodeSLO option is Koordinator's own: ``policies.cpuPolicy: coreSched``
with a class's ``cpuQOS.schedIdle: 1`` (Koordinator CPUQOS.SchedIdle, "takes effect if cpuPolicy =
coreSched"), for example ``beClass.cpuQOS: {enable: true, schedIdle: 1}`` for BE pods (docs/colocation.md).

With the gate on, every pod but SYSTEM pods gets an answer, as Koordinator's kubeQoS reconciler writes 0 under
any other policy: its class's ``schedIdle`` where ``policies.cpuPolicy`` is coreSched and the class's
``cpuQOS.enable`` is on, else 0, so switching the option (or the policy) off restores 0.

Unlike Koordinator, which writes ``cpu.idle`` on the kubeQoS dirs, the value goes on the pod dir: the kernel
refuses ``cpu.shares`` / ``cpu.weight`` writes on an idle group (EINVAL), and kubelet writes those on the QoS
dirs at every start (Koordinator #2732: kubelet cannot restart). Kubelet never writes a running pod's dir, so
the pod dir is safe; the same kernel rule is why the plan writes ``cpu.idle`` before ``cpu.shares`` and drops a
pod-level shares write while the pod is idle (koordlet/runtimehooks/apply.py ``cgroup_writes``).

Setting ``cpu.idle`` back to 0 makes the kernel reset the group's weight to 1024 (``sched_group_set_idle``), so
a BestEffort pod the option leaves also gets kubelet's pod-level shares back (2, kubelet's MinShares) unless
``batchresource`` owns its shares (a pod with batch resources). Applied at PreRunPodSandbox (the proxy and NRI:
pod-level values are written by koordlet directly) and by the reconciler; Koordinator has the reconciler only.
The prctl core-scheduling cookies are not part of this plugin.
"""

from __future__ import annotations

from dataclasses import dataclass

from koordlet.api.nodeslo import CPU_POLICY_CORE_SCHED, CPUQOS
from koordlet.api.qos import KubeQoS, QoSClass
from wire.kernel_ranges import CPU_SHARES_MIN

from .batchresource import batch_amounts
from .protocol import NO_CHANGES, Changes, NodeContext, PodContext
from .registry import Plugin, Stage, register


@dataclass(frozen=True, slots=True)
class Rule:
    lsr: int
    ls: int
    be: int


def _idle(cpu_qos: CPUQOS, core_sched: bool) -> int:
    return cpu_qos.sched_idle if core_sched and cpu_qos.enable else 0


def rule(node: NodeContext) -> Rule:
    strategy = node.node_slo.resource_qos_strategy
    core_sched = strategy.policies.cpu_policy == CPU_POLICY_CORE_SCHED
    return Rule(lsr=_idle(strategy.lsr_class.cpu_qos, core_sched), ls=_idle(strategy.ls_class.cpu_qos, core_sched),
                be=_idle(strategy.be_class.cpu_qos, core_sched))


def pod_idle(ctx: PodContext, r: Rule) -> int | None:
    """The pod's ``cpu.idle``: by QoS label (LSE and LSR take the LSR value), else by kube QoS; None for SYSTEM."""
    qos = ctx.pod.qos_label
    if qos is QoSClass.SYSTEM:
        return None
    if qos in (QoSClass.LSE, QoSClass.LSR):
        return r.lsr
    if qos is QoSClass.LS:
        return r.ls
    if qos is QoSClass.BE:
        return r.be
    kube_qos = ctx.pod.effective_kube_qos
    if kube_qos is KubeQoS.BESTEFFORT:
        return r.be
    if kube_qos in (KubeQoS.GUARANTEED, KubeQoS.BURSTABLE):
        return r.ls
    return None


def pod(ctx: PodContext, r: Rule) -> Changes:
    idle = pod_idle(ctx, r)
    if idle is None:
        return NO_CHANGES
    if idle == 0 and ctx.pod.effective_kube_qos is KubeQoS.BESTEFFORT and not batch_amounts(ctx.pod):
        return Changes(cpu_idle=0, cpu_shares=CPU_SHARES_MIN)
    return Changes(cpu_idle=idle)


PLUGIN = register(Plugin("coresched", "CoreSched", rule, pod=pod, stages=frozenset({Stage.PRE_RUN_POD_SANDBOX})))
