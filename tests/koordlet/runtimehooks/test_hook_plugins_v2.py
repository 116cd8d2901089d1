"""Every hook plugin's values on the real cgroup v2 kernel, through koord-runtime-proxy and through NRI (the VM stage;
each test runs once per front door).

A koordlet with every plugin on serves the guest session's containerd (tests/support/v2stack.py): through the
session's proxy, whose hook server registration it takes over for this module (and gives back), or as that
containerd's NRI plugin (pods straight on containerd's CRI). Its states come from a states informer, as in the agent
(node annotations, the NodeSLO, the pods, each container's threads), and its reconciler runs every second. Two pods:

- ``job``, BestEffort with batch resources: batchresource's values (normalized by the node's ratio, as Koordinator's
  CPU normalization does a batch-cpu limit) and CoreSched's ``cpu.idle=1`` on its pod dir;
- ``trainer``, an LS pod the scheduler gave a HAMi-core GPU share and an RDMA PF: CPU normalization's quota, the GPU
  env, HAMi-core's mounts and usage region, the RDMA device nodes (opened in the container: on v2 runc's eBPF device
  program lets through what the plugin added, and still refuses a node it did not), the OOM score annotation the
  reconciler gives every process of the container's dir (the sandbox's pause keeps the runtime's). Through the proxy
  it is also annotated for its own resctrl group, whose ``schemata`` the reconciler writes and into whose ``tasks``
  it moves the container's process from its v2 ``cgroup.procs`` (a fixture tree, whose groups get the kernel's files
  from a thread of the test as the kernel's mkdir would give them: the guest has no resctrl; through NRI runc would
  refuse the container an RDT class the kernel does not have, docs/testing.md).

Group identity (Anolis ``cpu.bvt_warp_ns``) has nothing to write on this stock kernel: no file, no answer. What
``koordlet explain`` shows for the trainer comes from the v2 files, by their v2 names.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from koordlet.api.device import ANNOTATION_DEVICE_ALLOCATED, LABEL_GPU_ISOLATION_PROVIDER
from koordlet.api.keys import (
    ANNOTATION_EXTENDED_RESOURCE_SPEC,
    ANNOTATION_NODE_CPU_NORMALIZATION_RATIO,
    ANNOTATION_OOM_SCORE_ADJ,
    ANNOTATION_RESCTRL,
    LABEL_QOS_CLASS,
)
from koordlet.api.nodeslo import parse_node_slo_spec
from koordlet.api.pod import PodMeta
from koordlet.api.qos import KubeQoS
from koordlet.debug.endpoints import DebugEndpoints, DebugSources
from koordlet.executor import ResourceExecutor
from koordlet.history.actions import RecentActions
from koordlet.metrics import Request
from koordlet.runtimehooks import RuntimeHooks, RuntimeHooksConfig
from koordlet.runtimehooks.nri import NriConfig
from koordlet.runtimehooks.registration import write_registration
from koordlet.statesinformer.api import NodeInfo
from koordlet.statesinformer.cgroups import container_task_reader
from koordlet.statesinformer.informer import StatesInformer
from koordlet.system.cgroup import CgroupFS
from koordlet.system.resources import cpu_shares_to_weight
from tests.koordlet.system.rdma_tree import PF0, rdma_tree
from tests.support.cri import CriClient, container_config
from tests.support.resctrl import groups_get_the_kernels_files, resctrl_tree
from tests.support.v2stack import LAYOUT, NODE, V2Pod, V2Stack
from tests.support.waiting import wait_for
from wire import cri_pb2 as cri

pytestmark = [pytest.mark.cgroupv2, pytest.mark.containerd]

MiB = 1 << 20
GATES = {"BatchResource": True, "CPUNormalization": True, "CoreSched": True, "GroupIdentity": True,
         "GPUEnvInject": True, "HamiCoreVGPUMonitor": True, "RDMADeviceInject": True, "OOMScoreAdj": True,
         "Resctrl": True}
RATIO = {ANNOTATION_NODE_CPU_NORMALIZATION_RATIO: "1.25"}
CORE_SCHED_BE_IDLE = {"resourceQOSStrategy": {"policies": {"cpuPolicy": "coreSched"},
                                              "beClass": {"cpuQOS": {"enable": True, "schedIdle": 1}}}}
BATCH = {"containers": {"job": {"requests": {"kubernetes.io/batch-cpu": "500", "kubernetes.io/batch-memory": "64Mi"},
                                "limits": {"kubernetes.io/batch-cpu": "1500", "kubernetes.io/batch-memory": "96Mi"}}}}
GPU_SHARE = {"koordinator.sh/gpu-core": "30", "koordinator.sh/gpu-memory-ratio": "25",
             "koordinator.sh/gpu-memory": "4Gi"}
ALLOCATED = {"gpu": [{"minor": 0, "resources": GPU_SHARE}],
             "rdma": [{"minor": 0, "id": PF0, "resources": {"koordinator.sh/rdma": "100"}}]}
# Device numbers of the experimental range (240-254): no driver answers them, so a node the container may open
# fails with ENXIO, one the device program refuses with EPERM.
DEVICES = {"rdma_cm": (240, 0), "uverbs0": (240, 1)}
NOT_INJECTED = (240, 2)
OOM_SCORE_ADJ = 600
WAIT_S = 15.0  # a reconciler pass (1 s) and an emulated guest's slack


@dataclass(frozen=True)
class NodeFiles:
    """What the node has besides its cgroups: RDMA functions in a sysfs tree and their device nodes in the guest's
    /dev, HAMi-core's library, a resctrl tree."""

    sys_dir: str
    library: Path
    resctrl: Path


