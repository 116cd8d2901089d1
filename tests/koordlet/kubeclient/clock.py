"""A clock the tests move by hand (koordlet.kubeclient.timing.Clock)."""

from __future__ import annotations


class FakeClock:
    def __init__(self, start: float = 1000.0) -> None:
        self.now = start
        self.slept: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def time(self) -> float:
        return 1_700_000_000.0 + self.now

    def sleep(self, seconds: float) -> None:
        """A sleep that moves the clock (the budget's wait for a token)."""
        self.slept.append(seconds)
        self.now += seconds
