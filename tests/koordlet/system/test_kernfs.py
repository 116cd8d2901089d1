"""kernfs: plain-syscall reads and the executor's kept descriptors (:class:`kernfs.KeptReads`).

Kept descriptors must read what opening the path now would read. Real cgroups show kernfs's side of that
(tests/koordlet/executor/test_executor_v1.py); plain files here show the rest: a file rewritten in
place, replaced by rename, or removed.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from koordlet.system import kernfs


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_read_text_and_raw(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"  1 2\n3\n")
    assert kernfs.read_text(str(path)) == "1 2\n3"
    assert kernfs.read_raw(str(path)) == "  1 2\n3\n"
    path.write_bytes(b"\xff7\n")
    assert kernfs.read_text(str(path)) == "\ufffd7"  # not ASCII: replaced, never raised
    with pytest.raises(FileNotFoundError):
        kernfs.read_text(str(tmp_path / "missing"))
    with pytest.raises(IsADirectoryError):
        kernfs.read_text(str(tmp_path))


def test_kept_reads_follow_rewrites_replacements_and_removal(tmp_path: Path) -> None:
    path = tmp_path / "value"
    path.write_text("100\n")
    reads = kernfs.KeptReads()
    try:
        assert reads.read_text(str(path)) == "100"
        assert len(reads) == 1
        path.write_text("200\n")  # same inode, new content
        assert reads.read_text(str(path)) == "200"
        other = tmp_path / "value.new"
        other.write_text("300\n")
        os.replace(other, path)  # a new inode under the same name: the kept one is unlinked
        assert reads.read_text(str(path)) == "300"
        assert len(reads) == 1
        path.unlink()
        with pytest.raises(FileNotFoundError):
            reads.read_text(str(path))
        assert len(reads) == 0
        path.write_text("400\n")  # created again
        assert reads.read_text(str(path)) == "400"
    finally:
        reads.close()
    assert len(reads) == 0


def test_kept_reads_close_idle_descriptors_and_keep_to_the_budget(tmp_path: Path) -> None:
    now = [0.0]
    paths = []
    for index in range(4):
        path = tmp_path / f"f{index}"
        path.write_text(f"{index}\n")
        paths.append(str(path))
    fds_before = _open_fds()
    reads = kernfs.KeptReads(idle_s=5.0, max_open=3, clock=lambda: now[0])
    assert [reads.read_text(p) for p in paths] == ["0", "1", "2", "3"]
    assert len(reads) == 3  # the fourth was read with open/read/close
    assert _open_fds() == fds_before + 3
    for _ in range(3):  # f0 stays in use, the others go idle
        now[0] += 2.0
        assert reads.read_text(paths[0]) == "0"
    assert len(reads) == 1  # swept: a descriptor pins its cgroup in the kernel
    assert _open_fds() == fds_before + 1
    reads.forget(str(tmp_path / "f0"))
    assert len(reads) == 0 and _open_fds() == fds_before


def test_kept_reads_read_large_files_whole_and_forget_by_marker(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    big = tmp_path / "a" / "big"
    big.write_bytes(b"y" * 100_000 + b"\n")
    small = tmp_path / "b" / "small"
    small.write_text("1\n")
    reads = kernfs.KeptReads()
    try:
        assert reads.read_text(str(big)) == "y" * 100_000
        assert reads.read_text(str(small)) == "1"
        reads.forget("/a/")
        assert len(reads) == 1
        assert reads.read_text(str(small)) == "1"
    finally:
        reads.close()


def test_kept_reads_are_safe_from_many_threads(tmp_path: Path) -> None:
    paths = []
    for index in range(8):
        path = tmp_path / f"f{index}"
        path.write_text(f"{index}\n")
        paths.append(str(path))
    now = [0.0]
    reads = kernfs.KeptReads(idle_s=0.001, clock=lambda: now[0])  # sweeps on almost every read
    wrong: list[tuple[str, str]] = []

    def reader(offset: int) -> None:
        for round_ in range(300):
            path = paths[(offset + round_) % len(paths)]
            now[0] += 0.0005
            value = reads.read_text(path)
            if value != os.path.basename(path)[1:]:
                wrong.append((path, value))

    threads = [threading.Thread(target=reader, args=(n,)) for n in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not any(thread.is_alive() for thread in threads)
    reads.close()
    assert wrong == []
    assert len(reads) == 0
