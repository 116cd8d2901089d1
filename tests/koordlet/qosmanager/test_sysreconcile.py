"""SystemConfig: sysctls from NodeSLO ``systemStrategy`` (docs/koordinator.md §4.9), written through the executor on a
private fixture tree laid out as /proc and /sys are, and put back as they were when the strategy or the gate
goes off. The real /proc/sys/vm files are written in the cgroup v2 guest (test_sysreconcile_v2.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from koordlet.actuator import PlanRunner
from koordlet.api.nodeslo import parse_node_slo_spec
from koordlet.executor import InvalidUpdateError, ResourceExecutor, UnsafePathError, WriteFailedError
from koordlet.metriccache import MetricCache
from koordlet.qosmanager import QoSManagerConfig, new_qos_manager, sysreconcile
from koordlet.qosmanager.snapshot import SnapshotBuilder
from koordlet.statesinformer.api import NodeInfo, StaticStates
from koordlet.system.cgroup import CgroupFS
from koordlet.system.kubepods import KubeCgroupLayout
from koordlet.system.roots import HostDirs
from tests.koordlet.qosmanager.factory import GiB, node, snapshot

KiB_16G = 16 * GiB // 1024  # 16777216


def _tree(root: Path, anolis: bool = False) -> HostDirs:
    dirs = HostDirs.under(str(root))
    vm = Path(dirs.proc_dir) / "sys/vm"
    vm.mkdir(parents=True)
    (vm / "min_free_kbytes").write_text("67584\n")
    (vm / "watermark_scale_factor").write_text("10\n")
    debug = Path(dirs.sys_dir) / "kernel/debug"
    debug.mkdir(parents=True)
    (debug / "sched_features").write_text("GENTLE_FAIR_SLEEPERS START_DEBIT NO_NEXT_BUDDY LAST_BUDDY NO_HRTICK\n")
    (Path(dirs.cgroup_mount_dir) / "cpu").mkdir(parents=True)
    if anolis:
        kernel = Path(dirs.proc_dir) / "sys/kernel"
        kernel.mkdir(parents=True)
        (kernel / "sched_group_identity_enabled").write_text("0\n")
        (kernel / "sched_idle_saver_wmark").write_text("0\n")
        for sub, name in (("memcg_reaper", "reap_background"), ("pagecache_limit", "enabled")):
            (Path(dirs.sys_dir) / "kernel/mm" / sub).mkdir(parents=True)
            (Path(dirs.sys_dir) / "kernel/mm" / sub / name).write_text("0\n")
    return dirs


def _executor(dirs: HostDirs, record: Path | None = None) -> ResourceExecutor:
    return ResourceExecutor(CgroupFS(dirs.cgroup_mount_dir), proc_dir=dirs.proc_dir, sys_dir=dirs.sys_dir,
                            originals_file=str(record) if record else None)


def _read(dirs: HostDirs, fs: str, path: str) -> str:
    return (Path(dirs.proc_dir if fs == "proc" else dirs.sys_dir) / path).read_text().strip()


def _run(executor: ResourceExecutor, system_strategy: dict | None, memory: int = 16 * GiB):
    spec = parse_node_slo_spec({"systemStrategy": system_strategy} if system_strategy is not None else None)
    states = StaticStates(node=NodeInfo("node-1", capacity={"cpu": 8000, "memory": memory}), node_slo=spec)
    builder = SnapshotBuilder(states, MetricCache(), reader=executor)
    config = sysreconcile.SystemConfig.from_node_slo(spec)
    plan = sysreconcile.decide(builder.build(config.needs), config)
    return plan, PlanRunner(executor).run(plan, "systemconfig")


def test_min_free_kbytes_is_the_factor_of_the_node_memory_within_koordinators_bounds() -> None:
    values = {"min_free_kbytes": "0", "watermark_scale_factor": "10"}

    def wanted(factor: int, memory: int = 16 * GiB):
        snap = snapshot(node=node(8000, memory), system_values=values)
        return sysreconcile.decide_values(snap, sysreconcile.SystemConfig(min_free_kbytes_factor=factor))

    assert wanted(100).wanted[0][:2] == ("min_free_kbytes", str(KiB_16G * 100 // 10000))  # 167772
    assert wanted(1).wanted == () and "1677 outside [10240, 10485760]" in wanted(1).skipped[0]
    assert wanted(10000, 64 * GiB).wanted == ()  # 64 GiB: above the 10 GiB bound
    assert wanted(6000).wanted[0][1] == str(10066329)  # just under 10 GiB


def test_watermark_scale_factor_is_written_within_10_to_400() -> None:
    snap = snapshot(system_values={"watermark_scale_factor": "10"})
    assert sysreconcile.decide_values(snap, sysreconcile.SystemConfig(watermark_scale_factor=150)).wanted[0][:2] \
        == ("watermark_scale_factor", "150")
    assert sysreconcile.decide_values(snap, sysreconcile.SystemConfig(watermark_scale_factor=5)).wanted == ()


def test_writes_record_the_value_before_and_putting_the_strategy_off_restores_it(tmp_path: Path) -> None:
    dirs = _tree(tmp_path)
    record = tmp_path / "run/record.json"
    executor = _executor(dirs, record)
    plan, done = _run(executor, {"minFreeKbytesFactor": 100, "watermarkScaleFactor": 150})
    assert done.system_written == 2 and done.system_errors == ()
    assert _read(dirs, "proc", "sys/vm/min_free_kbytes") == "167772"
    assert _read(dirs, "proc", "sys/vm/watermark_scale_factor") == "150"
    assert [a.reason for a in plan.system][0].startswith("minFreeKbytesFactor 100/10000 of 16777216 KiB")
    assert json.loads(record.read_text())["originals"] == {"min_free_kbytes": "67584", "watermark_scale_factor": "10"}
    _, again = _run(executor, {"minFreeKbytesFactor": 100, "watermarkScaleFactor": 150})
    assert again.system_written == 0  # already there
    # watermarkScaleFactor unset: it goes back; min_free_kbytes stays
    _, partial = _run(executor, {"minFreeKbytesFactor": 100})
    assert partial.system_written == 1 and _read(dirs, "proc", "sys/vm/watermark_scale_factor") == "10"
    # the whole strategy gone: everything back, nothing recorded any more
    _, off = _run(executor, None)
    assert off.system_written == 1 and _read(dirs, "proc", "sys/vm/min_free_kbytes") == "67584"
    assert json.loads(record.read_text())["originals"] == {}


def test_the_record_survives_a_restart_and_the_gate_off_restores_at_start(tmp_path: Path) -> None:
    dirs = _tree(tmp_path)
    record = tmp_path / "run/record.json"
    _run(_executor(dirs, record), {"minFreeKbytesFactor": 100})
    assert _read(dirs, "proc", "sys/vm/min_free_kbytes") == "167772"
    # a new agent whose first write would otherwise record 167772 as "the value before"
    restarted = _executor(dirs, record)
    assert restarted.originals.get("min_free_kbytes") == "67584"
    states = StaticStates(node=NodeInfo("node-1", capacity={"cpu": 8000, "memory": 16 * GiB}))
    new_qos_manager(states, MetricCache(), restarted, KubeCgroupLayout(), config=QoSManagerConfig(), cpus=())
    assert _read(dirs, "proc", "sys/vm/min_free_kbytes") == "67584"  # SystemConfig is off by default
    assert json.loads(record.read_text())["originals"] == {}


def test_a_sysctl_is_not_written_when_its_value_before_cannot_be_recorded(tmp_path: Path) -> None:
    dirs = _tree(tmp_path)
    (tmp_path / "run").write_text("a file where the record's dir should be\n")
    record = tmp_path / "run/record.json"
    executor = _executor(dirs, record)
    with pytest.raises(WriteFailedError, match="cannot be recorded"):
        executor.write_system("min_free_kbytes", 167772)
    _, done = _run(executor, {"watermarkScaleFactor": 150})
    assert done.system_written == 0 and len(done.system_errors) == 1
    assert _read(dirs, "proc", "sys/vm/min_free_kbytes") == "67584"
    assert _read(dirs, "proc", "sys/vm/watermark_scale_factor") == "10"
    assert executor.originals.keys() == frozenset()
    (tmp_path / "run").unlink()  # the record can be kept again: the next write records, then writes
    _, done = _run(executor, {"watermarkScaleFactor": 150})
    assert done.system_written == 1 and _read(dirs, "proc", "sys/vm/watermark_scale_factor") == "150"
    assert json.loads(record.read_text())["originals"] == {"watermark_scale_factor": "10"}


def test_a_corrupt_or_foreign_record_is_set_aside_not_fatal(tmp_path: Path) -> None:
    dirs = _tree(tmp_path)
    record = tmp_path / "run/record.json"
    record.parent.mkdir()
    for text in ("{not json", json.dumps({"kind": "something-else", "version": 1, "originals": {}}),
                 json.dumps({"kind": "koordlet-system-originals", "version": 1, "originals": {"x": 5}})):
        record.write_text(text)
        executor = _executor(dirs, record)
        assert executor.originals.keys() == frozenset()
        assert not record.exists()
    assert len(list(record.parent.glob("record.json.corrupt-*"))) >= 1
    _, done = _run(executor, {"watermarkScaleFactor": 150})
    assert done.system_written == 1 and json.loads(record.read_text())["originals"] == {"watermark_scale_factor": "10"}


def test_anolis_files_are_written_where_present_and_skipped_where_not(tmp_path: Path) -> None:
    fields = {"memcgReapBackGround": 1, "schedGroupIdentityEnabled": 1, "schedIdleSaverWmark": 1000,
              "pageCacheLimitEnabled": 1}
    plain = _tree(tmp_path / "debian")
    plan, done = _run(_executor(plain), fields)
    assert plan.system == () and done.failed == 0
    assert len(plan.report.skipped) == 4 and all("not on this kernel" in s for s in plan.report.skipped)
    anolis = _tree(tmp_path / "anolis", anolis=True)
    _, done = _run(_executor(anolis), fields)
    assert done.system_written == 4
    assert _read(anolis, "sys", "kernel/mm/memcg_reaper/reap_background") == "1"
    assert _read(anolis, "proc", "sys/kernel/sched_group_identity_enabled") == "1"
    assert _read(anolis, "proc", "sys/kernel/sched_idle_saver_wmark") == "1000"
    assert _read(anolis, "sys", "kernel/mm/pagecache_limit/enabled") == "1"


def test_sched_features_flags_are_switched_one_at_a_time_and_put_back(tmp_path: Path) -> None:
    dirs = _tree(tmp_path)
    executor = _executor(dirs)
    plan, done = _run(executor, {"schedFeatures": {"NEXT_BUDDY": True, "HRTICK": False, "NO_SUCH": True}})
    # NEXT_BUDDY off → on: one write; HRTICK is off already; NO_SUCH is not on this kernel
    assert [(a.name, a.value) for a in plan.system] == [("sched_features", "NEXT_BUDDY")]
    assert done.system_written == 1 and "sched_features: NO_SUCH not on this kernel" in plan.report.skipped
    # a regular file keeps only the last write (the kernel's file keeps every flag and shows them all)
    assert _read(dirs, "sys", "kernel/debug/sched_features") == "NEXT_BUDDY"
    assert executor.originals.keys() == {"sched_features:NEXT_BUDDY"}
    _, off = _run(executor, None)
    assert off.system_written == 1 and executor.originals.keys() == frozenset()
    assert _read(dirs, "sys", "kernel/debug/sched_features") == "NO_NEXT_BUDDY"
    fresh = _tree(tmp_path / "again")
    plan, _ = _run(_executor(fresh), {"schedFeatures": {"START_DEBIT": False}})
    assert [(a.name, a.value) for a in plan.system] == [("sched_features", "NO_START_DEBIT")]
    assert _read(fresh, "sys", "kernel/debug/sched_features") == "NO_START_DEBIT"


def test_the_executor_refuses_bad_values_and_paths(tmp_path: Path) -> None:
    executor = _executor(_tree(tmp_path))
    with pytest.raises(InvalidUpdateError):
        executor.write_system("watermark_scale_factor", "9")
    with pytest.raises(InvalidUpdateError):
        executor.write_system("min_free_kbytes", "1; reboot")
    with pytest.raises(InvalidUpdateError):
        executor.write_system("sched_features", "A/../B")
    with pytest.raises(UnsafePathError):
        executor.write_system("oom_score_adj", 100, pid=-1)
    (Path(tmp_path) / "proc/sys/vm/watermark_scale_factor").unlink()
    (Path(tmp_path) / "proc/sys/vm/watermark_scale_factor").symlink_to("/etc/hostname")
    with pytest.raises(UnsafePathError):
        executor.write_system("watermark_scale_factor", "150")
    assert executor.originals.keys() == frozenset()