@pytest.fixture(scope="module")
def node_files(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeFiles]:
    base = Path("/dev/infiniband")
    if base.exists():
        pytest.skip("this node has /dev/infiniband: not touching a real RDMA node's devices")
    root = tmp_path_factory.mktemp("node")
    sys_dir, _ = rdma_tree(root, dev_nodes=False)
    library = root / "vgpu" / "libvgpu.so"
    library.parent.mkdir()
    library.write_text("HAMi-core stands in here\n")
    lock = Path("/tmp/vgpulock")
    made_lock = not lock.exists()
    base.mkdir()
    try:
        for name, (major, minor) in DEVICES.items():
            os.mknod(base / name, 0o20666, os.makedev(major, minor))
        lock.mkdir(exist_ok=True)
        resctrl = resctrl_tree(root / "resctrl")
        with groups_get_the_kernels_files(resctrl):
            yield NodeFiles(sys_dir, library, resctrl)
    finally:
        shutil.rmtree(base)
        if made_lock:
            shutil.rmtree(lock, ignore_errors=True)


class _Pods:
    """The pod list kubelet would give the states informer."""

    name = "test"

    def __init__(self) -> None:
        self.pods: tuple[PodMeta, ...] = ()

    def list_pods(self) -> tuple[PodMeta, ...]:
        return self.pods


@dataclass
class Koordlet:
    door: str  # "proxy" or "nri"
    stack: V2Stack
    hooks: RuntimeHooks
    states: StatesInformer
    files: NodeFiles
    job: V2Pod
    trainer: V2Pod

    def debug(self, pod: V2Pod) -> dict:
        """``koordlet explain``'s answer for ``pod`` (``/debug/pods/<namespace>/<name>``)."""
        sources = DebugSources(NODE, self.states, ResourceExecutor(CgroupFS.detect()), LAYOUT, RecentActions(),
                               self.hooks)
        reply = DebugEndpoints(lambda: sources).pod(Request(f"/debug/pods/default/{pod.name}", {}, {}, "test"))
        assert reply.status == 200, reply.body
        return json.loads(reply.body)

    @property
    def region(self) -> Path:
        """HAMi-core's usage region of the trainer's container, where the host's vGPU monitor reads it: the container
        writes what it sees there."""
        name = f"{self.trainer.uid}_main"
        return self.files.library.parent / "containers" / name / f"{name}.cache"


def _proxy_log_names(stack: V2Stack, endpoint: str) -> bool:
    """The proxy's last word on its hook servers names ``endpoint`` (it re-reads its registrations dir on every
    change and logs the servers it then calls)."""
    lines = [line for line in stack.proxy.log().splitlines() if "hook servers:" in line]
    return bool(lines) and lines[-1].endswith(f"-> {endpoint}")


