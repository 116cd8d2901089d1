"""GPU discovery and per-GPU usage through NVML (the `pynvml` module of nvidia-ml-py).

`pynvml` is imported only when a session is opened, and every function takes the NVML module as
an argument, so CI drives the same code with a test double that implements the calls used here
(see tests/koordlet/gpu/fake_nvml.py). A node without the library, the driver or any GPU gets one
INFO line and no session: the GPU parts of koordlet stay off there.

Facts about real NVML on a GPU machine: docs/node-interfaces.md §15 (H100, NUMA node query
raises NVMLError_NotSupported inside the VM, which must read as "unknown", not a failure).
"""

from __future__ import annotations

import importlib
import logging
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Self

from koordlet.system.roots import SYS_DIR
from koordlet.system.sysfs import pci_device_numa_node, pci_device_parent_bridge

_log = logging.getLogger(__name__)

# The NVML module: the real `pynvml`, or a test double with the same functions and error classes.
NvmlModule = ModuleType | Any


class NvmlUnavailableError(RuntimeError):
    """NVML cannot be used on this node (no library, no driver, or no GPU)."""


@dataclass(frozen=True, slots=True)
class GPUInfo:
    """Static facts of one GPU, read once per discovery pass."""

    index: int
    uuid: str
    minor: int
    model: str
    memory_total_bytes: int
    # None when NVML cannot tell (NVMLError_NotSupported in VMs) and sysfs has no answer either.
    numa_node: int | None
    # Normalised to the sysfs form "dddd:bb:dd.f" (lower case, 4-digit domain).
    pci_bus_id: str
    # Upstream PCIe bridge/switch of the GPU from sysfs, "" when unknown.
    pcie_switch_id: str


@dataclass(frozen=True, slots=True)
class GPUInventory:
    driver_version: str
    gpus: tuple[GPUInfo, ...]

    @property
    def model(self) -> str:
        # One model per node is what the node label can carry; the first GPU names it.
        return self.gpus[0].model if self.gpus else ""


@dataclass(frozen=True, slots=True)
class GPUUsage:
    """One sample of a GPU's load (docs/koordinator.md §7.1: node GPU core and memory usage)."""

    uuid: str
    minor: int
    gpu_util_percent: int
    memory_used_bytes: int
    memory_total_bytes: int


@dataclass(frozen=True, slots=True)
class ProcessGPUUsage:
    """One process's share of one GPU (NVML per-process accounting, docs/koordinator.md §7.1)."""

    pid: int
    uuid: str
    minor: int
    sm_util_percent: int  # latest nvmlDeviceGetProcessUtilization sample; 0 when NVML has none
    memory_used_bytes: int  # nvmlDeviceGetComputeRunningProcesses usedGpuMemory; 0 when not available


def _text(value: str | bytes) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def normalise_pci_bus_id(bus_id: str) -> str:
    """NVML gives "00000000:00:06.0" (8-digit domain, upper case); sysfs names it "0000:00:06.0"."""
    bus_id = bus_id.strip().lower()
    domain, sep, rest = bus_id.partition(":")
    if not sep:
        return bus_id
    return f"{int(domain, 16):04x}:{rest}" if domain else rest


class NvmlSession:
    """An initialised NVML: nvmlInit on open, nvmlShutdown on close (NVML counts the pairs)."""

    def __init__(self, nvml: NvmlModule) -> None:
        self.nvml = nvml
        self._open = False
        self._handles: dict[str, Any] = {}
        # Per GPU, the newest process-utilisation sample seen (NVML µs clock): the next read asks for newer ones.
        self.last_process_sample_us: dict[str, int] = {}

    def open(self) -> Self:
        self.nvml.nvmlInit()
        self._open = True
        return self

    def close(self) -> None:
        if self._open:
            self._open = False
            self._handles.clear()
            try:
                self.nvml.nvmlShutdown()
            except self.nvml.NVMLError as exc:
                _log.warning("nvmlShutdown failed: %s", exc)

    def __enter__(self) -> Self:
        return self if self._open else self.open()

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def handle(self, uuid: str) -> Any:
        """The NVML handle of a GPU found by the last discovery."""
        try:
            return self._handles[uuid]
        except KeyError:
            raise KeyError(f"GPU {uuid} was not found by discovery") from None

    def remember(self, uuid: str, handle: Any) -> None:
        self._handles[uuid] = handle


def open_nvml(nvml: NvmlModule | None = None) -> NvmlSession | None:
    """Open NVML, or return None with one clear log line when this node has none (GPU parts stay off)."""
    if nvml is None:
        try:
            nvml = importlib.import_module("pynvml")
        except ImportError as exc:
            _log.info("GPU support off: the pynvml module (nvidia-ml-py) is not installed: %s", exc)
            return None
    session = NvmlSession(nvml)
    try:
        session.open()
    except nvml.NVMLError as exc:
        _log.info("GPU support off: NVML is not usable on this node (%s)", exc)
        return None
    try:
        count = nvml.nvmlDeviceGetCount()
    except nvml.NVMLError as exc:
        session.close()
        _log.info("GPU support off: NVML cannot count GPUs (%s)", exc)
        return None
    if count == 0:
        session.close()
        _log.info("GPU support off: NVML reports no GPU on this node")
        return None
    return session


