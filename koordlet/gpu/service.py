"""One object that owns the NVML session, the inventory, the health board and the Xid watcher."""

from __future__ import annotations

import logging
import threading
from typing import Any

from koordlet.gpu.devicecr import build_device
from koordlet.gpu.health import DEFAULT_RECOVER_AFTER_S, HealthBoard, XidHealthWatcher
from koordlet.gpu.nvml import (
    GPUInventory,
    GPUUsage,
    NvmlModule,
    NvmlSession,
    ProcessGPUUsage,
    discover,
    open_nvml,
    read_process_usage,
    read_usage,
)
from koordlet.gpu.reporter import DeviceReporter, ReportResult
from koordlet.system.roots import SYS_DIR
from koordlet.ticker import join_thread

_log = logging.getLogger(__name__)


class GPUService:
    def __init__(self, session: NvmlSession, inventory: GPUInventory, recover_after_s: float) -> None:
        self.session = session
        self.inventory = inventory
        self.board = HealthBoard(gpu.uuid for gpu in inventory.gpus)
        self.watcher = XidHealthWatcher(
            session, self.board, (gpu.uuid for gpu in inventory.gpus), recover_after_s=recover_after_s
        )
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @classmethod
    def start(
        cls,
        nvml: NvmlModule | None = None,
        sys_dir: str = SYS_DIR,
        recover_after_s: float = DEFAULT_RECOVER_AFTER_S,
        poll_timeout_ms: int = 5000,
    ) -> GPUService | None:
        """Discover the GPUs and start the health watcher; None when this node has no usable GPU."""
        session = open_nvml(nvml)
        if session is None:
            return None
        inventory = discover(session, sys_dir)
        if not inventory.gpus:
            session.close()
            _log.info("GPU support off: no GPU could be read through NVML")
            return None
        service = cls(session, inventory, recover_after_s)
        service.watcher.start()
        service._thread = threading.Thread(
            target=service.watcher.run, args=(service._stop, poll_timeout_ms), name="gpu-health", daemon=True
        )
        service._thread.start()
        _log.info(
            "GPUs: %d x %s, driver %s", len(inventory.gpus), inventory.model, inventory.driver_version
        )
        return service

    def usage(self) -> list[GPUUsage]:
        return read_usage(self.session, self.inventory)

    def process_usage(self) -> list[ProcessGPUUsage]:
        return read_process_usage(self.session, self.inventory)

    def device_object(self, node_name: str, node_uid: str = "", previous: Any = None) -> dict[str, Any]:
        return build_device(node_name, self.inventory, self.board.snapshot(), node_uid, previous)

    def report(self, reporter: DeviceReporter, node_uid: str = "") -> ReportResult:
        desired = self.device_object(reporter.node_name, node_uid, reporter.previous())
        return reporter.report(desired)

    def stop(self, timeout_s: float = 10.0) -> bool:
        """Stop the health thread, waiting at most ``timeout_s`` (it is in an NVML event wait of up to
        ``poll_timeout_ms``), then close the NVML session; True when the thread ended in time."""
        self._stop.set()
        self.board.close()
        thread, self._thread = self._thread, None
        stopped = join_thread(thread, "gpu-health", timeout_s)
        self.watcher.stop()
        self.session.close()
        return stopped