def _hooks(door: str, stack: V2Stack, files: NodeFiles, states: StatesInformer, state_dir: Path) -> RuntimeHooks:
    proxy = door == "proxy"
    config = RuntimeHooksConfig(
        socket_path=str(state_dir / "koordlet.sock"), host_endpoint=str(state_dir / "koordlet.sock"),
        config_dir=stack.hooks.config.config_dir if proxy else str(state_dir / "hooks.d"),
        reconcile_interval_s=1.0, feature_gates=GATES, resctrl_dir=str(files.resctrl), sys_dir=files.sys_dir,
        dev_dir="/dev", hami_core_library=str(files.library), serve_hooks=proxy,
        nri=None if proxy else NriConfig(socket_path=stack.nri_socket or "", socket_poll_s=0.2))
    executor = ResourceExecutor(CgroupFS.detect(), resctrl_root=str(files.resctrl), proc_dir="/proc")
    return RuntimeHooks(config, states, executor, LAYOUT, task_ids=states.container_task_ids)


def _trainer_script(library: Path) -> list[str]:
    """What the trainer's container does: write what it sees (each device node and what opening it gives, a node it
    makes itself and opens, HAMi-core's env, library and lock dir) to its usage region, then wait."""
    devices = " ".join(f"/dev/infiniband/{name}" for name in DEVICES)
    script = (
        'out="$CUDA_DEVICE_MEMORY_SHARED_CACHE"; : > "$out"\n'
        f'for d in {devices}; do echo "$d $(stat -c \'%F %t:%T\' $d) $(head -c1 $d 2>&1 >/dev/null)" >> "$out"; done\n'
        f'mknod /dev/not-injected c {NOT_INJECTED[0]} {NOT_INJECTED[1]}\n'
        'echo "/dev/not-injected $(head -c1 /dev/not-injected 2>&1 >/dev/null)" >> "$out"\n'
        'echo "env $CUDA_DEVICE_MEMORY_LIMIT $CUDA_DEVICE_SM_LIMIT $NVIDIA_VISIBLE_DEVICES" >> "$out"\n'
        f'cat {library} >> "$out"\n'
        'test -d /tmp/vgpulock && echo "lock dir" >> "$out"\n'
        'echo done >> "$out"\n'
        'exec sleep 3600\n')
    return ["sh", "-c", script]


