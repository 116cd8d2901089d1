"""The plugin side of NRI (wire/nri.py) against a stand-in runtime (tests/support/nriruntime.py): Configure's
event mask, split syncs answered as containerd requires, answers within the request timeout whatever the
handler does, and every frame the plugin writes at 4096 bytes or less."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.support.nriruntime import FakeRuntime, RuntimeConn
from wire import nri_pb2 as api
from wire.nri import Event, PluginConnection, event_mask, fit_updates
from wire.ttrpc import Code


class Handlers:
    events = event_mask([Event.RUN_POD_SANDBOX, Event.REMOVE_POD_SANDBOX, Event.CREATE_CONTAINER,
                         Event.UPDATE_CONTAINER])
    quick: frozenset[str] = frozenset()

    def __init__(self) -> None:
        self.synced: list[tuple[int, int]] = []
        self.delay_s = 0.0
        self.fail = False
        self.events_seen: list[int] = []
        self.threads: list[str] = []

    def configure(self, request: api.ConfigureRequest) -> None:
        pass

    def synchronize(self, pods, containers, deadline: float) -> list[api.ContainerUpdate]:
        self.synced.append((len(pods), len(containers)))
        return [api.ContainerUpdate(container_id=c.id) for c in containers]

    def create_container(self, request: api.CreateContainerRequest) -> api.CreateContainerResponse:
        self.threads.append(threading.current_thread().name)
        time.sleep(self.delay_s)
        if self.fail:
            raise RuntimeError("a bug")
        adjust = api.ContainerAdjustment(env=[api.KeyValue(key="K", value="v" * 20000)])
        return api.CreateContainerResponse(adjust=adjust)

    def update_container(self, request: api.UpdateContainerRequest) -> api.UpdateContainerResponse:
        return api.UpdateContainerResponse()

    def state_change(self, event: api.StateChangeEvent) -> None:
        self.events_seen.append(event.event)


@pytest.fixture()
def plugged(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[tuple[RuntimeConn, Handlers, dict]]:
    runtime = FakeRuntime(str(tmp_path / "nri.sock"))
    handlers = Handlers()
    handlers.quick = getattr(request, "param", frozenset())
    state: dict = {"observed": []}
    stop = threading.Event()

    async def main() -> None:
        executor = ThreadPoolExecutor(2)
        conn = await PluginConnection.open(runtime.path, handlers, executor, timeout_s=2,
                                           fail_on_error=state.get("fail_on_error", False),
                                           observe=lambda *o: state["observed"].append(o))
        state["conn"] = conn
        await conn.register("tester", "42")
        while not stop.is_set() and not conn.closed:
            await asyncio.sleep(0.02)
        conn.close()
        executor.shutdown(wait=False)

    thread = threading.Thread(target=asyncio.run, args=(main(),), name="plugin-loop", daemon=True)
    thread.start()
    conn = runtime.accept()
    deadline = time.monotonic() + 5
    while "conn" not in state and time.monotonic() < deadline:  # the plugin's side is built after the connect
        time.sleep(0.01)
    try:
        yield conn, handlers, state
    finally:
        stop.set()
        thread.join(5)
        runtime.close()


def test_registers_and_answers_configure_with_koordinators_event_mask(plugged) -> None:
    conn, _, _ = plugged
    configured, _ = conn.handshake()
    assert configured.events == 0x8D  # RunPodSandbox, RemovePodSandbox, CreateContainer, UpdateContainer


def test_a_split_sync_is_answered_more_true_without_updates_until_the_last_chunk(plugged) -> None:
    conn, handlers, state = plugged
    pods = [api.PodSandbox(id=f"p{i}") for i in range(6)]
    containers = [api.Container(id=f"c{i}", pod_sandbox_id=f"p{i}") for i in range(6)]
    _, answers = conn.handshake(pods, containers, chunks=3)
    assert [(a.more, len(a.update)) for a in answers] == [(True, 0), (True, 0), (False, 6)]
    assert handlers.synced == [(6, 6)]  # the handler sees everything once, at the end
    sync = state["conn"].sync
    assert (sync.messages, sync.pods, sync.containers, sync.updates) == (3, 6, 6, 6)


def test_a_slow_handler_gets_the_empty_answer_within_the_request_timeout(plugged) -> None:
    conn, handlers, state = plugged
    conn.handshake()
    handlers.delay_s = 3.0  # longer than the 2 s the runtime waits
    started = time.monotonic()
    answer = conn.call("CreateContainer", api.CreateContainerRequest(), api.CreateContainerResponse, wait_s=5)
    took = time.monotonic() - started
    assert answer.ByteSize() == 0 and 1.5 < took < 2.0
    assert ("CreateContainer", "timeout") in [o[:2] for o in state["observed"]]


def test_a_failing_handler_answers_no_change_and_the_plugin_keeps_serving(plugged) -> None:
    conn, handlers, _ = plugged
    conn.handshake()
    handlers.fail = True
    assert conn.call("CreateContainer", api.CreateContainerRequest(), api.CreateContainerResponse).ByteSize() == 0
    handlers.fail = False
    answer = conn.call("CreateContainer", api.CreateContainerRequest(), api.CreateContainerResponse)
    assert answer.adjust.env[0].key == "K"
    # a 20 kB answer went out in frames the Go mux reads safely
    assert max(conn.frame_payloads) <= 4096


def test_with_the_fail_policy_a_failing_handler_answers_an_error(plugged) -> None:
    conn, handlers, state = plugged
    state["conn"]._fail = True
    conn.handshake()
    handlers.fail = True
    response = conn.response(conn.request("CreateContainer", api.CreateContainerRequest().SerializeToString()))
    assert response.status.code == Code.UNKNOWN and "a bug" in response.status.message


def test_state_changes_reach_the_handler_and_are_answered_empty(plugged) -> None:
    conn, handlers, state = plugged
    conn.handshake()
    event = api.StateChangeEvent(event=api.RUN_POD_SANDBOX, pod=api.PodSandbox(id="p"))
    assert conn.call("StateChange", event, api.Empty).ByteSize() == 0
    assert handlers.events_seen == [api.RUN_POD_SANDBOX]
    assert ("RunPodSandbox", "ok") in [o[:2] for o in state["observed"]]


def test_sync_updates_beyond_one_message_are_cut_to_fit() -> None:
    update = api.ContainerUpdate(container_id="c" * 1000)
    assert fit_updates([update] * 10, room=5000) == 4
    assert fit_updates([update] * 3, room=5000) == 3


@pytest.mark.parametrize("plugged", [frozenset({"CreateContainer"})], indirect=True)
def test_quick_events_are_answered_on_the_connections_loop_and_a_failure_still_answers(plugged) -> None:
    conn, handlers, state = plugged
    conn.handshake()
    assert conn.call("CreateContainer", api.CreateContainerRequest(), api.CreateContainerResponse).ByteSize() > 0
    handlers.fail = True
    assert conn.call("CreateContainer", api.CreateContainerRequest(), api.CreateContainerResponse).ByteSize() == 0
    assert handlers.threads == ["plugin-loop", "plugin-loop"]  # no hop to a worker thread
    assert [o[:2] for o in state["observed"] if o[0] == "CreateContainer"] == \
        [("CreateContainer", "changed"), ("CreateContainer", "error")]
