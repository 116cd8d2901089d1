"""Readers for /proc: node CPU ticks, memory, pressure stall information (PSI), process CPU time.

Every reader takes the procfs mount dir ``proc_dir`` (default ``/proc``; :mod:`koordlet.system.roots`) so
tests point it at a fixture tree. Parsers take the raw bytes so they can be tested on their own. Reading
is the hot path of the 1 s collectors, so files are read with ``os.open``/``os.read`` (a third cheaper
than ``open().read()`` here) or, for files read every tick at a fixed path, through a :class:`KeptFile`
that keeps the descriptor and uses ``os.pread`` (half the cost again). No subprocesses: ``CLK_TCK`` comes
from ``os.sysconf``.
"""

from __future__ import annotations

import errno
import logging
import os
import resource
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from koordlet.system.roots import PROC_DIR

logger = logging.getLogger(__name__)

_READ_CHUNK = 65536


class ProcParseError(ValueError):
    """A /proc or cgroup file did not have the expected format."""


def read_file_bytes(path: str) -> bytes:
    """Read a small kernel file in full with plain syscalls (raises OSError as ``open`` would)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        data = os.read(fd, _READ_CHUNK)
        if len(data) < _READ_CHUNK:
            return data
        chunks = [data]
        while True:
            chunk = os.read(fd, _READ_CHUNK)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
    finally:
        os.close(fd)


class KeptFile:
    """A kernel file read again and again at offset 0 through one kept descriptor.

    procfs and kernfs regenerate the content on every read at offset 0, so ``pread(fd, n, 0)`` returns
    fresh data without open/close. The descriptor is reopened once if the file went away and came back.
    Not thread-safe: each collector keeps its own.
    """

    __slots__ = ("_fd", "_path", "_size")

    def __init__(self, path: str) -> None:
        self._path = path
        self._fd = -1
        self._size = _READ_CHUNK

    @property
    def path(self) -> str:
        return self._path

    def read(self) -> bytes:
        if self._fd < 0:
            self._fd = os.open(self._path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            return self._pread_all()
        except OSError as err:
            if err.errno not in (errno.ENODEV, errno.ESTALE, errno.ENOENT, errno.EBADF):
                raise
            self.close()
            self._fd = os.open(self._path, os.O_RDONLY | os.O_CLOEXEC)
            return self._pread_all()

    def _pread_all(self) -> bytes:
        while True:
            data = os.pread(self._fd, self._size, 0)
            if len(data) < self._size:
                return data
            # Buffer was too small (e.g. a long "intr" line in /proc/stat): grow and re-read from 0 so the
            # content is one consistent snapshot.
            self._size *= 2

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __del__(self) -> None:
        self.close()


def _replaced(fd: int) -> bool:
    """The descriptor's file was unlinked or replaced since it was opened (its link count fell to 0)."""
    try:
        return os.fstat(fd).st_nlink == 0
    except OSError:
        return True


# The share of the soft RLIMIT_NOFILE each part that holds descriptors open may take at once (a divisor), so that
# together they leave a quarter for sockets, the API client, logs and one-off reads: the pod and the PSI collectors'
# kept cgroup files a quarter each (KeptFiles), the executor's kept reads an eighth (kernfs.KeptReads), the CPI
# collector's perf counters an eighth (metricsadvisor/cpi.py).
SHARE_KEPT_FILES = 4
SHARE_KEPT_READS = 8
SHARE_PERF_COUNTERS = 8


