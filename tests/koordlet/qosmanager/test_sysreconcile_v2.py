"""SystemConfig on the real /proc/sys/vm files of the cgroup v2 guest (the VM stage of `make test`): the strategy
writes vm.min_free_kbytes and vm.watermark_scale_factor through the executor, and puts both back when the
strategy goes off. Never on the host (whose sysctls belong to the machine): the test runs only in the guest,
and restores the values it found whatever happens."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from koordlet.actuator import PlanRunner
from koordlet.api.nodeslo import parse_node_slo_spec
from koordlet.executor import ResourceExecutor
from koordlet.metriccache import MetricCache
from koordlet.qosmanager import sysreconcile
from koordlet.qosmanager.snapshot import SnapshotBuilder
from koordlet.statesinformer.api import NodeInfo, StaticStates
from koordlet.system.cgroup import CgroupFS
from koordlet.system.procfs import parse_meminfo
from tests.support.v2guest import in_v2_guest

pytestmark = pytest.mark.cgroupv2

VM = Path("/proc/sys/vm")
FILES = ("min_free_kbytes", "watermark_scale_factor")


@pytest.fixture
def real_vm() -> Iterator[dict[str, str]]:
    """The guest's vm sysctls as found; put back after the test whatever it did."""
    if not in_v2_guest():
        pytest.skip("writes the real /proc/sys/vm: only in the cgroup v2 guest (make v2-check)")
    found = {name: (VM / name).read_text().strip() for name in FILES}
    try:
        yield found
    finally:
        for name, value in found.items():
            if (VM / name).read_text().strip() != value:
                (VM / name).write_text(value)


def _tick(executor: ResourceExecutor, system_strategy: dict | None, memory: int):
    spec = parse_node_slo_spec({"systemStrategy": system_strategy} if system_strategy is not None else None)
    states = StaticStates(node=NodeInfo("guest", capacity={"cpu": 4000, "memory": memory}), node_slo=spec)
    config = sysreconcile.SystemConfig.from_node_slo(spec)
    plan = sysreconcile.decide(SnapshotBuilder(states, MetricCache(), reader=executor).build(config.needs), config)
    return PlanRunner(executor).run(plan, "systemconfig")


def test_v2_guest_real_vm_sysctls_are_written_and_put_back(real_vm: dict[str, str], tmp_path: Path) -> None:
    with open("/proc/meminfo", "rb") as file:
        memory = parse_meminfo(file.read()).mem_total_bytes
    executor = ResourceExecutor(CgroupFS("/sys/fs/cgroup"), proc_dir="/proc", sys_dir="/sys",
                                originals_file=str(tmp_path / "record.json"))
    # a factor whose min_free_kbytes differs from the guest's and lies within [10 MiB, 10 GiB]
    factor = next(f for f in range(30, 2000, 7)
                  if str(memory // 1024 * f // 10000) != real_vm["min_free_kbytes"]
                  and 10240 <= memory // 1024 * f // 10000 <= 10485760)
    wanted_min_free = str(memory // 1024 * factor // 10000)
    wanted_wsf = "150" if real_vm["watermark_scale_factor"] != "150" else "200"
    done = _tick(executor, {"minFreeKbytesFactor": factor, "watermarkScaleFactor": int(wanted_wsf)}, memory)
    assert done.system_errors == () and done.system_written == 2
    assert (VM / "min_free_kbytes").read_text().strip() == wanted_min_free
    assert (VM / "watermark_scale_factor").read_text().strip() == wanted_wsf
    assert {k: executor.originals.get(k) for k in FILES} == real_vm
    off = _tick(executor, None, memory)
    assert off.system_errors == () and off.system_written == 2
    assert {name: (VM / name).read_text().strip() for name in FILES} == real_vm
    assert executor.originals.keys() == frozenset()
