"""The log writer (Koordinator's eventWriter): appends events to ``audit.log``, rotates it at the file size and
removes the oldest files beyond the disk space (names: :mod:`koordlet.audit.rotation`)."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from datetime import UTC, datetime

from prometheus_client import Counter

from koordlet.audit.config import AuditConfig
from koordlet.audit.events import Event
from koordlet.audit.rotation import CURRENT_FILE, STAMP_FORMAT, next_rotated_name, rotated_files

logger = logging.getLogger(__name__)

_LOG_DIR_MODE = 0o755
_LOG_FILE_MODE = 0o640

EVENTS_WRITTEN = Counter("koordlet_audit_events", "Audit events by outcome (written, dropped, failed)",
                         ["status"])


class EventLog:
    """The rotated, bounded log file (Koordinator's eventWriter). Each event is one ``write`` of one line
    on an ``O_APPEND`` file: a reader never sees half an event, and nothing waits in a buffer."""

    def __init__(self, config: AuditConfig, clock: Callable[[], datetime] | None = None) -> None:
        self._config = config
        self._clock = clock or (lambda: datetime.now().astimezone())
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._size = 0
        os.makedirs(config.log_dir, mode=_LOG_DIR_MODE, exist_ok=True)
        os.chmod(config.log_dir, _LOG_DIR_MODE)

    @property
    def current_path(self) -> str:
        return os.path.join(self._config.log_dir, CURRENT_FILE)

    def wants(self, level: int) -> bool:
        verbose = self._config.verbose
        return verbose <= 0 or level <= verbose

    def log(self, level: int, event: Event) -> bool:
        """Append ``event`` when ``level`` is within the verbosity; False when it was not written."""
        if not self.wants(level):
            EVENTS_WRITTEN.labels("dropped").inc()
            return False
        line = event.line()
        with self._lock:
            try:
                if self._fd is None:
                    self._open()
                assert self._fd is not None
                os.write(self._fd, line)
                self._size += len(line)
                if self._size >= self._config.max_file_size_bytes:
                    self._rotate()
            except OSError as err:
                EVENTS_WRITTEN.labels("failed").inc()
                logger.warning("cannot write the audit log in %s: %s", self._config.log_dir, err)
                return False
        EVENTS_WRITTEN.labels("written").inc()
        return True

    def _open(self) -> None:
        fd = os.open(self.current_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, _LOG_FILE_MODE)
        self._fd, self._size = fd, os.fstat(fd).st_size

    def _rotate(self) -> None:
        """audit.log → audit-<time>-<n>.log, then the oldest files beyond the disk space go."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        directory = self._config.log_dir
        os.rename(self.current_path, os.path.join(directory, next_rotated_name(
            rotated_files(directory), self._clock().astimezone(UTC).strftime(STAMP_FORMAT))))
        rotated = rotated_files(directory)
        for old in rotated[: max(len(rotated) - self._config.max_files + 1, 0)]:
            try:
                os.remove(old)
            except OSError as err:
                logger.warning("cannot remove the old audit file %s: %s", old, err)
        self._open()

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None
