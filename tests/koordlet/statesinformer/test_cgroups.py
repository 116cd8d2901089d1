"""Where the collectors look: pod dirs and NodeSLO host applications' cgroupPath, for both drivers."""

from __future__ import annotations

import pytest

from koordlet.api.nodeslo import NodeSLOError, parse_node_slo_spec
from koordlet.metricsadvisor.pods import HostAppCgroup
from koordlet.statesinformer.cgroups import host_app_cgroups
from koordlet.system.cgroup import CgroupDriver
from koordlet.system.kubepods import KubeCgroupLayout


def _apps(*paths: dict) -> list[dict]:
    return [{"name": f"app{i}", "qos": "LS", "cgroupPath": path} for i, path in enumerate(paths)]


@pytest.mark.parametrize(("driver", "root", "expected"), [
    (CgroupDriver.CGROUPFS, "/", ["host-latency-sensitive/nginx", "kubepods/agents/sidecar",
                                  "kubepods/burstable/agents", "kubepods/besteffort/batch/sweeper"]),
    (CgroupDriver.SYSTEMD, "/", ["host-latency-sensitive/nginx", "kubepods.slice/agents/sidecar",
                                 "kubepods.slice/kubepods-burstable.slice/agents",
                                 "kubepods.slice/kubepods-besteffort.slice/batch/sweeper"]),
    (CgroupDriver.CGROUPFS, "/custom-root", ["host-latency-sensitive/nginx", "custom-root/kubepods/agents/sidecar",
                                             "custom-root/kubepods/burstable/agents",
                                             "custom-root/kubepods/besteffort/batch/sweeper"]),
])
def test_host_application_cgroup_path_per_base_and_driver(driver: CgroupDriver, root: str,
                                                           expected: list[str]) -> None:
    spec = parse_node_slo_spec({"hostApplications": _apps(
        {"base": "CgroupRoot", "parentDir": "host-latency-sensitive", "relativePath": "nginx"},
        {"base": "Kubepods", "parentDir": "agents", "relativePath": "sidecar"},
        {"base": "KubepodsBurstable", "relativePath": "/agents/"},
        {"base": "KubepodsBesteffort", "parentDir": "batch", "relativePath": "sweeper"},
    ) + [{"name": "no-path", "qos": "LS"}, {"name": "empty", "cgroupPath": {"base": "CgroupRoot"}}]})
    got = host_app_cgroups(spec, KubeCgroupLayout(driver, root))
    assert got == [HostAppCgroup(f"app{i}", rel) for i, rel in enumerate(expected)]


@pytest.mark.parametrize("bad", ["../etc", "host/../../etc", "a\x00b"])
def test_a_path_that_climbs_out_is_refused_with_the_field_named(bad: str) -> None:
    with pytest.raises(NodeSLOError, match="cgroupPath: relativePath: must be a plain relative path"):
        parse_node_slo_spec({"hostApplications": _apps({"relativePath": bad})})
