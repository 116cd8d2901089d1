"""Cold page cache: how much of a cgroup's file pages nobody touched for a while. Two kernel sources:

- **kidled** (Alibaba Cloud Linux / Anolis; Documentation/vm/kidled.rst of their kernel): a kernel thread scans
  pages every ``/sys/kernel/mm/kidled/scan_period_in_seconds`` and every memory cgroup's
  ``memory.idle_page_stats`` gives, per page kind (``c``/``d`` clean/dirty, ``s``/``f`` swap/file, ``e``/``u``
  evictable/unevictable, ``i``/``a`` inactive/active), the bytes idle for each age bucket. Cold = the file
  pages (``cfei``, ``dfei``, ``cfui``, ``dfui``) in the buckets from :data:`KIDLED_COLD_BOUNDARY` on
  (Koordinator util/system/kidled_util.go). :func:`start_kidled` sets the scan period and
  ``use_hierarchy`` as Koordinator does before reading.
- **the page-idle bitmap** (mainline, ``CONFIG_IDLE_PAGE_TRACKING``; Documentation/admin-guide/mm/
  idle_page_tracking.rst): :func:`mark_idle` sets the idle bit of every page in
  ``/sys/kernel/mm/page_idle/bitmap``; a bit still set when :func:`idle_file_pages` reads it later means no
  one touched the page since. Each idle page on the file LRU (``/proc/kpageflags``: LRU, not swap-backed)
  is counted for the memory cgroup that owns it (``/proc/kpagecgroup``: that cgroup's inode number).

The bitmap scan is done in chunks of pages with C-speed byte operations (a 256-entry table expands the bitmap
to one byte per page, ``bytes.translate`` picks the flag bits, big-integer AND combines them,
``itertools.compress`` and ``Counter`` count the owners): its cost is the kernel's rmap walk per page, not
Python's.
"""

from __future__ import annotations

import errno
import itertools
import os
from array import array
from collections import Counter
from dataclasses import dataclass

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
_CHUNK_PAGES = 1 << 16  # 8 KiB of bitmap, 512 KiB of flags and of owners per chunk
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


def start_kidled(sys_dir: str = SYS_DIR, scan_period_s: int = KIDLED_DEFAULT_SCAN_PERIOD_S,
                 use_hierarchy: int = KIDLED_DEFAULT_USE_HIERARCHY) -> None:
    """Make kidled scan every ``scan_period_s`` with hierarchical stats (what Koordinator's collector sets when it
    is enabled); raises OSError. Both values are checked (kidled's ranges) and written with O_NOFOLLOW."""
    if not 0 <= scan_period_s <= (1 << 32) - 1 or use_hierarchy not in (0, 1):
        raise ValueError(f"kidled scan period {scan_period_s} or use_hierarchy {use_hierarchy} out of range")
    base = os.path.join(sys_dir, *KIDLED_DIR)
    for name, value in ((KIDLED_SCAN_PERIOD, scan_period_s), (KIDLED_USE_HIERARCHY, use_hierarchy)):
        fd = os.open(os.path.join(base, name), os.O_WRONLY | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            os.write(fd, str(value).encode())
        finally:
            os.close(fd)


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


def mark_idle(sys_dir: str = SYS_DIR) -> int:
    """Set the idle bit of every page (the kernel takes it for user pages on an LRU and ignores the rest);
    returns how many page frames the bitmap covers. Raises OSError."""
    ones = b"\xff" * (_CHUNK_PAGES // 8)
    fd = os.open(os.path.join(sys_dir, *PAGE_IDLE_BITMAP), os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    covered = 0
    try:
        while True:
            try:
                written = os.pwrite(fd, ones, covered // 8)
            except OSError as exc:
                if exc.errno in (errno.ENXIO, errno.EINVAL) and covered:
                    return covered  # past the last page frame
                raise
            if written <= 0:
                return covered
            covered += written * 8
    finally:
        os.close(fd)


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


def idle_file_pages(sys_dir: str = SYS_DIR, proc_dir: str = PROC_DIR) -> IdlePages:
    """The file pages whose idle bit is still set (untouched since :func:`mark_idle`), by owner. OSError."""
    counts: Counter[int] = Counter()
    fds = [os.open(path, os.O_RDONLY | os.O_CLOEXEC) for path in (
        os.path.join(sys_dir, *PAGE_IDLE_BITMAP), os.path.join(proc_dir, KPAGEFLAGS),
        os.path.join(proc_dir, KPAGECGROUP))]
    bitmap_fd, flags_fd, owners_fd = fds
    try:
        first = 0
        while True:
            bitmap = os.pread(bitmap_fd, _CHUNK_PAGES // 8, first // 8)
            if not bitmap:
                break
            pages = len(bitmap) * 8
            if bitmap.count(0) != len(bitmap):
                idle = b"".join(map(_EXPAND.__getitem__, bitmap))
                flags = memoryview(os.pread(flags_fd, pages * 8, first * 8))
                owners = array("Q", os.pread(owners_fd, pages * 8, first * 8))
                count = min(len(flags) // 8, len(owners))
                selected = _and(idle[:count], flags[0:count * 8:8].tobytes().translate(_LRU),
                                flags[1:count * 8:8].tobytes().translate(_NOT_SWAPBACKED))
                counts.update(itertools.compress(owners, selected))
            first += pages
    finally:
        for fd in fds:
            os.close(fd)
    return IdlePages(dict(counts), sum(counts.values()))


def cgroup_inode(path: str) -> int | None:
    """The inode number of a cgroup dir (what ``/proc/kpagecgroup`` names it by); None when it is gone."""
    try:
        return os.stat(path).st_ino
    except OSError:
        return None
