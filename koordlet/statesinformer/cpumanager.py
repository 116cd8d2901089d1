"""kubelet's CPU manager state (``/var/lib/kubelet/cpu_manager_state``), as the koordlet models it.

The shapes here are shared by the NodeResourceTopology reporter (which reports the policy and the exclusive
assignments in Koordinator's annotations) and by the cpuset hook and CPU suppress (which never give kubelet's
exclusive CPUs to BE or shared-pool pods).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

POLICY_NONE = "none"
POLICY_STATIC = "static"


@dataclass(frozen=True, slots=True)
class CPUAssignment:
    """CPUs kubelet's static policy gave one container exclusively.

    The v2 checkpoint names the pod by UID and the container by name; the v1 checkpoint (kubelet before 1.18)
    names only the container ID (then ``pod_uid`` and ``container_name`` are empty).
    """

    cpus: frozenset[int]
    pod_uid: str = ""
    container_name: str = ""
    container_id: str = ""


@dataclass(frozen=True, slots=True)
class CPUManagerState:
    """What kubelet's CPU manager holds: its policy, options, reserved CPUs, shared pool and exclusive CPUs."""

    policy: str = POLICY_NONE
    options: Mapping[str, str] = field(default_factory=dict)
    reserved_cpus: frozenset[int] = frozenset()
    default_cpuset: frozenset[int] = frozenset()
    assignments: tuple[CPUAssignment, ...] = ()

    @property
    def exclusive_cpus(self) -> frozenset[int]:
        """Every CPU kubelet assigned to a container exclusively (never for BE or shared pools)."""
        out: set[int] = set()
        for assignment in self.assignments:
            out |= assignment.cpus
        return frozenset(out)
