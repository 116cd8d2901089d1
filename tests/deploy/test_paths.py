"""Every file koordlet opens is reachable in its pod, in every layout it runs in.

A path koordlet opens (as the flags and the kernel roots in ``koordlet.system`` make it, inside the pod) must lie
under a volume mount of the host path it stands for; one koordlet writes must lie under a read-write mount. The one
path reachable without a mount is procfs: with ``hostPID`` the pod's ``/proc`` is the host's PID namespace. The pod's
own sysfs does not count: it lacks the host's submounts (cgroups, resctrl, debugfs).

KOORDLET_PATHS lists what koordlet opens, taken from its flags and from the relative paths ``koordlet.system``
spells (collectors, strategies, hooks, reporters, device plugin). LAYOUTS lists the DaemonSets koordlet runs in:
our chart's hostMode and non-hostMode, and Koordinator v1.8.0's own chart (its pod spec as recorded facts), whose
mounts leave some paths out for any koordlet: KNOWN_GAPS names them with the reason, and the test holds each layout
to exactly its list.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

import pytest

from hooks.gpu import hami_cache_root
from koordlet.config import KoordletConfig, parse_config
from koordlet.system import coldpage, rdma, resctrl, sysfs
from koordlet.system.roots import HostDirs
from koordlet.system.sysctl import SYSTEM_RESOURCES
from tests.deploy import koordinator_v1_8_0 as koordinator
from tests.deploy.tools import chart_documents

# Every gate whose files only a conditional mount brings (vendor dirs): on, so those mounts are checked too.
GATES = "TerwayQoS=true,HamiCoreVGPUMonitor=true,GPUEnvInject=true"


@dataclass(frozen=True, slots=True)
class Layout:
    """One DaemonSet pod koordlet runs in: its pod spec, koordlet's container, and the environment kubelet gives it."""

    pod: dict[str, Any]
    container: dict[str, Any]
    environ: dict[str, str]

    @property
    def config(self) -> KoordletConfig:
        return parse_config(self.container.get("args", []), environ=self.environ)


def chart_layout(host_mode: bool) -> Layout:
    docs = chart_documents("--set", f"koordlet.features={GATES.replace(',', chr(92) + ',')}",
                           "--set", f"koordlet.hostMode={str(host_mode).lower()}")
    [daemonset] = [d for d in docs if d["kind"] == "DaemonSet"]
    pod = daemonset["spec"]["template"]["spec"]
    [container] = pod["containers"]
    environ = {"NODE_NAME": "node-1"} | {e["name"]: e["value"] for e in container["env"] if "value" in e}
    return Layout(pod, container, environ)


def koordinator_layout() -> Layout:
    """Koordinator v1.8.0's koordlet DaemonSet with our image, the vendor gates added to its own."""
    pod = koordinator.DAEMONSET_POD["spec"]
    [container] = pod["containers"]
    args = [f"{a},{GATES}" if a.startswith("-feature-gates=") else a for a in container["args"]]
    return Layout(pod, dict(container, args=args), {"NODE_NAME": "node-1"})


LAYOUTS: dict[str, Callable[[], Layout]] = {
    "chart-hostMode": lambda: chart_layout(True),
    "chart-non-hostMode": lambda: chart_layout(False),
    "koordinator-v1.8.0": koordinator_layout,
}

_RO_SYS = "Koordinator's chart mounts the host's /sys read-only (/host-sys): its own koordlet cannot write it either"
# What a layout cannot reach, by KoordletPath.what, with why (docs/koordinator.md, "Running under Koordinator's chart").
KNOWN_GAPS: dict[str, dict[str, str]] = {
    "koordinator-v1.8.0": {
        "sysctl memcg_reap_background": _RO_SYS,
        "sysctl pagecache_limit_enabled": _RO_SYS,
        "sysctl sched_features": _RO_SYS,
        "sysctl kidled_scan_period_in_seconds": _RO_SYS,
        "sysctl kidled_use_hierarchy": _RO_SYS,
        "kidled": _RO_SYS,
        "page_idle": _RO_SYS,
        "device plugins": "/var/lib/kubelet is read-only there: koordlet leaves the GPU device plugin off and says so",
        "audit log": "no mount for it: the audit log stays in the container and goes with it",
        "Terway QoS": "no mount for Terway's dir: gate TerwayQoS needs our chart",
        "HAMi-core library": "no mount for /usr/local/vgpu/libvgpu.so: gate HamiCoreVGPUMonitor needs our chart",
    },
}


