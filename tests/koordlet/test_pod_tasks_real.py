"""A pod's tasks as koordlet reads them from the real kernel, v1 on this host and v2 in the VM stage, and where they
go: a container's threads (v1 ``tasks`` of the cpu hierarchy, v2 ``cgroup.threads``) and processes
(``cgroup.procs``, in the cpu hierarchy on v1, the one hierarchy on v2).

- the states informer's task reader (``-enable-pod-taskids``) reads every thread of a container;
- the RdtResctrl strategy moves every thread of each pod into its class group (``tasks`` source);
- the resctrl hook's reconciler pass moves a pod's processes into the pod's own group, and with the informer's
  thread ids every thread.

No machine here has resctrl: the groups are a fixture tree (a plain ``tasks`` file keeps only the last write, so what
was moved is read from the runner's record)."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from hooks import registry
from hooks.protocol import NodeContext, ResctrlNode
from koordlet.actuator import PlanRunner
from koordlet.api.keys import ANNOTATION_RESCTRL
from koordlet.api.nodeslo import parse_node_slo_spec
from koordlet.api.pod import ContainerMeta
from koordlet.api.qos import KubeQoS, QoSClass
from koordlet.executor import ResourceExecutor
from koordlet.metriccache import MetricCache
from koordlet.qosmanager import QoSManager
from koordlet.qosmanager.resctrl import STRATEGY
from koordlet.qosmanager.snapshot import SnapshotBuilder
from koordlet.runtimehooks.reconciler import Reconciler
from koordlet.statesinformer.cgroups import container_task_reader
from tests.koordlet.qosmanager.realnode import BOTH_VERSIONS, RealNode
from tests.support.resctrl import group_as_the_kernel_makes_it, resctrl_tree

PODS = (("ls", QoSClass.LS, KubeQoS.BURSTABLE), ("be", QoSClass.BE, KubeQoS.BESTEFFORT))
# A process with three threads besides its main one, held until the test ends.
THREADS = ("import threading, time\n"
           "for _ in range(3):\n    threading.Thread(target=time.sleep, args=(120,), daemon=True).start()\n"
           "print('ready', flush=True)\ntime.sleep(120)\n")
RESCTRL_ON = parse_node_slo_spec({"resourceQOSStrategy": {"lsClass": {"resctrlQOS": {"enable": True}},
                                                         "beClass": {"resctrlQOS": {"enable": True}}}})


@pytest.fixture(params=BOTH_VERSIONS)
def node(request: pytest.FixtureRequest) -> Iterator[RealNode]:
    yield from RealNode.of_version_closed_after(request.param, "tasks", PODS)


def _threaded_container(node: RealNode, pod_name: str, container_id: str) -> tuple[subprocess.Popen[bytes], tuple]:
    """A container of ``pod_name`` running one process of four threads; the process and its thread ids."""
    container_dir = node.add_container(pod_name, ContainerMeta("app", container_id=container_id))
    child = node.groups.spawn(node._rel(container_dir), THREADS)
    assert child.stdout is not None and child.stdout.readline() == b"ready\n"
    threads = tuple(sorted(int(t) for t in os.listdir(f"/proc/{child.pid}/task")))
    assert len(threads) == 4
    return child, threads


def test_the_informers_task_reader_gives_every_thread_of_each_container(node: RealNode) -> None:
    _, ls_threads = _threaded_container(node, "ls", "1" * 12)
    _, be_threads = _threaded_container(node, "be", "2" * 12)
    read = container_task_reader(node.layout, node.fs)
    assert read(node.pod("ls")) == {"1" * 12: ls_threads}
    assert read(node.pod("be")) == {"2" * 12: be_threads}


def test_the_rdtresctrl_strategy_moves_every_thread_of_each_pod_into_its_class_group(node: RealNode,
                                                                                     tmp_path: Path) -> None:
    _, ls_threads = _threaded_container(node, "ls", "1" * 12)
    _, be_threads = _threaded_container(node, "be", "2" * 12)
    root = resctrl_tree(tmp_path / "resctrl")
    for group in ("LSR", "LS", "BE"):
        group_as_the_kernel_makes_it(root, group)
    executor = ResourceExecutor(node.fs, resctrl_root=str(root))
    node.states.set_node_slo(RESCTRL_ON)
    manager = QoSManager(node.states, [STRATEGY],
                         builder=SnapshotBuilder(node.states, MetricCache(), reader=executor, layout=node.layout),
                         runner=PlanRunner(executor))
    assert manager.run_strategy("resctrl")
    record = manager.last_record("resctrl")
    assert record is not None
    moved = {group: tuple(sorted(tasks)) for group, tasks in dict(record.moved_tasks).items()}
    assert moved == {"LS": ls_threads, "BE": be_threads}


def test_the_resctrl_hooks_reconciler_moves_a_pods_processes_and_with_the_informers_ids_every_thread(
        node: RealNode, tmp_path: Path) -> None:
    child, threads = _threaded_container(node, "ls", "1" * 12)
    pod = replace(node.pod("ls"), annotations={ANNOTATION_RESCTRL: json.dumps({"llc": {"schemataPerCache": []}})})
    node.states.set_pods([pod if p.uid == pod.uid else p for p in node.states.pods()])
    root = resctrl_tree(tmp_path / "resctrl")
    group = group_as_the_kernel_makes_it(root, f"koordlet-{pod.uid}")
    executor = ResourceExecutor(node.fs, resctrl_root=str(root))
    context = NodeContext(resctrl=ResctrlNode(0x7FF, (0,), has_mb=False))
    plugins = registry.enabled({"Resctrl": True})
    read = container_task_reader(node.layout, node.fs)

    def moved(task_ids) -> tuple[int, ...]:  # noqa: ANN001
        (group / "tasks").write_text("")  # the group as it was (a fixture file keeps only the last write)
        reconciler = Reconciler(node.states.pods, lambda: context, lambda: plugins, executor, node.layout,
                                task_ids=task_ids)
        record = PlanRunner(executor).run(reconciler.pod_plan(pod, context, plugins), "test")
        return tuple(sorted(dict(record.moved_tasks).get(group.name, ())))

    assert moved(None) == (child.pid,)  # cgroup.procs: the process only
    assert moved(lambda uid: read(pod) if uid == pod.uid else {}) == threads  # every thread
