"""Node PSI collector: /proc/pressure/{cpu,memory,io} avg10/avg60/avg300 for some and full (§7.1).

Off, with one log line, where the kernel has no readable /proc/pressure (CONFIG_PSI off or ``psi=0``).
"""

from __future__ import annotations

import logging

from koordlet.metriccache import Label, MetricKind, Sample, SeriesKey
from koordlet.system.procfs import PSI_RESOURCES, Psi, node_psi_path, node_psi_supported, read_psi

logger = logging.getLogger(__name__)

_PRECISIONS = ("avg10", "avg60", "avg300")


def _key(resource: str, precision: str, degree: str) -> SeriesKey:
    return SeriesKey.of(
        MetricKind.NODE_PSI,
        **{Label.PSI_RESOURCE: resource, Label.PSI_PRECISION: precision, Label.PSI_DEGREE: degree},
    )


_KEYS = {
    (resource, precision, degree): _key(resource, precision, degree)
    for resource in PSI_RESOURCES
    for precision in _PRECISIONS
    for degree in ("some", "full")
}


def psi_samples(psi: Psi, resource: str, now: float) -> list[Sample]:
    samples = []
    for degree, line in (("some", psi.some), ("full", psi.full)):
        if line is None:
            continue
        for precision, value in (("avg10", line.avg10), ("avg60", line.avg60), ("avg300", line.avg300)):
            samples.append(Sample(_KEYS[(resource, precision, degree)], now, value))
    return samples


class NodePsiCollector:
    name = "node_psi"

    def __init__(self, proc_root: str = "/proc", interval_s: float = 10.0) -> None:
        self.interval_s = interval_s
        self._proc_root = proc_root
        self._supported: bool | None = None

    def enabled(self) -> bool:
        if self._supported is None:
            self._supported = node_psi_supported(self._proc_root)
            if not self._supported:
                logger.info("PSI collector off: %s/pressure is missing or unreadable", self._proc_root)
        return self._supported

    def collect(self, now: float) -> list[Sample]:
        samples: list[Sample] = []
        for resource in PSI_RESOURCES:
            samples.extend(psi_samples(read_psi(node_psi_path(resource, self._proc_root)), resource, now))
        return samples
