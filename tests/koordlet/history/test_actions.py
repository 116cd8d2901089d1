"""The last writes and evictions per cgroup dir and pod (koordlet/history/actions.py), recorded by the plan runner
through the real executor on a fixture cgroup v1 tree and the real evictor against the project's API server."""

from __future__ import annotations

from pathlib import Path

import kubernetes.client

from koordlet.actuator import PlanRunner
from koordlet.eviction import Evictor
from koordlet.executor import ResourceExecutor
from koordlet.history.actions import RecentActions
from koordlet.plan import CgroupWrite, Evictions, Plan, Victim, WriteStep
from koordlet.system.cgroup import CgroupFS, CgroupVersion
from tests.koordlet.qosmanager.factory import seed_pod
from tests.support.apiserver import ApiServer

UID = "0a0b0c0d-0000-4000-8000-00000000000a"
POD_DIR = f"kubepods/besteffort/pod{UID}"


def _executor(tmp_path: Path) -> ResourceExecutor:
    for rel in ("kubepods/besteffort", POD_DIR):
        directory = tmp_path / "sys/fs/cgroup/cpu" / rel
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "cpu.cfs_quota_us").write_text("-1\n")
        (directory / "cpu.shares").write_text("1024\n")
    return ResourceExecutor(CgroupFS(str(tmp_path / "sys/fs/cgroup"), CgroupVersion.V1))


def test_writes_are_kept_with_their_source_reason_and_figures_and_a_refused_one_with_its_error(tmp_path: Path) -> None:
    actions = RecentActions()
    runner = PlanRunner(_executor(tmp_path), actions=actions)
    plan = Plan(steps=(WriteStep((CgroupWrite("cpu.cfs_quota_us", "kubepods/besteffort", 150000),
                                  CgroupWrite("cpu.shares", POD_DIR, 1),  # below the kernel's minimum: refused
                                  CgroupWrite("cpu.shares", f"{POD_DIR}/gone", 2))),),  # no dir: not kept
                reason="AdjustBEByNodeCPUUsage", why="BE budget 1.5 cores")
    runner.run(plan, "cpusuppress")
    runner.run(plan, "cpusuppress")  # the same value again: skipped by the executor, not kept twice
    found = actions.of(["kubepods/besteffort", POD_DIR, f"{POD_DIR}/gone"])
    assert [(where, a.source, a.what, a.reason, a.why) for where, a in found if "not set" not in a.what] == [
        ("kubepods/besteffort", "cpusuppress", "cpu.cfs_quota_us = 150000", "AdjustBEByNodeCPUUsage",
         "BE budget 1.5 cores")]
    refused = [a.what for _, a in found if "not set" in a.what]
    assert len(refused) == 2 and all(text.startswith("cpu.shares not set to 1: ") for text in refused)


def test_evictions_are_kept_for_the_pod_and_forgotten_when_the_pod_goes(
        tmp_path: Path, server: ApiServer, api_client: kubernetes.client.ApiClient) -> None:
    free = seed_pod(server, "free", "BE", "BestEffort", app="free")
    now = [1000.0]
    actions = RecentActions(clock=lambda: now[0])
    runner = PlanRunner(_executor(tmp_path), Evictor("node-1", api_client=api_client), actions=actions)
    task = Evictions("BEMemoryEvict", 100.0, (Victim(free, 120.0, "node memory 91% > 70%"),),
                     reason="memory above threshold")
    runner.run(Plan(evictions=(task,)), "memoryevict")
    ((where, action),) = actions.of(pod_uid=free.uid)
    assert where == "pod" and action.source == "memoryevict" and action.reason == "BEMemoryEvict"
    assert action.what == "evicted (evicted): releases 120 of 100" and action.why == "node memory 91% > 70%"
    assert actions.retain([]) == 0  # too new: the informer may not list the pod yet
    now[0] += 121
    assert actions.retain([free.uid]) == 0
    assert actions.retain([]) == 1 and actions.of(pod_uid=free.uid) == []


def test_the_record_is_bounded_per_dir_and_in_dirs() -> None:
    actions = RecentActions(per_key=2, max_keys=3)
    for index in range(5):
        actions.wrote(f"kubepods/pod{UID}", "cpu.shares", index, "reconciler")
        actions.wrote(f"d{index}", "cpu.shares", index, "reconciler")
    assert [a.what for _, a in actions.of([f"kubepods/pod{UID}"])] == ["cpu.shares = 4", "cpu.shares = 3"]
    assert actions.of(["d0", "d1", "d2"]) == [] and len(actions.of(["d3", "d4"])) == 2