@dataclass(frozen=True, slots=True)
class KoordletPath:
    """One file or dir koordlet opens: what it is for, its host path, and the path koordlet uses in the pod."""

    what: str
    host: str
    inside: Callable[[KoordletConfig, HostDirs], str]
    writes: bool = False


def _dirs(config: KoordletConfig) -> HostDirs:
    """The kernel roots the agent (koordlet.agent.context.host_dirs) hands koordlet.system, from the same flags."""
    return HostDirs.from_flags(proc_root_dir=config.proc_root_dir, sys_root_dir=config.sys_root_dir,
                               sys_fs_root_dir=config.sys_fs_root_dir, cgroup_root_dir=config.cgroup_root_dir)


def _under(root: str, *parts: str) -> Callable[[KoordletConfig, HostDirs], str]:
    """``<the HostDirs root named root>/<parts>``."""
    return lambda _config, dirs: os.path.join(getattr(dirs, root), *parts)


def _kubelet(*parts: str) -> Callable[[KoordletConfig, HostDirs], str]:
    return lambda config, _dirs: os.path.join(config.var_lib_kubelet_dir, *parts)


def _sysctl_paths() -> list[KoordletPath]:
    """Every node-wide kernel file of SystemConfig, CoreSched, GroupIdentity, OOM score (koordlet/system/sysctl.py)."""
    out = []
    for resource in SYSTEM_RESOURCES.values():
        root = "proc_dir" if resource.fs == "proc" else "sys_dir"
        relative = resource.relative_path.format(pid=1)
        out.append(KoordletPath(f"sysctl {resource.name}", f"/{resource.fs}/{relative}",
                                (lambda r: lambda _c, d: os.path.join(getattr(d, r[0]), r[1]))((root, relative)),
                                writes=True))
    return out


