"""The resource executor, the single writer of kernel files: ``ResourceExecutor``, ``ResourceUpdate``."""

from koordlet.executor.executor import (
    BatchResult,
    CgroupNotFoundError,
    ExecutorError,
    InvalidUpdateError,
    PartialWriteError,
    ResourceExecutor,
    ResourceUpdate,
    UnsafePathError,
    UnsupportedResourceError,
    UpdateFailure,
    WriteFailedError,
)

__all__ = [
    "BatchResult",
    "CgroupNotFoundError",
    "ExecutorError",
    "InvalidUpdateError",
    "PartialWriteError",
    "ResourceExecutor",
    "ResourceUpdate",
    "UnsafePathError",
    "UnsupportedResourceError",
    "UpdateFailure",
    "WriteFailedError",
]
