"""Pod-level RDT (docs/koordinator.md §3.3 Resctrl).

A pod annotated ``node.koordinator.sh/resctrl`` gets its own resctrl group ``koordlet-<podUID>`` with the
LLC ways and memory bandwidth it asks for (per cache id where it says so).
Needs the node's cbm mask and cache ids (NodeContext.resctrl); without RDT the plugin has no opinion.

Its containers are put in that group: at creation through NRI (the group as the container's RDT class, so
runc starts it there; Koordinator's SetContainerResctrlResources), and by moving their tasks (the pod plan of
the reconciler and the hook server). The group itself is made at pod level; NRI names it as a container's class only
once it exists (koordlet/runtimehooks/podgroups.py makes it before the answer, or leaves the class out when the
kernel refuses it), and it is removed with the pod from koordlet's record of the groups it made."""

from __future__ import annotations

from koordlet.api.annotations import parse_resctrl
from koordlet.api.keys import ANNOTATION_RESCTRL
from koordlet.api.resctrl import l3_mask, mb_value

from .protocol import NO_CHANGES, Changes, ContainerContext, NodeContext, PodContext, ResctrlNode
from .registry import Plugin, Stage, register

GROUP_PREFIX = "koordlet-"


def rule(node: NodeContext) -> ResctrlNode | None:
    return node.resctrl


def pod(ctx: PodContext, rdt: ResctrlNode | None) -> Changes:
    raw = ctx.pod.annotations.get(ANNOTATION_RESCTRL)
    if not raw or rdt is None:
        return NO_CHANGES
    wanted = parse_resctrl(raw)
    l3_parts, mb_parts = [], []
    for cache_id in rdt.cache_ids:
        llc = next((c for c in wanted.llc_per_cache if c.cache_id == cache_id), wanted.llc)
        start, end = (llc.start_percent, llc.end_percent) if llc else (0, 100)
        l3_parts.append(f"{cache_id}={l3_mask(rdt.cbm_mask, start, end):x}")
        mb = next((m for m in wanted.mb_per_cache if m.cache_id == cache_id), wanted.mb)
        mb_parts.append(f"{cache_id}={mb_value(mb.percent if mb else 100, rdt.vendor)}")
    schemata = "L3:" + ";".join(l3_parts) + "\n"
    if rdt.has_mb:
        schemata += "MB:" + ";".join(mb_parts) + "\n"
    return Changes(resctrl_group=GROUP_PREFIX + ctx.pod.uid, resctrl_schemata=schemata)


def container(ctx: ContainerContext, rdt: ResctrlNode | None) -> Changes:
    """The pod's group as the container's RDT class (only NRI can carry it; the other doors move tasks)."""
    if rdt is None or not ctx.pod.annotations.get(ANNOTATION_RESCTRL):
        return NO_CHANGES
    return Changes(resctrl_group=GROUP_PREFIX + ctx.pod.uid)


PLUGIN = register(Plugin("resctrl", "Resctrl", rule, pod=pod, container=container,
                         stages=frozenset({Stage.PRE_RUN_POD_SANDBOX, Stage.PRE_CREATE_CONTAINER})))
