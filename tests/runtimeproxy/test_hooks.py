"""Hook dispatch through a real proxy in front of real containerd, with recording hook servers."""

from __future__ import annotations

import os
import signal
import time
import urllib.request
from pathlib import Path

import grpc
import pytest

from tests.support.cri import CriClient, PodFactory, container_config, sandbox_config
from tests.support.hookserver import RecordingHookServer, echo, register
from tests.support.proxy import ProxyProcess
from wire import cri_pb2 as cri
from wire import hookapi_pb2 as hookapi

pytestmark = pytest.mark.containerd
CGROUP_V1 = Path("/sys/fs/cgroup")
RESOURCES = cri.LinuxContainerResources(cpu_period=100000, cpu_quota=50000, cpu_shares=512,
                                        memory_limit_in_bytes=64 << 20)


@pytest.fixture()
def state(tmp_path) -> Path:
    return tmp_path


@pytest.fixture()
def start_proxy(containerd_socket: str, state: Path):
    started: list[ProxyProcess] = []

    def start(*extra: str) -> ProxyProcess:
        p = ProxyProcess(str(state / "proxy.sock"), containerd_socket, "--runtime-hook-timeout", "0.5", *extra,
                         log_path=str(state / f"proxy-{len(started)}.log")).start()
        started.append(p)
        return p

    yield start
    for p in started:
        p.terminate()


@pytest.fixture()
def hook_server(state: Path):
    servers: list[RecordingHookServer] = []

    def make(name: str = "hook", behaviour=None) -> RecordingHookServer:
        kwargs = {"behaviour": behaviour} if behaviour else {}
        s = RecordingHookServer(str(state / f"{name}.sock"), **kwargs).start()
        servers.append(s)
        return s

    yield make
    for s in servers:
        s.stop()


@pytest.fixture()
def client_pods(start_proxy, containerd_socket: str):
    made: list[tuple[CriClient, PodFactory]] = []

    def connect(proxy: ProxyProcess) -> tuple[CriClient, PodFactory]:
        client = CriClient(proxy.listen)
        made.append((client, PodFactory(client)))
        return made[-1]

    yield connect
    direct = CriClient(containerd_socket)  # cleanup must not depend on a proxy a test killed
    try:
        for client, pods in made:
            client.close()
            pods.client = direct
            pods.cleanup()
    finally:
        direct.close()


def cgroup_value(controller: str, cgroup: str, name: str) -> str:
    return (CGROUP_V1 / controller / cgroup.lstrip("/") / name).read_text().strip()


def test_hook_changes_reach_containerd_and_the_cgroup_files(start_proxy, hook_server, client_pods, state) -> None:
    def behaviour(hook: str, request):
        answer = echo(request)
        if hook == "PreRunPodSandbox":
            answer.cgroup_parent = request.cgroup_parent.replace("/kubepods/besteffort/", "/hooked/")
            answer.annotations["hooked"] = "yes"
        elif hook == "PreCreateContainer":
            answer.container_resources.cpu_quota = 30000
            answer.container_resources.cpu_shares = 300
            answer.container_resources.memory_limit_in_bytes = 48 << 20
            answer.container_envs["HOOKED"] = "by-the-hook"
        return answer

    server = hook_server(behaviour=behaviour)
    register(str(state / "hookserver.d"), "10-test.json", server.socket_path)
    client, pods = client_pods(start_proxy())
    sid, cid, sandbox = pods.start_pod("hooked", resources=RESOURCES, envs={"KEPT": "1"})

    status = client.runtime.PodSandboxStatus(cri.PodSandboxStatusRequest(pod_sandbox_id=sid)).status
    assert status.annotations["hooked"] == "yes"
    parent = sandbox.linux.cgroup_parent.replace("/kubepods/besteffort/", "/hooked/")
    cgroup = f"{parent}/{cid}"
    assert cgroup_value("cpu", cgroup, "cpu.cfs_quota_us") == "30000"
    assert cgroup_value("cpu", cgroup, "cpu.shares") == "300"
    assert cgroup_value("memory", cgroup, "memory.limit_in_bytes") == str(48 << 20)
    out = client.runtime.ExecSync(cri.ExecSyncRequest(container_id=cid, cmd=["sh", "-c", "echo $KEPT $HOOKED"]))
    assert out.stdout == b"1 by-the-hook\n"
    assert (CGROUP_V1 / "cpu" / parent.lstrip("/") / sid).is_dir()  # the sandbox moved too

    [create] = server.requests("PreCreateContainer")
    assert create.pod_cgroup_parent == parent
    assert create.container_envs == {"KEPT": "1"}
    assert create.container_resources.cpu_quota == 50000
    [start] = server.wait_for("PreStartContainer")
    assert start.container_meta.id == cid and start.container_resources.cpu_quota == 30000
    server.wait_for("PostStartContainer")


