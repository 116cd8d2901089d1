"""koordlet for the demo on a machine without GPUs: ``python -m demo.fake_gpu_koordlet <koordlet flags>``.

The daemon exactly as ``python -m koordlet.main`` runs it, with the fake NVML the tests use (an H100 as
docs/node-interfaces.md §15 describes it, ``DEMO_FAKE_GPUS`` of them, default 2) in place of pynvml, so the
GPU service, the Device report and the device plugin run as they would on a GPU node.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from koordlet.main import main  # noqa: E402
from tests.koordlet.gpu.fake_nvml import FakeNvml, h100_gpus  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(nvml=FakeNvml(h100_gpus(int(os.environ.get("DEMO_FAKE_GPUS", "2"))))))
