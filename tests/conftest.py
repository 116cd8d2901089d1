"""Suite-wide fixtures. Area fixtures live in tests/support/ and in each area's conftest.py."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator

import kubernetes.client
import pytest

from tests.support.apiserver import ApiServer, kube_api_client
from tests.support.containerd import clean_up_dead_sessions, session_containerd

# In the cgroup v2 VM stage a skipped cgroupv2 test is a failure unless the kernel lacks the feature; no test
# writes into the node's own koordlet paths unless it is marked as owning them.
pytest_plugins = ["tests.support.v2guest", "tests.support.nodepaths"]


def _can_run_containerd() -> str | None:
    if os.geteuid() != 0:
        return "needs root to run containerd"
    if not shutil.which("containerd") or not shutil.which("runc"):
        return "containerd/runc not installed (make test installs them)"
    return None


@pytest.fixture(scope="session")
def containerd_socket() -> str:
    """The project's private containerd, started once per test session and stopped at its end."""
    reason = _can_run_containerd()
    if reason:
        pytest.skip(reason)
    clean_up_dead_sessions()
    containerd = session_containerd()
    containerd.up()
    try:
        yield containerd.socket
    finally:
        containerd.down()
        containerd.remove_dirs()


@pytest.fixture
def server() -> Iterator[ApiServer]:
    """The project's own small API server (validates against the chart's files/crds), fresh for each test."""
    with ApiServer() as running:
        yield running


@pytest.fixture
def api_client(server: ApiServer) -> Iterator[kubernetes.client.ApiClient]:
    """A real `kubernetes` client talking to ``server``."""
    with kube_api_client(server) as client:
        yield client