def test_every_hook_server_is_called_in_file_name_order_each_seeing_the_last(
        start_proxy, hook_server, client_pods, state) -> None:
    def first(hook, request):
        answer = echo(request)
        if hook == "PreCreateContainer":
            answer.container_annotations["first"] = "was-here"
            answer.container_resources.cpu_shares = 400
        return answer

    def second(hook, request):
        answer = echo(request)
        if hook == "PreCreateContainer":
            answer.container_envs["SAW"] = request.container_annotations.get("first", "nothing")
            answer.container_resources.cpu_shares = request.container_resources.cpu_shares + 1
        return answer

    a, b = hook_server("a", first), hook_server("b", second)
    register(str(state / "hookserver.d"), "20-second.json", b.socket_path)
    register(str(state / "hookserver.d"), "10-first.json", a.socket_path)
    client, pods = client_pods(start_proxy())
    _, cid, sandbox = pods.start_pod("chain", resources=RESOURCES)
    assert cgroup_value("cpu", f"{sandbox.linux.cgroup_parent}/{cid}", "cpu.shares") == "401"
    out = client.runtime.ExecSync(cri.ExecSyncRequest(container_id=cid, cmd=["sh", "-c", "echo $SAW"]))
    assert out.stdout == b"was-here\n"
    assert len(a.requests("PreCreateContainer")) == len(b.requests("PreCreateContainer")) == 1


@pytest.mark.parametrize("policy", ["Ignore", "Fail"])
def test_a_hanging_hook_server_costs_at_most_its_deadline(start_proxy, hook_server, client_pods, state,
                                                          policy: str) -> None:
    def hang(hook, request):
        time.sleep(3)
        return echo(request)

    server = hook_server(behaviour=hang)
    register(str(state / "hookserver.d"), "hang.json", server.socket_path, ["PreRunPodSandbox"], policy)
    _, pods = client_pods(start_proxy())
    started = time.monotonic()
    if policy == "Ignore":
        pods.run_pod(sandbox_config("hang"))
    else:
        with pytest.raises(grpc.RpcError) as err:
            pods.run_pod(sandbox_config("hang"))
        assert "hook server hang.json" in err.value.details()
        assert "PreRunPodSandbox" in err.value.details() and "0.5 s" in err.value.details()
    assert time.monotonic() - started < 0.5 + 1.5


def test_a_crashed_hook_server_is_skipped_fast_and_used_again_when_back(start_proxy, hook_server, client_pods,
                                                                       state) -> None:
    server = hook_server()
    register(str(state / "hookserver.d"), "gone.json", server.socket_path, ["PreRunPodSandbox"])
    proxy = start_proxy()
    _, pods = client_pods(proxy)
    pods.run_pod(sandbox_config("first"))
    assert len(server.requests("PreRunPodSandbox")) == 1
    server.stop()  # crashed: the socket file is gone
    t0 = time.monotonic()
    for i in range(3):
        pods.run_pod(sandbox_config(f"without-{i}"))
    assert time.monotonic() - t0 < 3 * 0.5  # no 0.5 s hook deadline waited per pod
    back = RecordingHookServer(server.socket_path).start()
    try:
        pods.run_pod(sandbox_config("again"))
        assert len(back.requests("PreRunPodSandbox")) == 1
    finally:
        back.stop()
    metrics = urllib.request.urlopen(f"http://127.0.0.1:{proxy.metrics_port}/metrics", timeout=5).read().decode()
    assert 'koord_runtimeproxy_hook_errors_total{hook="PreRunPodSandbox",policy="Ignore",server="gone.json"} 3.0' \
        in metrics