KOORDLET_PATHS: tuple[KoordletPath, ...] = (
    # procfs: node and pod usage, PSI, the uplink, cold pages (koordlet/system/procfs.py, net.py, coldpage.py)
    KoordletPath("node CPU", "/proc/stat", _under("proc_dir", "stat")),
    KoordletPath("node memory", "/proc/meminfo", _under("proc_dir", "meminfo")),
    KoordletPath("PSI", "/proc/pressure/cpu", _under("proc_dir", "pressure", "cpu")),
    KoordletPath("a process's CPU", "/proc/1/stat", _under("proc_dir", "1", "stat")),
    KoordletPath("default route", "/proc/net/route", _under("proc_dir", "net", "route")),
    KoordletPath("page flags", "/proc/kpageflags", _under("proc_dir", coldpage.KPAGEFLAGS)),
    KoordletPath("page cgroups", "/proc/kpagecgroup", _under("proc_dir", coldpage.KPAGECGROUP)),
    *_sysctl_paths(),
    # sysfs: CPU and NUMA topology, huge pages, PCI, NICs, block devices, RDMA, kidled, page_idle
    KoordletPath("online CPUs", "/sys/devices/system/cpu/online", _under("sys_dir", sysfs.CPU_SYSFS, "online")),
    KoordletPath("CPU topology", "/sys/devices/system/cpu/cpu0/topology/core_id",
                 _under("sys_dir", sysfs.CPU_SYSFS, "cpu0", "topology", "core_id")),
    KoordletPath("NUMA node", "/sys/devices/system/node/node0/meminfo",
                 _under("sys_dir", sysfs.NODE_SYSFS, "node0", "meminfo")),
    KoordletPath("huge pages", "/sys/devices/system/node/node0/hugepages/hugepages-2048kB/nr_hugepages",
                 _under("sys_dir", sysfs.NODE_SYSFS, "node0", "hugepages", "hugepages-2048kB", "nr_hugepages")),
    KoordletPath("PCI NUMA node", "/sys/bus/pci/devices/0000:3b:00.0/numa_node",
                 _under("sys_dir", sysfs.PCI_DEVICES_SYSFS, "0000:3b:00.0", "numa_node")),
    KoordletPath("NIC speed", "/sys/class/net/eth0/speed", _under("sys_dir", "class", "net", "eth0", "speed")),
    KoordletPath("block devices", "/sys/class/block", _under("sys_dir", "class", "block")),
    KoordletPath("RDMA devices", "/sys/class/infiniband", _under("sys_dir", *rdma.INFINIBAND_CLASS)),
    KoordletPath("kidled", "/sys/kernel/mm/kidled/scan_period_in_seconds",
                 _under("sys_dir", *coldpage.KIDLED_DIR, coldpage.KIDLED_SCAN_PERIOD), writes=True),
    KoordletPath("page_idle", "/sys/kernel/mm/page_idle/bitmap",
                 _under("sys_dir", *coldpage.PAGE_IDLE_BITMAP), writes=True),
    # cgroups (v1 and v2 under the same mount dir) and resctrl, both written
    KoordletPath("cgroup v1", "/sys/fs/cgroup/cpu/kubepods/besteffort/cpu.cfs_quota_us",
                 _under("cgroup_mount_dir", "cpu", "kubepods", "besteffort", "cpu.cfs_quota_us"), writes=True),
    KoordletPath("cgroup v2", "/sys/fs/cgroup/kubepods.slice/cpu.max",
                 _under("cgroup_mount_dir", "kubepods.slice", "cpu.max"), writes=True),
    KoordletPath("resctrl schemata", "/sys/fs/resctrl/BE/schemata", _under("resctrl_dir", "BE", "schemata"),
                 writes=True),
    KoordletPath("resctrl monitoring", "/sys/fs/resctrl/info/L3_MON/mon_features",
                 _under("resctrl_dir", *resctrl.MON_FEATURES_FILE)),
    # device nodes: GPUs (NVML, the device plugin), RDMA
    KoordletPath("GPU", "/dev/nvidia0", _under("dev_dir", "nvidia0")),
    KoordletPath("RDMA CM", "/dev/infiniband/rdma_cm", _under("dev_dir", rdma.INFINIBAND_DEV_DIR, rdma.RDMA_CM)),
    # kubelet's state (statesinformer/cpumanager.py; the pod-resources client; the device plugin's registration)
    KoordletPath("CPU manager state", "/var/lib/kubelet/cpu_manager_state", _kubelet("cpu_manager_state")),
    KoordletPath("memory manager state", "/var/lib/kubelet/memory_manager_state", _kubelet("memory_manager_state")),
    KoordletPath("pod-resources", "/var/lib/kubelet/pod-resources/kubelet.sock",
                 _kubelet("pod-resources", "kubelet.sock")),
    KoordletPath("device plugins", "/var/lib/kubelet/device-plugins", lambda c, _d: c.device_plugin_dir, writes=True),
    # koordlet's own sockets and state, containerd's NRI socket
    KoordletPath("hook server", "/var/run/koordlet/koordlet.sock", lambda c, _d: c.runtime_hooks_addr, writes=True),
    KoordletPath("hook registration", "/etc/runtime/hookserver.d", lambda c, _d: c.runtime_hooks_config_path,
                 writes=True),
    KoordletPath("NRI socket", "/var/run/nri/nri.sock", lambda c, _d: c.nri_socket_path),
    KoordletPath("predictor checkpoints", "/var/run/koordlet/prediction-checkpoints",
                 lambda c, _d: c.prediction_checkpoint_filepath, writes=True),
    KoordletPath("sysctl originals", "/var/run/koordlet/system-config-originals.json",
                 lambda c, _d: c.system_config_record_file, writes=True),
    KoordletPath("pod-resources proxy", "/var/run/koordlet/pod-resources", lambda c, _d: c.pod_resources_proxy_path,
                 writes=True),
    KoordletPath("audit log", "/var/log/koordlet", lambda c, _d: c.audit_log_dir, writes=True),
    # vendor gates
    KoordletPath("Terway QoS", "/var/lib/terway/qos", lambda c, _d: c.terway_qos_dir, writes=True),
    KoordletPath("HAMi-core library", "/usr/local/vgpu/libvgpu.so", lambda c, _d: c.hami_core_library_directory_path),
    KoordletPath("HAMi-core containers", "/usr/local/vgpu/containers",
                 lambda c, _d: hami_cache_root(c.hami_core_library_directory_path), writes=True),
)


