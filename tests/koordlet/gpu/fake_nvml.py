"""A test double of the `pynvml` calls koordlet uses, with an H100-like inventory.

Values from docs/node-interfaces.md §15 (one NVIDIA H100 80GB HBM3 on a VM, driver 580.159.04,
NUMA query NotSupported). It is a plain object standing in for the module: discovery takes the
NVML module as an argument, so the code under test runs unchanged against this or real NVML.
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass, field

H100_NAME = "NVIDIA H100 80GB HBM3"
H100_DRIVER = "580.159.04"
H100_MEMORY_TOTAL = 85520809984  # 81559 MiB
H100_MEMORY_USED_IDLE = 480 * 1024 * 1024


class NVMLError(Exception):
    def __init__(self, message: str = "") -> None:
        super().__init__(message or type(self).__name__)


class NVMLError_NotSupported(NVMLError):
    pass


class NVMLError_LibraryNotFound(NVMLError):
    pass


class NVMLError_Timeout(NVMLError):
    pass


class NVMLError_GpuIsLost(NVMLError):
    pass


class NVMLError_Uninitialized(NVMLError):
    pass


class NVMLError_NotFound(NVMLError):
    pass


@dataclass
class FakeProcess:
    """A compute process on a GPU: what nvmlDeviceGetComputeRunningProcesses lists (pid, usedGpuMemory) and
    the utilisation samples nvmlDeviceGetProcessUtilization returns for it (µs timestamps, SM %)."""

    pid: int
    used_gpu_memory: int | None  # None: NVML_VALUE_NOT_AVAILABLE, as pynvml reports it
    sm_util: int = 0
    mem_util: int = 0
    # None: NVML keeps sampling it (a fresh sample at every call, stamped now); 0: no sample at all (it ran
    # no kernel); a number: one sample at that time, seen once by a caller passing an older timestamp.
    sample_time_us: int | None = None


@dataclass
class FakeGPU:
    uuid: str
    minor: int
    bus_id: str
    name: str = H100_NAME
    memory_total: int = H100_MEMORY_TOTAL
    memory_used: int = H100_MEMORY_USED_IDLE
    util_gpu: int = 0
    util_memory: int = 0
    numa_node: int | None = None  # None: NVML says NotSupported, as on the VM
    lost: bool = False
    processes: list[FakeProcess] = field(default_factory=list)


@dataclass
class _ProcessInfo:
    """pynvml's c_nvmlProcessInfo_t as the Python binding hands it out."""

    pid: int
    usedGpuMemory: int | None
    gpuInstanceId: int = 0xFFFFFFFF
    computeInstanceId: int = 0xFFFFFFFF


@dataclass
class _ProcessUtilizationSample:
    """pynvml's c_nvmlProcessUtilizationSample_t."""

    pid: int
    timeStamp: int
    smUtil: int
    memUtil: int
    encUtil: int = 0
    decUtil: int = 0


@dataclass
class _Memory:
    total: int
    used: int
    free: int


@dataclass
class _Util:
    gpu: int
    memory: int


@dataclass
class _Pci:
    busId: bytes


@dataclass
class _Event:
    device: object
    eventType: int
    eventData: int


@dataclass
class _EventSet:
    events: queue.Queue = field(default_factory=queue.Queue)
    handles: list = field(default_factory=list)


def h100_gpus(count: int = 1) -> list[FakeGPU]:
    """`count` H100s; the first one is the machine's (bus 00000000:00:06.0), the others follow."""
    return [
        FakeGPU(
            uuid=f"GPU-{index:08x}-1a2b-3c4d-5e6f-{index + 0xA0B0C0D0E0:012x}",
            minor=index,
            bus_id=f"00000000:00:{6 + index:02X}.0",
        )
        for index in range(count)
    ]


