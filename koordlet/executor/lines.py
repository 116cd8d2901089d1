"""Per-device blkio lines written with a record of what the line held before, and put back from that record.

A blkio file holds one line per block device, and some of those lines are not koordlet's: an operator's
``io.cost.qos`` for a disk, a throttle another agent set. So koordlet writes a device's line only through
:meth:`DeviceLines.write`, which records that line as it was before koordlet's first write to it
(:class:`~koordlet.executor.records.NodeRecords`, persisted), and takes a line back only through
:meth:`DeviceLines.restore`, which writes that recorded value and forgets it. A line koordlet never wrote has no
record, so nothing ever resets it. A line whose record cannot be kept (the record full, or a line this agent
could not write back) is not written: what koordlet could not put back it does not change.
"""

from __future__ import annotations

import logging

from koordlet.executor.errors import CgroupNotFoundError, ExecutorError, InvalidUpdateError
from koordlet.executor.executor import ResourceExecutor
from koordlet.executor.updates import ResourceUpdate
from koordlet.plan import LineKey
from koordlet.system.blkiolines import absent_value, line_of
from koordlet.system.resources import InvalidCgroupValueError, device_of

logger = logging.getLogger(__name__)


class DeviceLines:
    """The recorded writes and restores of one executor's per-device lines."""

    def __init__(self, executor: ResourceExecutor) -> None:
        self._executor = executor
        self._record = executor.records.device_lines

    def key(self, resource: str, cgroup_dir: str, value: str) -> tuple[ResourceUpdate, LineKey]:
        """The update for ``value`` and the line it is for; InvalidUpdateError for a value that is not one
        device's line of a per-device file."""
        update = ResourceUpdate.of(resource, cgroup_dir, value)
        if not update.resource.per_device:
            raise InvalidUpdateError(f"{resource} is not a per-device file")
        try:
            device = device_of(update.resource.validate(value))
        except InvalidCgroupValueError as exc:
            raise InvalidUpdateError(str(exc)) from exc
        return update, LineKey.of(update.resource.name, update.cgroup_dir, device)

    def write(self, resource: str, cgroup_dir: str, value: str) -> bool:
        """Write one device's line, recording the line as it was first; True when written (False: the write
        cache had it). Raises ExecutorError (the dir gone, the kernel without the file, the record full)."""
        update, key = self.key(resource, cgroup_dir, value)
        if self._record.get(key.text()) is None:
            content = self._executor.read(update.resource, update.cgroup_dir)
            original = line_of(key.resource, content, key.device) or ""
            if original:
                self.key(resource, cgroup_dir, original)  # a line that could not be written back is not replaced
            if not self._record.record(key.text(), original):
                raise ExecutorError(f"{key.resource} {key.device} of {cgroup_dir or '/'} not written: its line "
                                    "before koordlet cannot be recorded")
        return self._executor.update(update)

    def restore(self, key: LineKey) -> bool:
        """Put the line back as it was before koordlet's first write and forget the record; False when nothing is
        recorded for it or its cgroup is gone (then only the record goes). Raises ExecutorError."""
        original = self._record.get(key.text())
        if original is None:
            return False
        value = original or absent_value(key.resource, key.device)
        try:
            self._executor.update(ResourceUpdate.of(key.resource, key.cgroup_dir, value))
        except CgroupNotFoundError:
            logger.debug("%s of %s is gone: its record goes", key.resource, key.cgroup_dir)
            self._record.forget(key.text())
            return False
        self._record.forget(key.text())
        return True
