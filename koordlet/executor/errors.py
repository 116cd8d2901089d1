"""Why the executor did not carry out a write: one exception class per outcome, each with the status it is
counted under (``koordlet_resource_update_total{resource,status}``, :mod:`koordlet.executor.metrics`)."""

from __future__ import annotations

from koordlet.executor import metrics


class ExecutorError(Exception):
    """A resource update was not carried out."""

    status = metrics.STATUS_FAILED


class InvalidUpdateError(ExecutorError):
    """The value is invalid for the resource, or the resource cannot be written in this cgroup version."""

    status = metrics.STATUS_INVALID


class UnsafePathError(ExecutorError):
    """The target path would leave the cgroup (or resctrl) root."""

    status = metrics.STATUS_UNSAFE_PATH


class UnsupportedResourceError(ExecutorError):
    """The file does not exist on this kernel (e.g. ``cpu.bvt_warp_ns`` outside Anolis)."""

    status = metrics.STATUS_UNSUPPORTED


class CgroupNotFoundError(ExecutorError):
    """The cgroup dir does not exist."""

    status = metrics.STATUS_NOT_FOUND


class WriteFailedError(ExecutorError):
    """The kernel refused the write; ``errno`` tells why (EINVAL, EBUSY, EPERM…)."""

    def __init__(self, message: str, errno_value: int | None) -> None:
        super().__init__(message)
        self.errno = errno_value
