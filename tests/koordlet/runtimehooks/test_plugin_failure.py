"""A hook plugin that raises anything, not only on malformed input, is skipped, logged and counted; the other
plugins' answers stand (hooks/registry.py). A test plugin raising RuntimeError runs first (its name sorts
before every real plugin) beside batchresource: through the hook server over real gRPC, and through the
reconciler onto real cgroup v1 files of this kernel under a private prefix."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from prometheus_client import REGISTRY

from hooks import registry
from hooks.protocol import Changes, ContainerContext, NodeContext, PodContext
from koordlet.api.pod import ContainerMeta, PodMeta
from koordlet.executor import ResourceExecutor
from koordlet.runtimehooks import RuntimeHooks, RuntimeHooksConfig
from koordlet.runtimehooks.reconciler import Reconciler
from koordlet.statesinformer.api import NodeInfo, StaticStates
from koordlet.system.cgroup import CgroupFS, CgroupVersion, detect_cgroup_version
from koordlet.system.kubepods import KubeCgroupLayout
from wire import hookapi_pb2 as hookapi
from wire import hookapi_pb2_grpc as hookapi_grpc

BROKEN = "aaa-broken"  # sorts first: its failure must not stop the plugins after it
GATES = {"BatchResource": True, "TestBrokenPlugin": True}
SPEC = {"containers": {"job": {"requests": {"kubernetes.io/batch-cpu": "500"},
                               "limits": {"kubernetes.io/batch-cpu": "1500", "kubernetes.io/batch-memory": "96Mi"}}}}
BE_ANNOTATIONS = {"node.koordinator.sh/extended-resource-spec": json.dumps(SPEC)}
BE_LABELS = {"koordinator.sh/qosClass": "BE"}
UID, CID = "5e6f7a8b-0000-4000-8000-000000000029", "e" * 64


def _raise(ctx: object, rule: object) -> Changes:
    raise RuntimeError("a bug in a hook plugin")


@pytest.fixture()
def broken_plugin() -> Iterator[registry.Plugin]:
    registry.enabled({})  # the real plugins registered first
    plugin = registry.register(registry.Plugin(
        name=BROKEN, gate="TestBrokenPlugin", rule=lambda node: None, pod=_raise, container=_raise,
        stages=frozenset({registry.Stage.PRE_RUN_POD_SANDBOX, registry.Stage.PRE_CREATE_CONTAINER})))
    try:
        yield plugin
    finally:
        del registry.PLUGINS[BROKEN]


def _errors() -> float:
    return REGISTRY.get_sample_value("koordlet_runtime_hook_plugin_errors_total", {"plugin": BROKEN}) or 0.0


def test_the_registry_skips_a_plugin_that_raises_and_keeps_the_others_answers(broken_plugin) -> None:
    plugins = registry.enabled(GATES)
    assert [p.name for p in plugins] == [BROKEN, "batchresource"]
    pod = PodMeta(name="job", namespace="ns", uid=UID, labels=BE_LABELS, annotations=BE_ANNOTATIONS)
    errors: list[tuple[str, str, Exception]] = []
    changes = registry.run_container(plugins, NodeContext(), ContainerContext(pod, "job"),
                                     lambda *err: errors.append(err))
    assert (changes.cpu_shares, changes.cfs_quota_us, changes.memory_limit_bytes) == (512, 150000, 96 << 20)
    assert [(name, key, type(err)) for name, key, err in errors] == [(BROKEN, "ns/job/job", RuntimeError)]
    assert registry.run_pod(plugins, NodeContext(), PodContext(pod)).cfs_quota_us == 150000


def test_the_hook_server_answers_with_the_other_plugins_values(broken_plugin, tmp_path: Path,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    config = RuntimeHooksConfig(socket_path=str(tmp_path / "koordlet.sock"),
                                host_endpoint=str(tmp_path / "koordlet.sock"),
                                config_dir=str(tmp_path / "hookserver.d"), reconcile_interval_s=60.0,
                                feature_gates=GATES)
    executor = ResourceExecutor(CgroupFS(mount_dir=str(tmp_path / "cg"), version=CgroupVersion.V1))
    hooks = RuntimeHooks(config, StaticStates(node=NodeInfo("n1")), executor, KubeCgroupLayout(cgroup_root="/"))
    before = _errors()
    hooks.start()
    try:
        with grpc.insecure_channel(f"unix://{config.socket_path}") as channel:
            response = hookapi_grpc.RuntimeHookServiceStub(channel).PreCreateContainerHook(
                hookapi.ContainerResourceHookRequest(
                    pod_meta=hookapi.PodSandboxMetadata(name="job", namespace="ns", uid=UID),
                    container_meta=hookapi.ContainerMetadata(name="job"),
                    container_resources=hookapi.LinuxContainerResources(cpu_shares=2),
                    pod_annotations=BE_ANNOTATIONS, pod_labels=BE_LABELS), timeout=5)
    finally:
        hooks.stop()
    r = response.container_resources
    assert (r.cpu_shares, r.cpu_quota, r.memory_limit_in_bytes) == (512, 150000, 96 << 20)
    assert _errors() == before + 1
    logged = [rec for rec in caplog.records if BROKEN in rec.getMessage() and "ns/job" in rec.getMessage()]
    assert logged and logged[0].exc_info is not None  # a bug, not bad input: the traceback is in the log


def _private_v1(controller: str, prefix: str, rel: str) -> list[Path]:
    made = []
    path = Path("/sys/fs/cgroup", controller)
    for part in [prefix, *rel.split("/")]:
        path = path / part
        if not path.is_dir():
            path.mkdir()
            made.append(path)
    return made


def test_the_reconciler_writes_the_other_plugins_values(broken_plugin) -> None:
    if os.geteuid() != 0 or detect_cgroup_version() is not CgroupVersion.V1:
        pytest.skip("needs root on cgroup v1 (the real cpu hierarchy)")
    prefix = f"koordlet-py-test-{os.getpid()}-plugin-failure"
    made: list[Path] = []
    try:
        for controller in ("cpu", "memory"):
            made += _private_v1(controller, prefix, f"kubepods/besteffort/pod{UID}/{CID}")
        pod = PodMeta(name="job", namespace="ns", uid=UID, labels=BE_LABELS, annotations=BE_ANNOTATIONS,
                      cgroup_parent=f"/{prefix}/kubepods/besteffort/pod{UID}", containers=(ContainerMeta("job", CID),))
        plugins = registry.enabled(GATES)
        before = _errors()
        Reconciler(lambda: (pod,), NodeContext, lambda: plugins, ResourceExecutor(CgroupFS()),
                   KubeCgroupLayout(cgroup_root=f"/{prefix}")).reconcile_once()
        container = Path("/sys/fs/cgroup/cpu", prefix, f"kubepods/besteffort/pod{UID}", CID)
        assert (container / "cpu.shares").read_text().strip() == "512"
        assert (container / "cpu.cfs_quota_us").read_text().strip() == "150000"
        assert _errors() == before + 2  # the pod and its container
    finally:
        for path in sorted(made, key=lambda p: len(p.parts), reverse=True):
            path.rmdir()


@pytest.fixture(autouse=True)
def _warnings(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
