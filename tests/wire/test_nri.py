"""The plugin side of NRI (wire/nri.py) against a stand-in runtime (tests/support/nriruntime.py): Configure's
event mask, split syncs answered as containerd requires, answers within the request timeout whatever the
handler does, and every frame the plugin writes at 4096 bytes or less."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.support.nriruntime import FakeRuntime, RuntimeConn
from wire import nri_pb2 as api
from wire.nri import Event, Late, PluginConnection, changing, event_mask, fit_updates
from wire.ttrpc import Code

# alone: the handlers' deadlines are windows of a few hundred milliseconds (an answer at 1.5-2.0 s, a change begun at
# 1.6 s of a 1.8 s budget), which a loaded machine's scheduling moves; nothing else of the test command runs beside.
pytestmark = pytest.mark.alone


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
        self.create: Callable[[], None] | None = None  # what create_container does first (a test's own steps)

    def configure(self, request: api.ConfigureRequest) -> int:
        return self.events

    def update_pod_sandbox(self, request: api.UpdatePodSandboxRequest) -> api.UpdatePodSandboxResponse:
        return api.UpdatePodSandboxResponse()

    def synchronize(self, pods, containers, deadline: float) -> list[api.ContainerUpdate]:
        self.synced.append((len(pods), len(containers)))
        return [api.ContainerUpdate(container_id=c.id) for c in containers]

    def create_container(self, request: api.CreateContainerRequest) -> api.CreateContainerResponse:
        self.threads.append(threading.current_thread().name)
        if self.create is not None:
            self.create()
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
        state["conn"], state["loop"] = conn, asyncio.get_running_loop()
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


def test_a_handler_past_its_deadline_is_answered_empty_in_time_while_the_connection_answers_others(plugged) -> None:
    """The handler runs in a worker thread: its connection reads and answers the requests that come meanwhile."""
    conn, handlers, state = plugged
    conn.handshake()
    handlers.delay_s = 5.0  # far past the 2 s the runtime waits
    started = time.monotonic()
    slow = conn.request("CreateContainer", api.CreateContainerRequest().SerializeToString(), timeout_s=2.0)
    others = []
    for _ in range(5):
        time.sleep(0.2)
        asked = time.monotonic()
        event = api.StateChangeEvent(event=api.REMOVE_POD_SANDBOX, pod=api.PodSandbox(id="p"))
        assert conn.call("UpdateContainer", api.UpdateContainerRequest(), api.UpdateContainerResponse).ByteSize() == 0
        assert conn.call("StateChange", event, api.Empty).ByteSize() == 0
        others.append(time.monotonic() - asked)
    response = conn.response(slow, timeout_s=5.0)
    took = time.monotonic() - started
    assert response.status.code == 0 and api.CreateContainerResponse.FromString(response.payload).ByteSize() == 0
    assert 1.5 < took < 2.0, took  # the empty answer, ahead of the 2 s deadline
    assert max(others) < 0.5, others  # two round trips each, answered while the slow one was pending
    assert handlers.events_seen == [api.REMOVE_POD_SANDBOX] * 5


def test_a_late_handler_changes_nothing_after_its_empty_answer(plugged) -> None:
    """A change begun before the time-out is waited for, so it lands before the answer; one after it never
    starts (Late), even though the handler's thread runs on."""
    conn, handlers, _ = plugged
    conn.handshake()
    changes: list[tuple[str, float]] = []
    late: list[Late] = []

    def change_across_the_time_out() -> None:
        time.sleep(1.6)  # the budget ends at 1.8 s of the 2 s
        with changing():
            time.sleep(0.3)
            changes.append(("slow change", time.monotonic()))
        time.sleep(0.5)
        try:
            with changing():
                changes.append(("late change", time.monotonic()))
        except Late as err:
            late.append(err)

    handlers.create = change_across_the_time_out
    started = time.monotonic()
    response = conn.response(conn.request("CreateContainer", api.CreateContainerRequest().SerializeToString()))
    answered = time.monotonic()
    assert api.CreateContainerResponse.FromString(response.payload).ByteSize() == 0
    assert answered - started < 2.0
    time.sleep(1.0)  # the handler's thread has finished by now
    assert [name for name, _ in changes] == ["slow change"] and len(late) == 1
    assert changes[0][1] <= answered  # the change under way landed before the answer went


