"""Koordinator's chart (v1.8.0) and source (a7a1b76), for the tests that check the recorded facts against them."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.deploy import koordinator_v1_8_0 as koordinator

# A checkout (or bare clone) of koordinator-sh/charts; none in CI (no network), where the facts stand as recorded.
CHARTS_DIR = os.environ.get("KOORDINATOR_CHARTS_DIR", "")


@pytest.fixture(scope="session")
def koordinator_chart(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Koordinator v1.8.0's chart from the koordinator-sh/charts at ``KOORDINATOR_CHARTS_DIR``, when one is named."""
    if not CHARTS_DIR:
        pytest.skip("KOORDINATOR_CHARTS_DIR names no koordinator-sh/charts: the recorded facts stand unchecked here")
    out = tmp_path_factory.mktemp("koordinator-chart")
    archive = subprocess.run(["git", "-C", CHARTS_DIR, "archive", "HEAD", f"versions/{koordinator.VERSION}"],
                             capture_output=True, timeout=60, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(out)], input=archive, check=True, timeout=60)
    return out / "versions" / koordinator.VERSION


@pytest.fixture(scope="session")
def koordinator_source() -> str:
    """A clone of koordinator-sh/koordinator (bare or not) holding commit a7a1b76, when ``KOORDINATOR_SOURCE_DIR``
    names one."""
    source = os.environ.get("KOORDINATOR_SOURCE_DIR", "")
    if not source:
        pytest.skip("KOORDINATOR_SOURCE_DIR names no koordinator-sh/koordinator: the recorded facts stand unchecked")
    return source
