"""PSI collectors (docs/koordinator.md §7.1): the node's /proc/pressure and every pod's and container's ``*.pressure``.

Both give avg10/avg60/avg300 for ``some`` and ``full``. The node collector is off, with one log line,
where the kernel has no readable /proc/pressure (CONFIG_PSI off or ``psi=0``).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from koordlet.metriccache import Label, MetricKind, Sample, SeriesKey
from koordlet.metricsadvisor.pods import PodSource
from koordlet.system.cgroup import CgroupFS, CgroupVersion
from koordlet.system.cgroup_stats import cgroup_psi_files
from koordlet.system.procfs import (
    PSI_RESOURCES,
    KeptFiles,
    ProcParseError,
    Psi,
    node_psi_supported,
    parse_psi,
    read_node_psi,
)
from koordlet.system.roots import PROC_DIR

logger = logging.getLogger(__name__)

_PRECISIONS = ("avg10", "avg60", "avg300")


def _psi_keys(kind: str, labels: dict[str, str]) -> dict[tuple[str, str, str], SeriesKey]:
    """The 18 series of one PSI source, by (resource, precision, degree)."""
    return {
        (resource, precision, degree): SeriesKey.of(
            kind, **labels, **{Label.PSI_RESOURCE: resource, Label.PSI_PRECISION: precision, Label.PSI_DEGREE: degree}
        )
        for resource in PSI_RESOURCES
        for precision in _PRECISIONS
        for degree in ("some", "full")
    }


_KEYS = _psi_keys(MetricKind.NODE_PSI, {})


def psi_samples(
    psi: Psi, resource: str, now: float, keys: dict[tuple[str, str, str], SeriesKey] = _KEYS
) -> list[Sample]:
    samples = []
    for degree, line in (("some", psi.some), ("full", psi.full)):
        if line is None:
            continue
        for precision, value in (("avg10", line.avg10), ("avg60", line.avg60), ("avg300", line.avg300)):
            samples.append(Sample(keys[(resource, precision, degree)], now, value))
    return samples


class NodePsiCollector:
    name = "node_psi"

    def __init__(self, proc_dir: str = PROC_DIR, interval_s: float = 10.0) -> None:
        self.interval_s = interval_s
        self._proc_dir = proc_dir
        self._supported: bool | None = None

    def enabled(self) -> bool:
        if self._supported is None:
            self._supported = node_psi_supported(self._proc_dir)
            if not self._supported:
                logger.info("PSI collector off: %s/pressure is missing or unreadable", self._proc_dir)
        return self._supported

    def collect(self, now: float) -> list[Sample]:
        samples: list[Sample] = []
        for resource in PSI_RESOURCES:
            samples.extend(psi_samples(read_node_psi(resource, self._proc_dir), resource, now))
        return samples


# --------------------------------------------------------------------------------- pods and containers

UNIFIED_SUBDIR = "unified"  # where systemd's hybrid layout mounts the cgroup2 hierarchy on a v1 host


@dataclass(frozen=True, slots=True)
class _PsiTarget:
    rel: str
    paths: tuple[tuple[str, str], ...]  # (resource, path of <resource>.pressure)
    keys: dict[tuple[str, str, str], SeriesKey]  # (resource, precision, degree) -> series


class PodPsiCollector:
    """Pod and container PSI: ``cpu|memory|io.pressure`` of every pod and container cgroup.

    docs/koordinator.md §6, §7.1.

    Where the files are, tried in this order for each cgroup:
      cgroup v2     the cgroup's own dir;
      cgroup v1     the ``cpuacct`` dir (Alibaba Cloud Linux / Anolis with cgroup v1 PSI enabled), then the
                    same relative dir in the hybrid ``unified`` cgroup2 mount. runc joins that hierarchy
                    on hybrid hosts (Ubuntu 20.04, Debian 11 and this machine), and the kernel keeps
                    ``*.pressure`` in every cgroup2 dir even when no controller is enabled there, so
                    per-pod PSI is there on plain v1 nodes too; Koordinator reads only the first two.
    A cgroup whose files are not found yet is tried again next tick (a stat per candidate), so pods
    created later are picked up; while no cgroup has them at all, one log line says so. Samples are
    percent (the kernel's avg10/avg60/avg300) under ``pod_psi`` / ``container_psi`` with the labels of
    the node PSI collector; the ``full`` cpu line is emitted only where the kernel writes one.
    """

    name = "pod_psi"

    def __init__(self, pods: PodSource, cgroup_fs: CgroupFS, interval_s: float = 10.0) -> None:
        self.interval_s = interval_s
        self._pods = pods
        self._fs = cgroup_fs
        self._targets: dict[str, _PsiTarget] = {}
        self._files = KeptFiles()
        self._said_missing = False
        self.read_errors = 0

    def enabled(self) -> bool:
        return True

    @property
    def open_files(self) -> int:
        """Descriptors of pressure files kept open between ticks."""
        return len(self._files)

    def close(self) -> None:
        self._files.close()

    def forget_dirs(self, cgroup_dirs: Sequence[str]) -> None:
        """Close the kept descriptors below ``cgroup_dirs`` now (their pod left the states; any thread)."""
        self._files.forget_under(cgroup_dirs)

    def _candidates(self, rel: str) -> tuple[str, ...]:
        fs = self._fs
        if fs.version is CgroupVersion.V2:
            return (fs.cgroup_dir("cpu", rel),)
        return (fs.cgroup_dir("cpuacct", rel), fs.cgroup_dir(UNIFIED_SUBDIR, rel))

    def _target(self, ident: str, rel: str, kind: str, labels: dict[str, str]) -> _PsiTarget | None:
        target = self._targets.get(ident)
        if target is not None and target.rel == rel:
            return target
        if target is not None:
            self._files.forget(path for _, path in target.paths)
            del self._targets[ident]
        for directory in self._candidates(rel):
            paths = cgroup_psi_files(directory)
            if paths is not None:
                target = _PsiTarget(rel, paths, _psi_keys(kind, labels))
                self._targets[ident] = target
                return target
        return None

    def _observe(self, ident: str, rel: str, kind: str, labels: dict[str, str], now: float,
                 seen: set[str], samples: list[Sample]) -> None:
        target = self._target(ident, rel, kind, labels)
        if target is None:
            return
        seen.add(ident)
        for resource, path in target.paths:
            try:
                psi = parse_psi(self._files.read(path))
            except FileNotFoundError:
                seen.discard(ident)  # the cgroup went away since it was listed: its other files are closed too
                return
            except (OSError, ProcParseError) as err:
                self.read_errors += 1
                logger.debug("cannot read %s: %s", path, err)
                continue
            samples.extend(psi_samples(psi, resource, now, target.keys))

    def collect(self, now: float) -> list[Sample]:
        samples: list[Sample] = []
        seen: set[str] = set()
        listed = 0
        for pod in self._pods():
            pod_labels = {Label.POD_UID.value: pod.pod_uid}
            listed += 1
            self._observe("pod/" + pod.pod_uid, pod.cgroup_dir, MetricKind.POD_PSI, pod_labels, now, seen, samples)
            for container in pod.containers:
                listed += 1
                labels = {**pod_labels, Label.CONTAINER_ID.value: container.container_id}
                self._observe("ctr/" + container.container_id, container.cgroup_dir, MetricKind.CONTAINER_PSI,
                              labels, now, seen, samples)
        if listed and not seen and not self._said_missing:
            self._said_missing = True
            logger.info("pod PSI: no cpu.pressure in any of %d pod and container cgroups (tried %s); "
                        "the kernel or its cgroup layout has no per-cgroup PSI", listed,
                        ", ".join(self._candidates("<cgroup>")))
        elif seen:
            self._said_missing = False
        for ident in [ident for ident in self._targets if ident not in seen]:
            target = self._targets.pop(ident)
            self._files.forget(path for _, path in target.paths)
        return samples