def test_a_workers_answer_goes_out_while_the_connections_loop_is_busy(plugged) -> None:
    """The worker sends its answer itself: it does not wait for the loop (which is blocked here for a second)."""
    conn, handlers, state = plugged
    conn.handshake()
    loop_blocked = threading.Event()

    def block_the_loop() -> None:
        loop_blocked.set()
        time.sleep(1.0)

    def create() -> None:
        state["loop"].call_soon_threadsafe(block_the_loop)
        assert loop_blocked.wait(5)

    handlers.create = create
    started = time.monotonic()
    answer = conn.call("CreateContainer", api.CreateContainerRequest(), api.CreateContainerResponse)
    assert answer.adjust.env[0].key == "K" and time.monotonic() - started < 0.5


def test_work_queued_behind_busy_workers_past_its_deadline_never_starts(plugged) -> None:
    conn, handlers, _ = plugged
    conn.handshake()
    handlers.delay_s = 2.5  # both workers of the fixture's pool busy past the deadline
    calls = [conn.request("CreateContainer", api.CreateContainerRequest().SerializeToString()) for _ in range(3)]
    answers = [api.CreateContainerResponse.FromString(conn.response(c, 5.0).payload) for c in calls]
    assert [a.ByteSize() for a in answers] == [0, 0, 0]
    time.sleep(3.0)
    assert len(handlers.threads) == 2  # the third never ran


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


def test_with_the_fail_policy_a_late_handler_answers_deadline_exceeded_in_time(plugged) -> None:
    conn, handlers, state = plugged
    state["conn"]._fail = True
    conn.handshake()
    handlers.delay_s = 3.0
    started = time.monotonic()
    stream = conn.request("CreateContainer", api.CreateContainerRequest().SerializeToString())
    response = conn.response(stream, timeout_s=5.0)
    assert response.status.code == Code.DEADLINE_EXCEEDED and time.monotonic() - started < 2.0
    time.sleep(1.5)  # the handler ends meanwhile: its answer does not follow the error
    assert conn.responses[stream].empty() and not conn.other


def test_every_call_gets_exactly_one_answer_when_handlers_end_around_their_give_up_time(plugged) -> None:
    """Handlers that end just before, at and just after the moment their call is given up (0.2 s into a 0.3 s
    request timeout): each call is answered once, with the handler's answer or the empty one."""
    conn, handlers, _ = plugged
    conn.handshake()
    delays = iter([0.17, 0.19, 0.20, 0.21, 0.23] * 4)
    handlers.create = lambda: time.sleep(next(delays))
    streams = []
    for _ in range(10):  # two at a time (the fixture's two workers), so none waits in the queue past its time
        streams += [conn.request("CreateContainer", api.CreateContainerRequest().SerializeToString(), timeout_s=0.3)
                    for _ in range(2)]
        for stream in streams[-2:]:
            assert conn.response(stream, timeout_s=2.0).status.code == 0
    time.sleep(0.5)  # any second answer would be here by now
    assert all(conn.responses[stream].empty() for stream in streams) and not conn.other
    assert len(handlers.threads) == 20


def test_a_sync_whose_first_update_does_not_fit_reports_it_left_out(plugged) -> None:
    conn, handlers, state = plugged
    huge = api.ContainerUpdate(container_id="c0", linux=api.LinuxContainerUpdate(
        resources=api.LinuxResources(unified={"memory.high": "x" * (5 << 20)})))
    handlers.synchronize = lambda pods, containers, deadline: [huge]
    _, answers = conn.handshake([api.PodSandbox(id="p0")], [api.Container(id="c0", pod_sandbox_id="p0")])
    assert len(answers[0].update) == 0
    sync = state["conn"].sync
    assert (sync.updates, sync.updates_left_out) == (0, 1)


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
