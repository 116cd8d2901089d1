"""GPUs in the agent (gate ``Accelerators``): a usage collector for the metrics advisor and the Device reporter loop.

The NVML session, inventory and health watcher are :class:`koordlet.gpu.service.GPUService`; this module only
schedules them. :class:`GPUCollector` puts per-GPU core and memory usage into the metric cache on the
collector runner's clock (docs/koordinator.md §7.1: "with node collector"), and, given the pods, each pod's
and container's GPU usage: NVML's per-process usage attributed through the PIDs in each container's
``cgroup.procs``. :class:`DeviceReportLoop` writes the Device object every ``-node-topology-sync-interval``
(3 s, docs/koordinator.md §5.1; the first at a random point of it, each ±10 %) through
:class:`koordlet.gpu.reporter.DeviceReporter`, which skips unchanged objects without a request; a failed write is
logged once when failing starts and tried again after a backoff (full jitter, up to 30 s), a tick the koordlet's
API budget holds back does nothing.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable

import urllib3
from kubernetes.client.exceptions import ApiException

from koordlet.gpu.metrics import PodPIDs, process_samples, usage_samples
from koordlet.gpu.reporter import DeviceReporter, DeviceReportError, ReportResult
from koordlet.gpu.service import GPUService
from koordlet.gpu.xpu import XPUInventory, without_xpu_metadata, xpu_device_object
from koordlet.kubeapi import Throttled, retry_after_s
from koordlet.kubeclient.backoff import Backoff
from koordlet.metriccache import Sample
from koordlet.metricsadvisor.pods import PodSource
from koordlet.reporters.rdma import RDMAInventory, device_object
from koordlet.system.cgroup import CgroupFS
from koordlet.system.cgroup_stats import CgroupStatError, read_cgroup_procs
from koordlet.ticker import PeriodicThread

logger = logging.getLogger(__name__)

DEFAULT_SYNC_INTERVAL_S = 3.0


class GPUCollector:
    """A metricsadvisor collector over a started GPUService."""

    name = "gpu"

    def __init__(self, service: GPUService, interval_s: float = 1.0, pods: PodSource | None = None,
                 cgroup_fs: CgroupFS | None = None) -> None:
        self.interval_s = interval_s
        self._service = service
        self._pods = pods
        self._cgroup_fs = cgroup_fs or CgroupFS()

    def enabled(self) -> bool:
        return bool(self._service.inventory.gpus)

    def collect(self, now: float) -> list[Sample]:
        samples = usage_samples(self._service.usage(), now)
        if self._pods is None:
            return samples
        processes = self._service.process_usage()
        if processes:  # no GPU process: no cgroup to read
            samples += process_samples(processes, self._pod_pids(), now)
        return samples

    def _pod_pids(self) -> list[PodPIDs]:
        """The PIDs of every container of every pod; a container whose cgroup is gone is left out."""
        assert self._pods is not None
        out = []
        for pod in self._pods():
            containers: dict[str, tuple[int, ...]] = {}
            for container in pod.containers:
                try:
                    containers[container.container_id] = read_cgroup_procs(
                        self._cgroup_fs.cgroup_dir("cpu", container.cgroup_dir))
                except (OSError, CgroupStatError) as exc:
                    logger.debug("no PIDs of container %s: %s", container.container_id, exc)
            if containers:
                out.append(PodPIDs(pod.pod_uid, containers))
        return out


class DeviceReportLoop:
    """Reports the Device object on a timer: the GPUs of the GPU service (which stays its owner's to stop), the
    XPUs of the device-info files (``xpu``; they take the GPUs' place when there are any, koordlet/gpu/xpu.py) and
    the RDMA devices of ``rdma`` (gate ``RDMADevices``), each None when off. ``xpu_only``
    (``-xpu-enforce-collect-from-device-infos``): never the GPU service's GPUs."""

    def __init__(self, service: GPUService | None, reporter: DeviceReporter,
                 interval_s: float = DEFAULT_SYNC_INTERVAL_S, node_uid: Callable[[], str] = lambda: "",
                 observe: Callable[[str], None] | None = None, rdma: RDMAInventory | None = None,
                 xpu: XPUInventory | None = None, xpu_only: bool = False,
                 monotonic: Callable[[], float] = time.monotonic, rng: random.Random | None = None) -> None:
        self._service = service
        self._rdma = rdma
        self._xpu = xpu
        self._xpu_only = xpu_only
        self._reporter = reporter
        self._interval_s = interval_s
        self._node_uid = node_uid
        self._observe = observe or (lambda outcome: None)
        self._failing = False
        self._monotonic = monotonic
        rng = rng or random.Random()
        self._backoff = Backoff(rng=rng)
        self._retry_at = -float("inf")
        self.timer = PeriodicThread("device-reporter", interval_s, self.report_once, monotonic=monotonic, rng=rng)
        self.reports = 0

    def report_once(self) -> bool:
        if self._monotonic() < self._retry_at:
            return False
        try:
            result = self._report()
        except Throttled:
            self._observe("throttled")
            return False
        except (DeviceReportError, ApiException, urllib3.exceptions.HTTPError, OSError, ValueError) as err:
            self._observe("failed")
            delay = self._backoff.delay(retry_after_s(err.__cause__ or err))
            self._retry_at = self._monotonic() + delay
            if not self._failing:
                logger.warning("Device report failed; retrying in %.1f s: %s", delay, err)
            self._failing = True
            return False
        self._backoff.reset()
        if self._failing:
            logger.info("Device report recovered")
            self._failing = False
        self.reports += 1
        self._observe(result.value)
        return True

    def _report(self) -> ReportResult:
        reporter, node_uid = self._reporter, self._node_uid()
        previous = reporter.previous()
        xpus = self._xpu.devices() if self._xpu is not None else ()
        if xpus:
            assert self._xpu is not None
            accelerators = xpu_device_object(reporter.node_name, node_uid, xpus, previous,
                                             on_problem=self._xpu.problem)
        elif self._service is not None and not self._xpu_only:
            accelerators = self._service.device_object(reporter.node_name, node_uid, previous)
        else:
            accelerators = None
        rdma = self._rdma.entries() if self._rdma is not None else []
        desired = device_object(reporter.node_name, node_uid, rdma, accelerators)
        if self._xpu is not None and not xpus:
            desired = without_xpu_metadata(desired)
        return reporter.report(desired)

    def start(self) -> None:
        """The first report at a random point of the first interval, then every interval ±10 %."""
        self.timer.start()

    def stop(self, timeout_s: float = 5.0) -> bool:
        return self.timer.stop(timeout_s)
