"""The resource executor: the one writer of kernel files, cgroups, resctrl, the node-wide files (sysctls, kidled,
``oom_score_adj``) and the page-idle bitmap alike (docs/design.md §4, docs/koordinator.md §10). Network QoS changes
the kernel over netlink, not through files (:mod:`koordlet.system.tc`, from :mod:`koordlet.netqos`).

:class:`ResourceExecutor` is the face the rest of koordlet holds; each kind of kernel file has its own module
behind it, and all of them share one lock, one write cache and one set of checked roots:

- cgroup files (:mod:`koordlet.executor.cgroups`): validated, path-checked, cached writes, the leveled
  (parent/child ordered) batch, and reads through the same checks, the QoS snapshot's through kept descriptors;
- resctrl (:mod:`koordlet.executor.resctrl`): a group's ``schemata`` and ``tasks``, and the groups themselves;
- node-wide files (:mod:`koordlet.executor.nodefiles`): sysctls, kidled's settings and ``oom_score_adj``, each
  recorded before koordlet's first write (:mod:`koordlet.executor.originals`) and put back from that record;
- the page-idle bitmap's marks (:mod:`koordlet.executor.pageidle`);
- per-device blkio lines, recorded and put back (:mod:`koordlet.executor.lines`), and the records of what koordlet
  made on the node (:mod:`koordlet.executor.records`), which the plan runner and the collector keep.

What a write may fail with is :mod:`koordlet.executor.errors`; the values a caller hands over are
:mod:`koordlet.executor.updates`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence

from koordlet.executor.cache import DEFAULT_FORCE_UPDATE_SECONDS, WriteCache
from koordlet.executor.cgroups import CgroupFiles
from koordlet.executor.files import RealRoots
from koordlet.executor.nodefiles import NodeFiles
from koordlet.executor.originals import Originals
from koordlet.executor.pageidle import mark_page_idle
from koordlet.executor.records import NodeRecords
from koordlet.executor.resctrl import ResctrlGroups
from koordlet.executor.updates import BatchResult, ResourceUpdate
from koordlet.system.cgroup import CgroupFS
from koordlet.system.resources import CgroupResource, WeightFormula


class ResourceExecutor:
    """Validated, cached, path-checked writes of cgroup, resctrl and node-wide kernel files. Thread-safe."""

    def __init__(
        self,
        cgroup_fs: CgroupFS,
        *,
        resctrl_root: str | None = None,
        force_update_seconds: float = DEFAULT_FORCE_UPDATE_SECONDS,
        clock: Callable[[], float] = time.monotonic,
        proc_dir: str | None = None,
        sys_dir: str | None = None,
        originals_file: str | None = None,
        records: NodeRecords | None = None,
    ) -> None:
        """``proc_dir``/``sys_dir``: where procfs and sysfs are mounted (None: no system writes);
        ``originals_file``: where the values found before the first sysctl writes are kept (None: memory);
        ``records``: what koordlet made on the node, for the plan runner and the collector (None: in memory)."""
        self.cgroup_fs = cgroup_fs
        self.resctrl_root = resctrl_root
        self.records = records if records is not None else NodeRecords()
        self._sys_dir = sys_dir
        lock = threading.Lock()
        cache = WriteCache(force_update_seconds)
        roots = RealRoots()
        self._cgroups = CgroupFiles(cgroup_fs, cache, lock, roots, clock)
        self._resctrl = ResctrlGroups(resctrl_root, lock, roots, self.records.resctrl_groups)
        self._node = NodeFiles({"proc": proc_dir, "sys": sys_dir}, Originals(originals_file), cache, lock, roots,
                               clock)

    @property
    def weight_formula(self) -> WeightFormula:
        """The runtime's cpu.shares → cpu.weight formula every cpu.shares write on v2 uses (system/resources.py)."""
        return self._cgroups.weight_formula

    @weight_formula.setter
    def weight_formula(self, formula: WeightFormula) -> None:
        self._cgroups.weight_formula = formula

    @property
    def originals(self) -> Originals:
        """What the node-wide files held before koordlet's first write to each."""
        return self._node.originals

    # ------------------------------------------------------------------------------------- cgroup files

    def update(self, update: ResourceUpdate, verify: bool = False) -> bool:
        """Carry out one update: True when written, False when skipped (cached). Raises ExecutorError
        (:meth:`koordlet.executor.cgroups.CgroupFiles.update`)."""
        return self._cgroups.update(update, verify)

    def update_batch(self, updates: Sequence[ResourceUpdate], verify: bool = False) -> BatchResult:
        """Each update in the given order; failures are collected, not raised."""
        return self._cgroups.update_batch(updates, verify)

    def leveled_update(self, updates: Sequence[ResourceUpdate], verify: bool = False) -> BatchResult:
        """Parent/child-ordered update of hierarchical files; failures are collected, not raised
        (:meth:`koordlet.executor.cgroups.CgroupFiles.leveled_update`)."""
        return self._cgroups.leveled_update(updates, verify)

    def read(self, resource: CgroupResource | str, cgroup_dir: str, subsystem: str | None = None, *,
             every_tick: bool = False) -> str:
        """Current content of a cgroup file (stripped), through the same path checks as writes; ``every_tick``:
        through a kept descriptor (:meth:`koordlet.executor.cgroups.CgroupFiles.read`)."""
        return self._cgroups.read(resource, cgroup_dir, subsystem, every_tick=every_tick)

    def forget_reads(self, cgroup_dirs: Sequence[str]) -> None:
        """Close the kept read descriptors of files below ``cgroup_dirs`` (a gone pod's dir)."""
        self._cgroups.forget_reads(cgroup_dirs)

    def has(self, resource: CgroupResource | str, cgroup_dir: str) -> bool:
        """Whether this kernel has ``resource`` in ``cgroup_dir``
        (:meth:`koordlet.executor.cgroups.CgroupFiles.has`)."""
        return self._cgroups.has(resource, cgroup_dir)

    # ------------------------------------------------------------------------------------------ resctrl

    def write_resctrl(self, group: str, filename: str, value: str) -> None:
        """Write ``schemata`` or ``tasks`` of resctrl group ``group`` ("" = the root group). Not cached."""
        self._resctrl.write(group, filename, value)

    def read_resctrl(self, group: str, filename: str) -> str:
        """Content of ``schemata`` or ``tasks`` of ``group``; "" when the group has no such file yet."""
        return self._resctrl.read(group, filename)

    def remove_resctrl_group(self, group: str) -> bool:
        """Remove resctrl group ``group``; True when it was removed, False when it did not exist
        (:meth:`koordlet.executor.resctrl.ResctrlGroups.remove`)."""
        return self._resctrl.remove(group)

    def ensure_resctrl_group(self, group: str, for_pod: bool = False) -> bool:
        """Create resctrl group ``group`` (a mkdir in the resctrl fs), recorded in ``records.resctrl_groups``
        before it is made (``for_pod``: also when it was there, a pod's own group koordlet takes); True when it
        was created. A group whose record cannot be written is not made: WriteFailedError
        (:meth:`koordlet.executor.resctrl.ResctrlGroups.ensure`)."""
        return self._resctrl.ensure(group, for_pod)

    # ------------------------------------------------------------------------------------ node-wide files

    def read_system(self, name: str, pid: int | None = None) -> str:
        """Current content of a node-wide kernel file (``pid``: of that process); raises ExecutorError."""
        return self._node.read(name, pid)

    def write_system(self, name: str, value: str | int, pid: int | None = None) -> bool:
        """Write ``value`` to a node-wide kernel file, recording a sysctl's value before koordlet's first write:
        True when written, False when skipped. Raises ExecutorError
        (:meth:`koordlet.executor.nodefiles.NodeFiles.write`)."""
        return self._node.write(name, value, pid)

    def restore_system(self, key: str) -> bool:
        """Write back what was there before koordlet's first write of ``key`` (a sysctl name, or
        ``sched_features:<NAME>``) and forget it; False when nothing was recorded. Raises ExecutorError."""
        return self._node.restore(key)

    def mark_page_idle(self, first_page: int, pages: int) -> int:
        """Mark ``pages`` page frames from ``first_page`` idle in the page-idle bitmap; how many it covered (0:
        past the last frame). Raises ExecutorError (koordlet/executor/pageidle.py)."""
        return mark_page_idle(self._sys_dir, first_page, pages)