@pytest.fixture(scope="module", params=["proxy", "nri"])
def koordlet(request: pytest.FixtureRequest, v2_stack: V2Stack, node_files: NodeFiles,
             tmp_path_factory: pytest.TempPathFactory) -> Iterator[Koordlet]:
    door = request.param
    source = _Pods()
    states = StatesInformer(source, task_reader=container_task_reader(LAYOUT, CgroupFS.detect()))
    cpu_milli = (os.cpu_count() or 1) * 1000
    states.set_node(NodeInfo(NODE, annotations=RATIO, capacity={"cpu": cpu_milli, "memory": 4096 * MiB},
                             allocatable={"cpu": cpu_milli, "memory": 4096 * MiB}))
    states.set_node_slo(parse_node_slo_spec(CORE_SCHED_BE_IDLE))
    states.sync_pods()
    hooks = _hooks(door, v2_stack, node_files, states, tmp_path_factory.mktemp(f"koordlet-{door}"))
    session = v2_stack.hooks.config
    pods = v2_stack.pods(direct=door == "nri")
    hooks.start()
    try:
        if door == "proxy":  # the session's proxy now calls this koordlet
            assert wait_for(lambda: _proxy_log_names(v2_stack, hooks.config.host_endpoint), 10.0)
        else:
            assert hooks.nri is not None and hooks.nri.registered.wait(30), "not registered with containerd's NRI"
        job = v2_stack.start_pod(pods, "job", KubeQoS.BESTEFFORT, {LABEL_QOS_CLASS: "BE"},
                                 {ANNOTATION_EXTENDED_RESOURCE_SPEC: json.dumps(BATCH)}, container_config("job"),
                                 requests={"kubernetes.io/batch-cpu": 500, "kubernetes.io/batch-memory": 64 * MiB},
                                 limits={"kubernetes.io/batch-cpu": 1500, "kubernetes.io/batch-memory": 96 * MiB})
        annotations = {ANNOTATION_DEVICE_ALLOCATED: json.dumps(ALLOCATED), ANNOTATION_OOM_SCORE_ADJ: str(OOM_SCORE_ADJ)}
        if door == "proxy":
            annotations[ANNOTATION_RESCTRL] = json.dumps({"llc": {"schemata": {"range": [0, 50]}}})
        resources = cri.LinuxContainerResources(cpu_period=100000, cpu_quota=200000, cpu_shares=1024,
                                                memory_limit_in_bytes=256 * MiB, oom_score_adj=100)
        trainer = v2_stack.start_pod(pods, "trainer", KubeQoS.BURSTABLE,
                                     {LABEL_QOS_CLASS: "LS", LABEL_GPU_ISOLATION_PROVIDER: "HAMi-core"}, annotations,
                                     container_config("main", command=_trainer_script(node_files.library),
                                                      resources=resources),
                                     requests={"cpu": 1000, "memory": 128 * MiB},
                                     limits={"cpu": 2000, "memory": 256 * MiB})
        source.pods = (job.meta, trainer.meta)
        states.sync_pods()  # kubelet lists them
        running = Koordlet(door, v2_stack, hooks, states, node_files, job, trainer)
        assert wait_for(lambda: "done" in _lines(running.region), 30.0), _lines(running.region)
        yield running
    finally:
        pods.client = CriClient(v2_stack.containerd_socket)  # removed without the hooks on the way
        pods.cleanup()
        pods.client.close()
        hooks.stop()
        if door == "proxy":  # the session's koordlet registered again
            write_registration(session.config_dir, session.host_endpoint, session.failure_policy,
                               v2_stack.hooks.stages())
            assert wait_for(lambda: _proxy_log_names(v2_stack, session.host_endpoint), 10.0)


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def test_v2_batch_resources_and_cpu_normalization_land_in_cpu_weight_and_cpu_max(koordlet: Koordlet) -> None:
    job, trainer = koordlet.job, koordlet.trainer
    # BE: shares 512 as weight, the batch-cpu limit's 1.5 cores normalized by the ratio 1.25, the batch memory.
    assert job.read("cpu.weight") == str(cpu_shares_to_weight(512))
    assert job.read("cpu.max") == "120000 100000"
    assert job.read("memory.max") == str(96 * MiB)
    assert wait_for(lambda: job.read("cpu.max", container=False) == "120000 100000", WAIT_S)
    assert job.read("memory.max", container=False) == str(96 * MiB)
    # LS: kubelet's 2 cores normalized, kubelet's weight and memory limit untouched.
    assert trainer.read("cpu.max") == "160000 100000"
    assert trainer.read("cpu.weight") == str(cpu_shares_to_weight(1024))
    assert trainer.read("memory.max") == str(256 * MiB)


def test_v2_core_sched_makes_the_be_pod_dir_a_sched_idle_group_and_not_the_ls_ones(koordlet: Koordlet) -> None:
    job, trainer = koordlet.job, koordlet.trainer
    assert wait_for(lambda: job.read("cpu.idle", container=False) == "1", WAIT_S)
    assert wait_for(lambda: trainer.read("cpu.idle", container=False) == "0", WAIT_S)
    assert job.read("cpu.idle") == "0"  # the container inside the idle pod is not an idle group of its own
    assert job.read("cpu.weight") == str(cpu_shares_to_weight(512))


def test_v2_group_identity_has_nothing_to_write_on_a_stock_kernel(koordlet: Koordlet) -> None:
    assert not koordlet.hooks.node_context().group_identity_supported
    assert not (koordlet.job.dir / "cpu.bvt_warp_ns").exists()
    pod_level = koordlet.debug(koordlet.job)["hooks"]["pod"]
    answered = {answer["plugin"]: answer["answered"] for answer in pod_level["plugins"]}
    assert answered["groupidentity"] in (None, {}) and answered["coresched"] == {"cpu_idle": 1}, answered


def test_v2_rdma_devices_open_in_the_container_and_a_node_the_plugin_did_not_add_stays_refused(
        koordlet: Koordlet) -> None:
    lines = {line.split()[0]: line for line in _lines(koordlet.region) if line.startswith("/dev/")}
    for name, (major, minor) in DEVICES.items():
        line = lines[f"/dev/infiniband/{name}"]
        assert f"character special file {major:x}:{minor:x}" in line, line
        # let through by the device program: the open reaches the kernel's lookup, which finds no driver
        assert "No such device or address" in line, line
    assert "Operation not permitted" in lines["/dev/not-injected"], lines