def test_garbage_and_invalid_answers_do_not_crash_the_proxy(start_proxy, hook_server, client_pods, state) -> None:
    def garbage(hook, request):
        if hook == "PreRunPodSandbox":
            return b"\xff\xff\xff not protobuf"
        answer = echo(request)
        answer.container_resources.cpu_quota = 5  # the kernel refuses quotas under 1 ms
        answer.container_resources.cpuset_cpus = "banana"
        answer.container_resources.cpu_shares = 300
        return answer

    server = hook_server(behaviour=garbage)
    register(str(state / "hookserver.d"), "garbage.json", server.socket_path)
    proxy = start_proxy()
    client, pods = client_pods(proxy)
    _, cid, sandbox = pods.start_pod("garbage", resources=RESOURCES)
    cgroup = f"{sandbox.linux.cgroup_parent}/{cid}"
    assert cgroup_value("cpu", cgroup, "cpu.cfs_quota_us") == "50000"  # the bad value was dropped
    assert cgroup_value("cpu", cgroup, "cpu.shares") == "300"  # the good one kept
    assert client.runtime.Version(cri.VersionRequest()).runtime_name == "containerd"
    assert proxy.proc.poll() is None
    assert "sets cpu_quota=5" in proxy.log() and "undecodable PodSandboxHookResponse" in proxy.log()


def test_skip_label_bypasses_every_hook_of_the_pod(start_proxy, hook_server, client_pods, state) -> None:
    server = hook_server()
    register(str(state / "hookserver.d"), "all.json", server.socket_path)
    client, pods = client_pods(start_proxy())
    _, cid, _ = pods.start_pod("skipped", labels={"runtimeproxy.koordinator.sh/skip-hookserver": "true"})
    client.runtime.StopContainer(cri.StopContainerRequest(container_id=cid, timeout=0))
    assert server.hooks_called() == []
    pods.start_pod("not-skipped", labels={"runtimeproxy.koordinator.sh/skip-hookserver": "false"})
    assert server.wait_for("PreStartContainer")


def test_kill_9_between_create_and_start_keeps_the_start_hook_complete(
        start_proxy, hook_server, client_pods, state) -> None:
    server = hook_server()
    register(str(state / "hookserver.d"), "hook.json", server.socket_path)
    first = start_proxy()
    client, pods = client_pods(first)
    sandbox = sandbox_config("restart", labels={"team": "a"})
    sid = pods.run_pod(sandbox)
    cid = pods.create_container(sid, sandbox, container_config("app", resources=RESOURCES, envs={"E": "1"}))
    first.proc.send_signal(signal.SIGKILL)
    first.proc.wait(10)
    client.close()

    for keep_checkpoint in (True, False):
        if not keep_checkpoint:
            Path(first.checkpoint).unlink()  # rebuilt from containerd's verbose status alone
        second = start_proxy()
        client2, _ = client_pods(second)
        if keep_checkpoint:
            client2.runtime.StartContainer(cri.StartContainerRequest(container_id=cid))
            request = server.wait_for("PreStartContainer")[-1]
        else:
            client2.runtime.UpdateContainerResources(cri.UpdateContainerResourcesRequest(
                container_id=cid, linux=cri.LinuxContainerResources(cpu_shares=700)))
            request = server.wait_for("PreUpdateContainerResources")[-1]
        assert request.container_meta.id == cid
        assert request.pod_cgroup_parent == sandbox.linux.cgroup_parent
        assert request.pod_labels == {"team": "a"}
        assert request.container_envs == {"E": "1"}
        assert request.container_resources.cpu_quota == 50000
        assert request.container_resources.memory_limit_in_bytes == 64 << 20
        second.proc.send_signal(signal.SIGKILL)
        second.proc.wait(10)


@pytest.mark.alone  # a one-second bound on the proxy's reload and a pod start: no other test's load beside it
def test_registration_files_take_effect_within_a_second(start_proxy, hook_server, client_pods, state) -> None:
    server = hook_server()
    hook_dir = state / "hookserver.d"
    hook_dir.mkdir()
    (hook_dir / "00-broken.json").write_text("{ not json")
    proxy = start_proxy()
    _, pods = client_pods(proxy)
    pods.run_pod(sandbox_config("before"))
    assert server.hooks_called() == []

    def within_a_second(check) -> None:
        deadline = time.monotonic() + 1.0
        while not check():
            assert time.monotonic() < deadline, "registration change not seen within 1 s"
            time.sleep(0.05)

    path = register(str(hook_dir), "10-late.json", server.socket_path, ["PreRunPodSandbox"])
    within_a_second(lambda: (pods.run_pod(sandbox_config("probe")), server.requests("PreRunPodSandbox"))[1])
    register(str(hook_dir), "10-late.json", server.socket_path, ["PreCreateContainer"])
    time.sleep(1.0)
    n = len(server.requests("PreRunPodSandbox"))
    pods.start_pod("changed")
    assert len(server.requests("PreRunPodSandbox")) == n and server.requests("PreCreateContainer")
    os.unlink(path)
    time.sleep(1.0)
    calls = len(server.calls)
    pods.start_pod("removed")
    assert len(server.calls) == calls
    assert "ignoring hook server registration 00-broken.json: 00-broken.json: not valid JSON" in proxy.log()


