"""koordlet's NRI handlers behind a real plugin connection (wire/nri.py) and a stand-in runtime
(tests/support/nriruntime.py): a slow decision never holds up the connection, every answer comes within the
request's deadline, and a handler that missed it writes nothing after its empty answer.

What is slow here is a hook plugin of the test's own that sleeps (a plugin stuck on a lock or a slow file), beside
koordlet's real plugins, on a fixture cgroup tree."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from hooks import registry
from hooks.protocol import Changes, NodeContext
from koordlet.executor import ResourceExecutor
from koordlet.runtimehooks.nri import NriHandlers
from koordlet.system.cgroup import CgroupFS, CgroupVersion
from koordlet.system.kubepods import KubeCgroupLayout
from tests.koordlet.runtimehooks.nri.test_handlers import BE_ANNOTATIONS, BE_LABELS, GATES, container, sandbox
from tests.support.nriruntime import FakeRuntime, RuntimeConn
from wire import nri_pb2 as api
from wire.nri import PluginConnection


class SlowPlugin:
    """Sleeps ``seconds[pod uid]`` in its pod and container stages; wants nothing."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.done: list[tuple[str, float]] = []  # (pod uid, when its stage ended)

    def _sleep(self, uid: str) -> Changes:
        time.sleep(self.seconds.get(uid, 0.0))
        self.done.append((uid, time.monotonic()))
        return Changes()

    def plugin(self) -> registry.Plugin:
        return registry.Plugin("aaa-slow", "Slow", lambda node: None,
                               pod=lambda context, rule: self._sleep(context.pod.uid),
                               container=lambda context, rule: self._sleep(context.pod.uid),
                               stages=frozenset(registry.Stage))


@pytest.fixture
def connected(tmp_path: Path) -> Iterator[tuple[RuntimeConn, SlowPlugin, Path]]:
    cgroups = tmp_path / "cg"
    for uid in ("u1", "u2", "u3"):
        pod_dir = cgroups / "cpu/kubepods/besteffort" / f"pod{uid}"
        pod_dir.mkdir(parents=True)
        (pod_dir / "cpu.shares").write_text("1024\n")
        (pod_dir / "cpu.cfs_quota_us").write_text("-1\n")
    slow = SlowPlugin()
    executor = ResourceExecutor(CgroupFS(mount_dir=str(cgroups), version=CgroupVersion.V1))
    handlers = NriHandlers(lambda: [slow.plugin(), *registry.enabled(GATES)], NodeContext, lambda: (), executor,
                           KubeCgroupLayout())
    runtime = FakeRuntime(str(tmp_path / "nri.sock"))
    stop = threading.Event()

    async def main() -> None:
        with ThreadPoolExecutor(4, thread_name_prefix="nri-handler") as workers:
            conn = await PluginConnection.open(runtime.path, handlers, workers, timeout_s=2)
            await conn.register("koordlet", "00")
            while not stop.is_set() and not conn.closed:
                await asyncio.sleep(0.02)
            conn.close()

    thread = threading.Thread(target=asyncio.run, args=(main(),), name="nri-plugin", daemon=True)
    thread.start()
    conn = runtime.accept()
    try:
        yield conn, slow, cgroups / "cpu/kubepods/besteffort"
    finally:
        stop.set()
        thread.join(10)
        handlers.close()
        runtime.close()


def _shares(pods: Path, uid: str) -> str:
    return (pods / f"pod{uid}" / "cpu.shares").read_text().strip()


def test_a_slow_create_container_is_answered_empty_in_time_while_other_requests_are_answered(connected) -> None:
    conn, slow, _ = connected
    conn.handshake()
    slow.seconds["u1"] = 4.0
    request = api.CreateContainerRequest(pod=sandbox("u1", BE_LABELS, BE_ANNOTATIONS), container=container())
    started = time.monotonic()
    pending = conn.request("CreateContainer", request.SerializeToString(), timeout_s=2.0)
    quick = []
    for _ in range(4):
        time.sleep(0.25)
        asked = time.monotonic()
        other = api.CreateContainerRequest(pod=sandbox("u2", BE_LABELS, BE_ANNOTATIONS),
                                           container=container("c2", "u2"))
        answer = conn.call("CreateContainer", other, api.CreateContainerResponse)
        assert answer.adjust.linux.resources.cpu.shares.value == 512  # a real answer, decided meanwhile
        quick.append(time.monotonic() - asked)
    response = conn.response(pending, 5.0)
    took = time.monotonic() - started
    assert api.CreateContainerResponse.FromString(response.payload).ByteSize() == 0 and took < 2.0, took
    assert max(quick) < 0.5, quick


def test_a_late_synchronize_makes_no_pod_level_write_after_its_empty_answer(connected) -> None:
    """u1's decision ends in time and its values are written before the answer; u2's ends after the deadline:
    its values are never written, though its decision finishes."""
    conn, slow, pods = connected
    slow.seconds.update({"u1": 1.0, "u2": 1.5})
    pods_sent = [sandbox(uid, BE_LABELS, BE_ANNOTATIONS) for uid in ("u1", "u2")]
    started = time.monotonic()
    _, (answer,) = conn.handshake(pods_sent, [])
    answered = time.monotonic()
    assert answered - started < 2.0 and len(answer.update) == 0
    assert _shares(pods, "u1") == "512"
    deadline = time.monotonic() + 5
    while "u2" not in [uid for uid, _ in slow.done] and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)
    assert [uid for uid, when in slow.done if when > answered] == ["u2"]  # u2 was decided after the answer ...
    assert _shares(pods, "u2") == "1024"  # ... and not written
