"""Suite-wide fixtures. Area fixtures live in tests/support/ and in each area's conftest.py."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from tests.support.containerd import clean_up_dead_sessions, session_containerd

if TYPE_CHECKING:  # imported by the fixtures that use them: the kubernetes client costs seconds in an emulated guest
    import kubernetes.client

    from tests.support.apiserver import ApiServer
    from tests.support.v2stack import V2Stack

# In the cgroup v2 VM stage a skipped cgroupv2 test is a failure unless the kernel lacks the feature; no test
# writes into the node's own koordlet paths unless it is marked as owning them (tests.support.nodepaths).
# The host stage runs in parallel (pytest-xdist, scripts/test-all.sh): a test that touches node state with a fixed
# name (a host path such as /var/run/koordlet or /etc/runtime/hookserver.d, a port such as 9316, a sysctl) is marked
# `@pytest.mark.serial` and runs in the serial session beside the parallel one; a test that measures CPU shares (or
# has a deadline of its own) is marked `@pytest.mark.alone` and runs in the last pass, with nothing beside it.
# tests.support.nodestate fails a test that touches such state without the marker (docs/testing.md, "Running in
# parallel").
pytest_plugins = ["tests.support.v2guest", "tests.support.nodestate", "tests.support.nodepaths"]


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


@pytest.fixture(scope="session")
def v2_stack(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[V2Stack]:
    """The node stack of a cgroup v2 guest session, started once (tests/support/v2stack.py): the session's containerd
    (with NRI in a guest), koordlet's runtime hooks and koord-runtime-proxy in front of containerd. Skips where
    /sys/fs/cgroup is no writable cgroup v2 root (this host), before starting anything."""
    from tests.support.v2guest import skip_unless_v2_writable

    skip_unless_v2_writable()
    from tests.support.v2stack import V2Stack

    containerd_socket = request.getfixturevalue("containerd_socket")
    nri_socket = session_containerd().nri_socket
    with V2Stack.running(containerd_socket, nri_socket, tmp_path_factory.mktemp("v2stack")) as stack:
        yield stack


@pytest.fixture
def server() -> Iterator[ApiServer]:
    """The project's own small API server (validates against the chart's files/crds), fresh for each test."""
    from tests.support.apiserver import ApiServer

    with ApiServer() as running:
        yield running


@pytest.fixture
def api_client(server: ApiServer) -> Iterator[kubernetes.client.ApiClient]:
    """A real `kubernetes` client talking to ``server`` as its admin (a client certificate in system:masters)."""
    from tests.support.apiserver import kube_api_client

    with kube_api_client(server) as client:
        yield client
