"""Real NVML on a real GPU (a machine with an NVIDIA GPU; make gpu-check). Skipped where nvmlInit fails.

Prints the Device object, the model, the driver and the time of one discovery pass so the lead can
compare with docs/node-interfaces.md §15 (≈24 ms including nvmlInit on the H100).
"""

import json
import time

import pytest

from koordlet.gpu.devicecr import build_device
from koordlet.gpu.health import HealthBoard, XidHealthWatcher
from koordlet.gpu.nvml import discover, open_nvml, read_usage

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def pynvml():
    nvml = pytest.importorskip("pynvml", reason="nvidia-ml-py is not installed")
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as exc:
        pytest.skip(f"no usable GPU: nvmlInit failed: {exc}")
    nvml.nvmlShutdown()
    return nvml


def test_real_gpu_discovery_metrics_and_device_object(pynvml) -> None:
    start = time.perf_counter()
    session = open_nvml(pynvml)
    assert session is not None
    try:
        inventory = discover(session)
        discovery_s = time.perf_counter() - start
        usage = read_usage(session, inventory)
        board = HealthBoard(g.uuid for g in inventory.gpus)
        watcher = XidHealthWatcher(session, board, [g.uuid for g in inventory.gpus])
        watcher.start()
        watcher.poll_once(timeout_ms=100)
        watcher.stop()
    finally:
        session.close()
    device = build_device("gpu-node", inventory, board.snapshot())
    print(f"\nmodel: {inventory.model}\ndriver: {inventory.driver_version}")
    print(f"one discovery pass incl. nvmlInit: {discovery_s * 1000:.1f} ms")
    print(f"events registered for: {list(watcher.watched)}")
    for sample in usage:
        print(f"usage: minor {sample.minor} util {sample.gpu_util_percent}% memory {sample.memory_used_bytes} B")
    print(json.dumps(device, indent=2))
    assert inventory.gpus and inventory.driver_version
    for gpu in inventory.gpus:
        assert gpu.uuid.startswith("GPU-") and gpu.memory_total_bytes > 0 and gpu.pci_bus_id
    assert {u.uuid for u in usage} == {g.uuid for g in inventory.gpus}
    assert all(d["health"] for d in device["spec"]["devices"])