def descriptor_budget(share: int, unlimited: int) -> int:
    """How many descriptors a part may hold: 1/``share`` of the soft RLIMIT_NOFILE now (``unlimited`` when there is
    no limit)."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return unlimited if soft == resource.RLIM_INFINITY else max(soft // share, 0)


def dir_markers(cgroup_dirs: Iterable[str]) -> tuple[str, ...]:
    """``/<dir>/`` of each cgroup dir (relative to its hierarchy): what the path of a file below it holds, in
    every hierarchy."""
    return tuple(f"/{directory.strip('/')}/" for directory in cgroup_dirs if directory.strip("/"))


def under(path: str, markers: Sequence[str]) -> bool:
    """``path`` (a file of a hierarchy) is below one of the dirs of ``markers`` (:func:`dir_markers`)."""
    return any(marker in path for marker in markers)


class KeptFiles:
    """Many kernel files read every tick (per-cgroup stats), each through a kept descriptor and ``pread``.

    Saves the open/close pair (about 40 % of a small cgroup file read). At most ``max_open``
    descriptors are kept (default: a quarter of the soft RLIMIT_NOFILE); beyond that, files are read
    with plain open/read/close. A descriptor whose file was removed (kernfs answers ENODEV) is closed
    and the path reopened once, so a re-created cgroup is followed; a path that is gone raises
    FileNotFoundError. With ``check_replaced``, a descriptor whose file was unlinked or replaced (a plain
    file whose link count fell to 0: kernfs never shows that, fixture trees do) is reopened too, at one
    ``fstat`` per read. Read by one collector; :meth:`forget_under` may come from another thread (the states'
    callback when a pod goes), so reads and closes hold a lock (uncontended: a fraction of the ``pread``): a
    descriptor is never closed, and its number reused, under a read.
    """

    def __init__(self, max_open: int | None = None, *, check_replaced: bool = False) -> None:
        self._max_open = descriptor_budget(SHARE_KEPT_FILES, 256) if max_open is None else max_open
        self._check_replaced = check_replaced
        self._fds: dict[str, int] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._fds)

    def read(self, path: str) -> bytes:
        with self._lock:
            return self._read(path)

    def _read(self, path: str) -> bytes:
        fd = self._fds.get(path)
        if fd is None:
            if len(self._fds) >= self._max_open:
                return read_file_bytes(path)
            fd = self._open(path)
        elif self._check_replaced and _replaced(fd):
            self._drop(path)
            fd = self._open(path)
        try:
            data = os.pread(fd, _READ_CHUNK, 0)
        except OSError as err:
            self._drop(path)
            if err.errno not in (errno.ENODEV, errno.ESTALE, errno.ENOENT):
                raise
            fd = self._open(path)  # removed and perhaps re-created: one fresh try
            try:
                data = os.pread(fd, _READ_CHUNK, 0)
            except OSError:
                self._drop(path)
                raise
        if len(data) < _READ_CHUNK:
            return data
        return read_file_bytes(path)  # larger than a chunk: not worth keeping a buffer for

    def _open(self, path: str) -> int:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        self._fds[path] = fd
        return fd

    def _drop(self, path: str) -> None:
        fd = self._fds.pop(path, None)
        if fd is not None:
            os.close(fd)

    def forget(self, paths: Iterable[str]) -> None:
        """Close the descriptors of files that will not be read again (their pod or container is gone)."""
        with self._lock:
            for path in paths:
                self._drop(path)

    def forget_under(self, cgroup_dirs: Iterable[str]) -> None:
        """Close the descriptors of files below any of ``cgroup_dirs`` (relative to a hierarchy: every hierarchy's
        copy of the dir), whatever thread asks."""
        markers = dir_markers(cgroup_dirs)
        with self._lock:
            for path in [path for path in self._fds if under(path, markers)]:
                self._drop(path)

    def close(self) -> None:
        with self._lock:
            for path in list(self._fds):
                self._drop(path)

    def __del__(self) -> None:
        self.close()


# --------------------------------------------------------------------------------------------- /proc/stat


@dataclass(frozen=True, slots=True)
class CpuTicks:
    """Busy and total ticks (USER_HZ) of one ``cpu`` line of /proc/stat."""

    # user+nice+system+irq+softirq; idle, iowait and steal are not busy (Koordinator, docs/koordinator.md §7.1).
    busy_ticks: int
    total_ticks: int


@dataclass(frozen=True, slots=True)
class ProcStat:
    node: CpuTicks
    # (cpu id, ticks) for each "cpuN" line, in file order.
    per_cpu: tuple[tuple[int, CpuTicks], ...]


def _cpu_ticks(fields: list[bytes]) -> CpuTicks:
    # fields after the label: user nice system idle iowait irq softirq steal [guest guest_nice]
    if len(fields) < 7:
        raise ProcParseError(f"/proc/stat cpu line has {len(fields)} fields, want >= 7")
    values = [int(v) for v in fields[:8]]
    busy = values[0] + values[1] + values[2] + values[5] + values[6]
    # guest time is already counted in user, so the total is the first 8 fields only.
    return CpuTicks(busy_ticks=busy, total_ticks=sum(values))


def parse_proc_stat(data: bytes) -> ProcStat:
    node: CpuTicks | None = None
    per_cpu: list[tuple[int, CpuTicks]] = []
    for line in data.split(b"\n"):
        if not line.startswith(b"cpu"):
            if node is not None:
                break  # cpu lines come first; skip the long intr/ctxt/softirq tail
            continue
        parts = line.split()
        label = parts[0]
        try:
            if label == b"cpu":
                node = _cpu_ticks(parts[1:])
            else:
                per_cpu.append((int(label[3:]), _cpu_ticks(parts[1:])))
        except ValueError as err:
            raise ProcParseError(f"bad /proc/stat line {line[:80]!r}: {err}") from err
    if node is None:
        raise ProcParseError("/proc/stat has no aggregate 'cpu' line")
    return ProcStat(node=node, per_cpu=tuple(per_cpu))


def read_proc_stat(proc_dir: str = PROC_DIR) -> ProcStat:
    return parse_proc_stat(read_file_bytes(os.path.join(proc_dir, "stat")))


class NodeProcFiles:
    """``/proc/stat`` and ``/proc/meminfo`` read every tick through kept descriptors (the node collector)."""

    __slots__ = ("_meminfo", "_stat")

    def __init__(self, proc_dir: str = PROC_DIR) -> None:
        self._stat = KeptFile(os.path.join(proc_dir, "stat"))
        self._meminfo = KeptFile(os.path.join(proc_dir, "meminfo"))

    def proc_stat(self) -> ProcStat:
        return parse_proc_stat(self._stat.read())

    def meminfo(self) -> MemInfo:
        return parse_meminfo(self._meminfo.read())

    def close(self) -> None:
        self._stat.close()
        self._meminfo.close()


def clock_ticks_per_second() -> int:
    """USER_HZ, the unit of /proc/stat and /proc/<pid>/stat times (``getconf CLK_TCK``)."""
    try:
        value = os.sysconf("SC_CLK_TCK")
    except (ValueError, OSError):
        value = -1
    return value if value > 0 else 100


# ------------------------------------------------------------------------------------------ /proc/meminfo


@dataclass(frozen=True, slots=True)
class MemInfo:
    mem_total_bytes: int
    mem_free_bytes: int
    mem_available_bytes: int
    buffers_bytes: int
    cached_bytes: int
    swap_free_bytes: int = 0  # SwapFree: what the node can still swap out (0 without swap)

    @property
    def used_bytes(self) -> int:
        """Node memory usage as Koordinator reports it: MemTotal − MemAvailable (docs/koordinator.md §7.1)."""
        return max(self.mem_total_bytes - self.mem_available_bytes, 0)

    @property
    def used_with_page_cache_bytes(self) -> int:
        """MemTotal − MemFree: usage that also counts page cache and buffers."""
        return max(self.mem_total_bytes - self.mem_free_bytes, 0)


def parse_meminfo_fields(data: bytes) -> dict[str, int]:
    """All ``Key: value [kB]`` lines of a meminfo file, converted to bytes where the unit is kB."""
    fields: dict[str, int] = {}
    for line in data.split(b"\n"):
        key, sep, rest = line.partition(b":")
        if not sep:
            continue
        parts = rest.split()
        if not parts:
            continue
        try:
            value = int(parts[0])
        except ValueError as err:
            raise ProcParseError(f"bad meminfo line {line!r}") from err
        if len(parts) > 1 and parts[1] == b"kB":
            value *= 1024
        fields[key.decode()] = value
    return fields


def parse_meminfo(data: bytes) -> MemInfo:
    fields = parse_meminfo_fields(data)
    try:
        total = fields["MemTotal"]
        free = fields["MemFree"]
    except KeyError as err:
        raise ProcParseError(f"meminfo lacks {err.args[0]}") from err
    buffers = fields.get("Buffers", 0)
    cached = fields.get("Cached", 0)
    # Kernels before 3.14 have no MemAvailable; approximate it the way `free` does.
    available = fields.get("MemAvailable", free + buffers + cached)
    return MemInfo(
        mem_total_bytes=total,
        mem_free_bytes=free,
        mem_available_bytes=available,
        buffers_bytes=buffers,
        cached_bytes=cached,
        swap_free_bytes=fields.get("SwapFree", 0),
    )


def read_meminfo(proc_dir: str = PROC_DIR) -> MemInfo:
    return parse_meminfo(read_file_bytes(os.path.join(proc_dir, "meminfo")))


# ------------------------------------------------------------------------------------------------- PSI

PSI_RESOURCES = ("cpu", "memory", "io")


@dataclass(frozen=True, slots=True)
class PsiLine:
    avg10: float
    avg60: float
    avg300: float
    total_us: int


@dataclass(frozen=True, slots=True)
class Psi:
    some: PsiLine
    # None where the file has no "full" line (cpu pressure before Linux 5.13).
    full: PsiLine | None


def _psi_line(parts: list[bytes], line: bytes) -> PsiLine:
    values: dict[bytes, bytes] = {}
    for part in parts:
        key, sep, value = part.partition(b"=")
        if not sep:
            raise ProcParseError(f"bad PSI field {part!r} in {line!r}")
        values[key] = value
    try:
        return PsiLine(
            avg10=float(values[b"avg10"]),
            avg60=float(values[b"avg60"]),
            avg300=float(values[b"avg300"]),
            total_us=int(values[b"total"]),
        )
    except (KeyError, ValueError) as err:
        raise ProcParseError(f"bad PSI line {line!r}: {err}") from err


def parse_psi(data: bytes) -> Psi:
    """Parse ``some avg10=… avg60=… avg300=… total=…`` and the optional ``full …`` line."""
    some: PsiLine | None = None
    full: PsiLine | None = None
    for line in data.split(b"\n"):
        parts = line.split()
        if not parts:
            continue
        if parts[0] == b"some":
            some = _psi_line(parts[1:], line)
        elif parts[0] == b"full":
            full = _psi_line(parts[1:], line)
        else:
            raise ProcParseError(f"unknown PSI line {line!r}")
    if some is None:
        raise ProcParseError("PSI file has no 'some' line")
    return Psi(some=some, full=full)


def read_psi(path: str) -> Psi:
    """Read a PSI file: ``/proc/pressure/<res>`` or a cgroup's ``<res>.pressure``."""
    return parse_psi(read_file_bytes(path))


