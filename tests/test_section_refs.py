"""Every "§N" in the tracked files names a page that exists, and no research note from outside the repository is
named (scripts/section-refs.py, issue 25): a citation that no longer resolves fails here, not in a reader's hands."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_section_references_resolve() -> None:
    out = subprocess.run([sys.executable, str(REPO / "scripts" / "section-refs.py")], cwd=REPO, capture_output=True,
                         text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout == "", out.stdout