class FakeNvml:
    NVMLError = NVMLError
    NVMLError_NotSupported = NVMLError_NotSupported
    NVMLError_LibraryNotFound = NVMLError_LibraryNotFound
    NVMLError_Timeout = NVMLError_Timeout
    NVMLError_GpuIsLost = NVMLError_GpuIsLost
    NVMLError_Uninitialized = NVMLError_Uninitialized
    NVMLError_NotFound = NVMLError_NotFound
    nvmlEventTypeSingleBitEccError = 1
    nvmlEventTypeDoubleBitEccError = 2
    nvmlEventTypeXidCriticalError = 8

    def __init__(self, gpus: list[FakeGPU] | None = None, driver: str = H100_DRIVER, library: bool = True,
                 events_supported: bool = True) -> None:
        self.gpus = h100_gpus(1) if gpus is None else gpus
        self.driver = driver
        self.library = library
        self.events_supported = events_supported
        self.init_count = 0
        self.calls = 0
        self.event_sets: list[_EventSet] = []
        self._lock = threading.Lock()

    # -- lifecycle
    def nvmlInit(self) -> None:
        if not self.library:
            raise NVMLError_LibraryNotFound("NVML Shared Library Not Found")
        with self._lock:
            self.init_count += 1

    def nvmlShutdown(self) -> None:
        with self._lock:
            if self.init_count == 0:
                raise NVMLError_Uninitialized()
            self.init_count -= 1

    def _check(self) -> None:
        self.calls += 1
        if self.init_count == 0:
            raise NVMLError_Uninitialized()

    def _gpu(self, handle: object) -> FakeGPU:
        self._check()
        gpu = self.gpus[handle]  # the handle is the index
        if gpu.lost:
            raise NVMLError_GpuIsLost()
        return gpu

    # -- queries
    def nvmlSystemGetDriverVersion(self) -> str:
        self._check()
        return self.driver

    def nvmlDeviceGetCount(self) -> int:
        self._check()
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        self._check()
        if not 0 <= index < len(self.gpus):
            raise NVMLError("invalid argument")
        return index

    def nvmlDeviceGetUUID(self, handle: int) -> str:
        return self._gpu(handle).uuid

    def nvmlDeviceGetMinorNumber(self, handle: int) -> int:
        return self._gpu(handle).minor

    def nvmlDeviceGetName(self, handle: int) -> str:
        return self._gpu(handle).name

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> _Memory:
        gpu = self._gpu(handle)
        return _Memory(total=gpu.memory_total, used=gpu.memory_used, free=gpu.memory_total - gpu.memory_used)

    def nvmlDeviceGetNumaNodeId(self, handle: int) -> int:
        gpu = self._gpu(handle)
        if gpu.numa_node is None:
            raise NVMLError_NotSupported("Not Supported")
        return gpu.numa_node

    def nvmlDeviceGetPciInfo(self, handle: int) -> _Pci:
        return _Pci(busId=self._gpu(handle).bus_id.encode())

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> _Util:
        gpu = self._gpu(handle)
        return _Util(gpu=gpu.util_gpu, memory=gpu.util_memory)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: int) -> list[_ProcessInfo]:
        return [_ProcessInfo(p.pid, p.used_gpu_memory) for p in self._gpu(handle).processes]

    def nvmlDeviceGetProcessUtilization(self, handle: int, timeStamp: int) -> list[_ProcessUtilizationSample]:
        """Samples newer than ``timeStamp``; NVML answers NOT_FOUND when there is none (pynvml raises)."""
        now_us = time.time_ns() // 1000
        samples = [_ProcessUtilizationSample(p.pid, stamp, p.sm_util, p.mem_util)
                   for p in self._gpu(handle).processes
                   for stamp in [now_us if p.sample_time_us is None else p.sample_time_us]
                   if stamp and stamp > timeStamp]
        if not samples:
            raise NVMLError_NotFound("Not Found")
        return samples

    # -- events
    def nvmlEventSetCreate(self) -> _EventSet:
        self._check()
        event_set = _EventSet()
        self.event_sets.append(event_set)
        return event_set

    def nvmlDeviceRegisterEvents(self, handle: int, mask: int, event_set: _EventSet) -> None:
        self._gpu(handle)
        if not self.events_supported:
            raise NVMLError_NotSupported("Not Supported")
        event_set.handles.append(handle)

    def nvmlEventSetWait(self, event_set: _EventSet, timeout_ms: int) -> _Event:
        self._check()
        try:
            return event_set.events.get(timeout=timeout_ms / 1000)
        except queue.Empty:
            raise NVMLError_Timeout("Timeout") from None

    def nvmlEventSetFree(self, event_set: _EventSet) -> None:
        self.event_sets.remove(event_set)

    # -- test controls
    def inject_xid(self, index: int, xid: int) -> None:
        """What the driver does on an Xid: an event on every set the GPU is registered with."""
        for event_set in self.event_sets:
            if index in event_set.handles:
                event_set.events.put(_Event(device=index, eventType=self.nvmlEventTypeXidCriticalError, eventData=xid))
