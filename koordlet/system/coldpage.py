"""Cold page cache: how much of a cgroup's file pages nobody touched for a while. Two kernel sources:

- **kidled** (Alibaba Cloud Linux / Anolis; Documentation/vm/kidled.rst of their kernel): a kernel thread scans
  pages every ``/sys/kernel/mm/kidled/scan_period_in_seconds`` and every memory cgroup's
  ``memory.idle_page_stats`` gives, per page kind (``c``/``d`` clean/dirty, ``s``/``f`` swap/file, ``e``/``u``
  evictable/unevictable, ``i``/``a`` inactive/active), the bytes idle for each age bucket. Cold = the file
  pages (``cfei``, ``dfei``, ``cfui``, ``dfui``) in the buckets from :data:`KIDLED_COLD_BOUNDARY` on
  (Koordinator util/system/kidled_util.go). Its two settings (the scan period and ``use_hierarchy``) are
  node-wide files the executor writes (``koordlet.system.sysctl``: ``kidled_*``), recorded and put back.
- **the page-idle bitmap** (mainline, ``CONFIG_IDLE_PAGE_TRACKING``; Documentation/admin-guide/mm/
  idle_page_tracking.rst): :func:`mark_idle_range` sets the idle bit of a range of pages in
  ``/sys/kernel/mm/page_idle/bitmap`` (called by the executor, a chunk at a time); a bit still set when
  :class:`IdleScan` reads it later means no one touched the page since. Each idle page on the file LRU
  (``/proc/kpageflags``: LRU, not swap-backed) is counted for the memory cgroup that owns it
  (``/proc/kpagecgroup``: that cgroup's inode number).

The bitmap is read in chunks of :data:`CHUNK_PAGES` pages (8 KiB of bitmap, 512 KiB each of flags and owners),
one :meth:`IdleScan.step` per chunk, so a caller can pause between chunks; each chunk is counted with C-speed
byte operations (a 256-entry table expands the bitmap to one byte per page, ``bytes.translate`` picks the flag
bits, big-integer AND combines them, ``itertools.compress`` and ``Counter`` count the owners): its cost is the
kernel's per-page work, not Python's.
"""

from __future__ import annotations

import errno
import itertools
import os
import stat
from array import array
from collections import Counter
from dataclasses import dataclass
from types import TracebackType

from koordlet.system.procfs import ProcParseError
from koordlet.system.roots import PROC_DIR, SYS_DIR

KIDLED_DIR = ("kernel", "mm", "kidled")
KIDLED_SCAN_PERIOD = "scan_period_in_seconds"
KIDLED_USE_HIERARCHY = "use_hierarchy"
KIDLED_DEFAULT_SCAN_PERIOD_S = 5  # Koordinator's defaults (kidled_util.go)
KIDLED_DEFAULT_USE_HIERARCHY = 1
KIDLED_COLD_BOUNDARY = 5  # the first bucket counted cold
IDLE_PAGE_STATS = "memory.idle_page_stats"
_KIDLED_ROWS = ("csei", "dsei", "cfei", "dfei", "csui", "dsui", "cfui", "dfui", "csea", "dsea", "cfea", "dfea",
                "csua", "dsua", "cfua", "dfua", "slab")
_KIDLED_COLD_ROWS = ("cfei", "dfei", "cfui", "dfui")

PAGE_IDLE_BITMAP = ("kernel", "mm", "page_idle", "bitmap")
KPAGEFLAGS = "kpageflags"
KPAGECGROUP = "kpagecgroup"
_KPF_LRU = 1 << 5  # in the flags' first byte
_KPF_SWAPBACKED_BYTE1 = 1 << (14 - 8)  # bit 14 (anon and shmem pages), in the flags' second byte
CHUNK_PAGES = 1 << 16  # 8 KiB of bitmap, 512 KiB of flags and of owners per chunk
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")

# One byte per page from one bitmap byte (bit j of byte k is page 8k + j).
_EXPAND = tuple(bytes((byte >> bit) & 1 for bit in range(8)) for byte in range(256))
_LRU = bytes(1 if byte & _KPF_LRU else 0 for byte in range(256))
_NOT_SWAPBACKED = bytes(0 if byte & _KPF_SWAPBACKED_BYTE1 else 1 for byte in range(256))


class ColdPageError(ProcParseError):
    """A cold page file is malformed."""


# ------------------------------------------------------------------------------------------------ kidled


def kidled_present(sys_dir: str = SYS_DIR) -> bool:
    base = os.path.join(sys_dir, *KIDLED_DIR)
    return all(os.path.isfile(os.path.join(base, name)) for name in (KIDLED_SCAN_PERIOD, KIDLED_USE_HIERARCHY))


def parse_idle_page_stats(text: str, boundary: int = KIDLED_COLD_BOUNDARY) -> int:
    """Cold file bytes of one ``memory.idle_page_stats``: the cold rows' buckets from ``boundary`` on."""
    rows: dict[str, list[int]] = {}
    buckets = 0
    for line in text.splitlines():
        parts = line.split()
        if not parts:
            continue
        if parts[0] == "#":
            if len(parts) >= 3 and parts[1] == "buckets:":
                buckets = len(parts[2].split(","))
            continue
        if parts[0] in _KIDLED_ROWS:
            try:
                rows[parts[0]] = [int(v) for v in parts[1:]]
            except ValueError as exc:
                raise ColdPageError(f"bad {IDLE_PAGE_STATS} row {line.strip()[:80]!r}") from exc
    missing = [row for row in _KIDLED_ROWS if row not in rows]
    if missing or not buckets or any(len(values) != buckets for values in rows.values()):
        raise ColdPageError(f"{IDLE_PAGE_STATS}: missing rows {missing} or buckets ({buckets}) not matching")
    return sum(sum(rows[row][boundary:]) for row in _KIDLED_COLD_ROWS)