def _numa_node(nvml: NvmlModule, handle: Any, bus_id: str, sys_dir: str) -> int | None:
    try:
        node = int(nvml.nvmlDeviceGetNumaNodeId(handle))
    except nvml.NVMLError_NotSupported:
        node = -1
    except nvml.NVMLError as exc:
        # Older drivers lack the call (FunctionNotFound); not a reason to lose the GPU.
        _log.debug("nvmlDeviceGetNumaNodeId failed for %s: %s", bus_id, exc)
        node = -1
    if node >= 0:
        return node
    return pci_device_numa_node(bus_id, sys_dir)


def discover(session: NvmlSession, sys_dir: str = SYS_DIR) -> GPUInventory:
    """One discovery pass over every GPU NVML sees.

    Raises NvmlUnavailableError when NVML fails for the node as a whole; a GPU whose own queries
    fail is logged and left out (it cannot be offered without its UUID and minor).
    """
    nvml = session.nvml
    try:
        driver_version = _text(nvml.nvmlSystemGetDriverVersion())
        count = int(nvml.nvmlDeviceGetCount())
    except nvml.NVMLError as exc:
        raise NvmlUnavailableError(f"NVML node query failed: {exc}") from exc
    gpus: list[GPUInfo] = []
    for index in range(count):
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            uuid = _text(nvml.nvmlDeviceGetUUID(handle))
            minor = int(nvml.nvmlDeviceGetMinorNumber(handle))
            model = _text(nvml.nvmlDeviceGetName(handle))
            memory_total = int(nvml.nvmlDeviceGetMemoryInfo(handle).total)
            bus_id = normalise_pci_bus_id(_text(nvml.nvmlDeviceGetPciInfo(handle).busId))
        except nvml.NVMLError as exc:
            _log.warning("GPU index %d left out: NVML query failed: %s", index, exc)
            continue
        session.remember(uuid, handle)
        gpus.append(
            GPUInfo(
                index=index,
                uuid=uuid,
                minor=minor,
                model=model,
                memory_total_bytes=memory_total,
                numa_node=_numa_node(nvml, handle, bus_id, sys_dir),
                pci_bus_id=bus_id,
                pcie_switch_id=pci_device_parent_bridge(bus_id, sys_dir),
            )
        )
    return GPUInventory(driver_version=driver_version, gpus=tuple(gpus))


def read_usage(session: NvmlSession, inventory: GPUInventory) -> list[GPUUsage]:
    """Utilisation and memory used of every discovered GPU; a GPU whose read fails is skipped."""
    nvml = session.nvml
    samples: list[GPUUsage] = []
    for gpu in inventory.gpus:
        try:
            handle = session.handle(gpu.uuid)
            util = nvml.nvmlDeviceGetUtilizationRates(handle)
            memory = nvml.nvmlDeviceGetMemoryInfo(handle)
        except (KeyError, nvml.NVMLError) as exc:
            _log.debug("GPU %s usage read failed: %s", gpu.uuid, exc)
            continue
        samples.append(
            GPUUsage(
                uuid=gpu.uuid,
                minor=gpu.minor,
                gpu_util_percent=int(util.gpu),
                memory_used_bytes=int(memory.used),
                memory_total_bytes=int(memory.total),
            )
        )
    return samples


def _latest_sm_util(nvml: NvmlModule, handle: Any, since_us: int) -> tuple[dict[int, int], int]:
    """pid -> SM utilisation of its newest sample newer than ``since_us``, and the newest timestamp seen.

    NVML raises NotFound when no process ran a kernel since ``since_us``: every process is idle then."""
    try:
        samples = nvml.nvmlDeviceGetProcessUtilization(handle, since_us)
    except nvml.NVMLError_NotFound:
        return {}, since_us
    newest: dict[int, tuple[int, int]] = {}
    latest = since_us
    for sample in samples:
        pid, stamp = int(sample.pid), int(sample.timeStamp)
        latest = max(latest, stamp)
        if pid not in newest or stamp >= newest[pid][0]:
            newest[pid] = (stamp, int(sample.smUtil))
    return {pid: util for pid, (_, util) in newest.items()}, latest


def read_process_usage(session: NvmlSession, inventory: GPUInventory) -> list[ProcessGPUUsage]:
    """Per process and GPU: SM utilisation and memory used, for every compute process NVML lists.

    ``nvmlDeviceGetComputeRunningProcesses`` names the processes and their memory; the SM share comes from
    ``nvmlDeviceGetProcessUtilization`` (the newest sample since the previous read). Koordinator drops a
    process without a utilisation sample; here it stays with 0 % so the memory it holds is still counted.
    A GPU whose reads fail is skipped for this round."""
    nvml = session.nvml
    out: list[ProcessGPUUsage] = []
    for gpu in inventory.gpus:
        try:
            handle = session.handle(gpu.uuid)
            processes = nvml.nvmlDeviceGetComputeRunningProcesses(handle)
            if not processes:
                continue
            sm_util, latest = _latest_sm_util(nvml, handle, session.last_process_sample_us.get(gpu.uuid, 0))
        except (KeyError, nvml.NVMLError) as exc:
            _log.debug("GPU %s process usage read failed: %s", gpu.uuid, exc)
            continue
        session.last_process_sample_us[gpu.uuid] = latest
        memory: dict[int, int] = {}
        for process in processes:
            used = getattr(process, "usedGpuMemory", None)  # None: NVML_VALUE_NOT_AVAILABLE
            memory[int(process.pid)] = memory.get(int(process.pid), 0) + (int(used) if used is not None else 0)
        for pid, used in sorted(memory.items()):
            out.append(ProcessGPUUsage(pid=pid, uuid=gpu.uuid, minor=gpu.minor,
                                       sm_util_percent=sm_util.get(pid, 0), memory_used_bytes=used))
    return out
