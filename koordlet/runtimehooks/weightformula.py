"""Which cpu.shares → cpu.weight formula the node's runtime uses (cgroup v2), so that koordlet writes the same one
(docs/koordinator.md "Where koordlet-py differs": the weight formula).

The runtime (runc, crun) writes a container's ``cpu.weight`` from the CRI ``cpu_shares`` kubelet (or the proxy, or
an NRI adjustment) gave it, and koordlet writes the same file from the same shares (batch resources' BE shares, the
reconciler). runc ≤ 1.3.1 maps shares linearly, runc ≥ 1.3.2 and crun ≥ 1.23 quadratically
(:class:`~koordlet.system.resources.WeightFormula`); with different formulas the two would overwrite each other's
value each time either writes. ``-cgroup-v2-weight-formula`` names the formula (``linear``, ``quadratic``) or leaves it
to ``auto`` (the default): the runtime's own writes are read back. An LS or unlabelled container of a Guaranteed or
Burstable pod gets its shares from kubelet alone (no hook plugin changes them: batch resources and core scheduling
change BE and BestEffort pods only), so its shares are known from its CPU request (kubelet's MilliCPUToShares),
and its ``cpu.weight`` is what the runtime made of them. The two formulas agree only at 2 and 262144 shares, so one
such container with a request between those answers the question.

Each reconciler pass (before its writes) reads the weight of up to :data:`MAX_OBSERVED` such containers. Where every
one that matches a formula matches the same one, that is the runtime's; a change (a runc upgraded under a running
koordlet) is followed and logged. Containers that match neither (a weight set by hand, a resize the runtime has not
carried out yet) are ignored; when the ones that match disagree (two runtimes on one node, through runtime
handlers), the formula stays as it is and that is logged once. Until the first answer, or with no such container on
the node, the executor writes the linear formula (Koordinator's).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass

from hooks.protocol import shares_from_milli
from koordlet.api.keys import RESOURCE_CPU
from koordlet.api.pod import ContainerMeta, PodMeta
from koordlet.api.qos import KubeQoS, QoSClass
from koordlet.executor import ExecutorError, ResourceExecutor
from koordlet.system.cgroup import CgroupVersion
from koordlet.system.kubepods import CgroupPathError, KubeCgroupLayout, pod_cgroup_dir
from koordlet.system.resources import WeightFormula, formulas_giving
from wire.kernel_ranges import CPU_SHARES_MAX, CPU_SHARES_MIN

logger = logging.getLogger(__name__)

AUTO = "auto"
SETTINGS = (AUTO, WeightFormula.LINEAR.value, WeightFormula.QUADRATIC.value)
MAX_OBSERVED = 8  # containers read per pass: one answers the question, a few show a disagreement


@dataclass(frozen=True, slots=True)
class Observation:
    """One container's weight as the runtime wrote it, and the formulas that give it from its shares."""

    container: str  # <namespace>/<pod>/<container>, for the log
    shares: int
    weight: int
    formulas: frozenset[WeightFormula]


def kubelet_shares(container: ContainerMeta) -> int | None:
    """The cpu.shares kubelet gives the container (its CPU request), None when it has no request."""
    milli = container.requests.get(RESOURCE_CPU, 0)
    return shares_from_milli(int(milli)) if milli > 0 else None


def _observable(pod: PodMeta) -> bool:
    """A pod whose containers' shares only kubelet sets (module docstring)."""
    return (pod.qos_class is not QoSClass.BE and pod.effective_kube_qos in (KubeQoS.GUARANTEED, KubeQoS.BURSTABLE)
            and pod.phase not in ("Succeeded", "Failed"))


def decide(observations: Iterable[Observation]) -> WeightFormula | None:
    """The formula every informative observation agrees on; None without one or when they disagree."""
    found = {next(iter(o.formulas)) for o in observations if len(o.formulas) == 1}
    return found.pop() if len(found) == 1 else None


class WeightFormulaSource:
    """Sets the executor's weight formula from ``-cgroup-v2-weight-formula``, or (``auto``) from what the runtime
    wrote (module docstring). Used from the reconciler's thread only."""

    def __init__(self, setting: str, executor: ResourceExecutor, layout: KubeCgroupLayout) -> None:
        if setting not in SETTINGS:
            raise ValueError(f"cgroup v2 weight formula {setting!r}: one of {', '.join(SETTINGS)}")
        self._executor = executor
        self._layout = layout
        self._auto = setting == AUTO
        self._disagreement_logged = False
        self.observed: WeightFormula | None = None  # the runtime's formula as last observed (auto)
        if not self._auto:
            executor.weight_formula = WeightFormula(setting)
        if executor.cgroup_fs.version is CgroupVersion.V2:
            logger.info("cgroup v2 cpu.shares -> cpu.weight: %s", "linear until the runtime's own writes are read "
                        "(-cgroup-v2-weight-formula=auto)" if self._auto else f"{setting} (-cgroup-v2-weight-formula)")

    @property
    def formula(self) -> WeightFormula:
        return self._executor.weight_formula

    def observe(self, pods: Iterable[PodMeta]) -> list[Observation]:
        """Read the runtime's weights of up to MAX_OBSERVED containers whose shares are known."""
        found: list[Observation] = []
        for pod in pods:
            if len(found) >= MAX_OBSERVED:
                break
            if not _observable(pod) or (pod_dir := pod_cgroup_dir(self._layout, pod)) is None:
                continue
            for container in pod.containers:
                shares = kubelet_shares(container)
                if (container.is_init or not container.container_id or shares is None
                        or not CPU_SHARES_MIN < shares < CPU_SHARES_MAX):
                    continue
                try:
                    container_dir = self._layout.container_dir(pod_dir, container.container_id, container.runtime)
                    weight = int(self._executor.read("cpu.shares", container_dir))
                except (CgroupPathError, ExecutorError, ValueError) as err:
                    logger.debug("cpu.weight of %s/%s not read: %s", pod.key, container.name, err)
                    continue
                found.append(Observation(f"{pod.key}/{container.name}", shares, weight,
                                         formulas_giving(shares, weight)))
                break  # one container a pod: the pods differ more than the containers of one pod
        return found

    def update(self, pods: Iterable[PodMeta]) -> WeightFormula:
        """With ``auto`` on cgroup v2: observe, and follow the runtime's formula; the formula in force."""
        if not self._auto or self._executor.cgroup_fs.version is not CgroupVersion.V2:
            return self.formula
        observations = self.observe(pods)
        formula = decide(observations)
        informative = [o for o in observations if len(o.formulas) == 1]
        if formula is None:
            if informative and not self._disagreement_logged:
                self._disagreement_logged = True
                logger.warning("cgroup v2 weight formula: the runtime's weights disagree (%s); keeping %s",
                               "; ".join(f"{o.container}: {o.shares} shares -> {o.weight}" for o in informative),
                               self.formula.value)
            return self.formula
        self._disagreement_logged = False
        self.observed = formula
        if formula is not self.formula:
            example = next(o for o in informative if formula in o.formulas)
            logger.info("cgroup v2 weight formula: %s, as the runtime writes it (%s: %d shares -> cpu.weight %d)",
                        formula.value, example.container, example.shares, example.weight)
            self._executor.weight_formula = formula
        return formula
