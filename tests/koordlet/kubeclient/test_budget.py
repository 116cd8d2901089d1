"""The koordlet-wide API budget on a fake clock: the token bucket (-kube-api-qps, -kube-api-burst), pushback on
429/503 with Retry-After honoured, one essential request per slot, periodic actions only when normal."""

from __future__ import annotations

import random

import pytest

from koordlet.kubeclient.budget import PROBATION_S, Budget, State, Throttled
from tests.koordlet.kubeclient.clock import FakeClock


def budget(clock: FakeClock, **kwargs: object) -> Budget:
    return Budget(clock=clock, rng=random.Random(5), sleep=clock.sleep, **kwargs)  # type: ignore[arg-type]


def test_the_bucket_lets_a_burst_through_then_the_rate_with_a_short_wait_then_holds_back() -> None:
    clock = FakeClock()
    limits = budget(clock, qps=20.0, burst=30)
    for _ in range(30):
        limits.admit()
    assert clock.slept == []  # the burst: at once
    limits.admit()
    assert clock.slept == [pytest.approx(0.05)]  # the next token, 1/qps later: waited for, as client-go does
    # 40 more requested at one instant would need a 2 s wait: held back instead (nothing waits long in the budget)
    started = clock.now
    admitted = 0
    with pytest.raises(Throttled) as held:
        for _ in range(40):
            limits.admit()
            admitted += 1
            clock.now = started  # all at the same instant
    assert 0 < admitted <= 20 and held.value.status == 429 and held.value.why == "rate"
    assert 0 < held.value.retry_in_s <= 2.0


def test_koordinators_defaults() -> None:
    limits = Budget()
    assert (limits.qps, limits.burst) == (20.0, 30)
    with pytest.raises(ValueError):
        Budget(qps=0)


def test_a_429_pushes_back_everything_and_retry_after_is_honoured() -> None:
    clock = FakeClock()
    limits = budget(clock, pushback_interval_s=40.0)
    limits.admit()
    limits.answered(429, retry_after_s=90.0)
    assert limits.state is State.PUSHBACK
    with pytest.raises(Throttled) as periodic:
        limits.admit()  # a periodic action: skips its turn
    with pytest.raises(Throttled) as essential:
        limits.admit(essential=True)  # even a watcher waits for the slot, here the server's Retry-After
    assert essential.value.retry_in_s == pytest.approx(90.0) and periodic.value.why == "pushback"
    clock.now += 89.0
    with pytest.raises(Throttled):
        limits.admit(essential=True)
    clock.now += 1.0
    limits.admit(essential=True)  # the slot: one request, a probe
    with pytest.raises(Throttled):
        limits.admit(essential=True)  # the others wait to see that nothing pushes back


def test_pushback_slots_are_spread_around_the_steady_rate() -> None:
    slots = []
    for seed in range(300):
        clock = FakeClock()
        limits = Budget(clock=clock, rng=random.Random(seed))
        limits.answered(503)
        with pytest.raises(Throttled) as held:
            limits.admit(essential=True)
        slots.append(held.value.retry_in_s)
    assert min(slots) >= 25.5 and max(slots) <= 34.5  # 30 s ±15 %: nodes pushed back together come back apart
    assert max(slots) - min(slots) > 7.0


def test_after_a_probe_nothing_pushing_back_for_the_probation_returns_to_normal() -> None:
    clock = FakeClock()
    limits = budget(clock)
    limits.answered(503)
    clock.now += 60.0
    limits.admit(essential=True)
    limits.answered(200)
    assert limits.state is State.PROBATION
    clock.now += PROBATION_S
    assert limits.state is State.NORMAL
    limits.admit()  # periodic actions go again
    limits.admit()


def test_a_push_during_probation_starts_a_new_slot() -> None:
    clock = FakeClock()
    limits = budget(clock)
    limits.answered(503)
    clock.now += 60.0
    limits.admit(essential=True)
    limits.stream_broken()  # the watch the probe opened was cut again
    assert limits.state is State.PUSHBACK
    with pytest.raises(Throttled) as held:
        limits.admit(essential=True)
    assert held.value.retry_in_s >= 25.5


def test_a_watch_broken_off_lets_one_probe_go_at_once() -> None:
    clock = FakeClock()
    limits = budget(clock)
    limits.stream_broken()  # a load balancer cut an idle connection: no pushback yet
    assert limits.state is State.PROBE
    with pytest.raises(Throttled):
        limits.admit()  # periodic actions wait
    limits.admit(essential=True)  # the watcher's re-watch goes now
    with pytest.raises(Throttled) as held:
        limits.admit(essential=True)  # the other watcher waits for the probation
    assert held.value.retry_in_s == pytest.approx(PROBATION_S)


def test_answers_that_are_not_pushback_change_nothing() -> None:
    clock = FakeClock()
    limits = budget(clock)
    for status in (200, 201, 404, 409, 410, 422, 500):
        limits.answered(status)
    assert limits.state is State.NORMAL
    limits.answered(500, retry_after_s=3.0)  # a 5xx that says when to come back is pushback
    assert limits.state is State.PUSHBACK


def test_an_unreachable_server_is_pushback() -> None:
    clock = FakeClock()
    limits = budget(clock)
    limits.unreachable()
    assert limits.state is State.PUSHBACK


def test_observe_counts_pushback_and_held_requests() -> None:
    clock = FakeClock()
    seen: list[str] = []
    limits = budget(clock, observe=seen.append)
    limits.answered(429)
    for essential in (False, True):
        with pytest.raises(Throttled):
            limits.admit(essential=essential)
    assert seen == ["pushback", "throttled_periodic", "throttled_essential"]
