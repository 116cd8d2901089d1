"""Exponential backoff with full jitter: the window doubles from 0.8 s to a 30 s cap, every draw is anywhere in it,
Retry-After is a floor, and only the caller resets it."""

from __future__ import annotations

import random

import pytest

from koordlet.kubeclient.backoff import Backoff


def test_the_window_doubles_to_the_cap_and_every_delay_is_drawn_from_zero() -> None:
    backoff = Backoff(rng=random.Random(1))
    windows = []
    for _ in range(10):
        windows.append(backoff.window_s())
        backoff.delay()
    assert windows == [0.8, 1.6, 3.2, 6.4, 12.8, 25.6, 30.0, 30.0, 30.0, 30.0]
    at_cap = [backoff.delay() for _ in range(4000)]
    assert min(at_cap) >= 0.0 and max(at_cap) <= 30.0
    assert min(at_cap) < 0.5 and max(at_cap) > 29.5  # full jitter: the whole window, not [d, 2d)


def test_retry_after_is_a_floor_and_reset_starts_over() -> None:
    backoff = Backoff(rng=random.Random(2))
    assert all(backoff.delay(retry_after_s=5.0) >= 5.0 for _ in range(50))
    assert backoff.failures == 50
    backoff.reset()
    assert backoff.failures == 0 and backoff.window_s() == 0.8


def test_a_window_that_makes_no_sense_is_refused() -> None:
    with pytest.raises(ValueError):
        Backoff(initial_s=0.0)
    with pytest.raises(ValueError):
        Backoff(initial_s=10.0, cap_s=1.0)
