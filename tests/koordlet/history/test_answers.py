"""What each hook plugin answered at creation is kept (koordlet/history/answers.py) where the plugins run: the hook
server over gRPC, the NRI handlers, the reconciler for a pod with no record; bounded and forgotten with the pod."""

from __future__ import annotations

import json
from pathlib import Path

import grpc

from hooks import registry
from hooks.protocol import NodeContext
from koordlet.api.pod import ContainerMeta, PodMeta
from koordlet.executor import ResourceExecutor
from koordlet.history.answers import POD_LEVEL, HookAnswers
from koordlet.runtimehooks import RuntimeHooks, RuntimeHooksConfig
from koordlet.runtimehooks.nri import NriHandlers
from koordlet.runtimehooks.reconciler import Reconciler
from koordlet.statesinformer.api import NodeInfo, StaticStates
from koordlet.system.cgroup import CgroupFS, CgroupVersion
from koordlet.system.kubepods import KubeCgroupLayout
from wire import hookapi_pb2 as hookapi
from wire import hookapi_pb2_grpc as hookapi_grpc
from wire import nri_pb2 as api

UID = "0a0b0c0d-0000-4000-8000-000000000008"
BE_LABELS = {"koordinator.sh/qosClass": "BE"}
SPEC_ANNOTATION = "node.koordinator.sh/extended-resource-spec"


def _spec(limits: dict[str, str]) -> dict[str, str]:
    return {SPEC_ANNOTATION: json.dumps({"containers": {"job": {"requests": {"kubernetes.io/batch-cpu": "500"},
                                                                "limits": limits}}})}


def _hooks(tmp_path: Path, disabled: frozenset[str] = frozenset()) -> RuntimeHooks:
    config = RuntimeHooksConfig(socket_path=str(tmp_path / "koordlet.sock"),
                                host_endpoint=str(tmp_path / "koordlet.sock"),
                                config_dir=str(tmp_path / "hookserver.d"), reconcile_interval_s=60.0,
                                feature_gates={"BatchResource": True}, disabled_stages=disabled)
    executor = ResourceExecutor(CgroupFS(mount_dir=str(tmp_path / "cg" / "sys/fs/cgroup"), version=CgroupVersion.V1))
    return RuntimeHooks(config, StaticStates(node=NodeInfo("n1")), executor, KubeCgroupLayout(cgroup_root="/"))


def _create(hooks: RuntimeHooks, annotations: dict[str, str], name: str = "job") -> None:
    with grpc.insecure_channel(f"unix://{hooks.config.socket_path}") as channel:
        stub = hookapi_grpc.RuntimeHookServiceStub(channel)
        stub.PreRunPodSandboxHook(hookapi.PodSandboxHookRequest(
            pod_meta=hookapi.PodSandboxMetadata(name="p", namespace="ns", uid=UID), labels=BE_LABELS,
            annotations=annotations, cgroup_parent=f"/kubepods/besteffort/pod{UID}"), timeout=5)
        stub.PreCreateContainerHook(hookapi.ContainerResourceHookRequest(
            pod_meta=hookapi.PodSandboxMetadata(name="p", namespace="ns", uid=UID),
            container_meta=hookapi.ContainerMetadata(name=name), pod_labels=BE_LABELS, pod_annotations=annotations,
            pod_cgroup_parent=f"/kubepods/besteffort/pod{UID}"), timeout=5)


def test_the_hook_server_keeps_each_plugins_answer_for_the_pod_and_its_container(tmp_path: Path) -> None:
    hooks = _hooks(tmp_path)
    hooks.start()
    try:
        _create(hooks, _spec({"kubernetes.io/batch-cpu": "1500", "kubernetes.io/batch-memory": "64Mi"}))
    finally:
        hooks.stop()
    records = hooks.answers.of(UID)
    pod, job = records[POD_LEVEL], records["job"]
    assert (pod.stage, pod.door) == ("PreRunPodSandbox", "hookserver")
    assert (job.stage, job.door) == ("PreCreateContainer", "hookserver")
    (answer,) = job.answers
    assert answer.plugin == "batchresource" and answer.error == ""
    assert answer.changes is not None and answer.changes.cfs_quota_us == 150000
    assert job.result is not None and job.result.memory_limit_bytes == 64 << 20 and job.rejected == ()


