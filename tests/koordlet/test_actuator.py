"""The plan runner: cgroup writes (plain and leveled) through the real executor on a fixture cgroup v1 tree,
resctrl actions, evictions through the real evictor against the project's API server (a PDB refusal makes
it try the next candidate), gauges set and removed, and the record of all of it."""

from __future__ import annotations

from pathlib import Path

import kubernetes.client
import pytest
from prometheus_client import CollectorRegistry, Gauge

from koordlet.actuator import PlanRunner
from koordlet.eviction import Evictor
from koordlet.executor import ResourceExecutor
from koordlet.plan import (
    CgroupWrite,
    Evictions,
    GaugeSet,
    Plan,
    ResctrlGroup,
    ResctrlMoveTasks,
    ResctrlWrite,
    Victim,
    WriteStep,
)
from koordlet.system.cgroup import CgroupFS, CgroupVersion
from tests.koordlet.qosmanager.factory import seed_pod
from tests.support.apiserver import ApiServer


def _tree(tmp_path: Path) -> ResourceExecutor:
    """kubepods/besteffort/pod-a/c1 with cpu files, as cgroup v1 shows them."""
    base = tmp_path / "sys/fs/cgroup/cpu/kubepods/besteffort"
    for rel in ("", "pod-a", "pod-a/c1"):
        directory = base / rel
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "cpu.cfs_quota_us").write_text("-1\n")
        (directory / "cpu.shares").write_text("1024\n")
        (directory / "tasks").write_text("")
    (base / "pod-a/c1/tasks").write_text("11\n12\n")
    resctrl = tmp_path / "resctrl"
    (resctrl / "BE").mkdir(parents=True)
    (resctrl / "BE/schemata").write_text("")
    (resctrl / "BE/tasks").write_text("11\n")
    return ResourceExecutor(CgroupFS(str(tmp_path / "sys/fs/cgroup"), CgroupVersion.V1),
                            resctrl_root=str(resctrl))


def test_writes_resctrl_and_gauges_are_carried_out_and_recorded(tmp_path: Path) -> None:
    executor = _tree(tmp_path)
    gauge = Gauge("test_actuator_gauge", "a gauge plans may set", ["node"], registry=CollectorRegistry())
    runner = PlanRunner(executor, gauges={"test_actuator_gauge": gauge})
    pod_dir = "kubepods/besteffort/pod-a"
    plan = Plan(
        steps=(
            WriteStep((CgroupWrite("cpu.cfs_quota_us", pod_dir, 50000),
                       CgroupWrite("cpu.cfs_quota_us", f"{pod_dir}/c1", 40000)), leveled=True),
            WriteStep((CgroupWrite("cpu.shares", pod_dir, 2), CgroupWrite("no.such.file", pod_dir, 1))),
        ),
        resctrl=(ResctrlGroup("BE"), ResctrlWrite("BE", "schemata", "L3:0=f\n"),
                 ResctrlMoveTasks("BE", (f"{pod_dir}/c1", "kubepods/besteffort/gone"))),
        gauges=(GaugeSet("test_actuator_gauge", (("node", "n1"),), 3.0),),
    )
    record = runner.run(plan, "test", now=5.0)
    cpu = tmp_path / "sys/fs/cgroup/cpu"
    assert (cpu / pod_dir / "cpu.cfs_quota_us").read_text().strip() == "50000"
    assert (cpu / pod_dir / "c1/cpu.cfs_quota_us").read_text().strip() == "40000"
    assert (cpu / pod_dir / "cpu.shares").read_text().strip() == "2"
    assert record.written == 3 and record.unknown_resources == ("no.such.file",) and record.failed == 1
    assert (tmp_path / "resctrl/BE/schemata").read_text() == "L3:0=f\n"
    assert dict(record.moved_tasks) == {"BE": (12,)}  # 11 was there already; the gone dir is skipped
    assert gauge.labels(node="n1")._value.get() == 3.0
    assert runner.last("test") is record and record.at == 5.0
    runner.run(Plan(gauges=(GaugeSet("test_actuator_gauge", (("node", "n1"),), None),)), "test")
    assert list(gauge.collect()[0].samples) == []  # removed
    assert runner.run(Plan(), "empty").failed == 0


