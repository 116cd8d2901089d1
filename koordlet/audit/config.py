"""Koordinator's audit flags and their defaults (``-audit-log-dir``, ``-audit-verbose``,
``-audit-max-disk-space-mb``, ``-audit-max-concurrent-readers``, ``-audit-max-events-limit``), checked once."""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_LOG_DIR = "/var/log/koordlet"
DEFAULT_VERBOSE = 3
DEFAULT_MAX_DISK_SPACE_MB = 16
DEFAULT_MAX_CONCURRENT_READERS = 4
DEFAULT_ACTIVE_READER_TTL_S = 600.0
DEFAULT_EVENTS_LIMIT = 256
DEFAULT_MAX_EVENTS_LIMIT = 2048
MAX_FILE_SIZE_BYTES = 2 << 20  # Koordinator audit.MaxFileSize


class AuditConfigError(ValueError):
    """An audit setting that cannot work (no disk space for one file, a non-positive limit)."""


@dataclass(frozen=True, slots=True)
class AuditConfig:
    """Koordinator's audit flags and defaults (``-audit-log-dir``, ``-audit-verbose``...)."""

    log_dir: str = DEFAULT_LOG_DIR
    verbose: int = DEFAULT_VERBOSE  # 0 = every level
    max_disk_space_mb: int = DEFAULT_MAX_DISK_SPACE_MB
    max_concurrent_readers: int = DEFAULT_MAX_CONCURRENT_READERS
    active_reader_ttl_s: float = DEFAULT_ACTIVE_READER_TTL_S
    default_events_limit: int = DEFAULT_EVENTS_LIMIT
    max_events_limit: int = DEFAULT_MAX_EVENTS_LIMIT
    max_file_size_bytes: int = MAX_FILE_SIZE_BYTES

    def __post_init__(self) -> None:
        if self.max_disk_space_mb * (1 << 20) < self.max_file_size_bytes:
            raise AuditConfigError(f"-audit-max-disk-space-mb {self.max_disk_space_mb} holds no "
                                   f"{self.max_file_size_bytes} byte file")
        for name in ("max_concurrent_readers", "default_events_limit", "max_events_limit"):
            if getattr(self, name) < 1:
                raise AuditConfigError(f"audit {name.replace('_', '-')} must be at least 1")

    @property
    def max_files(self) -> int:
        """Files the log may keep, the current one included (Koordinator: size MB × 1 MiB / 2 MiB)."""
        return self.max_disk_space_mb * (1 << 20) // self.max_file_size_bytes