def read_idle_page_stats(memory_dir: str, boundary: int = KIDLED_COLD_BOUNDARY) -> int:
    """Cold file bytes of the memory cgroup at ``memory_dir`` (kidled); OSError or ColdPageError."""
    with open(os.path.join(memory_dir, IDLE_PAGE_STATS), encoding="ascii", errors="replace") as f:
        return parse_idle_page_stats(f.read(), boundary)


# ---------------------------------------------------------------------------------------------- page idle


def page_idle_present(sys_dir: str = SYS_DIR, proc_dir: str = PROC_DIR) -> bool:
    """The bitmap, and the per-page files that tell a page's kind and memory cgroup."""
    return (os.path.exists(os.path.join(sys_dir, *PAGE_IDLE_BITMAP))
            and all(os.path.exists(os.path.join(proc_dir, name)) for name in (KPAGEFLAGS, KPAGECGROUP)))


def page_idle_bitmap_path(sys_dir: str = SYS_DIR) -> str:
    return os.path.join(sys_dir, *PAGE_IDLE_BITMAP)


_ONES = b"\xff" * (CHUNK_PAGES // 8)


def mark_idle_range(path: str, first_page: int, pages: int = CHUNK_PAGES) -> int:
    """Set the idle bit of ``pages`` pages from ``first_page`` (both multiples of 64: the bitmap is read and
    written in u64 words) in the bitmap at ``path`` (the kernel takes it for user pages on an LRU and ignores the
    rest); returns how many it covered, 0 past the last page frame. Raises OSError (O_NOFOLLOW: ELOOP)."""
    if first_page % 64 or pages % 64 or not 0 < pages <= CHUNK_PAGES:
        raise ValueError(f"page-idle range {first_page}+{pages}: not whole u64 words within one chunk")
    fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        status = os.fstat(fd)
        if stat.S_ISREG(status.st_mode):  # a file standing in for the bitmap (a test tree): its size is the end
            pages = min(pages, max(status.st_size - first_page // 8, 0) * 8)
            if not pages:
                return 0
        try:
            written = os.pwrite(fd, _ONES[:pages // 8], first_page // 8)
        except OSError as exc:
            if exc.errno in (errno.ENXIO, errno.EINVAL) and first_page:
                return 0  # past the last page frame
            raise
    finally:
        os.close(fd)
    return max(written, 0) * 8


@dataclass(frozen=True, slots=True)
class IdlePages:
    """Idle file pages by the inode number of their memory cgroup (0: not charged to one), and in all."""

    by_cgroup_inode: dict[int, int]
    total: int


def _and(*selectors: bytes) -> bytes:
    size = len(selectors[0])
    value = int.from_bytes(selectors[0], "little")
    for other in selectors[1:]:
        value &= int.from_bytes(other, "little")
    return value.to_bytes(size, "little")


def _open_all(paths: tuple[str, ...]) -> list[int]:
    """Read-only descriptors of ``paths``; when one cannot be opened, those already open are closed."""
    fds: list[int] = []
    try:
        for path in paths:
            fds.append(os.open(path, os.O_RDONLY | os.O_CLOEXEC))
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    return fds


class IdleScan:
    """One pass over the bitmap, a chunk of :data:`CHUNK_PAGES` pages per :meth:`step`: the file pages whose idle
    bit is still set (untouched since they were marked), by owner. Holds three descriptors until :meth:`close`
    (a ``with`` block); raises OSError."""

    def __init__(self, sys_dir: str = SYS_DIR, proc_dir: str = PROC_DIR) -> None:
        self._fds = _open_all((page_idle_bitmap_path(sys_dir), os.path.join(proc_dir, KPAGEFLAGS),
                               os.path.join(proc_dir, KPAGECGROUP)))
        self._counts: Counter[int] = Counter()
        self.next_page = 0
        self.done = False

    def step(self) -> bool:
        """Count the next chunk; False once the bitmap has ended (nothing read)."""
        if self.done:
            return False
        bitmap_fd, flags_fd, owners_fd = self._fds
        first = self.next_page
        bitmap = os.pread(bitmap_fd, CHUNK_PAGES // 8, first // 8)
        if not bitmap:
            self.done = True
            return False
        pages = len(bitmap) * 8
        if bitmap.count(0) != len(bitmap):
            idle = b"".join(map(_EXPAND.__getitem__, bitmap))
            flags = memoryview(os.pread(flags_fd, pages * 8, first * 8))
            owners = array("Q", os.pread(owners_fd, pages * 8, first * 8))
            count = min(len(flags) // 8, len(owners))
            selected = _and(idle[:count], flags[0:count * 8:8].tobytes().translate(_LRU),
                            flags[1:count * 8:8].tobytes().translate(_NOT_SWAPBACKED))
            self._counts.update(itertools.compress(owners, selected))
        self.next_page = first + pages
        return True

    def result(self) -> IdlePages:
        return IdlePages(dict(self._counts), sum(self._counts.values()))

    def close(self) -> None:
        fds, self._fds = self._fds, []
        for fd in fds:
            os.close(fd)

    def __enter__(self) -> IdleScan:
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.close()


def idle_file_pages(sys_dir: str = SYS_DIR, proc_dir: str = PROC_DIR) -> IdlePages:
    """A whole :class:`IdleScan` at once (tools and tests). OSError."""
    with IdleScan(sys_dir, proc_dir) as scan:
        while scan.step():
            pass
        return scan.result()


def cgroup_inode(path: str) -> int | None:
    """The inode number of a cgroup dir (what ``/proc/kpagecgroup`` names it by); None when it is gone."""
    try:
        return os.stat(path).st_ino
    except OSError:
        return None
