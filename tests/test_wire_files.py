"""write_atomic: the new content in one rename, the mode asked for, no temp file left behind on failure."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from wire.files import write_atomic


def test_replaces_the_file_with_the_mode_asked_for(tmp_path: Path) -> None:
    path = tmp_path / "koordlet.json"
    path.write_text("old")
    write_atomic(path, "new\n", prefix=".koordlet-", suffix=".tmp", mode=0o644)
    assert path.read_text() == "new\n"
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o644
    assert os.listdir(tmp_path) == ["koordlet.json"]


def test_a_failed_rename_leaves_the_old_file_and_no_temp_file(tmp_path: Path) -> None:
    target = tmp_path / "a-dir"
    target.mkdir()
    (target / "keep").write_text("x")  # os.replace cannot put a file over a non-empty directory
    with pytest.raises(OSError):
        write_atomic(target, "new")
    assert sorted(os.listdir(tmp_path)) == ["a-dir"]
