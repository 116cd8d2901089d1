from __future__ import annotations

import pytest

from tests.support.cri import CriClient, PodFactory
from tests.support.fakeruntime import FakeRuntime
from tests.support.proxy import ProxyProcess


@pytest.fixture(scope="module")
def proxy(containerd_socket: str, tmp_path_factory: pytest.TempPathFactory) -> ProxyProcess:
    """A real koord-runtime-proxy in front of the test containerd."""
    sock = str(tmp_path_factory.mktemp("proxy") / "proxy.sock")
    p = ProxyProcess(sock, containerd_socket).start()
    try:
        yield p
    finally:
        p.terminate()


@pytest.fixture()
def direct(containerd_socket: str) -> CriClient:
    c = CriClient(containerd_socket)
    yield c
    c.close()


@pytest.fixture()
def via_proxy(proxy: ProxyProcess) -> CriClient:
    c = CriClient(proxy.listen)
    yield c
    c.close()


@pytest.fixture()
def pods(via_proxy: CriClient) -> PodFactory:
    f = PodFactory(via_proxy)
    yield f
    f.cleanup()


@pytest.fixture()
def fake_runtime(tmp_path) -> FakeRuntime:
    rt = FakeRuntime(str(tmp_path / "runtime.sock")).start()
    yield rt
    rt.stop()


@pytest.fixture()
def fake_proxy(fake_runtime: FakeRuntime, tmp_path) -> ProxyProcess:
    p = ProxyProcess(str(tmp_path / "proxy.sock"), fake_runtime.socket_path).start()
    yield p
    p.terminate()