def node_psi_path(resource: str, proc_dir: str = PROC_DIR) -> str:
    if resource not in PSI_RESOURCES:
        raise ValueError(f"unknown PSI resource {resource!r}, want one of {PSI_RESOURCES}")
    return os.path.join(proc_dir, "pressure", resource)


def read_node_psi(resource: str, proc_dir: str = PROC_DIR) -> Psi:
    """The system-wide ``/proc/pressure/<resource>``."""
    return read_psi(node_psi_path(resource, proc_dir))


def node_psi_supported(proc_dir: str = PROC_DIR) -> bool:
    """True when the kernel exposes readable system-wide PSI (CONFIG_PSI=y and not psi=0)."""
    try:
        read_psi(node_psi_path("cpu", proc_dir))
    except (OSError, ProcParseError):
        return False
    return True


# ------------------------------------------------------------------------------------------ /proc/<pid>


def parse_pid_cpu_ticks(data: bytes) -> int:
    """utime + stime (USER_HZ ticks) from the content of /proc/<pid>/stat."""
    # The command name (field 2) is in parentheses and may itself contain spaces and ')'.
    _, sep, rest = data.rpartition(b")")
    if not sep:
        raise ProcParseError("pid stat has no ')' after the command name")
    fields = rest.split()
    # rest starts at field 3 (state); utime and stime are fields 14 and 15.
    try:
        return int(fields[11]) + int(fields[12])
    except (IndexError, ValueError) as err:
        raise ProcParseError(f"bad pid stat tail {rest[:80]!r}") from err


def read_pid_cpu_ticks(pid: int, proc_dir: str = PROC_DIR) -> int:
    return parse_pid_cpu_ticks(read_file_bytes(os.path.join(proc_dir, str(pid), "stat")))