def test_evictions_walk_the_candidates_skip_a_refused_pod_and_never_ask_for_a_non_be_pod(
        tmp_path: Path, server: ApiServer, api_client: kubernetes.client.ApiClient) -> None:
    guarded = seed_pod(server, "guarded", "BE", "BestEffort", app="guarded")
    web = seed_pod(server, "web", "LS", "Burstable", app="web")
    free = seed_pod(server, "free", "BE", "BestEffort", app="free")
    spare = seed_pod(server, "spare", "BE", "BestEffort", app="spare")
    kubernetes.client.PolicyV1Api(api_client).create_namespaced_pod_disruption_budget("default", {
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "guarded"},
        "spec": {"selector": {"matchLabels": {"app": "guarded"}}, "minAvailable": 1}})
    runner = PlanRunner(_tree(tmp_path), Evictor("node-1", api_client=api_client))
    candidates = tuple(Victim(p, 100.0, f"test eviction of {p.name}") for p in (guarded, web, free, spare))
    record = runner.run(Plan(evictions=(Evictions("BEMemoryEvict", 100.0, candidates),)), "memoryevict", now=1.0)
    assert record.blocked == ("default/guarded",)
    assert record.evicted == ("default/free",) and record.released == (("BEMemoryEvict", 100.0),)  # spare not needed
    assert server.get_object("pods", "web", "default") is not None
    assert server.get_object("pods", "spare", "default") is not None
    assert not server.requests("POST", r"/pods/web/eviction$")
    messages = [e["message"] for e in server.list_objects("events", "default")]
    assert messages == ["evicted by koordlet BEMemoryEvict: test eviction of free"]


def test_a_plan_removes_one_labelled_series_whatever_order_it_names_the_labels_in(tmp_path: Path) -> None:
    gauge = Gauge("test_actuator_two_labels", "a gauge with two labels", ["node", "type"],
                  registry=CollectorRegistry())
    runner = PlanRunner(_tree(tmp_path), gauges={"test_actuator_two_labels": gauge})
    runner.run(Plan(gauges=(GaugeSet("test_actuator_two_labels", (("node", "n1"), ("type", "cpuset")), 2.0),
                            GaugeSet("test_actuator_two_labels", (("node", "n1"), ("type", "cfsQuota")), 1.5))),
               "test")
    runner.run(Plan(gauges=(GaugeSet("test_actuator_two_labels", (("type", "cpuset"), ("node", "n1")), None),
                            GaugeSet("test_actuator_two_labels", (("type", "never"), ("node", "n1")), None))),
               "test")
    assert [(s.labels, s.value) for s in gauge.collect()[0].samples] == [({"node": "n1", "type": "cfsQuota"}, 1.5)]


def test_an_eviction_outcome_is_a_victim_outcome_never_a_bare_string() -> None:
    """A misspelt outcome ("evict") used to count as released without asking; now the walk refuses it."""
    from koordlet.api.pod import PodMeta
    from koordlet.plan import Evictions, Victim, VictimOutcome, walk_evictions

    be = PodMeta(name="be", namespace="ns", uid="u-be", labels={"koordinator.sh/qosClass": "BE"})
    victims = (Victim(be, 1.0),)
    task = Evictions("BEMemoryEvict", 1.0, victims)
    (done,) = walk_evictions((task,), lambda _, v: VictimOutcome.EVICTED)
    assert (done.released, done.accepted, done.refused) == (1.0, victims, ())
    (done,) = walk_evictions((task,), lambda _, v: VictimOutcome.REFUSED)
    assert (done.released, done.accepted, done.refused) == (0.0, (), victims)
    with pytest.raises(TypeError, match="VictimOutcome"):
        walk_evictions((task,), lambda _, v: "evict")


def test_a_resctrl_group_whose_record_cannot_be_written_is_not_made_and_one_that_was_there_is_not_taken(
        tmp_path: Path) -> None:
    """A class group (the RdtResctrl strategy's) is recorded before its mkdir, so that the collector can take it
    away: one whose record cannot be written is not made (a failure, counted); a group that was there before
    koordlet is neither recorded nor touched."""
    from koordlet.executor.metrics import update_count
    from koordlet.executor.records import NodeRecords

    (tmp_path / "run").write_text("a file where the records' dir should be\n")
    records = NodeRecords.beside(str(tmp_path / "run" / "system-config-originals.json"))
    resctrl = tmp_path / "resctrl"
    (resctrl / "BE").mkdir(parents=True)
    executor = ResourceExecutor(CgroupFS(str(tmp_path / "cg"), CgroupVersion.V1), resctrl_root=str(resctrl),
                                records=records)
    failed = update_count("resctrl.group", "failed")
    record = PlanRunner(executor).run(Plan(resctrl=(ResctrlGroup("LS"), ResctrlGroup("BE"))), "rdtresctrl")
    assert len(record.resctrl_errors) == 1 and "LS" in record.resctrl_errors[0]
    assert "cannot be recorded" in record.resctrl_errors[0]
    assert record.created_groups == () and not (resctrl / "LS").exists()
    assert update_count("resctrl.group", "failed") == failed + 1
    (tmp_path / "run").unlink()
    record = PlanRunner(executor).run(Plan(resctrl=(ResctrlGroup("LS"), ResctrlGroup("BE"))), "rdtresctrl")
    assert record.created_groups == ("LS",) and (resctrl / "LS").is_dir()
    assert records.resctrl_groups.keys() == {"LS"}  # BE was there before koordlet: not its to remove