def test_a_plugin_that_raised_is_kept_as_skipped_with_its_error_and_a_dropped_value_with_its_reason(
        tmp_path: Path) -> None:
    hooks = _hooks(tmp_path)
    hooks.start()
    try:
        _create(hooks, {SPEC_ANNOTATION: "[1, 2"})  # not JSON: batchresource raises
        broken = hooks.answers.of(UID)["job"]
        _create(hooks, _spec({"kubernetes.io/batch-memory": "1"}))  # one byte: the check drops it
        tiny = hooks.answers.of(UID)["job"]
    finally:
        hooks.stop()
    (answer,) = broken.answers
    assert answer.changes is None and answer.error.startswith("AnnotationError: ")
    assert [(r.key, r.value) for r in tiny.rejected] == [("memory_limit_bytes", "1")]
    assert "page" in tiny.rejected[0].reason
    assert tiny.result is not None and tiny.result.memory_limit_bytes is None


def test_a_disabled_stage_is_kept_with_why_the_plugins_did_not_run(tmp_path: Path) -> None:
    hooks = _hooks(tmp_path, disabled=frozenset({"PreCreateContainer"}))
    hooks.start()
    try:
        _create(hooks, _spec({"kubernetes.io/batch-cpu": "1500"}))
    finally:
        hooks.stop()
    job = hooks.answers.of(UID)["job"]
    assert job.answers == () and job.result is None
    assert job.note == "stage PreCreateContainer off (-runtime-hooks-disable-stages)"


def _executor(tmp_path: Path) -> ResourceExecutor:
    return ResourceExecutor(CgroupFS(mount_dir=str(tmp_path / "cg"), version=CgroupVersion.V1))


def test_nri_keeps_the_answers_it_decides_itself(tmp_path: Path) -> None:
    answers = HookAnswers()
    handlers = NriHandlers(lambda: registry.enabled({"BatchResource": True}), NodeContext, lambda: (),
                           _executor(tmp_path), KubeCgroupLayout(), answers=answers)
    pod = api.PodSandbox(id="sb", name="p", namespace="ns", uid=UID, labels=BE_LABELS,
                         annotations=_spec({"kubernetes.io/batch-cpu": "1500"}),
                         linux=api.LinuxPodSandbox(cgroup_parent=f"/kubepods/besteffort/pod{UID}"))
    handlers.create_container(api.CreateContainerRequest(pod=pod, container=api.Container(id="c1", name="job")))
    handlers.close()
    job = answers.of(UID)["job"]
    assert (job.stage, job.door) == ("PreCreateContainer", "nri")
    assert job.result is not None and job.result.cfs_quota_us == 150000


def test_the_reconciler_records_a_pod_only_while_it_has_no_record(tmp_path: Path) -> None:
    answers = HookAnswers()
    pod = PodMeta(name="p", namespace="ns", uid=UID, labels=BE_LABELS,
                  annotations=_spec({"kubernetes.io/batch-cpu": "1500"}),
                  cgroup_parent=f"/kubepods/besteffort/pod{UID}", containers=(ContainerMeta("job", "c" * 64),))
    reconciler = Reconciler(lambda: (pod,), NodeContext, lambda: registry.enabled({"BatchResource": True}),
                            _executor(tmp_path), KubeCgroupLayout(), answers=answers)
    reconciler.reconcile_once()
    first = answers.of(UID)
    assert first[POD_LEVEL].door == "reconciler" and first["job"].stage == "reconcile"
    reconciler.reconcile_once()
    assert answers.of(UID)["job"] is first["job"]  # not recorded again


def test_answers_are_bounded_and_forgotten_once_the_pod_is_no_longer_listed() -> None:
    now = [1000.0]
    answers = HookAnswers(capacity=3, keep_unlisted_s=60.0, clock=lambda: now[0])
    for index in range(5):
        answers.record(f"uid-{index}", "c", "PreCreateContainer", "hookserver", None, None)
    assert len(answers) == 3 and not answers.of("uid-0") and answers.of("uid-4")
    assert answers.retain(["uid-2"]) == 0  # too new to be forgotten: the informer may not list them yet
    now[0] += 61
    assert answers.retain(["uid-2"]) == 2
    assert len(answers) == 1 and answers.of("uid-2")