def test_v2_the_gpu_env_and_hami_cores_mounts_and_usage_region_reach_the_container(koordlet: Koordlet) -> None:
    lines = _lines(koordlet.region)
    assert f"env {4 << 30} 30 0" in lines, lines
    assert "HAMi-core stands in here" in lines  # the library, bind-mounted at its own path
    assert "lock dir" in lines
    assert stat.S_IMODE(koordlet.region.parent.stat().st_mode) == 0o777  # made by koordlet for HAMi's monitor


def test_v2_the_reconciler_gives_every_process_of_the_container_its_oom_score_adj(koordlet: Koordlet) -> None:
    """kubelet's 100 (runc's, at the container's start) becomes the annotation's 600 on every process of the
    container's own dir (``cgroup.procs`` of ``cri-containerd-<id>.scope`` on the systemd layout); the sandbox's pause
    keeps the runtime's."""
    trainer = koordlet.trainer

    def scores(cgroup_dir: Path) -> set[int]:
        pids = (cgroup_dir / "cgroup.procs").read_text().split()
        return {int(Path(f"/proc/{pid}/oom_score_adj").read_text()) for pid in pids}

    assert wait_for(lambda: scores(trainer.container_dir) == {OOM_SCORE_ADJ}, WAIT_S), scores(trainer.container_dir)
    pause = scores(trainer.container_dir.parent / trainer.container_dir.name.replace(trainer.container_id,
                                                                                     trainer.sandbox_id))
    assert pause and OOM_SCORE_ADJ not in pause, pause


@pytest.mark.parametrize("koordlet", ["proxy"], indirect=True)  # through NRI the group is runc's RDT class
def test_v2_the_reconciler_gives_the_trainers_resctrl_group_its_schemata_and_the_containers_process(
        koordlet: Koordlet) -> None:
    """The group ``koordlet-<uid>`` the hook server made at RunPodSandbox gets the LLC ways the annotation asks (0-50 %
    of 11 ways: 0x3f on both caches, MB left at 100) and the process of the trainer's container, read from
    ``cgroup.procs`` of its ``cri-containerd-<id>.scope``."""
    group = koordlet.files.resctrl / f"koordlet-{koordlet.trainer.uid}"
    assert group.is_dir(), sorted(p.name for p in koordlet.files.resctrl.iterdir())
    wanted = "L3:0=3f;1=3f\nMB:0=100;1=100\n"
    assert wait_for(lambda: (group / "schemata").read_text() == wanted, WAIT_S), (group / "schemata").read_text()
    processes = set((koordlet.trainer.container_dir / "cgroup.procs").read_text().split())
    assert processes
    seen: set[str] = set()  # a fixture file keeps only the last write: gather what each pass left

    def moved() -> bool:
        seen.update((group / "tasks").read_text().split())
        return processes <= seen

    assert wait_for(moved, WAIT_S, step_s=0.1), (processes, seen)


def test_v2_explain_shows_the_trainers_v2_files_by_their_v2_names_and_what_each_plugin_answered(
        koordlet: Koordlet) -> None:
    answer = koordlet.debug(koordlet.trainer)
    levels = {entry["level"]: entry for entry in answer["cgroups"]}
    assert {entry["cgroupVersion"] for entry in answer["cgroups"]} == {"v2"}
    container = levels["container"]["values"]
    assert container["cpu.max"] == koordlet.trainer.read("cpu.max") == "160000 100000"
    assert container["cpu.weight"] == koordlet.trainer.read("cpu.weight")
    assert container["memory.max"] == str(256 * MiB)
    assert not {"cpu.shares", "cpu.cfs_quota_us", "memory.limit_in_bytes"} & set(container)
    assert levels["pod"]["values"]["cpu.idle"] == "0"
    (record,) = answer["hooks"]["containers"].values()
    assert record["by"] == ("hookserver" if koordlet.door == "proxy" else "nri")
    answered = {a["plugin"] for a in record["plugins"] if a["answered"]}
    assert {"cpunormalization", "gpu", "hamicore-vgpu-monitor", "rdma"} <= answered, record
    assert record["result"]["cfs_quota_us"] == 160000

