import threading

import pytest

from koordlet.gpu.health import HealthBoard, XidHealthWatcher
from koordlet.gpu.nvml import discover, open_nvml
from tests.koordlet.gpu.fake_nvml import FakeNvml, h100_gpus


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def setup(tmp_path):
    nvml = FakeNvml(h100_gpus(2))
    session = open_nvml(nvml)
    inventory = discover(session, sys_dir=str(tmp_path / "sys"))
    uuids = [g.uuid for g in inventory.gpus]
    board = HealthBoard(uuids)
    clock = Clock()
    watcher = XidHealthWatcher(session, board, uuids, recover_after_s=60.0, clock=clock)
    watcher.start()
    try:
        yield nvml, board, watcher, clock, uuids
    finally:
        watcher.stop()
        session.close()


def test_critical_xid_marks_that_gpu_unhealthy_with_the_xid_as_reason(setup) -> None:
    nvml, board, watcher, _clock, uuids = setup
    nvml.inject_xid(1, 79)
    watcher.poll_once(timeout_ms=1000)
    assert board.get(uuids[1]).healthy is False
    assert board.get(uuids[1]).reason == "Xid79"
    assert board.get(uuids[0]).healthy is True


def test_application_xid_is_ignored(setup) -> None:
    nvml, board, watcher, _clock, uuids = setup
    generation = board.generation
    nvml.inject_xid(0, 13)
    watcher.poll_once(timeout_ms=1000)
    assert board.get(uuids[0]).healthy is True
    assert board.generation == generation


def test_gpu_comes_back_after_quiet_period_when_its_probe_passes(setup) -> None:
    nvml, board, watcher, clock, uuids = setup
    nvml.inject_xid(0, 48)
    watcher.poll_once(timeout_ms=1000)
    clock.now += 30
    watcher.poll_once(timeout_ms=1)
    assert board.get(uuids[0]).healthy is False, "too early to recover"
    nvml.gpus[0].lost = True
    clock.now += 60
    watcher.poll_once(timeout_ms=1)
    assert board.get(uuids[0]).healthy is False, "a failing probe keeps it unhealthy"
    nvml.gpus[0].lost = False
    watcher.poll_once(timeout_ms=1)
    assert board.get(uuids[0]).healthy is True
    assert board.get(uuids[0]).reason == ""


def test_watchers_wake_on_a_change_both_ways(setup) -> None:
    nvml, board, watcher, clock, uuids = setup
    seen: list[bool] = []
    ready = threading.Event()

    def follow() -> None:
        generation = board.generation
        ready.set()
        for _ in range(2):
            generation = board.wait_for_change(generation, timeout_s=5)
            seen.append(board.get(uuids[0]).healthy)

    thread = threading.Thread(target=follow)
    thread.start()
    ready.wait(5)
    nvml.inject_xid(0, 79)
    watcher.poll_once(timeout_ms=1000)
    clock.now += 120
    watcher.poll_once(timeout_ms=1)
    thread.join(5)
    assert seen == [False, True]


def test_lost_gpu_without_event_support_is_caught_by_the_probe_and_comes_back(tmp_path) -> None:
    nvml = FakeNvml(events_supported=False)
    with open_nvml(nvml) as session:
        inventory = discover(session, sys_dir=str(tmp_path / "sys"))
        uuid = inventory.gpus[0].uuid
        board = HealthBoard([uuid])
        watcher = XidHealthWatcher(session, board, [uuid], recover_after_s=0.0)
        watcher.start()
        assert watcher.watched == ()
        nvml.gpus[0].lost = True
        watcher.poll_once(timeout_ms=1)
        assert board.get(uuid).reason == "GPULost"
        nvml.gpus[0].lost = False
        watcher.poll_once(timeout_ms=1)
        watcher.stop()
    assert board.get(uuid).healthy is True


def test_gpu_marked_unhealthy_by_someone_else_is_not_cleared_by_the_watcher(setup) -> None:
    _nvml, board, watcher, clock, uuids = setup
    board.set(uuids[0], False, "Drained")
    clock.now += 3600
    watcher.poll_once(timeout_ms=1)
    assert board.get(uuids[0]).reason == "Drained"


def test_board_rejects_unknown_gpu() -> None:
    board = HealthBoard(["GPU-a"])
    with pytest.raises(KeyError):
        board.set("GPU-b", False, "Xid79")


def test_history_gives_every_state_after_a_generation() -> None:
    board = HealthBoard(["GPU-a"])
    start, _ = board.versioned_snapshot()
    board.set("GPU-a", False, "Xid79")
    board.set("GPU-a", True)
    assert [(g, h["GPU-a"].healthy) for g, h in board.snapshots_since(start)] == [(1, False), (2, True)]
    assert board.snapshots_since(2) == []
    for _ in range(100):
        board.set("GPU-a", False, "Xid79")
        board.set("GPU-a", True)
    assert [g for g, _ in board.snapshots_since(start)] == [202], "too far behind: only the latest"
