import logging

import pytest

from koordlet.gpu.metrics import usage_samples
from koordlet.gpu.nvml import (
    discover,
    normalise_pci_bus_id,
    open_nvml,
    read_usage,
)
from koordlet.metriccache import MetricCache, SeriesKey
from tests.koordlet.gpu.fake_nvml import H100_DRIVER, H100_MEMORY_TOTAL, H100_NAME, FakeNvml, h100_gpus
from tests.koordlet.system.pci_tree import pci_tree


@pytest.fixture
def nvml() -> FakeNvml:
    return FakeNvml()


def test_discovery_reads_the_h100_inventory(nvml: FakeNvml, tmp_path) -> None:
    with open_nvml(nvml) as session:
        inventory = discover(session, sys_dir=str(tmp_path / "sys"))
    assert inventory.driver_version == H100_DRIVER
    assert inventory.model == H100_NAME
    (gpu,) = inventory.gpus
    assert gpu.uuid == nvml.gpus[0].uuid and gpu.uuid.startswith("GPU-")
    assert gpu.minor == 0
    assert gpu.memory_total_bytes == H100_MEMORY_TOTAL
    assert gpu.pci_bus_id == "0000:00:06.0"
    assert nvml.init_count == 0, "the session must shut NVML down"


def test_numa_not_supported_reads_as_unknown_not_a_failure(nvml: FakeNvml, tmp_path) -> None:
    with open_nvml(nvml) as session:
        (gpu,) = discover(session, sys_dir=str(tmp_path / "sys")).gpus
    assert gpu.numa_node is None


def test_numa_from_nvml_when_supported(tmp_path) -> None:
    gpus = h100_gpus(2)
    gpus[1].numa_node = 1
    with open_nvml(FakeNvml(gpus)) as session:
        inventory = discover(session, sys_dir=str(tmp_path / "sys"))
    assert [g.numa_node for g in inventory.gpus] == [None, 1]


def test_numa_and_pcie_switch_fall_back_to_sysfs(nvml: FakeNvml, tmp_path) -> None:
    pci_tree(tmp_path, "0000:00:06.0", "1")
    with open_nvml(nvml) as session:
        (gpu,) = discover(session, sys_dir=str(tmp_path / "sys")).gpus
    assert gpu.numa_node == 1
    assert gpu.pcie_switch_id == "0000:00:01.0"


def test_pci_bus_id_normalised_to_sysfs_form() -> None:
    assert normalise_pci_bus_id("00000000:00:06.0") == "0000:00:06.0"
    assert normalise_pci_bus_id("00000001:3B:00.0") == "0001:3b:00.0"


def test_node_without_nvml_library_logs_one_line_and_stays_off(caplog) -> None:
    caplog.set_level(logging.INFO, logger="koordlet.gpu.nvml")
    assert open_nvml(FakeNvml(library=False)) is None
    lines = [r for r in caplog.records if r.name == "koordlet.gpu.nvml"]
    assert len(lines) == 1 and "GPU support off" in lines[0].getMessage()


def test_node_without_gpus_stays_off_and_shuts_nvml_down(caplog) -> None:
    caplog.set_level(logging.INFO, logger="koordlet.gpu.nvml")
    nvml = FakeNvml(gpus=[])
    assert open_nvml(nvml) is None
    assert nvml.init_count == 0
    assert "no GPU" in caplog.text


def test_a_gpu_failing_its_queries_is_left_out(tmp_path) -> None:
    gpus = h100_gpus(2)
    gpus[0].lost = True
    with open_nvml(FakeNvml(gpus)) as session:
        inventory = discover(session, sys_dir=str(tmp_path / "sys"))
    assert [g.minor for g in inventory.gpus] == [1]


def test_usage_reports_utilisation_and_memory_used(tmp_path) -> None:
    gpus = h100_gpus(2)
    gpus[1].util_gpu = 87
    gpus[1].memory_used = 40 * 2**30
    with open_nvml(FakeNvml(gpus)) as session:
        inventory = discover(session, sys_dir=str(tmp_path / "sys"))
        usage = {u.minor: u for u in read_usage(session, inventory)}
    assert usage[0].gpu_util_percent == 0
    assert usage[1].gpu_util_percent == 87
    assert usage[1].memory_used_bytes == 40 * 2**30
    assert usage[1].memory_total_bytes == H100_MEMORY_TOTAL


def test_usage_lands_in_the_metric_cache_under_koordinator_series_names(tmp_path) -> None:
    gpus = h100_gpus(1)
    gpus[0].util_gpu = 42
    cache = MetricCache()
    with open_nvml(FakeNvml(gpus)) as session:
        inventory = discover(session, sys_dir=str(tmp_path / "sys"))
        assert cache.append_samples(usage_samples(read_usage(session, inventory), timestamp=100.0)) == 2
    labels = {"gpu_minor": "0", "gpu_device_uuid": gpus[0].uuid}
    assert cache.latest(SeriesKey.of("node_gpu_core_usage", **labels)) == (100.0, 42.0)
    assert cache.latest(SeriesKey.of("node_gpu_memory_usage", **labels)) == (100.0, float(gpus[0].memory_used))
