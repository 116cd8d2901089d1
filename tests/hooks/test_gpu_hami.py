"""GPUEnvInject with HAMi-core isolation and ``HamiCoreVGPUMonitor``, as Koordinator's gpu hook: the envs,
mounts and host dir for a GPU share below a whole GPU of a pod labelled for HAMi-core; nothing more for a whole
GPU or an unlabelled pod; Koordinator's errors for a share without ratio or memory."""

from __future__ import annotations

import json

import pytest

from hooks import registry
from hooks.gpu import container, monitor_container
from hooks.protocol import ContainerContext, Mount, NodeContext
from koordlet.api.device import ANNOTATION_DEVICE_ALLOCATED, LABEL_GPU_ISOLATION_PROVIDER
from koordlet.api.pod import PodMeta

LIB = "/usr/local/vgpu/libvgpu.so"
HAMI = {LABEL_GPU_ISOLATION_PROVIDER: "HAMi-core"}


def _ctx(resources: dict[str, str] | None, labels: dict[str, str] = HAMI, uid: str = "u-1") -> ContainerContext:
    gpu = {"minor": 1}
    if resources is not None:
        gpu["resources"] = resources
    return ContainerContext(PodMeta("infer", "ml", uid, labels=labels,
                                    annotations={ANNOTATION_DEVICE_ALLOCATED: json.dumps({"gpu": [gpu]})}), "main")


SHARE = {"koordinator.sh/gpu-core": "30", "koordinator.sh/gpu-memory-ratio": "25",
         "koordinator.sh/gpu-memory": "20Gi"}


def test_a_hami_core_share_gets_its_limits_the_preload_and_the_mounts() -> None:
    changes = container(_ctx(SHARE), LIB)
    assert dict(changes.envs) == {"NVIDIA_VISIBLE_DEVICES": "1", "CUDA_DEVICE_MEMORY_LIMIT": str(20 << 30),
                                  "CUDA_DEVICE_SM_LIMIT": "30", "LD_PRELOAD": LIB}
    assert changes.mounts == (Mount(LIB, LIB), Mount("/tmp/vgpulock", "/tmp/vgpulock"))
    assert not changes.host_dirs


def test_a_whole_gpu_or_an_unlabelled_pod_gets_only_the_visible_devices() -> None:
    whole = dict(SHARE, **{"koordinator.sh/gpu-memory-ratio": "100"})
    for ctx in (_ctx(whole), _ctx(SHARE, labels={})):
        changes = container(ctx, LIB)
        assert dict(changes.envs) == {"NVIDIA_VISIBLE_DEVICES": "1"} and not changes.mounts
        assert not monitor_container(ctx, LIB)


def test_koordinators_errors_for_a_share_without_ratio_or_memory() -> None:
    with pytest.raises(ValueError, match="gpu memory ratio not found"):
        container(_ctx({"koordinator.sh/gpu-core": "30"}), LIB)
    with pytest.raises(ValueError, match="gpu memory not found"):
        container(_ctx({"koordinator.sh/gpu-memory-ratio": "50"}), LIB)


def test_the_monitor_puts_the_usage_region_in_a_host_dir_of_the_container() -> None:
    changes = monitor_container(_ctx(SHARE, uid="6f1a9c3e-0b7d-4e5f-8a21-3c4d5e6f7a8b"), LIB)
    name = "6f1a9c3e-0b7d-4e5f-8a21-3c4d5e6f7a8b_main"
    assert dict(changes.envs) == {"CUDA_DEVICE_MEMORY_SHARED_CACHE": f"/usr/local/vgpu/{name}.cache"}
    assert changes.mounts == (Mount("/usr/local/vgpu", f"/usr/local/vgpu/containers/{name}"),)
    assert changes.host_dirs == (f"/usr/local/vgpu/containers/{name}",)
    with pytest.raises(ValueError, match="cannot name a directory"):
        monitor_container(_ctx(SHARE, uid="../../etc"), LIB)


def test_both_plugins_together_answer_the_envs_and_all_mounts() -> None:
    plugins = registry.enabled({"GPUEnvInject": True, "HamiCoreVGPUMonitor": True})
    assert [p.name for p in plugins] == ["gpu", "hamicore-vgpu-monitor"]
    changes = registry.run_container(plugins, NodeContext(hami_core_library=LIB), _ctx(SHARE))
    assert {m.destination for m in changes.mounts} == {LIB, "/tmp/vgpulock", "/usr/local/vgpu"}
    assert set(changes.envs) == {"NVIDIA_VISIBLE_DEVICES", "CUDA_DEVICE_MEMORY_LIMIT", "CUDA_DEVICE_SM_LIMIT",
                                 "LD_PRELOAD", "CUDA_DEVICE_MEMORY_SHARED_CACHE"}


def test_the_monitor_needs_the_gpu_env_hook(tmp_path) -> None:  # noqa: ANN001
    from koordlet.executor import ResourceExecutor
    from koordlet.runtimehooks import RuntimeHooks, RuntimeHooksConfig
    from koordlet.statesinformer.api import StaticStates
    from koordlet.system.cgroup import CgroupFS
    from koordlet.system.kubepods import KubeCgroupLayout

    def plugins(gates: dict[str, bool]) -> list[str]:
        config = RuntimeHooksConfig(socket_path=str(tmp_path / "k.sock"), config_dir=str(tmp_path / "d"),
                                    feature_gates=gates)
        hooks = RuntimeHooks(config, StaticStates(), ResourceExecutor(CgroupFS(str(tmp_path / "cg"))),
                             KubeCgroupLayout())
        return [p.name for p in hooks.plugins]

    assert plugins({"HamiCoreVGPUMonitor": True}) == []
    assert plugins({"HamiCoreVGPUMonitor": True, "GPUEnvInject": True}) == ["gpu", "hamicore-vgpu-monitor"]
