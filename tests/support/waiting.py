"""The one polling helper of the tests: a probe called until it answers something truthy, or time runs out
(a condition another thread, process or the kernel makes true)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(probe: Callable[[], T], timeout_s: float = 5.0, step_s: float = 0.02) -> T:
    """The probe's first truthy value, or its last (falsy) value once ``timeout_s`` has passed."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = probe()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(step_s)
