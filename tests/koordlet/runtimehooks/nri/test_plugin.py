"""koordlet's NRI connection (runtimehooks/nri/plugin.py) against a stand-in runtime that can do what
containerd never does: garbage on the mux, an oversized ttrpc message, an unknown method, a hang-up, a
socket that appears late. The plugin survives each, keeps serving, and never holds two connections."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import REGISTRY

from hooks import registry
from hooks.protocol import NodeContext
from koordlet.executor import ResourceExecutor
from koordlet.runtimehooks.nri import NriConfig, NriHandlers, NriPlugin
from koordlet.runtimehooks.nri.plugin import backoff_delay
from koordlet.system.cgroup import CgroupFS
from koordlet.system.kubepods import KubeCgroupLayout
from tests.support.nriruntime import FakeRuntime, RuntimeConn, ttrpc_message
from wire import nri_pb2 as api
from wire.ttrpc import RECEIVE_MAX, Code

SPEC = {"containers": {"job": {"requests": {"kubernetes.io/batch-cpu": "500"},
                               "limits": {"kubernetes.io/batch-cpu": "1500"}}}}
BE_POD = api.PodSandbox(id="sb", name="job", namespace="default", uid="u1",
                        labels={"koordinator.sh/qosClass": "BE"},
                        annotations={"node.koordinator.sh/extended-resource-spec": json.dumps(SPEC)},
                        linux=api.LinuxPodSandbox(cgroup_parent="/kubepods/besteffort/podu1"))
CREATE = api.CreateContainerRequest(pod=BE_POD, container=api.Container(id="c1", pod_sandbox_id="sb", name="job"))


def _plugin(tmp_path: Path, socket_path: str, **config: object) -> NriPlugin:
    executor = ResourceExecutor(CgroupFS(mount_dir=str(tmp_path / "cg")))
    handlers = NriHandlers(lambda: registry.enabled({"BatchResource": True}), NodeContext, lambda: (), executor,
                           KubeCgroupLayout())
    return NriPlugin(NriConfig(socket_path=socket_path, **config), handlers)  # type: ignore[arg-type]


@pytest.fixture()
def running(tmp_path: Path) -> Iterator[tuple[FakeRuntime, NriPlugin, RuntimeConn]]:
    runtime = FakeRuntime(str(tmp_path / "nri" / "nri.sock"))
    plugin = _plugin(tmp_path, runtime.path, socket_poll_s=0.1, backoff_s=0.1)
    plugin.start()
    try:
        conn = runtime.accept()
        conn.handshake()
        assert plugin.registered.wait(5)
        yield runtime, plugin, conn
    finally:
        plugin.stop()
        runtime.close()


def _answers_create(conn: RuntimeConn) -> None:
    answer = conn.call("CreateContainer", CREATE, api.CreateContainerResponse)
    assert answer.adjust.linux.resources.cpu.shares.value == 512


def test_registers_as_koordinators_plugin_and_answers(running) -> None:
    runtime, plugin, conn = running
    _answers_create(conn)
    assert REGISTRY.get_sample_value("koordlet_nri_registered") == 1
    assert REGISTRY.get_sample_value("koordlet_nri_events_total", {"event": "CreateContainer",
                                                                   "result": "changed"}) >= 1


def test_registration_names_the_plugin_as_configured(tmp_path: Path) -> None:
    runtime = FakeRuntime(str(tmp_path / "nri.sock"))
    plugin = _plugin(tmp_path, runtime.path, plugin_name="koordlet_nri", plugin_index="07")
    plugin.start()
    try:
        registered = runtime.accept().registered.get(timeout=5)
        assert (registered.plugin_name, registered.plugin_idx) == ("koordlet_nri", "07")
    finally:
        plugin.stop()
        runtime.close()


def test_garbage_on_the_mux_is_dropped_and_the_plugin_keeps_serving(running) -> None:
    _, plugin, conn = running
    conn.send(7, b"\x01\x02 a frame for a connection nobody opened")
    conn.send(1, b"\x00\x00\x00\x04\x00\x00\x00\x09\xee\x00 not a ttrpc message type")
    conn.send(1, ttrpc_message(conn.next_stream_id(), 1, b"\xff\xfe not a Request envelope"))
    _answers_create(conn)
    assert plugin.registered.is_set() and plugin.registrations == 1


def test_an_oversized_message_is_answered_resource_exhausted_and_the_plugin_keeps_serving(running) -> None:
    _, plugin, conn = running
    stream_id = conn.next_stream_id()
    conn.send(1, ttrpc_message(stream_id, 1, b"\0" * (RECEIVE_MAX + 1)), frame_payload=1 << 20)
    response = conn.response(stream_id, timeout_s=30)
    assert response.status.code == Code.RESOURCE_EXHAUSTED
    _answers_create(conn)
    assert plugin.registrations == 1


def test_an_unknown_method_is_answered_unimplemented_and_the_plugin_keeps_serving(running) -> None:
    _, plugin, conn = running
    response = conn.response(conn.request("RunPodSandbox", BE_POD.SerializeToString()))  # NRI v0.12's direct call
    assert (response.status.code, response.status.message) == (Code.UNIMPLEMENTED, "method RunPodSandbox")
    other = conn.response(conn.request("Anything", b"", service="some.other.Service"))
    assert other.status.code == Code.UNIMPLEMENTED
    _answers_create(conn)
    assert plugin.registrations == 1


def test_after_a_hang_up_it_registers_again_on_one_connection_only(running) -> None:
    runtime, plugin, conn = running
    conn.close()
    second = runtime.accept(timeout_s=5)
    second.handshake()
    deadline = time.monotonic() + 5
    while plugin.registrations < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert plugin.registrations == 2 and runtime.live() == 1
    _answers_create(second)


def test_a_runtime_that_never_configures_is_given_up_after_the_connect_timeout_one_connection_at_a_time(
        tmp_path: Path) -> None:
    runtime = FakeRuntime(str(tmp_path / "nri.sock"))
    plugin = _plugin(tmp_path, runtime.path, connect_timeout_s=0.5, backoff_s=0.1, backoff_cap_s=0.2)
    plugin.start()
    try:
        first = runtime.accept()  # registered, then silence: no Configure, no Synchronize
        assert first.closed.wait(3), "the silent attempt was not closed"
        second = runtime.accept(timeout_s=3)
        assert first.closed.is_set() and not second.closed.is_set() and runtime.live() == 1
        second.handshake()
        assert plugin.registered.wait(3)
    finally:
        plugin.stop()
        runtime.close()


def test_a_socket_that_appears_after_the_start_is_picked_up(tmp_path: Path) -> None:
    path = str(tmp_path / "later" / "nri.sock")
    plugin = _plugin(tmp_path, path, backoff_cap_s=2.0)
    plugin.start()
    runtime = None
    try:
        time.sleep(1.5)
        assert not plugin.registered.is_set()
        runtime = FakeRuntime(path)
        appeared = time.monotonic()
        runtime.accept(timeout_s=5).handshake()
        assert plugin.registered.wait(5)
        assert time.monotonic() - appeared < 2.0  # within the backoff cap
    finally:
        plugin.stop()
        if runtime is not None:
            runtime.close()


def test_stop_closes_the_connection(running) -> None:
    runtime, plugin, conn = running
    assert plugin.stop(5)
    assert conn.closed.wait(2) and runtime.live() == 0


def test_backoff_grows_by_the_factor_and_never_passes_the_cap() -> None:
    config = NriConfig(socket_path="x", backoff_s=1.0, backoff_factor=2.0, backoff_cap_s=10.0)
    assert [backoff_delay(config, n, jitter=0.0) for n in range(7)] == [0.0, 1.0, 2.0, 4.0, 8.0, 10.0, 10.0]
    assert backoff_delay(config, 3, jitter=1.0) == pytest.approx(4.4)
    assert backoff_delay(config, 60, jitter=1.0) == 10.0  # jitter does not lift it over the cap
    few_steps = NriConfig(socket_path="x", backoff_s=1.0, backoff_factor=2.0, backoff_steps=2, backoff_cap_s=100.0)
    assert backoff_delay(few_steps, 10, jitter=0.0) == 4.0
    huge = NriConfig(socket_path="x", backoff_factor=1e300, backoff_cap_s=5.0)
    assert backoff_delay(huge, 10**6, jitter=0.0) == 5.0


KOORDINATOR_MASK = 0x8D  # RunPodSandbox, RemovePodSandbox, CreateContainer, UpdateContainer
UPDATE_POD_SANDBOX_BIT = 1 << (api.UPDATE_POD_SANDBOX - 1)


@pytest.mark.parametrize("runtime,subscribed", [
    (("containerd", "2.1.9+unknown"), False),  # Debian's 2.1.9: NRI v0.8.0, whose LAST = 12 refuses the bit
    (("containerd", "1.7.24~ds1"), False),
    (("containerd", "v2.2.0"), True),  # NRI v0.10.0: UpdatePodSandbox
    (("cri-o", "1.34.0"), False),  # not known: the bit would risk the registration
])
def test_update_pod_sandbox_is_subscribed_only_where_the_runtimes_nri_has_it(
        tmp_path: Path, runtime: tuple[str, str], subscribed: bool) -> None:
    fake = FakeRuntime(str(tmp_path / "nri.sock"))
    plugin = _plugin(tmp_path, fake.path)
    plugin.start()
    try:
        configured, _ = fake.accept().handshake(runtime=runtime)
        assert configured.events == (KOORDINATOR_MASK | UPDATE_POD_SANDBOX_BIT if subscribed else KOORDINATOR_MASK)
    finally:
        plugin.stop()
        fake.close()


def test_a_pod_level_resize_from_an_nri_010_runtime_writes_the_pod_values_again(tmp_path: Path) -> None:
    """containerd 2.2+ relays UpdatePodSandboxResources as UpdatePodSandbox after kubelet wrote the pod dir: the
    pod-level answers (here the BE pod's batch values) are written again over kubelet's, and the resize is told on."""
    pod_dir = tmp_path / "cg" / "cpu" / "kubepods" / "besteffort" / "podu1"
    pod_dir.mkdir(parents=True)
    (pod_dir / "cpu.shares").write_text("2\n")  # what kubelet writes for a BestEffort pod
    resized: list[str] = []
    handlers = NriHandlers(lambda: registry.enabled({"BatchResource": True}), NodeContext, lambda: (),
                           ResourceExecutor(CgroupFS(mount_dir=str(tmp_path / "cg"))), KubeCgroupLayout(),
                           resized=lambda uid, container, resources: resized.append(uid))
    fake = FakeRuntime(str(tmp_path / "nri.sock"))
    plugin = NriPlugin(NriConfig(socket_path=fake.path), handlers)
    plugin.start()
    try:
        conn = fake.accept()
        conn.handshake(runtime=("containerd", "v2.2.0"))
        answer = conn.call("UpdatePodSandbox", api.UpdatePodSandboxRequest(pod=BE_POD), api.UpdatePodSandboxResponse)
        assert answer == api.UpdatePodSandboxResponse()
        assert (pod_dir / "cpu.shares").read_text().strip() == "512"  # Σ batch-cpu requests 500 → 512 shares
        assert resized == ["u1"]
    finally:
        plugin.stop()
        fake.close()
