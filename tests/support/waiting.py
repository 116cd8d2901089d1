"""Bounded polling for the real-kernel tests: a predicate checked until it holds or time runs out."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_until(predicate: Callable[[], object], timeout_s: float, step_s: float = 0.05) -> bool:
    """True as soon as ``predicate()`` is truthy; after ``timeout_s``, its last answer (one more try)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(step_s)
    return bool(predicate())
