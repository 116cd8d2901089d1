"""OOM score (docs/koordinator.md §3.3 OOMScoreAdj; Koordinator runtimehooks/hooks/oomscoreadj).

Every process of a container gets the ``oom_score_adj`` its pod's annotations name: the container's entry of
``koordinator.sh/oom-score-adj-spec`` (``{"container-a": -500}``), else ``koordinator.sh/oom-score-adj``
(``"200"``).

Like Koordinator, the value is applied by the reconciler only (no hook stage: a container has no process
before it starts), to the processes of the container's cgroup whose value differs, again at every pass, so
processes that come later get it too; the sandbox (pause) container is never touched (its value belongs to
the runtime), and removing the annotation leaves the processes as they are. Values outside −1000..1000 are
dropped by hooks/validate.py (reported, never written); an annotation that cannot be read is reported and the
container left alone.
"""

from __future__ import annotations

from koordlet.api.annotations import parse_oom_score_adj

from .protocol import NO_CHANGES, Changes, ContainerContext, NodeContext
from .registry import Plugin, register


def rule(node: NodeContext) -> None:
    return None


def container(ctx: ContainerContext, _rule: None) -> Changes:
    value = parse_oom_score_adj(ctx.pod.annotations, ctx.name)
    return NO_CHANGES if value is None else Changes(oom_score_adj=value)


PLUGIN = register(Plugin("oomscoreadj", "OOMScoreAdj", rule, container=container, stages=frozenset()))
