"""BlkIOReconcile (docs/koordinator.md §4.8): decide(), the v1 → v2 file mapping, and the real thing.

decide() on hand-made snapshots, the v1 → v2 file mapping through the executor, and the real thing: a BE
pod reading a loop device on this host's cgroup v1, throttled to the configured rate, measured.
The v2 guest does the same on a disk attached to the VM (test_blkio_v2.py)."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from types import MappingProxyType

import pytest

from koordlet.actuator import PlanRunner
from koordlet.api.keys import ANNOTATION_BLKIO_QOS, LABEL_QOS_CLASS
from koordlet.api.nodeslo import parse_node_slo_spec
from koordlet.api.pod import ContainerMeta, PodMeta
from koordlet.api.qos import KubeQoS
from koordlet.executor import ResourceExecutor
from koordlet.executor.records import NodeRecords
from koordlet.metriccache import MetricCache
from koordlet.plan import LineKey, LineRestore, LineWrite
from koordlet.qosmanager import blkio
from koordlet.qosmanager.snapshot import SnapshotBuilder
from koordlet.statesinformer.api import NodeInfo, StaticStates
from koordlet.system.blockdev import BlockDevice, StorageInfo
from koordlet.system.cgroup import CgroupFS, CgroupVersion
from koordlet.system.kubepods import KubeCgroupLayout
from tests.koordlet.metricsadvisor.v1cgroups import V1TestCgroups, skip_unless_v1_writable
from tests.koordlet.qosmanager.factory import snapshot

MiB = 1 << 20
STORAGE = StorageInfo(MappingProxyType({
    "vda": BlockDevice("vda", "254:0", "vda"), "vda2": BlockDevice("vda2", "254:2", "vda"),
    "vdb": BlockDevice("vdb", "254:16", "vdb"), "loop7": BlockDevice("loop7", "7:7", "loop7"),
}))
BE_DIR = "kubepods/besteffort"
UID, CID = "0b1c2d3e-0000-4000-8000-00000000b10c", "d" * 64


def _spec(be: dict | None = None, root: dict | None = None):
    strategy: dict = {}
    if be is not None:
        strategy["beClass"] = {"blkioQOS": be}
    if root is not None:
        strategy["cgroupRoot"] = {"blkioQOS": root}
    return parse_node_slo_spec({"resourceQOSStrategy": strategy})


def _block(name: str, **io: int) -> dict:
    return {"name": name, "type": "device", "ioCfg": io}


def _pod(annotation: str | None) -> PodMeta:
    return PodMeta("job", "default", UID, labels={LABEL_QOS_CLASS: "BE"},
                   annotations={} if annotation is None else {ANNOTATION_BLKIO_QOS: annotation},
                   kube_qos=KubeQoS.BESTEFFORT, containers=(ContainerMeta("main", CID),), phase="Running")


def _writes(plan) -> list[tuple[str, str, str]]:
    return [(w.resource, w.cgroup_dir, w.value) for w in plan.lines if isinstance(w, LineWrite)]


def _restores(plan) -> list[tuple[str, str, str]]:
    return [(r.resource, r.cgroup_dir, r.device) for r in plan.lines if isinstance(r, LineRestore)]


def _decide(spec, **fields):
    values = {"node_slo": spec, "storage": STORAGE, "kernel_files": frozenset({blkio.IO_WEIGHT})}
    values.update(fields)
    return blkio.decide(snapshot(**values), blkio.BlkIOConfig.from_node_slo(spec))


def test_be_class_blocks_become_the_five_per_device_files_of_the_besteffort_dir() -> None:
    plan = _decide(_spec({"enable": True, "blocks": [_block("/dev/vdb", readBPS=MiB, writeIOPS=100)]}))
    assert _writes(plan) == [
        ("blkio.throttle.read_iops_device", BE_DIR, "254:16 0"),
        ("blkio.throttle.read_bps_device", BE_DIR, f"254:16 {MiB}"),
        ("blkio.throttle.write_iops_device", BE_DIR, "254:16 100"),
        ("blkio.throttle.write_bps_device", BE_DIR, "254:16 0"),
        ("blkio.cost.weight", BE_DIR, "254:16 100"),
    ]
    assert plan.lines[1].reason == f"beClass blkioQOS: block /dev/vdb (254:16) read_bps_device = {MiB}"
    assert plan.report.configured[0] == (BE_DIR, ("254:16",))


def test_a_partition_throttles_its_disk_and_no_weight_without_blk_iocost() -> None:
    plan = _decide(_spec({"enable": True, "blocks": [_block("/dev/vda2", readBPS=5)]}), kernel_files=frozenset())
    assert [w for w in _writes(plan) if "weight" in w[0]] == []
    assert ("blkio.throttle.read_bps_device", BE_DIR, "254:0 5") in _writes(plan)


def test_lines_koordlet_wrote_that_no_block_names_any_more_are_put_back_and_no_other_line_is_touched() -> None:
    """7:7 was koordlet's (recorded), 8:0 an operator's (listed in the files, never written by koordlet)."""
    current = {("blkio.throttle.read_bps_device", BE_DIR): f"7:7 5000\n8:0 700\n254:16 {MiB}",
               ("blkio.cost.weight", BE_DIR): "default 100\n7:7 50\n8:0 20"}
    recorded = frozenset(LineKey(name, BE_DIR, "7:7") for name in blkio.THROTTLE_FILES)
    plan = _decide(_spec({"enable": True, "blocks": [_block("/dev/vdb", readBPS=MiB)]}), cgroup_values=current,
                   lines_recorded=recorded)
    assert _restores(plan) == sorted((name, BE_DIR, "7:7") for name in blkio.THROTTLE_FILES)
    assert not [w for w in _writes(plan) if not w[2].startswith("254:16")]
    assert (blkio.READ_BPS, BE_DIR, f"254:16 {MiB}") not in _writes(plan)  # holds already: not written again
    # the class switched off: what koordlet wrote goes back, the operator's 8:0 stays
    recorded |= {LineKey(blkio.READ_BPS, BE_DIR, "254:16")}
    off = _decide(_spec({"enable": False, "blocks": [_block("/dev/vdb", readBPS=MiB)]}), cgroup_values=current,
                  lines_recorded=recorded)
    assert _writes(off) == [] and {device for _, _, device in _restores(off)} == {"7:7", "254:16"}


def test_a_block_that_does_not_resolve_leaves_its_target_unchanged() -> None:
    current = {("blkio.throttle.read_bps_device", BE_DIR): f"254:16 {MiB}"}
    for block in (_block("/dev/sdz", readBPS=1), {"name": "vg0", "type": "volumegroup", "ioCfg": {}},
                  {"name": "data", "type": "podvolume", "ioCfg": {}}):
        plan = _decide(_spec({"enable": True, "blocks": [_block("/dev/vdb", readBPS=1), block]}),
                       cgroup_values=current, lines_recorded=frozenset({LineKey(blkio.READ_BPS, BE_DIR, "254:16")}))
        assert plan.lines == () and "left unchanged" in plan.report.problems[0]


def test_an_annotated_pod_gets_its_own_limits_and_on_v1_its_containers_too() -> None:
    annotation = json.dumps({"blocks": [_block("/dev/loop7", readBPS=2 * MiB)]})
    pod_dir = f"{BE_DIR}/pod{UID}"
    v1 = _writes(_decide(_spec(), pods=(_pod(annotation),)))
    assert (blkio.READ_BPS, pod_dir, f"7:7 {2 * MiB}") in v1
    assert (blkio.READ_BPS, f"{pod_dir}/{CID}", f"7:7 {2 * MiB}") in v1  # v1 blk-throttle is flat
    v2 = _writes(_decide(_spec(), pods=(_pod(annotation),), cgroup_v2=True))
    assert (blkio.READ_BPS, pod_dir, f"7:7 {2 * MiB}") in v2
    assert not [w for w in v2 if w[1].endswith(CID)]
    bad = _decide(_spec(), pods=(_pod("{not json"),))
    assert _writes(bad) == [] and "koordinator.sh/blkioQOS" in bad.report.problems[0]
    assert _writes(_decide(_spec(), pods=(_pod(None),))) == []  # no annotation: the pod is not blkio's


def test_the_root_gets_blk_iocost_qos_and_model_where_the_kernel_has_them() -> None:
    root = {"enable": True, "blocks": [_block("/dev/vdb", readLatency=2000, writeLatencyPercent=90),
                                       _block("/dev/loop7", enableUserModel=True, modelReadBPS=100,
                                              modelWriteRandIOPS=5)]}
    operator = "7:0 enable=1 ctrl=user rpct=90.00 rlat=5000 wpct=90.00 wlat=5000 min=1.00 max=10000.00"
    with_iocost = _decide(_spec(root=root), cgroup_values={("blkio.cost.qos", ""): operator},
                          lines_recorded=frozenset({LineKey("blkio.cost.qos", "", "1:2")}))
    assert [w for w in _writes(with_iocost) if w[1] == ""] == [
        ("blkio.cost.qos", "", "254:16 enable=1 ctrl=user rpct=95 rlat=2000 wpct=90 wlat=3000"),
        ("blkio.cost.model", "", "254:16 ctrl=auto"),
        ("blkio.cost.qos", "", "7:7 enable=1 ctrl=user rpct=95 rlat=3000 wpct=95 wlat=3000"),
        ("blkio.cost.model", "", "7:7 ctrl=user rbps=100 rseqiops=0 rrandiops=0 wbps=0 wseqiops=0 wrandiops=5"),
    ]  # the operator's 7:0 line is not koordlet's: left alone
    assert _restores(with_iocost) == [("blkio.cost.qos", "", "1:2")]  # koordlet's, no block names it any more
    without = _decide(_spec(root=root))
    assert [w for w in _writes(without) if w[1] == ""] == [] and "no blk-iocost" in without.report.problems[0]


def test_a_root_line_the_kernel_already_holds_is_not_written_again() -> None:
    """The kernel prints every key, with two decimals: what a write named is compared as numbers."""
    root = {"enable": True, "blocks": [_block("/dev/vdb", readLatency=2000)]}
    current = {("blkio.cost.qos", ""): "254:16 enable=1 ctrl=user rpct=95.00 rlat=2000 wpct=95.00 wlat=3000 "
                                       "min=1.00 max=10000.00",
               ("blkio.cost.model", ""): "254:16 ctrl=auto model=linear rbps=1 rseqiops=2 rrandiops=3 wbps=4 "
                                         "wseqiops=5 wrandiops=6"}
    assert _writes(_decide(_spec(root=root), cgroup_values=current)) == []
    changed = {**current, ("blkio.cost.qos", ""): current[("blkio.cost.qos", "")].replace("rlat=2000", "rlat=9")}
    assert _writes(_decide(_spec(root=root), cgroup_values=changed)) == [
        ("blkio.cost.qos", "", "254:16 enable=1 ctrl=user rpct=95 rlat=2000 wpct=95 wlat=3000")]


def test_the_runner_writes_the_v2_files_and_records_each_line_as_it_was(tmp_path: Path) -> None:
    """The v1 names of the plan land in io.max (one key per write) and io.weight on cgroup v2; each device line's
    value before koordlet's first write is recorded, and putting it back writes that value."""
    be = tmp_path / BE_DIR
    be.mkdir(parents=True)
    (be / "io.max").write_text("254:16 rbps=max wbps=max riops=77 wiops=max\n")
    (be / "io.weight").write_text("default 100\n")
    executor = ResourceExecutor(CgroupFS(str(tmp_path), CgroupVersion.V2))
    seen: list[str] = []
    # (a plain file keeps only the last write; the kernel's io.max keeps the other keys of the line)
    for resource, value in ((blkio.READ_IOPS, "254:16 0"), (blkio.READ_BPS, f"254:16 {MiB}"),
                            (blkio.IO_WEIGHT, "254:16 40")):
        record = PlanRunner(executor).run(blkio.Plan(lines=(LineWrite(resource, BE_DIR, value),)), "t")
        assert record.lines_written == 1
        seen.append((be / ("io.weight" if "weight" in resource else "io.max")).read_text())
    assert seen == ["254:16 riops=max", f"254:16 rbps={MiB}", "254:16 40"]
    assert executor.records.device_lines.items() == {
        f"{blkio.READ_IOPS}@254:16@{BE_DIR}": "254:16 77", f"{blkio.READ_BPS}@254:16@{BE_DIR}": "",
        f"{blkio.IO_WEIGHT}@254:16@{BE_DIR}": ""}
    record = PlanRunner(executor).run(blkio.Plan(lines=(LineRestore(blkio.READ_IOPS, BE_DIR, "254:16"),)), "t")
    assert (record.lines_written, (be / "io.max").read_text()) == (1, "254:16 riops=77")
    again = PlanRunner(executor).run(blkio.Plan(lines=(LineRestore(blkio.READ_IOPS, BE_DIR, "254:16"),)), "t")
    assert again.lines_written == 0  # forgotten once put back: nothing of koordlet's left there


