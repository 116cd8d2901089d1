"""perf_event_open(2) counters of a cgroup, through ctypes (no C build step): what the CPI collector counts.

A cgroup counter is opened per CPU with ``PERF_FLAG_PID_CGROUP`` on the cgroup's directory (the ``perf_event``
hierarchy on cgroup v1, the unified one on v2): it counts the cgroup's tasks while they run on that CPU, and
the cgroup's count is the sum over the CPUs. A value is scaled by ``time_enabled / time_running`` when the
kernel had to multiplex the counter (Koordinator util/perf).

Two ways to open (Koordinator util/perf and util/perf_group): one counter per event and CPU, each read on its
own; or one group per CPU, the first event leading and the others following it, read at once with
``PERF_FORMAT_GROUP`` (gate ``Libpfm4``), where :func:`encode_with_libpfm` asks libpfm4 (``libpfm.so.4``,
through ctypes) for the encoding of event names.

Hardware events (cycles, instructions) need the CPU's performance monitoring unit: a kernel or a virtual
machine without one answers ENOENT (:func:`probe`), as software events (``task-clock``, ``cpu-clock``) still
count.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import fcntl
import logging
import os
import platform
import struct
from collections.abc import Sequence
from dataclasses import dataclass

logger = logging.getLogger(__name__)

PERF_TYPE_HARDWARE = 0
PERF_TYPE_SOFTWARE = 1
PERF_COUNT_HW_CPU_CYCLES = 0
PERF_COUNT_HW_INSTRUCTIONS = 1
PERF_COUNT_SW_CPU_CLOCK = 0
PERF_COUNT_SW_TASK_CLOCK = 1

PERF_FORMAT_TOTAL_TIME_ENABLED = 1 << 0
PERF_FORMAT_TOTAL_TIME_RUNNING = 1 << 1
PERF_FORMAT_ID = 1 << 2
PERF_FORMAT_GROUP = 1 << 3
PERF_FLAG_PID_CGROUP = 1 << 2
PERF_FLAG_FD_CLOEXEC = 1 << 3
PERF_IOC_FLAG_GROUP = 1
ATTR_DISABLED = 1 << 0  # perf_event_attr bit field: disabled
ATTR_EXCLUDE_HV = 1 << 6

# ioctls: _IO('$', n), and PERF_EVENT_IOC_ID = _IOR('$', 7, __u64 *)
PERF_EVENT_IOC_ENABLE = 0x2400
PERF_EVENT_IOC_DISABLE = 0x2401
PERF_EVENT_IOC_RESET = 0x2403
PERF_EVENT_IOC_ID = 0x80082407

_SYSCALL_NR = {"x86_64": 298, "aarch64": 241, "ppc64le": 319, "s390x": 331, "riscv64": 241}
_ATTR_SIZE_VER0 = 64
_SINGLE_READ = struct.Struct("=QQQ")  # value, time_enabled, time_running


class PerfError(OSError):
    """A counter could not be opened or read."""


class PerfLibraryError(PerfError):
    """libpfm4 is missing or does not know an event."""


class _Attr(ctypes.Structure):
    """The first 64 bytes of ``struct perf_event_attr`` (PERF_ATTR_SIZE_VER0): all a counting event needs."""

    _fields_ = [("type", ctypes.c_uint32), ("size", ctypes.c_uint32), ("config", ctypes.c_uint64),
                ("sample_period", ctypes.c_uint64), ("sample_type", ctypes.c_uint64),
                ("read_format", ctypes.c_uint64), ("flags", ctypes.c_uint64), ("wakeup_events", ctypes.c_uint32),
                ("bp_type", ctypes.c_uint32), ("config1", ctypes.c_uint64)]


@dataclass(frozen=True, slots=True)
class PerfEvent:
    """An event as perf_event_open knows it: ``type``, ``config`` (and ``config1``, and attribute bits such as
    exclude_hv that an encoder may ask for)."""

    name: str
    type: int
    config: int
    config1: int = 0
    flags: int = ATTR_EXCLUDE_HV


CYCLES = PerfEvent("cycles", PERF_TYPE_HARDWARE, PERF_COUNT_HW_CPU_CYCLES)
INSTRUCTIONS = PerfEvent("instructions", PERF_TYPE_HARDWARE, PERF_COUNT_HW_INSTRUCTIONS)
TASK_CLOCK = PerfEvent("task-clock", PERF_TYPE_SOFTWARE, PERF_COUNT_SW_TASK_CLOCK)
CPU_CLOCK = PerfEvent("cpu-clock", PERF_TYPE_SOFTWARE, PERF_COUNT_SW_CPU_CLOCK)

_libc: ctypes.CDLL | None = None


def _syscall_number() -> int:
    machine = platform.machine()
    try:
        return _SYSCALL_NR[machine]
    except KeyError as exc:
        raise PerfError(errno.ENOSYS, f"perf_event_open: unknown syscall number on {machine}") from exc


def _open(event: PerfEvent, pid: int, cpu: int, group_fd: int, flags: int, read_format: int, leader: bool) -> int:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    attr = _Attr(type=event.type, size=_ATTR_SIZE_VER0, config=event.config, config1=event.config1,
                 read_format=read_format, flags=event.flags | (ATTR_DISABLED if leader else 0))
    fd = _libc.syscall(_syscall_number(), ctypes.byref(attr), pid, cpu, group_fd, flags)
    if fd < 0:
        err = ctypes.get_errno()
        raise PerfError(err, f"perf_event_open({event.name}): {os.strerror(err)}")
    return fd


def probe(event: PerfEvent) -> None:
    """Open ``event`` for the calling thread on any CPU and close it; PerfError (ENOENT: no such counter on this
    kernel or machine) when it cannot be counted."""
    os.close(_open(event, 0, -1, -1, PERF_FLAG_FD_CLOEXEC, 0, leader=True))


class CgroupCounters:
    """``events`` of one cgroup on ``cpus``: opened (disabled) at construction, :meth:`start`, then :meth:`read`
    once (it disables, reads and closes everything). ``group``: one group per CPU read at once."""

    def __init__(self, cgroup_path: str, cpus: Sequence[int], events: Sequence[PerfEvent], group: bool = False) -> None:
        self._events = tuple(events)
        self._group = group
        self._fds: list[list[int]] = []  # per CPU: the events' fds (the leader first when grouped)
        self._ids: dict[int, int] = {}  # kernel event id → index in events (grouped)
        cgroup_fd = os.open(cgroup_path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            for cpu in cpus:
                self._fds.append(self._open_cpu(cgroup_fd, cpu))
        except BaseException:
            self.close()
            raise
        finally:
            os.close(cgroup_fd)

    def _open_cpu(self, cgroup_fd: int, cpu: int) -> list[int]:
        flags = PERF_FLAG_PID_CGROUP | PERF_FLAG_FD_CLOEXEC
        fds: list[int] = []
        try:
            if not self._group:
                read_format = PERF_FORMAT_TOTAL_TIME_ENABLED | PERF_FORMAT_TOTAL_TIME_RUNNING
                for event in self._events:
                    fds.append(_open(event, cgroup_fd, cpu, -1, flags, read_format, leader=True))
                return fds
            read_format = (PERF_FORMAT_GROUP | PERF_FORMAT_TOTAL_TIME_ENABLED | PERF_FORMAT_TOTAL_TIME_RUNNING
                           | PERF_FORMAT_ID)
            for index, event in enumerate(self._events):
                fd = _open(event, cgroup_fd, cpu, fds[0] if fds else -1, flags, read_format, leader=not fds)
                fds.append(fd)
                self._ids[struct.unpack("=Q", fcntl.ioctl(fd, PERF_EVENT_IOC_ID, bytes(8)))[0]] = index
            return fds
        except BaseException:
            for fd in fds:
                os.close(fd)
            raise

    def start(self) -> None:
        for fds in self._fds:
            if self._group:
                fcntl.ioctl(fds[0], PERF_EVENT_IOC_RESET, PERF_IOC_FLAG_GROUP)
                fcntl.ioctl(fds[0], PERF_EVENT_IOC_ENABLE, PERF_IOC_FLAG_GROUP)
                continue
            for fd in fds:
                fcntl.ioctl(fd, PERF_EVENT_IOC_RESET, 0)
                fcntl.ioctl(fd, PERF_EVENT_IOC_ENABLE, 0)

    def read(self) -> dict[str, float]:
        """{event name: the cgroup's count since :meth:`start`, scaled, summed over the CPUs}; closes."""
        totals = dict.fromkeys((event.name for event in self._events), 0.0)
        try:
            for fds in self._fds:
                if self._group:
                    fcntl.ioctl(fds[0], PERF_EVENT_IOC_DISABLE, PERF_IOC_FLAG_GROUP)
                    for index, value in self._read_group(fds[0]):
                        totals[self._events[index].name] += value
                    continue
                for event, fd in zip(self._events, fds, strict=True):
                    fcntl.ioctl(fd, PERF_EVENT_IOC_DISABLE, 0)
                    value, enabled, running = _SINGLE_READ.unpack(os.read(fd, _SINGLE_READ.size))
                    totals[event.name] += _scaled(value, enabled, running)
        finally:
            self.close()
        return totals

    def _read_group(self, leader: int) -> list[tuple[int, float]]:
        size = 24 + 16 * len(self._events)
        data = os.read(leader, size)
        count, enabled, running = struct.unpack_from("=QQQ", data)
        out = []
        for i in range(count):
            value, ident = struct.unpack_from("=QQ", data, 24 + 16 * i)
            index = self._ids.get(ident)
            if index is not None:
                out.append((index, _scaled(value, enabled, running)))
        return out

    def close(self) -> None:
        for fds in self._fds:
            for fd in fds:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self._fds = []


def _scaled(value: int, enabled: int, running: int) -> float:
    """A multiplexed counter's value over the whole time it was enabled (Koordinator util/perf)."""
    if running and enabled and running != enabled:
        return value * enabled / running
    return float(value)


# -------------------------------------------------------------------------------------------------- libpfm4


class _PfmEncodeArg(ctypes.Structure):
    """``pfm_perf_encode_arg_t`` (perfmon/pfmlib_perf_event.h)."""

    _fields_ = [("attr", ctypes.c_void_p), ("fstr", ctypes.c_void_p), ("size", ctypes.c_size_t),
                ("idx", ctypes.c_int), ("cpu", ctypes.c_int), ("flags", ctypes.c_int)]


PFM_PLM0 = 0x1  # kernel
PFM_PLM3 = 0x8  # user
PFM_OS_PERF_EVENT = 1
_PFM_ATTR_BUFFER = 256  # more than any struct perf_event_attr libpfm4 fills
_pfm: ctypes.CDLL | None = None


def _libpfm() -> ctypes.CDLL:
    global _pfm
    if _pfm is not None:
        return _pfm
    name = ctypes.util.find_library("pfm") or "libpfm.so.4"
    try:
        lib = ctypes.CDLL(name)
    except OSError as exc:
        raise PerfLibraryError(errno.ENOENT, f"libpfm4 not found ({name}): {exc}") from exc
    lib.pfm_strerror.restype = ctypes.c_char_p
    rc = lib.pfm_initialize()
    if rc != 0:
        raise PerfLibraryError(errno.EINVAL, f"pfm_initialize: {lib.pfm_strerror(rc).decode(errors='replace')}")
    _pfm = lib
    return lib


def encode_with_libpfm(names: Sequence[str]) -> tuple[PerfEvent, ...]:
    """Each event name as libpfm4 encodes it for perf_event_open (user and kernel level, as Koordinator asks);
    PerfLibraryError when libpfm4 is missing or does not know a name."""
    lib = _libpfm()
    events = []
    for name in names:
        buffer = ctypes.create_string_buffer(_PFM_ATTR_BUFFER)
        arg = _PfmEncodeArg(attr=ctypes.addressof(buffer), fstr=None, size=ctypes.sizeof(_PfmEncodeArg))
        rc = lib.pfm_get_os_event_encoding(name.encode(), PFM_PLM0 | PFM_PLM3, PFM_OS_PERF_EVENT, ctypes.byref(arg))
        if rc != 0:
            raise PerfLibraryError(errno.EINVAL, f"libpfm4 cannot encode {name!r}: "
                                                 f"{lib.pfm_strerror(rc).decode(errors='replace')}")
        attr = _Attr.from_buffer_copy(buffer.raw[:ctypes.sizeof(_Attr)])
        events.append(PerfEvent(name, attr.type, attr.config, attr.config1, attr.flags & ~ATTR_DISABLED))
    return tuple(events)
