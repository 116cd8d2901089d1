"""A node's page-frame files for the page-idle scan, laid out as the kernel writes them, of any size: the idle
bitmap (``<sys>/kernel/mm/page_idle/bitmap``, bit i = frame i, in u64 words), ``<proc>/kpageflags`` and
``<proc>/kpagecgroup`` (one u64 per frame: the KPF_* flags, the owning memory cgroup's inode).

One chunk of :data:`~koordlet.system.coldpage.CHUNK_PAGES` frames is built once and written again and again
(about 1 MiB per chunk: a 512 GiB node is 2048 chunks, 2 GiB of files), so the files are quick to make and every
chunk costs the scan what a real one does: every bitmap word has idle bits, 40 % of the frames are page cache on
the LRU, 20 % anonymous memory on the LRU, the rest free or kernel pages, owned by :data:`OWNERS` cgroups.
"""

from __future__ import annotations

import os
import random
import struct
from dataclasses import dataclass
from pathlib import Path

from koordlet.system.coldpage import CHUNK_PAGES

KPF_LRU, KPF_ANON, KPF_SWAPBACKED, KPF_BUDDY, KPF_SLAB = 5, 12, 14, 10, 7
OWNERS = 200
FIRST_INODE = 1000


@dataclass(frozen=True, slots=True)
class PageFrames:
    sys_dir: str
    proc_dir: str
    frames: int
    idle_file_by_inode: dict[int, int]  # what a scan of the files as written counts
    file_by_inode: dict[int, int]  # what it counts once every frame was marked idle


def _chunk() -> tuple[bytes, bytes, bytes, dict[int, int], dict[int, int]]:
    rng = random.Random(33)
    bitmap = rng.randbytes(CHUNK_PAGES // 8)
    flags: list[int] = []
    owners: list[int] = []
    counted: dict[int, int] = {}
    every: dict[int, int] = {}
    for frame in range(CHUNK_PAGES):
        kind = frame % 10
        owner = FIRST_INODE + (frame * 7919) % OWNERS
        if kind < 4:  # page cache on the LRU
            flags.append(1 << KPF_LRU)
            owners.append(owner)
            every[owner] = every.get(owner, 0) + 1
            if bitmap[frame // 8] >> (frame % 8) & 1:
                counted[owner] = counted.get(owner, 0) + 1
        elif kind < 6:  # anonymous memory on the LRU: idle or not, never page cache
            flags.append(1 << KPF_LRU | 1 << KPF_ANON | 1 << KPF_SWAPBACKED)
            owners.append(owner)
        else:
            flags.append(1 << (KPF_BUDDY if kind < 8 else KPF_SLAB))
            owners.append(0)
    return bitmap, struct.pack(f"={CHUNK_PAGES}Q", *flags), struct.pack(f"={CHUNK_PAGES}Q", *owners), counted, every


def write_page_frames(root: Path, frames: int) -> PageFrames:
    """The three files under ``root/sys`` and ``root/proc`` for ``frames`` page frames (a multiple of
    :data:`CHUNK_PAGES`)."""
    if frames <= 0 or frames % CHUNK_PAGES:
        raise ValueError(f"{frames} frames: not a positive multiple of {CHUNK_PAGES}")
    sys_dir, proc_dir = root / "sys", root / "proc"
    (sys_dir / "kernel/mm/page_idle").mkdir(parents=True, exist_ok=True)
    proc_dir.mkdir(parents=True, exist_ok=True)
    bitmap, flags, owners, counted, every = _chunk()
    chunks = frames // CHUNK_PAGES
    for path, data in ((sys_dir / "kernel/mm/page_idle/bitmap", bitmap), (proc_dir / "kpageflags", flags),
                       (proc_dir / "kpagecgroup", owners)):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            for _ in range(chunks):
                os.write(fd, data)
        finally:
            os.close(fd)
    return PageFrames(str(sys_dir), str(proc_dir), frames, {inode: n * chunks for inode, n in counted.items()},
                      {inode: n * chunks for inode, n in every.items()})