def test_store_forgets_pods_and_containers_that_go_away(start_proxy, hook_server, client_pods, state,
                                                        containerd_socket) -> None:
    server = hook_server()
    register(str(state / "hookserver.d"), "hook.json", server.socket_path)
    proxy = start_proxy("--store-gc-interval", "1")
    client, pods = client_pods(proxy)

    def entries() -> dict[str, float]:
        text = urllib.request.urlopen(f"http://127.0.0.1:{proxy.metrics_port}/metrics", timeout=5).read().decode()
        return {kind: float(line.rsplit(" ", 1)[1]) for kind in ("pod", "container") for line in text.splitlines()
                if line.startswith(f'koord_runtimeproxy_store_entries{{kind="{kind}"}}')}

    sid, cid, _ = pods.start_pod("lifecycle")
    assert entries() == {"pod": 1.0, "container": 1.0}
    client.runtime.StopContainer(cri.StopContainerRequest(container_id=cid, timeout=0))
    client.runtime.StopPodSandbox(cri.StopPodSandboxRequest(pod_sandbox_id=sid))
    assert entries() == {"pod": 0.0, "container": 0.0}
    assert server.wait_for("PostStopContainer") and server.wait_for("PostStopPodSandbox")

    sid2, cid2, _ = pods.start_pod("removed-behind-its-back")
    direct = CriClient(containerd_socket)
    try:
        direct.runtime.StopContainer(cri.StopContainerRequest(container_id=cid2, timeout=0))
        direct.runtime.RemoveContainer(cri.RemoveContainerRequest(container_id=cid2))
        direct.runtime.StopPodSandbox(cri.StopPodSandboxRequest(pod_sandbox_id=sid2))
        direct.runtime.RemovePodSandbox(cri.RemovePodSandboxRequest(pod_sandbox_id=sid2))
    finally:
        direct.close()
    deadline = time.monotonic() + 10
    while entries() != {"pod": 0.0, "container": 0.0}:
        assert time.monotonic() < deadline, entries()
        time.sleep(0.2)


def test_post_hook_errors_never_fail_the_call(start_proxy, hook_server, client_pods, state) -> None:
    def fail_post(hook, request):
        if hook.startswith("Post"):
            raise RuntimeError("post hook exploded")
        return echo(request)

    server = hook_server(behaviour=fail_post)
    register(str(state / "hookserver.d"), "post.json", server.socket_path, policy="Fail")
    client, pods = client_pods(start_proxy())
    sid, cid, _ = pods.start_pod("post")
    client.runtime.StopContainer(cri.StopContainerRequest(container_id=cid, timeout=0))
    client.runtime.StopPodSandbox(cri.StopPodSandboxRequest(pod_sandbox_id=sid))
    assert {"PostStartContainer", "PostStopContainer", "PostStopPodSandbox"} <= set(server.hooks_called())


def test_pod_hook_request_is_built_per_koordinator(start_proxy, hook_server, client_pods, state) -> None:
    server = hook_server()
    register(str(state / "hookserver.d"), "hook.json", server.socket_path, ["PreRunPodSandbox"])
    _, pods = client_pods(start_proxy())
    sandbox = sandbox_config("meta", labels={"koordinator.sh/qosClass": "BE"}, annotations={"x": "y"})
    pods.run_pod(sandbox)
    [request] = server.requests("PreRunPodSandbox")
    assert isinstance(request, hookapi.PodSandboxHookRequest)
    assert (request.pod_meta.name, request.pod_meta.namespace, request.pod_meta.uid) == \
        ("meta", "default", sandbox.metadata.uid)
    assert request.labels == {"koordinator.sh/qosClass": "BE"} and request.annotations == {"x": "y"}
    assert request.cgroup_parent == sandbox.linux.cgroup_parent


# --------------------------------------------------------------------------------------- pod-level resize (KEP-1287)

POD_RESIZE = "PreUpdatePodSandboxResources"


def _pod_resize_request(sandbox_id: str) -> bytes:
    """What kubelet sends after resizing a pod's own cgroup (generateUpdatePodSandboxResourcesRequest): the pod's
    resources without overhead; plus a field of a newer CRI that our subset lacks, which must reach the runtime."""
    request = cri.UpdatePodSandboxResourcesRequest(
        pod_sandbox_id=sandbox_id, overhead=cri.LinuxContainerResources(cpu_shares=10),
        resources=cri.LinuxContainerResources(cpu_period=100000, cpu_quota=200000, cpu_shares=2048,
                                              memory_limit_in_bytes=256 << 20))
    return request.SerializeToString() + b"\xc8\x3e\x07"  # field 1001, varint 7


