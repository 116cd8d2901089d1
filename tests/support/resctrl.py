"""Fixture resctrl trees (this kernel has no resctrl): the files koordlet reads to learn the node's RDT, in the
kernel's formats, and a tree whose mkdir fails with ENOSPC as the kernel's does once the CPU's CLOSIDs are used
up (a tmpfs with no inode left)."""

from __future__ import annotations

import os
import subprocess
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
