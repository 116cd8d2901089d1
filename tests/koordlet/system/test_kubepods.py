"""kubelet cgroup paths for both drivers, the CRI cgroup parent, and the parse back from dir names."""

from __future__ import annotations

import pytest

from koordlet.api.qos import KubeQoS
from koordlet.system.cgroup import CgroupDriver
from koordlet.system.kubepods import (
    CgroupPathError,
    KubeCgroupLayout,
    container_id_from_dir_name,
    expand_systemd_slice,
    pod_cgroup_dir,
    pod_uid_from_dir_name,
)

UID = "1234-abcd-5678"
CID = "0123456789abcdef" * 4

CGROUPFS = KubeCgroupLayout(CgroupDriver.CGROUPFS)
SYSTEMD = KubeCgroupLayout(CgroupDriver.SYSTEMD)


@pytest.mark.parametrize(
    ("layout", "kube_qos", "pod_dir"),
    [
        (CGROUPFS, KubeQoS.GUARANTEED, f"kubepods/pod{UID}"),
        (CGROUPFS, KubeQoS.BURSTABLE, f"kubepods/burstable/pod{UID}"),
        (CGROUPFS, KubeQoS.BESTEFFORT, f"kubepods/besteffort/pod{UID}"),
        (SYSTEMD, KubeQoS.GUARANTEED, "kubepods.slice/kubepods-pod1234_abcd_5678.slice"),
        (
            SYSTEMD,
            KubeQoS.BURSTABLE,
            "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1234_abcd_5678.slice",
        ),
        (
            SYSTEMD,
            KubeQoS.BESTEFFORT,
            "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1234_abcd_5678.slice",
        ),
    ],
)
def test_pod_dirs_follow_kubelet_layout(layout: KubeCgroupLayout, kube_qos: KubeQoS, pod_dir: str) -> None:
    assert layout.pod_dir(UID, kube_qos) == pod_dir
    assert pod_uid_from_dir_name(pod_dir.rsplit("/", 1)[1]) == UID


def test_qos_dirs() -> None:
    assert CGROUPFS.qos_dir(KubeQoS.GUARANTEED) == "kubepods"
    assert CGROUPFS.qos_dir(KubeQoS.BESTEFFORT) == "kubepods/besteffort"
    assert SYSTEMD.qos_dir(KubeQoS.BURSTABLE) == "kubepods.slice/kubepods-burstable.slice"


def test_cgroup_root_prefix_is_prepended() -> None:
    layout = KubeCgroupLayout(CgroupDriver.CGROUPFS, cgroup_root="/koordlet-py/")
    assert layout.cgroup_root == "/koordlet-py"
    assert layout.kubepods_dir() == "koordlet-py/kubepods"
    assert layout.pod_dir(UID, KubeQoS.BESTEFFORT) == f"koordlet-py/kubepods/besteffort/pod{UID}"


@pytest.mark.parametrize(
    ("layout", "runtime", "name"),
    [
        (CGROUPFS, "containerd", CID),
        (CGROUPFS, "cri-o", f"crio-{CID}"),
        (CGROUPFS, "docker", CID),
        (SYSTEMD, "containerd", f"cri-containerd-{CID}.scope"),
        (SYSTEMD, "docker", f"docker-{CID}.scope"),
        (SYSTEMD, "crio", f"crio-{CID}.scope"),
    ],
)
def test_container_dirs_per_driver_and_runtime(layout: KubeCgroupLayout, runtime: str, name: str) -> None:
    pod_dir = layout.pod_dir(UID, KubeQoS.BURSTABLE)
    assert layout.container_dir(pod_dir, CID, runtime) == f"{pod_dir}/{name}"
    assert container_id_from_dir_name(name) == CID


def test_container_id_with_runtime_prefix() -> None:
    pod_dir = SYSTEMD.pod_dir(UID, KubeQoS.BESTEFFORT)
    assert SYSTEMD.container_dir(pod_dir, f"containerd://{CID}").endswith(f"/cri-containerd-{CID}.scope")


@pytest.mark.parametrize(
    ("parent", "pod_dir"),
    [
        (f"/kubepods/besteffort/pod{UID}", f"kubepods/besteffort/pod{UID}"),
        (f"/koordlet-py/kubepods/pod{UID}", f"koordlet-py/kubepods/pod{UID}"),
        (
            "kubepods-besteffort-pod1234_abcd.slice",
            "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1234_abcd.slice",
        ),
        (
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1234_abcd.slice",
            "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1234_abcd.slice",
        ),
    ],
)
def test_cri_cgroup_parent_maps_to_pod_dir(parent: str, pod_dir: str) -> None:
    assert CGROUPFS.dir_from_cgroup_parent(parent) == pod_dir


@pytest.mark.parametrize("parent", ["/kubepods/../../etc", "", "/", "/kubepods/./x", "a-.slice"])
def test_unsafe_cgroup_parents_are_refused(parent: str) -> None:
    with pytest.raises(CgroupPathError):
        CGROUPFS.dir_from_cgroup_parent(parent)


@pytest.mark.parametrize("bad", ["../x", "a/b", "..", "", "x\x00"])
def test_unsafe_uid_or_container_id_is_refused(bad: str) -> None:
    with pytest.raises(CgroupPathError):
        CGROUPFS.pod_dir(bad, KubeQoS.BURSTABLE)
    with pytest.raises(CgroupPathError):
        SYSTEMD.container_dir("kubepods.slice", bad)


def test_unsafe_cgroup_root_is_refused() -> None:
    with pytest.raises(CgroupPathError):
        KubeCgroupLayout(CgroupDriver.CGROUPFS, cgroup_root="/a/../..")


def test_expand_slice_root_and_names_that_are_not_pods() -> None:
    assert expand_systemd_slice("-.slice") == ""
    assert expand_systemd_slice("kubepods.slice") == "kubepods.slice"
    assert pod_uid_from_dir_name("burstable") is None
    assert container_id_from_dir_name("cgroup.procs") is None


def test_a_pods_dir_comes_from_its_cgroup_parent_else_its_uid_and_qos(caplog: pytest.LogCaptureFixture) -> None:
    """The one pod-dir helper every part asks: a request's cgroup parent first, then the pod's, then uid and QoS;
    None for a pod with neither, and for one whose parent is not a safe dir (warned about once, not every tick)."""
    from koordlet.api.pod import PodMeta

    with_parent = PodMeta("p", "ns", UID, cgroup_parent=f"/kubepods/burstable/pod{UID}")
    assert pod_cgroup_dir(CGROUPFS, with_parent) == f"kubepods/burstable/pod{UID}"
    assert pod_cgroup_dir(CGROUPFS, with_parent, f"/kubepods/pod{UID}") == f"kubepods/pod{UID}"
    assert pod_cgroup_dir(SYSTEMD, PodMeta("p", "ns", UID, kube_qos=KubeQoS.BESTEFFORT)) == (
        "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1234_abcd_5678.slice")
    assert pod_cgroup_dir(CGROUPFS, PodMeta("p", "ns", UID)) is None
    hostile = PodMeta("p", "ns", "uid-x", cgroup_parent="/kubepods/../../etc")
    with caplog.at_level("WARNING", logger="koordlet.system.kubepods"):
        assert [pod_cgroup_dir(CGROUPFS, hostile) for _ in range(3)] == [None, None, None]
    assert [r.getMessage() for r in caplog.records] == [
        "pod uid-x has no cgroup dir: unsafe cgroup parent component for a cgroup dir name: '..'"]
