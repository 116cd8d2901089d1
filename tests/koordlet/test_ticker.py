"""The periodic loop every koordlet part runs on: first delay, interval, wake, rate limit, errors, bounded stop."""

from __future__ import annotations

import logging
import threading
import time

import pytest

from koordlet.ticker import PeriodicThread, join_thread
from tests.support.waiting import wait_for


class Runs:
    def __init__(self) -> None:
        self.at: list[float] = []

    def __call__(self) -> None:
        self.at.append(time.monotonic())


def test_first_run_after_the_first_delay_then_every_interval() -> None:
    runs = Runs()
    loop = PeriodicThread("t", 0.05, runs, first_delay_s=0.2)
    started = time.monotonic()
    loop.start()
    try:
        assert wait_for(lambda: len(runs.at) >= 4, timeout_s=3.0)
    finally:
        assert loop.stop(1.0)
    assert runs.at[0] - started >= 0.2
    assert all(later - earlier >= 0.05 for earlier, later in zip(runs.at, runs.at[1:], strict=False))


def test_wake_runs_at_once_and_cuts_the_first_delay_short() -> None:
    runs = Runs()
    loop = PeriodicThread("t", 60.0, runs, first_delay_s=60.0)
    loop.start()
    try:
        loop.wake()
        assert wait_for(lambda: len(runs.at) == 1, timeout_s=2.0)
        time.sleep(0.1)
        assert len(runs.at) == 1  # the next one is an interval away
    finally:
        assert loop.stop(1.0)


def test_wakes_within_the_min_gap_are_merged_into_one_run() -> None:
    runs = Runs()
    loop = PeriodicThread("t", 60.0, runs, min_gap_s=0.3)
    loop.start()
    try:
        assert wait_for(lambda: len(runs.at) == 1, timeout_s=2.0)
        for _ in range(20):
            loop.wake()
            time.sleep(0.005)
        assert wait_for(lambda: len(runs.at) == 2, timeout_s=2.0)
        time.sleep(0.4)
        assert len(runs.at) == 2
        assert runs.at[1] - runs.at[0] >= 0.3
    finally:
        assert loop.stop(1.0)


def test_a_follow_up_runs_once_more_later() -> None:
    runs = Runs()
    loop = PeriodicThread("t", 60.0, runs)
    loop.start()
    try:
        assert wait_for(lambda: len(runs.at) == 1, timeout_s=2.0)
        loop.wake(follow_up_s=0.3)
        assert wait_for(lambda: len(runs.at) == 3, timeout_s=2.0)
        assert runs.at[2] - runs.at[1] >= 0.25
        time.sleep(0.4)
        assert len(runs.at) == 3
    finally:
        assert loop.stop(1.0)


def test_a_failing_run_is_reported_and_the_loop_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    errors: list[Exception] = []
    calls = [0]

    def fail() -> None:
        calls[0] += 1
        raise ValueError("boom")

    loop = PeriodicThread("t", 0.01, fail, on_error=errors.append)
    loop.start()
    try:
        assert wait_for(lambda: len(errors) >= 3, timeout_s=2.0)
    finally:
        assert loop.stop(1.0)
    assert all(isinstance(err, ValueError) for err in errors)
    default = PeriodicThread("logged", 60.0, fail)
    with caplog.at_level(logging.ERROR, logger="koordlet.ticker"):
        default.start()
        assert wait_for(lambda: "logged: run failed" in caplog.text, timeout_s=2.0)
        assert default.stop(1.0)


def test_stop_is_bounded_by_its_timeout_and_says_so(caplog: pytest.LogCaptureFixture) -> None:
    release = threading.Event()
    entered = threading.Event()

    def stuck() -> None:
        entered.set()
        release.wait(10.0)

    loop = PeriodicThread("stuck", 60.0, stuck)
    loop.start()
    assert entered.wait(2.0)
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="koordlet.ticker"):
        assert loop.stop(0.2) is False
    assert time.monotonic() - started < 0.5
    assert "stuck thread did not stop within 0.2 s" in caplog.text
    release.set()
    assert not loop.running


def test_join_thread_of_nothing_or_a_finished_thread_is_true() -> None:
    assert join_thread(None, "none", 0.0)
    thread = threading.Thread(target=lambda: None)
    thread.start()
    assert join_thread(thread, "done", 1.0)
