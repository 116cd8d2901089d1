"""The resource executor, the one writer of kernel files: ``ResourceExecutor``, ``ResourceUpdate``."""

from koordlet.executor.errors import (
    CgroupNotFoundError,
    ExecutorError,
    InvalidUpdateError,
    UnsafePathError,
    UnsupportedResourceError,
    WriteFailedError,
)
from koordlet.executor.executor import ResourceExecutor
from koordlet.executor.updates import BatchResult, ResourceUpdate, UpdateFailure

__all__ = [
    "BatchResult",
    "CgroupNotFoundError",
    "ExecutorError",
    "InvalidUpdateError",
    "ResourceExecutor",
    "ResourceUpdate",
    "UnsafePathError",
    "UnsupportedResourceError",
    "UpdateFailure",
    "WriteFailedError",
]
