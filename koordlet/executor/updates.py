"""What a caller asks the executor to write to a cgroup (:class:`ResourceUpdate`) and what a batch of such writes
came to (:class:`BatchResult`). Values only."""

from __future__ import annotations

from dataclasses import dataclass

from koordlet.executor.errors import ExecutorError
from koordlet.system.resources import CgroupResource, get_resource


@dataclass(frozen=True, slots=True)
class ResourceUpdate:
    """Write ``value`` (v1 semantics) to ``resource`` of the cgroup ``cgroup_dir``.

    ``cgroup_dir`` is relative to the hierarchy root (``kubepods/besteffort/pod<uid>``); ``subsystem``
    overrides the resource's v1 hierarchy (e.g. ``cgroup.procs`` of the memory hierarchy).
    """

    resource: CgroupResource
    cgroup_dir: str
    value: str | int
    subsystem: str | None = None

    @classmethod
    def of(cls, resource: str, cgroup_dir: str, value: str | int, subsystem: str | None = None) -> ResourceUpdate:
        """Build from a registry name (raises ``UnknownCgroupResourceError`` for a name not in the registry)."""
        return cls(get_resource(resource), cgroup_dir, value, subsystem)

    @property
    def depth(self) -> int:
        return len([part for part in self.cgroup_dir.split("/") if part])


@dataclass(frozen=True, slots=True)
class UpdateFailure:
    update: ResourceUpdate
    error: ExecutorError


@dataclass(frozen=True, slots=True)
class BatchResult:
    """``written``: files written (a leveled update may write a file twice); ``skipped``: exact values
    not written because the cache said they are already there; ``done``: the updates whose exact value was
    written (what the audit log records)."""

    written: int = 0
    skipped: int = 0
    failures: tuple[UpdateFailure, ...] = ()
    done: tuple[ResourceUpdate, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.failures
