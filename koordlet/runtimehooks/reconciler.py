"""The reconciler (docs/koordinator.md §3.4): the same plugin results, applied to the cgroup files of
every pod and container on a timer and whenever the pods or the NodeSLO change, so settings converge
without the proxy, after a koordlet restart, and after someone changed a file by hand.

Pods carrying the skip-hookserver label are left alone here too: the label opts a pod out of koordlet's
runtime hooks as a whole. Each pod's results become one :class:`~koordlet.plan.Plan` (:meth:`pod_plan`)
that the plan runner carries out: quota, memory limit and cpuset as a leveled step (pod before its
containers where a value grows, after them where it shrinks), as cgroup v1 requires.
"""

from __future__ import annotations

import logging
import posixpath
import time
from collections.abc import Callable, Mapping

from hooks import registry
from hooks.protocol import Changes, NodeContext, PodContext
from hooks.registry import Trace
from koordlet.actuator import PlanRunner, ProcessResult
from koordlet.api.pod import PodMeta
from koordlet.api.qos import skips_hooks
from koordlet.executor import CgroupNotFoundError, ResourceExecutor, UnsupportedResourceError
from koordlet.history.answers import POD_LEVEL, HookAnswers
from koordlet.plan import Plan, ProcessWrite
from koordlet.system.kubepods import CgroupPathError, KubeCgroupLayout, pod_cgroup_dir
from koordlet.ticker import PeriodicThread

from . import metrics
from .apply import (
    RejectedValues,
    besteffort_unlimited_first,
    cgroup_writes,
    container_context_from_meta,
    effective_quota_reader,
    process_writes,
    report_plugin_error,
    resctrl_actions,
    steps_of,
    suppressed_quota_why,
    unlimited_parent_write,
)
from .weightformula import WeightFormulaSource

log = logging.getLogger(__name__)

_TERMINAL_PHASES = ("Succeeded", "Failed")


