"""Koordinator v1.8's ``-disable-unset-cpu-quota`` and ``-enable-pod-taskids`` (facts: Koordinator v1.8.0
runtimehooks/config.go and hooks/cpuset/cpuset.go ``DisableUnsetCPUQuotaForCPUSetPod``; statesinformer/impl/config.go
``EnablePodTaskIds``, states_pods.go getTaskIds, util/resctrl GetPodCgroupNewTaskIdsFromPodCtx), on real cgroup v1
dirs of this host and a resctrl fixture tree (no RDT here).

- ``-disable-unset-cpu-quota``: the cpuset hook keeps the CFS quota kubelet gave a pod bound to CPUs (LSE/LSR with
  a cpuset in ``scheduling.koordinator.sh/resource-status``) instead of unsetting it (-1), at pod and container level;
- ``-enable-pod-taskids``: the states informer reads the thread ids of each container and the sandbox at every
  pod sync, and the resctrl reconciler moves every one of those threads into the pod's group (without it, the
  processes of ``cgroup.procs`` only: a thread that existed before the move stays behind).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from hooks import cpuset, registry
from hooks.protocol import Changes, ContainerContext, NodeContext, PodContext, ResctrlNode
from koordlet.actuator import PlanRunner
from koordlet.api.pod import ContainerMeta, PodMeta
from koordlet.config import parse_config
from koordlet.executor import ResourceExecutor
from koordlet.runtimehooks import RuntimeHooks, RuntimeHooksConfig
from koordlet.runtimehooks.reconciler import Reconciler
from koordlet.statesinformer.api import NodeInfo, StaticStates
from koordlet.statesinformer.cgroups import container_task_reader
from koordlet.statesinformer.informer import StatesInformer
from koordlet.system.cgroup import CgroupFS, CgroupVersion, detect_cgroup_version
from koordlet.system.kubepods import KubeCgroupLayout

UID, CID, SANDBOX = "7a6b5c4d-0000-4000-8000-0000000000aa", "d" * 64, "e" * 64
ENV = {"NODE_NAME": "n1"}


def _bound_pod(prefix: str, cpus: str = "1") -> PodMeta:
    return PodMeta(name="db", namespace="ns", uid=UID, labels={"koordinator.sh/qosClass": "LSR"},
                   annotations={"scheduling.koordinator.sh/resource-status": json.dumps({"cpuset": cpus})},
                   cgroup_parent=f"/{prefix}/kubepods/pod{UID}", containers=(ContainerMeta("db", CID),),
                   sandbox_id=SANDBOX)


def test_the_flags_parse_with_koordinators_defaults() -> None:
    config = parse_config([], ENV)
    assert (config.disable_unset_cpu_quota, config.enable_pod_taskids) == (False, False)
    config = parse_config(["-disable-unset-cpu-quota", "-enable-pod-taskids=true"], ENV)
    assert (config.disable_unset_cpu_quota, config.enable_pod_taskids) == (True, True)


def test_the_cpuset_hook_keeps_a_bound_pods_quota_when_asked() -> None:
    pod = _bound_pod("x")
    unset, keep = cpuset.rule(NodeContext()), cpuset.rule(NodeContext(keep_cpuset_pod_quota=True))
    assert cpuset.pod(PodContext(pod), unset) == Changes(cfs_quota_us=-1)
    assert cpuset.container(ContainerContext(pod, "db"), unset) == Changes(cpuset_cpus="1", cfs_quota_us=-1)
    assert not cpuset.pod(PodContext(pod), keep)
    assert cpuset.container(ContainerContext(pod, "db"), keep) == Changes(cpuset_cpus="1")


def _v1_dirs(prefix: str, rel: str, controllers: tuple[str, ...]) -> list[Path]:
    """``/sys/fs/cgroup/<controller>/<prefix>/<rel>`` made dir by dir (cpuset dirs get their parent's cpus and
    mems, as a new v1 cpuset is empty)."""
    made = []
    for controller in controllers:
        path = Path("/sys/fs/cgroup", controller)
        for part in [prefix, *rel.split("/")]:
            parent, path = path, path / part
            if path.is_dir():
                continue
            path.mkdir()
            made.append(path)
            if controller == "cpuset":
                for name in ("cpuset.cpus", "cpuset.mems"):
                    (path / name).write_text((parent / name).read_text())
    return made


@pytest.fixture
def v1_pod() -> Iterator[str]:
    if os.geteuid() != 0 or detect_cgroup_version() is not CgroupVersion.V1:
        pytest.skip("needs root on cgroup v1")
    prefix = f"koordlet-py-test-{os.getpid()}-parity"
    made: list[Path] = []
    try:
        for rel in (f"kubepods/pod{UID}/{CID}", f"kubepods/pod{UID}/{SANDBOX}"):
            made += _v1_dirs(prefix, rel, ("cpu", "cpuset", "memory"))
        yield prefix
    finally:
        for path in sorted(made, key=lambda p: len(p.parts), reverse=True):
            path.rmdir()


@pytest.mark.parametrize("keep", [False, True])
def test_the_reconciler_keeps_or_unsets_kubelets_quota_on_real_cgroups(tmp_path: Path, v1_pod: str,
                                                                       keep: bool) -> None:
    pod_dir = Path("/sys/fs/cgroup/cpu", v1_pod, f"kubepods/pod{UID}")
    for path in (pod_dir, pod_dir / CID):  # kubelet's quota of a 2-CPU guaranteed pod
        (path / "cpu.cfs_quota_us").write_text("200000")
    config = RuntimeHooksConfig(feature_gates={"CPUSetAllocator": True}, serve_hooks=False,
                                disable_unset_cpu_quota=keep, config_dir=str(tmp_path))
    hooks = RuntimeHooks(config, StaticStates(node=NodeInfo("n1"), pods=(_bound_pod(v1_pod),)),
                         ResourceExecutor(CgroupFS()), KubeCgroupLayout(cgroup_root=f"/{v1_pod}"))
    assert hooks.node_context().keep_cpuset_pod_quota is keep
    hooks.reconciler.reconcile_once()
    expected = "200000" if keep else "-1"
    assert (pod_dir / "cpu.cfs_quota_us").read_text().strip() == expected
    assert (pod_dir / CID / "cpu.cfs_quota_us").read_text().strip() == expected
    assert Path("/sys/fs/cgroup/cpuset", v1_pod, f"kubepods/pod{UID}", CID, "cpuset.cpus").read_text().strip() == "1"


def test_with_the_flag_a_be_pod_bound_to_a_cpuset_keeps_kubelets_unlimited_quota_not_its_batch_limit(
        tmp_path: Path, v1_pod: str) -> None:
    """The quota of a pod bound to CPUs is the cpuset hook's (koordlet/api/cfsquota.py, rule 1), whatever kind of
    pod: with ``-disable-unset-cpu-quota`` that means kubelet's, which for a BE pod (no cpu limit) is unlimited.
    Batch resources still give its shares and memory limit, never its quota."""
    pod_dir = Path("/sys/fs/cgroup/cpu", v1_pod, f"kubepods/pod{UID}")
    for path in (pod_dir, pod_dir / CID):
        (path / "cpu.cfs_quota_us").write_text("-1")
    spec = {"containers": {"db": {"requests": {"kubernetes.io/batch-cpu": "500"},
                                  "limits": {"kubernetes.io/batch-cpu": "1000", "kubernetes.io/batch-memory": "1Gi"}}}}
    bound = _bound_pod(v1_pod)
    be = PodMeta(name=bound.name, namespace=bound.namespace, uid=UID, labels={"koordinator.sh/qosClass": "BE"},
                 annotations={**bound.annotations, "node.koordinator.sh/extended-resource-spec": json.dumps(spec)},
                 cgroup_parent=bound.cgroup_parent, containers=bound.containers, sandbox_id=SANDBOX)
    config = RuntimeHooksConfig(feature_gates={"CPUSetAllocator": True, "BatchResource": True}, serve_hooks=False,
                                disable_unset_cpu_quota=True, config_dir=str(tmp_path))
    hooks = RuntimeHooks(config, StaticStates(node=NodeInfo("n1"), pods=(be,)), ResourceExecutor(CgroupFS()),
                         KubeCgroupLayout(cgroup_root=f"/{v1_pod}"))
    hooks.reconciler.reconcile_once()
    assert (pod_dir / "cpu.cfs_quota_us").read_text().strip() == "-1"
    assert (pod_dir / CID / "cpu.cfs_quota_us").read_text().strip() == "-1"
    assert (pod_dir / CID / "cpu.shares").read_text().strip() == "512"  # batch resources' shares still land
    assert Path("/sys/fs/cgroup/cpuset", v1_pod, f"kubepods/pod{UID}", CID, "cpuset.cpus").read_text().strip() == "1"


class _OnePod:
    name = "test"

    def __init__(self, pod: PodMeta) -> None:
        self.pod = pod

    def list_pods(self) -> tuple[PodMeta, ...]:
        return (self.pod,)


_THREADS = "import threading, time\n" + \
    "for _ in range(3):\n    threading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n" + \
    "print('ready', flush=True)\ntime.sleep(60)\n"


def test_the_informer_reads_every_thread_and_the_reconciler_moves_them_into_the_pods_group(
        tmp_path: Path, v1_pod: str) -> None:
    pod = PodMeta(**{f: getattr(_bound_pod(v1_pod), f) for f in PodMeta.__slots__} |
                  {"annotations": {"node.koordinator.sh/resctrl": json.dumps({"llc": {"schemataPerCache": []}})},
                   "labels": {"koordinator.sh/qosClass": "LS"}})
    container_dir = Path("/sys/fs/cgroup/cpu", v1_pod, f"kubepods/pod{UID}", CID)
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.readline()\n" + _THREADS],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        (container_dir / "cgroup.procs").write_text(str(child.pid))
        assert child.stdin is not None and child.stdout is not None
        child.stdin.write(b"go\n")
        child.stdin.flush()
        assert child.stdout.readline() == b"ready\n"
        threads = tuple(sorted(int(t) for t in os.listdir(f"/proc/{child.pid}/task")))
        assert len(threads) == 4
        layout = KubeCgroupLayout(cgroup_root=f"/{v1_pod}")
        informer = StatesInformer(_OnePod(pod), task_reader=container_task_reader(layout, CgroupFS()))
        assert informer.sync_pods()
        assert informer.container_task_ids(UID) == {CID: threads, SANDBOX: ()}  # the sandbox dir holds no task
        resctrl = tmp_path / "resctrl"
        group = resctrl / f"koordlet-{UID}"
        group.mkdir(parents=True)  # what the kernel creates with the group
        for name in ("schemata", "tasks"):
            (group / name).write_text("")
        executor = ResourceExecutor(CgroupFS(), resctrl_root=str(resctrl))
        node = NodeContext(resctrl=ResctrlNode(0x7FF, (0,), has_mb=False))
        plugins = registry.enabled({"Resctrl": True})

        def moved(task_ids) -> tuple[int, ...]:
            reconciler = Reconciler(informer.pods, lambda: node, lambda: plugins, executor, layout, task_ids=task_ids)
            record = PlanRunner(executor).run(reconciler.pod_plan(pod, node, plugins), "test")
            return tuple(sorted(dict(record.moved_tasks).get(f"koordlet-{UID}", ())))

        assert moved(None) == (child.pid,)  # cgroup.procs: the process only
        (group / "tasks").write_text("")  # the group as it was (a fixture file keeps only the last write)
        assert moved(informer.container_task_ids) == threads  # every thread
    finally:
        child.kill()
        child.wait()
