"""Fixture resctrl trees (this kernel has no resctrl): the files koordlet reads to learn the node's RDT, in the
kernel's formats, and a tree whose mkdir fails with ENOSPC as the kernel's does once the CPU's CLOSIDs are used
up (a tmpfs with no inode left)."""

from __future__ import annotations

import os
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


def resctrl_tree(root: Path) -> Path:
    """``info/L3/cbm_mask`` (11 ways) and a root ``schemata`` with two L3 caches and MBA."""
    (root / "info/L3").mkdir(parents=True)
    (root / "info/L3/cbm_mask").write_text("7ff\n")
    (root / "schemata").write_text("    L3:0=7ff;1=7ff\n    MB:0=100;1=100\n")
    return root


def group_as_the_kernel_makes_it(root: Path, group: str, tasks: str = "") -> Path:
    """A group dir with the files the kernel's mkdir gives it (a plain mkdir here creates none)."""
    path = root / group
    path.mkdir()
    (path / "schemata").write_text("L3:0=7ff;1=7ff\nMB:0=100;1=100\n")
    (path / "tasks").write_text(tasks)
    return path


@contextmanager
def groups_get_the_kernels_files(root: Path, poll_s: float = 0.05) -> Iterator[None]:
    """While inside: each group dir made under ``root`` by anyone (a plain mkdir, which here gives it no files) gets
    the files the kernel's mkdir gives a new group at once, within ``poll_s``: ``schemata`` with the root group's
    masks (a new group may use every way) and an empty ``tasks``. A write to one of them between the mkdir and the
    poll fails as a write to a missing file; the next writer (koordlet's reconciler) finds them."""
    stop = threading.Event()
    skip = {"info", "mon_groups", "mon_data"}

    def run() -> None:
        while not stop.wait(poll_s):
            for path in root.iterdir():
                if path.name in skip or not path.is_dir() or (path / "tasks").exists():
                    continue
                try:
                    (path / "schemata").write_text((root / "schemata").read_text().replace("    ", ""))
                    (path / "tasks").write_text("")
                except FileNotFoundError:  # removed in between
                    continue

    thread = threading.Thread(target=run, name="resctrl-kernel-mkdir", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=5)


@contextmanager
def resctrl_tree_without_closids(root: Path) -> Iterator[Path]:
    """A resctrl tree where every mkdir of a group fails with ENOSPC: a tmpfs whose inodes the tree uses up."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    root.mkdir(parents=True)
    # the root, info, info/L3, cbm_mask and schemata: five inodes, none left for a group
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k,nr_inodes=5,mode=0755", "koordlet-test-resctrl",
                    str(root)], check=True)
    try:
        resctrl_tree(root)
        with pytest.raises(OSError, match="No space left"):
            (root / "probe").mkdir()
        yield root
    finally:
        subprocess.run(["umount", str(root)], check=True)