@dataclass(frozen=True, slots=True)
class _Mount:
    inside: PurePosixPath
    host: PurePosixPath
    read_only: bool


def _mounts(layout: Layout) -> list[_Mount]:
    host_of = {v["name"]: v["hostPath"]["path"] for v in layout.pod["volumes"] if "hostPath" in v}
    return [_Mount(PurePosixPath(m["mountPath"]), PurePosixPath(host_of[m["name"]]), bool(m.get("readOnly")))
            for m in layout.container["volumeMounts"] if m["name"] in host_of]


def unreachable(layout: Layout, paths: tuple[KoordletPath, ...] = KOORDLET_PATHS) -> list[str]:
    """What of ``paths`` koordlet could not open in ``layout``, each with the reason; [] when every one is there."""
    config = layout.config
    dirs = _dirs(config)
    mounts = _mounts(layout)
    problems = []
    for path in paths:
        inside = PurePosixPath(os.path.normpath(path.inside(config, dirs)))
        covering = [m for m in mounts if inside == m.inside or m.inside in inside.parents]
        if not covering:
            if inside.parts[:2] == ("/", "proc") and layout.pod.get("hostPID"):
                if PurePosixPath(path.host) != inside:
                    problems.append(f"{path.what}: {inside} is the host's {inside}, not {path.host}")
                continue
            problems.append(f"{path.what}: {inside} is under no volume mount")
            continue
        mount = max(covering, key=lambda m: len(m.inside.parts))  # the innermost mount is the one seen
        seen = mount.host / inside.relative_to(mount.inside)
        if seen != PurePosixPath(path.host):
            problems.append(f"{path.what}: {inside} is the host's {seen}, not {path.host}")
        elif path.writes and mount.read_only:
            problems.append(f"{path.what}: koordlet writes {inside}, but {mount.inside} is mounted read-only")
    return problems


@pytest.mark.parametrize("layout_name", sorted(LAYOUTS))
def test_every_path_koordlet_opens_lies_under_a_mount_of_its_host_path(layout_name: str) -> None:
    layout = LAYOUTS[layout_name]()
    assert layout.config.gate("TerwayQoS") and layout.config.gate("HamiCoreVGPUMonitor")
    problems = unreachable(layout)
    assert sorted(p.split(":")[0] for p in problems) == sorted(KNOWN_GAPS.get(layout_name, {})), problems


def test_the_check_finds_a_missing_mount_a_wrong_host_path_and_a_read_only_write() -> None:
    """The check itself: the hostMode layout with kubelet's dir dropped, the NRI dir pointed elsewhere and the
    audit log read-only is refused on exactly those paths."""
    layout = chart_layout(True)
    mounts = [dict(m) for m in layout.container["volumeMounts"] if m["name"] != "kubelet-lib"]
    for mount in mounts:
        if mount["name"] == "audit-log":
            mount["readOnly"] = True
    volumes = [dict(v, hostPath={"path": "/run/other-nri"}) if v["name"] == "nri" else v
               for v in layout.pod["volumes"]]
    broken = Layout(dict(layout.pod, volumes=volumes), dict(layout.container, volumeMounts=mounts), layout.environ)
    problems = unreachable(broken)
    assert [p.split(":")[0] for p in problems] == ["CPU manager state", "memory manager state", "pod-resources",
                                                   "NRI socket", "audit log"], problems
    assert "is the host's /run/other-nri/nri.sock, not /var/run/nri/nri.sock" in problems[3]
    assert "mounted read-only" in problems[4]


def test_without_host_pid_procfs_is_the_pods_own() -> None:
    layout = chart_layout(True)
    alone = Layout(dict(layout.pod, hostPID=False), layout.container, layout.environ)
    assert "node CPU: /proc/stat is under no volume mount" in unreachable(alone)