class Reconciler:
    def __init__(self, pods: Callable[[], tuple[PodMeta, ...]], node: Callable[[], NodeContext],
                 plugins: Callable[[], list[registry.Plugin]], executor: ResourceExecutor,
                 layout: KubeCgroupLayout, interval_s: float = 10.0, rejects: RejectedValues | None = None,
                 answers: HookAnswers | None = None,
                 task_ids: Callable[[str], Mapping[str, tuple[int, ...]]] | None = None,
                 weight_formula: WeightFormulaSource | None = None) -> None:
        """``answers``: where the plugins' answer for a pod or container that has none yet (created before koordlet
        started, or with no front door) is kept for ``/debug/pods``. ``task_ids``: pod UID → each container's (and
        the sandbox's) thread ids as the states informer last read them (``-enable-pod-taskids``); they are moved
        into the pod's resctrl group with its processes. ``weight_formula``: learns the runtime's cpu.shares →
        cpu.weight formula from its own writes before each pass's writes (cgroup v2, weightformula.py)."""
        self._pods = pods
        self._weight_formula = weight_formula
        self._answers = answers
        self._task_ids = task_ids
        self._executor = executor
        self._rejects = rejects or RejectedValues()
        self._node = node
        self._plugins = plugins
        self._runner = PlanRunner(executor)
        self._layout = layout
        self.interval_s = interval_s
        self._thread = PeriodicThread("runtime-hooks-reconciler", lambda: self.interval_s, self.reconcile_once,
                                      on_error=lambda err: log.exception("reconcile pass failed"))
        self.passes = 0
        self._gauged: set[tuple[str, str, str, str]] = set()  # container gauge series set by the last pass
        self._refusals_logged: set[tuple[str, str, int]] = set()

    _report = staticmethod(report_plugin_error)

    def pod_plan(self, pod: PodMeta, node: NodeContext, plugins: list[registry.Plugin]) -> Plan:
        """The plugins' results for one pod and its containers, as a plan (empty when the pod has no dir)."""
        pod_dir = pod_cgroup_dir(self._layout, pod)
        if pod_dir is None:
            return Plan()
        unlimited = besteffort_unlimited_first(self._layout, pod_dir, node)
        trace = self._trace(pod.uid, POD_LEVEL)
        pod_changes = registry.run_pod(plugins, node, PodContext(pod), self._report, self._rejects.reporter(pod),
                                       effective_quota_reader(self._executor, posixpath.dirname(pod_dir),
                                                              unlimited=unlimited), trace)
        self._note(pod.uid, POD_LEVEL, trace, pod_changes)
        # a container's quota is bound by its pod's as this plan leaves it (the pod's write comes first when
        # it loosens, last when it tightens: leveled)
        container_parent = effective_quota_reader(self._executor, pod_dir, pod_changes.cfs_quota_us, unlimited)
        leveled, plain = cgroup_writes(pod_changes, pod_dir, suppressed_quota_why(pod, node, pod_changes))
        if (parent_write := unlimited_parent_write(self._executor, unlimited, pod_changes)) is not None:
            leveled.insert(0, parent_write)
        container_dirs: list[str] = []
        processes: list[ProcessWrite] = []
        for container in pod.containers:
            if not container.container_id:
                continue
            trace = self._trace(pod.uid, container.name)
            changes = registry.run_container(plugins, node, container_context_from_meta(pod, container),
                                             self._report, self._rejects.reporter(pod, container.name),
                                             container_parent, trace)
            self._note(pod.uid, container.name, trace, changes)
            container_dir = self._layout.container_dir(pod_dir, container.container_id, container.runtime)
            container_dirs.append(container_dir)
            more_leveled, more_plain = cgroup_writes(changes, container_dir,
                                                     suppressed_quota_why(pod, node, changes))
            leveled += more_leveled
            plain += more_plain
            processes += process_writes(changes, container_dir, f"{pod.key}/{container.name}")
        threads = self._task_ids(pod.uid) if self._task_ids is not None and pod_changes.resctrl_group else {}
        task_ids = tuple(sorted({tid for ids in threads.values() for tid in ids}))
        return Plan(steps_of(leveled, plain),
                    resctrl=resctrl_actions(pod_changes, pod.uid, tuple(container_dirs), task_ids),
                    processes=tuple(processes))

    def _trace(self, pod_uid: str, container: str) -> Trace | None:
        """A trace when nothing is recorded yet for this pod or container (one lookup per pass otherwise)."""
        answers = self._answers
        return Trace() if answers is not None and answers.missing(pod_uid, container) else None

    def _note(self, pod_uid: str, container: str, trace: Trace | None, changes: Changes) -> None:
        if trace is not None and self._answers is not None:
            self._answers.record(pod_uid, container, "reconcile", "reconciler", trace, changes)

    def reconcile_pod(self, pod: PodMeta, node: NodeContext, plugins: list[registry.Plugin]) -> int:
        """Apply one pod's results; returns the number of failed writes (pods gone meanwhile excluded)."""
        # verify: a value someone changed since koordlet wrote it is written again at once, not after the
        # executor's 60 s write cache expires (that is what the reconciler is for).
        record = self._runner.run(self.pod_plan(pod, node, plugins), "reconciler", verify=True)
        failed = 0
        for failure in record.failures:
            # gone pods (no dir) and kernels without a file are not failures: nothing to do there
            if not isinstance(failure.error, CgroupNotFoundError | UnsupportedResourceError):
                failed += 1
                log.warning("reconcile %s: %s", pod.key, failure.error)
        for error in record.resctrl_errors:
            failed += 1
            log.warning("reconcile %s: resctrl group %s", pod.key, error)
        failed += self._report_processes(pod, record.process_results)
        return failed

    def _report_processes(self, pod: PodMeta, results: tuple[ProcessResult, ...]) -> int:
        """The container gauge (while some process holds the value) and the refusals (counted; logged once per
        container and value, as every pass meets them again)."""
        refused = 0
        for result in results:
            container = posixpath.basename(result.write.cgroup_dir)
            name = next((c.name for c in pod.containers if c.container_id and container.endswith(c.container_id)),
                        container)
            labels = (metrics.node(), pod.namespace, pod.name, pod.uid, name)
            if result.holds:
                metrics.CONTAINER_OOM_SCORE_ADJ.labels(*labels).set(result.write.value)
                self._gauged.add(labels)
            for code in result.refused:
                metrics.PROCESS_WRITE_ERRORS.labels(result.write.name, code).inc()
            if result.refused:
                refused += len(result.refused)
                key = (pod.uid, name, result.write.value)
                if key not in self._refusals_logged:
                    self._refusals_logged.add(key)
                    log.warning("reconcile %s/%s: %s %d refused for %d of %d processes (%s)", pod.key, name,
                                result.write.name, result.write.value, len(result.refused), result.processes,
                                ", ".join(sorted(set(result.refused))))
        return refused

    def reconcile_once(self) -> None:
        started = time.perf_counter()
        node, plugins = self._node(), self._plugins()
        failed = 0
        gauged, self._gauged = self._gauged, set()
        pods = self._pods()
        if self._weight_formula is not None:
            self._weight_formula.update(pods)
        for pod in pods:
            if pod.phase in _TERMINAL_PHASES or skips_hooks(pod.labels):
                continue
            try:
                failed += self.reconcile_pod(pod, node, plugins)
            except (CgroupPathError, ValueError) as err:
                failed += 1
                log.warning("reconcile %s: %s", pod.key, err)
        for labels in gauged - self._gauged:
            metrics.CONTAINER_OOM_SCORE_ADJ.remove(*labels)  # the container, or its annotation, is gone
        if len(self._refusals_logged) > 4096:
            self._refusals_logged.clear()
        self.passes += 1
        status = "failed" if failed else "succeeded"
        elapsed_ms = (time.perf_counter() - started) * 1000
        metrics.RECONCILER_DURATION_MS.labels(metrics.node(), "pod", "all", status).observe(elapsed_ms)

    @property
    def loop(self) -> PeriodicThread:
        """The reconciler's thread (its heartbeat is a health check)."""
        return self._thread

    def trigger(self) -> None:
        """Reconcile soon (pods or rules changed)."""
        self._thread.wake()

    def start(self) -> None:
        """The first pass at once, then every interval and on every trigger."""
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> bool:
        return self._thread.stop(timeout_s)