def _call_raw(client: CriClient, method: str, payload: bytes) -> tuple[grpc.StatusCode, str]:
    call = client.channel.unary_unary(f"/runtime.v1.RuntimeService/{method}")
    try:
        call(payload, timeout=30)
    except grpc.RpcError as err:
        return err.code(), err.details() or ""
    return grpc.StatusCode.OK, ""


def _containerd_answer(containerd_socket: str, sandbox_id: str) -> tuple[grpc.StatusCode, str]:
    """What containerd answers kubelet's UpdatePodSandboxResources without the proxy."""
    direct = CriClient(containerd_socket)
    try:
        return _call_raw(direct, "UpdatePodSandboxResources", _pod_resize_request(sandbox_id))
    finally:
        direct.close()


def test_a_pod_level_resize_is_offered_to_the_hook_and_answered_as_the_runtime_answers(
        start_proxy, hook_server, client_pods, state, containerd_socket: str) -> None:
    """UpdatePodSandboxResources through the proxy: the hook sees the sandbox with the call's resources, its answer is
    merged in, and kubelet gets the runtime's own answer. Debian's containerd 2.1.9, 1.7.24 and 1.6.20 were built
    against a cri-api without the call: they answer UNIMPLEMENTED, which kubelet logs and goes on from (the call is
    best effort); the test holds the proxy to answering exactly what containerd answers kubelet directly."""
    def behaviour(hook, request):
        answer = echo(request)
        if hook == POD_RESIZE:
            answer.resources.CopyFrom(request.resources)
            answer.resources.cpu_quota = -1  # what the cpuset hook answers for a pod bound to CPUs
        return answer

    server = hook_server(behaviour=behaviour)
    register(str(state / "hookserver.d"), "10-test.json", server.socket_path, ["PreRunPodSandbox", POD_RESIZE],
             "Fail")
    client, pods = client_pods(start_proxy())
    sandbox = sandbox_config("resized", labels={"koordinator.sh/qosClass": "LS"}, kube_qos="burstable")
    sid = pods.run_pod(sandbox)
    expected = _containerd_answer(containerd_socket, sid)
    assert _call_raw(client, "UpdatePodSandboxResources", _pod_resize_request(sid)) == expected
    [request] = server.requests(POD_RESIZE)
    assert (request.pod_meta.uid, request.labels["koordinator.sh/qosClass"]) == (sandbox.metadata.uid, "LS")
    assert request.cgroup_parent == sandbox.linux.cgroup_parent
    assert (request.resources.cpu_shares, request.resources.cpu_quota, request.resources.memory_limit_in_bytes) == \
        (2048, 200000, 256 << 20)
    assert request.overhead.cpu_shares == 10


def test_a_pod_level_resize_fails_only_as_its_failure_policy_says(start_proxy, hook_server, client_pods,
                                                                  state, containerd_socket: str) -> None:
    """A hook server that errs fails the call under Fail, as any pre hook; one that does not serve the hook (a
    Koordinator koordlet: UNIMPLEMENTED) is skipped even under Fail, so kubelet gets the runtime's answer."""
    def broken(hook, request):
        raise RuntimeError("broken on purpose")

    failing = hook_server("failing", broken)
    register(str(state / "hookserver.d"), "10-failing.json", failing.socket_path, [POD_RESIZE], "Fail")
    client, pods = client_pods(start_proxy())
    sid = pods.run_pod(sandbox_config("resize-fail"))
    code, details = _call_raw(client, "UpdatePodSandboxResources", _pod_resize_request(sid))
    assert code is grpc.StatusCode.UNKNOWN
    assert "hook server 10-failing.json" in details and POD_RESIZE in details
    failing.stop()
    (state / "hookserver.d" / "10-failing.json").unlink()
    older = RecordingHookServer(str(state / "older.sock"), serves=frozenset({"PreRunPodSandbox"})).start()
    try:
        register(str(state / "hookserver.d"), "20-older.json", older.socket_path, ["PreRunPodSandbox", POD_RESIZE],
                 "Fail")
        time.sleep(1.5)  # registration files take effect within a second
        expected = _containerd_answer(containerd_socket, sid)
        assert _call_raw(client, "UpdatePodSandboxResources", _pod_resize_request(sid)) == expected
    finally:
        older.stop()
