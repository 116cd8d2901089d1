"""The rule of the cgroup v2 VM stage (scripts/v2-guest.sh sets KPY_V2_GUEST=1): there every test marked
``cgroupv2`` must run, so a skip is reported as a failure, unless the kernel truly lacks what the test needs
and the skip reason says so with :data:`KERNEL_LACKS`. Loaded by tests/conftest.py."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

KERNEL_LACKS = "kernel lacks"


def in_v2_guest() -> bool:
    return os.environ.get("KPY_V2_GUEST") == "1"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    if not (in_v2_guest() and report.skipped and item.get_closest_marker("cgroupv2")):
        return
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    if KERNEL_LACKS in reason:
        return
    report.outcome = "failed"
    report.longrepr = f"skipped in the cgroup v2 guest, where every cgroupv2 test must run: {reason}"