# ---------------------------------------------------------------------------------- real kernel (v1)


@pytest.fixture
def loop_device(tmp_path: Path) -> Iterator[str]:
    """A 64 MiB loop device over a file in ``tmp_path``, detached after the test."""
    if os.geteuid() != 0 or not Path("/dev/loop-control").exists():
        pytest.skip("needs root and /dev/loop-control for a loop device")
    image = tmp_path / "disk.img"
    with open(image, "wb") as file:
        file.truncate(64 * MiB)
    done = subprocess.run(["losetup", "-f", "--show", str(image)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot set up a loop device: {done.stderr.strip()}")
    device = done.stdout.strip()
    try:
        yield device
    finally:
        subprocess.run(["losetup", "-d", device], check=False)


def read_rate(procs_file: str, device: str, nbytes: int) -> float:
    """Bytes per second of a direct read of ``nbytes`` of ``device`` by a process that joins ``procs_file``'s
    cgroup before it starts reading."""
    count = nbytes // (256 << 10)
    started = time.monotonic()
    subprocess.run(["dd", f"if={device}", "of=/dev/null", "bs=256k", f"count={count}", "iflag=direct"],
                   check=True, capture_output=True,
                   preexec_fn=lambda: Path(procs_file).write_text(str(os.getpid())))  # noqa: PLW1509
    return nbytes / (time.monotonic() - started)


def _tick(executor: ResourceExecutor, layout: KubeCgroupLayout, spec, pods, sys_dir: str = "/sys") -> object:
    states = StaticStates(node=NodeInfo("node-1"), node_slo=spec, pods=pods)
    builder = SnapshotBuilder(states, MetricCache(), reader=executor, layout=layout, sys_dir=sys_dir)
    config = blkio.BlkIOConfig.from_node_slo(spec)
    plan = blkio.decide(builder.build(config.needs), config)
    record = PlanRunner(executor).run(plan, "blkio")
    assert all("weight" in error for error in record.line_errors), record.line_errors
    return plan


def _line(path: Path, number: str) -> str:
    return next((line for line in path.read_text().splitlines() if line.startswith(number + " ")), "")


def check_an_operators_cost_qos_line_survives(root: Path, new_executor, layout: KubeCgroupLayout, disk: str,
                                              number: str, sys_dir: str = "/sys") -> None:
    """An operator's own io.cost.qos line for ``disk``: koordlet with the gate on leaves it alone while the root's
    blkioQOS is off (the default) or names other disks; koordlet's own line for that disk is written once (not again
    while it holds) and the operator's comes back when the root is switched off, and again when koordlet starts with
    the gate off (the collector, from the record a restarted agent reads). ``new_executor()``: an agent's executor
    with the records in their files."""
    from koordlet.collector import CollectorConfig, NodeStateCollector

    qos = root / "io.cost.qos"
    qos.write_text(f"{number} enable=1 ctrl=user rpct=90 rlat=5000 wpct=90 wlat=5000")
    operators = _line(qos, number)
    assert "rlat=5000" in operators
    executor = new_executor()
    for spec in (_spec(), _spec(root={"enable": True, "blocks": [_block("/dev/no-such-disk")]})):
        for _ in range(3):
            assert _tick(executor, layout, spec, (), sys_dir).lines == ()
    assert _line(qos, number) == operators
    mine = _spec(root={"enable": True, "blocks": [_block(disk, readLatency=2000)]})
    assert "blkio.cost.qos" in {line.resource for line in _tick(executor, layout, mine, (), sys_dir).lines}
    assert "rlat=2000" in _line(qos, number)
    assert _tick(executor, layout, mine, (), sys_dir).lines == ()  # holds: not written again
    _tick(executor, layout, _spec(root={"enable": False}), (), sys_dir)
    assert _line(qos, number) == operators
    _tick(executor, layout, mine, (), sys_dir)
    assert "rlat=2000" in _line(qos, number)
    restarted = new_executor()  # koordlet starts again, gate BlkIOReconcile off
    states = StaticStates(node=NodeInfo("node-1"))
    collector = NodeStateCollector(CollectorConfig(blkio=False, system_config=True), states, restarted)
    assert collector.collect_once() == 1
    assert _line(qos, number) == operators
    assert restarted.records.device_lines.keys() == frozenset()


def test_an_operators_io_cost_qos_line_survives_koordlet_gate_on_and_off_on_a_fixture_tree(tmp_path: Path) -> None:
    root = tmp_path / "cgroup"
    root.mkdir()
    (root / "io.cost.model").write_text("254:16 ctrl=auto model=linear rbps=1 rseqiops=2 rrandiops=3 wbps=4 "
                                        "wseqiops=5 wrandiops=6\n")
    (tmp_path / "sys/class/block/vdb").mkdir(parents=True)
    (tmp_path / "sys/class/block/vdb/dev").write_text("254:16\n")
    record = str(tmp_path / "run" / "system-config-originals.json")

    def new_executor() -> ResourceExecutor:
        return ResourceExecutor(CgroupFS(str(root), CgroupVersion.V2), records=NodeRecords.beside(record))

    check_an_operators_cost_qos_line_survives(root, new_executor, KubeCgroupLayout(cgroup_root="/none"), "/dev/vdb",
                                              "254:16", str(tmp_path / "sys"))


@pytest.mark.cgroupv1
def test_v1_a_be_pod_reading_a_loop_device_is_throttled_to_the_configured_rate(loop_device: str) -> None:
    skip_unless_v1_writable(("blkio",))
    cgroups = V1TestCgroups("blkio", ("blkio",))
    pod_dir = f"kubepods/besteffort/pod{UID}"
    try:
        cgroups.make(f"{pod_dir}/{CID}")
        layout = KubeCgroupLayout(cgroup_root="/" + cgroups.prefix)
        executor = ResourceExecutor(CgroupFS("/sys/fs/cgroup"))
        container_procs = os.path.join(cgroups.path("blkio", f"{pod_dir}/{CID}"), "cgroup.procs")
        be_procs = os.path.join(cgroups.path("blkio", "kubepods/besteffort"), "cgroup.procs")
        free = read_rate(container_procs, loop_device, 8 * MiB)
        spec = _spec({"enable": True, "blocks": [_block(loop_device, readBPS=MiB)]})
        annotation = json.dumps({"blocks": [_block(loop_device, readBPS=2 * MiB)]})
        _tick(executor, layout, spec, (_pod(annotation),))
        number = (Path("/sys/class/block") / Path(loop_device).name / "dev").read_text().strip()
        assert Path(cgroups.path("blkio", f"{pod_dir}/{CID}"), blkio.READ_BPS).read_text().strip() == \
            f"{number} {2 * MiB}"
        pod_rate = read_rate(container_procs, loop_device, 4 * MiB)  # ~2 s at 2 MiB/s
        class_rate = read_rate(be_procs, loop_device, 2 * MiB)  # ~2 s at 1 MiB/s (its own processes only)
        print(f"\nblkio v1 {loop_device}: unthrottled {free / MiB:.1f} MiB/s; pod annotation 2 MiB/s → "
              f"{pod_rate / MiB:.2f} MiB/s; beClass 1 MiB/s → {class_rate / MiB:.2f} MiB/s")
        assert 0.8 * 2 * MiB <= pod_rate <= 1.15 * 2 * MiB
        assert 0.8 * MiB <= class_rate <= 1.15 * MiB
        assert free > 5 * 2 * MiB
        # switched off: the limits go, the pod reads at full speed again
        _tick(executor, layout, _spec({"enable": False}), (_pod(""),))
        assert Path(cgroups.path("blkio", f"{pod_dir}/{CID}"), blkio.READ_BPS).read_text().strip() == ""
        assert read_rate(container_procs, loop_device, 8 * MiB) > 5 * 2 * MiB
    finally:
        cgroups.cleanup()
