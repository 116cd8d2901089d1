"""The proxy's store: checkpoint round trip, coalesced atomic writes, bounded by what exists."""

from __future__ import annotations

import asyncio
import json

from runtimeproxy.store import Store, container_request, pod_request_from_config
from wire import cri_pb2 as cri


def _pod(name: str) -> cri.PodSandboxConfig:
    return cri.PodSandboxConfig(metadata=cri.PodSandboxMetadata(name=name, uid=f"uid-{name}", namespace="ns"),
                                labels={"app": name}, linux=cri.LinuxPodSandboxConfig(cgroup_parent=f"/kp/pod{name}"))


def _container(name: str) -> cri.ContainerConfig:
    return cri.ContainerConfig(
        metadata=cri.ContainerMetadata(name=name), envs=[cri.KeyValue(key="E", value=b"\xe2\x82\xac")],
        linux=cri.LinuxContainerConfig(resources=cri.LinuxContainerResources(cpu_quota=20000, cpuset_cpus="0-1")))


def test_checkpoint_round_trip(tmp_path) -> None:
    store = Store(str(tmp_path / "store.json"))
    pod = pod_request_from_config(_pod("a"), "runc")
    store.put_pod("sb-a", pod)
    store.put_container("c-1", "sb-a", container_request(pod, _container("app"), pod.cgroup_parent))
    pods, containers = Store(str(tmp_path / "store.json")).load_checkpoint()
    assert pods == {"sb-a": pod}
    sandbox_id, request = containers["c-1"]
    assert sandbox_id == "sb-a" and request.container_meta.id == "c-1"
    assert request.container_envs == {"E": "€"} and request.container_resources.cpuset_cpus == "0-1"
    store.drop_pod("sb-a")  # takes its containers along
    assert json.loads((tmp_path / "store.json").read_text()) == {"version": 1, "pods": {}, "containers": {}}


def test_writes_from_the_event_loop_are_coalesced_and_leave_no_temp_files(tmp_path) -> None:
    store = Store(str(tmp_path / "store.json"))
    writes: list[str] = []
    real_write = store._write
    store._write = lambda text: (writes.append(text), real_write(text))  # count the file writes

    async def burst() -> None:
        for i in range(50):
            store.put_pod(f"sb-{i}", pod_request_from_config(_pod(str(i)), ""))
        await asyncio.sleep(0.2)

    asyncio.run(burst())
    assert len(writes) == 1
    assert len(json.loads((tmp_path / "store.json").read_text())["pods"]) == 50
    assert sorted(p.name for p in tmp_path.iterdir()) == ["store.json"]


def test_unreadable_checkpoint_is_ignored_with_a_log_line(tmp_path, caplog) -> None:
    (tmp_path / "store.json").write_text('{"version": 1, "pods": {"x": {"pod_meta": 5}}}')
    assert Store(str(tmp_path / "store.json")).load_checkpoint() == ({}, {})
    assert "ignoring unreadable store checkpoint" in caplog.text
    (tmp_path / "store.json").write_text('{"version": 99}')
    assert Store(str(tmp_path / "store.json")).load_checkpoint() == ({}, {})


def test_keep_only_drops_what_the_runtime_no_longer_has(tmp_path) -> None:
    store = Store(None)
    pod = pod_request_from_config(_pod("a"), "")
    for sid in ("s1", "s2"):
        store.put_pod(sid, pod)
    store.put_container("c1", "s1", container_request(pod, _container("x"), ""))
    store.put_container("c2", "s2", container_request(pod, _container("y"), ""))
    assert store.keep_only({"s1"}, {"c1"}) == 2
    assert set(store.pods) == {"s1"} and set(store.containers) == {"c1"}
