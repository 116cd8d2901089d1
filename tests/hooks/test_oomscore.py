"""OOMScoreAdj (docs/koordinator.md §3.3): the annotations, the plugin and its bound.

The −1000..1000 bound of validate.check, and the reconciler keeping the value on every process of a real
containerd container as processes come and go."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hooks import registry, validate
from hooks.oomscore import container
from hooks.protocol import Changes, ContainerContext, NodeContext
from koordlet.api.annotations import AnnotationError, parse_oom_score_adj
from koordlet.api.keys import ANNOTATION_OOM_SCORE_ADJ, ANNOTATION_OOM_SCORE_ADJ_SPEC
from koordlet.api.pod import PodMeta

SPEC = ANNOTATION_OOM_SCORE_ADJ_SPEC
POD_WIDE = ANNOTATION_OOM_SCORE_ADJ


def test_the_container_entry_wins_then_the_pod_wide_value() -> None:
    annotations = {SPEC: json.dumps({"app": -500, "sidecar": 200}), POD_WIDE: "300"}
    assert parse_oom_score_adj(annotations, "app") == -500
    assert parse_oom_score_adj(annotations, "sidecar") == 200
    assert parse_oom_score_adj(annotations, "other") == 300
    assert parse_oom_score_adj({POD_WIDE: "+7"}, "x") == 7
    assert parse_oom_score_adj({}, "x") is None
    assert parse_oom_score_adj({SPEC: "", POD_WIDE: ""}, "x") is None


@pytest.mark.parametrize("annotations", [
    {SPEC: "{not json"},
    {SPEC: '["app"]'},
    {SPEC: '{"app": 1.5}'},  # Go's json into int64 refuses a fraction
    {SPEC: '{"app": "100"}'},
    {SPEC: '{"other": true}', POD_WIDE: "5"},  # a bad spec is not skipped for the fall back
    {POD_WIDE: " 5"},
    {POD_WIDE: "5e2"},
    {POD_WIDE: "99999999999999999999"},
])
def test_malformed_annotations_are_errors(annotations: dict[str, str]) -> None:
    with pytest.raises(AnnotationError):
        parse_oom_score_adj(annotations, "app")


@given(st.dictionaries(st.sampled_from([SPEC, POD_WIDE, "x"]), st.text(max_size=40)), st.text(max_size=8))
def test_any_annotation_gives_a_value_none_or_an_annotation_error(annotations: dict, name: str) -> None:
    try:
        value = parse_oom_score_adj(annotations, name)
    except AnnotationError:
        return
    assert value is None or isinstance(value, int)


def _ctx(annotations: dict[str, str], name: str = "app") -> ContainerContext:
    return ContainerContext(pod=PodMeta("p", "ns", "uid-p", annotations=annotations), name=name)


@pytest.mark.parametrize("value,kept", [(-1000, True), (1000, True), (0, True), (1001, False), (-1001, False),
                                        (2**40, False)])
def test_validate_keeps_only_minus_1000_to_1000(value: int, kept: bool) -> None:
    changes = container(_ctx({POD_WIDE: str(value)}), None)
    assert changes.oom_score_adj == value
    checked, rejected = validate.check(changes, NodeContext())
    assert (checked.oom_score_adj == value) is kept
    assert bool(rejected) is not kept
    if rejected:
        assert rejected[0].key == "oom_score_adj" and "-1000..1000" in rejected[0].reason


def test_the_registry_runs_the_plugin_behind_its_gate_and_drops_out_of_range_values() -> None:
    assert [p.name for p in registry.enabled({"OOMScoreAdj": True})] == ["oomscoreadj"]
    assert registry.enabled({"OOMScoreAdj": False}) == []
    assert registry.stages({"OOMScoreAdj": True}) == []  # the reconciler's alone: no hook stage
    plugins = registry.enabled({"OOMScoreAdj": True})
    rejected: list = []
    errors: list = []
    out = registry.run_container(plugins, NodeContext(), _ctx({POD_WIDE: "5000"}), on_reject=rejected.extend,
                                 on_error=lambda *e: errors.append(e))
    assert out == Changes() and [r.key for r in rejected] == ["oom_score_adj"]
    out = registry.run_container(plugins, NodeContext(), _ctx({SPEC: "{bad"}), on_error=lambda *e: errors.append(e))
    assert out == Changes() and errors and errors[0][0] == "oomscoreadj"


# ------------------------------------------------------------------------------------ real containerd


def _has_cap_sys_resource() -> bool:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("CapEff:"):
            return bool(int(line.split()[1], 16) >> 24 & 1)
    return False


@pytest.mark.containerd
def test_reconciler_keeps_the_value_on_every_process_of_a_real_container(containerd_socket: str) -> None:
    """A container's processes get the annotation's value, and a process started later gets it at the next pass;
    a value below what runc gave the container needs CAP_SYS_RESOURCE: without it (this host) every refusal is
    counted (EACCES), never raised, and the processes keep their value."""
    from koordlet.executor import ResourceExecutor
    from koordlet.runtimehooks import metrics
    from koordlet.runtimehooks.reconciler import Reconciler
    from koordlet.statesinformer.cri import CriPodSource
    from koordlet.system.cgroup import CgroupFS
    from koordlet.system.kubepods import KubeCgroupLayout
    from tests.support.containerd import CGROUP_ROOT
    from tests.support.cri import CriClient, PodFactory
    from wire import cri_pb2 as cri

    client = CriClient(containerd_socket)
    factory = PodFactory(client)
    source = CriPodSource(containerd_socket)
    fs = CgroupFS.detect("/sys/fs/cgroup")
    layout = KubeCgroupLayout(cgroup_root=CGROUP_ROOT)
    try:
        # runc starts the processes at 100 (kubelet's BestEffort 1000 would leave no room to raise)
        resources = cri.LinuxContainerResources(oom_score_adj=100)
        _, up_cid, _ = factory.start_pod("oom-up", resources=resources, annotations={POD_WIDE: "600"})
        _, down_cid, _ = factory.start_pod("oom-down", resources=resources, annotations={POD_WIDE: "-500"})
        pods = {p.name: p for p in source.list_pods() if p.name in ("oom-up", "oom-down")}
        reconciler = Reconciler(lambda: tuple(pods.values()), NodeContext, lambda: registry.enabled(
            {"OOMScoreAdj": True}), ResourceExecutor(fs, proc_dir="/proc"), layout)

        def values(pod_name: str, cid: str) -> dict[int, int]:
            pod = pods[pod_name]
            procs_dir = Path(fs.hierarchy_dir("cpu")) / layout.dir_from_cgroup_parent(pod.cgroup_parent) / cid
            pids = [int(p) for p in (procs_dir / "cgroup.procs").read_text().split()]
            return {pid: int(Path(f"/proc/{pid}/oom_score_adj").read_text()) for pid in pids}

        refused_before = metrics.PROCESS_WRITE_ERRORS.labels("oom_score_adj", "EACCES")._value.get()
        reconciler.reconcile_once()
        first = values("oom-up", up_cid)
        assert len(first) == 2 and set(first.values()) == {600}  # the shell and its sleep
        gauge = metrics.CONTAINER_OOM_SCORE_ADJ.labels(metrics.node(), "default", "oom-up", pods["oom-up"].uid,
                                                       "oom-up")
        assert gauge._value.get() == 600
        # a process that comes later from outside (kubectl exec: runc gives it the container's 100)
        client.runtime.ExecSync(cri.ExecSyncRequest(
            container_id=up_cid, cmd=["sh", "-c", "sleep 3602 </dev/null >/dev/null 2>&1 &"], timeout=10), timeout=30)
        later = values("oom-up", up_cid)
        assert len(later) == 3 and sorted(later.values()) == [100, 600, 600]
        reconciler.reconcile_once()
        assert set(values("oom-up", up_cid).values()) == {600}
        down = values("oom-down", down_cid)
        refused = metrics.PROCESS_WRITE_ERRORS.labels("oom_score_adj", "EACCES")._value.get() - refused_before
        if _has_cap_sys_resource():
            assert set(down.values()) == {-500} and refused == 0
        else:
            assert set(down.values()) == {100}  # kept: the kernel refused to lower it
            assert refused == 2 * len(down)  # both passes, every process, counted
    finally:
        factory.cleanup()
        source.close()
        client.close()


@pytest.mark.cgroupv2
def test_v2_guest_lowers_oom_score_adj_where_root_has_cap_sys_resource() -> None:
    """In the cgroup v2 guest (root with every capability, unlike this host's): the runner lowers a process's
    oom_score_adj below its start value, which the host's root cannot (EACCES, counted)."""
    import os
    import subprocess

    from koordlet.actuator import PlanRunner
    from koordlet.executor import ResourceExecutor
    from koordlet.plan import Plan, ProcessWrite
    from koordlet.system.cgroup import CgroupFS
    from tests.support.v2guest import in_v2_guest

    if not in_v2_guest():
        pytest.skip("only in the cgroup v2 guest (make v2-check)")
    name = f"koordlet-py-test-oom-{os.getpid()}"
    cgroup = Path("/sys/fs/cgroup") / name
    cgroup.mkdir()
    sleeper = subprocess.Popen(["sleep", "60"], preexec_fn=lambda: Path("/proc/self/oom_score_adj").write_text("300"))
    try:
        (cgroup / "cgroup.procs").write_text(str(sleeper.pid))
        runner = PlanRunner(ResourceExecutor(CgroupFS.detect("/sys/fs/cgroup"), proc_dir="/proc"))
        record = runner.run(Plan(processes=(ProcessWrite("oom_score_adj", name, -200, "test"),)), "test")
        value = int(Path(f"/proc/{sleeper.pid}/oom_score_adj").read_text())
        if _has_cap_sys_resource():
            assert value == -200 and record.processes_written == 1 and record.process_errors == ()
        else:
            assert value == 300 and len(record.process_errors) == 1 and "Permission denied" in record.process_errors[0]
    finally:
        sleeper.kill()
        sleeper.wait()
        if cgroup.exists():
            cgroup.rmdir()
