"""The GPU tests' shared fixture: a started GPU service over the fake NVML's two H100s."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from koordlet.gpu.service import GPUService
from tests.koordlet.gpu.fake_nvml import FakeNvml, h100_gpus


@pytest.fixture
def service(tmp_path: Path) -> Iterator[GPUService]:
    started = GPUService.start(FakeNvml(h100_gpus(2)), sys_dir=str(tmp_path / "sys"), poll_timeout_ms=20)
    assert started is not None
    try:
        yield started
    finally:
        started.stop()
