"""Hostile clients on the proxy socket, against a real proxy process in front of the project's containerd.

Each case: the proxy answers or closes within a bound, its peak RSS stays under +32 MiB over its RSS before
the attack, and a well-behaved client calling through the same proxy meanwhile is served throughout.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support import hostile
from tests.support.proxy import ProxyProcess

# serial: the module's tests share one proxy, and test_refusals_are_counted reads the refusals the others made on it
# (a worker of the parallel session would get only some of them); one process runs them in order.
# alone: each case has a deadline of a few seconds for the proxy's answer (and the module's refusal counts add up
# over its own cases), so nothing runs beside it.
pytestmark = [pytest.mark.containerd, pytest.mark.alone]

RSS_BOUND_MIB = 32


@pytest.fixture(scope="module")
def proxy(containerd_socket: str, tmp_path_factory: pytest.TempPathFactory):
    state = tmp_path_factory.mktemp("hostile")
    process = ProxyProcess(str(state / "proxy.sock"), containerd_socket, "--handshake-timeout", "2",
                           "--stall-timeout", "2", state_dir=str(state)).start()
    try:
        yield process
    finally:
        process.terminate()


@pytest.mark.parametrize("case,expected", [
    ("hooked_body_100MiB", "resource_exhausted@"),
    ("hooked_body_declared_100MiB", "resource_exhausted@"),
    ("gzip_64MiB_as_64KiB", "resource_exhausted"),
    ("random_after_preface", "goaway(6)+closed"),
    ("bad_preface", "goaway(1)+closed"),
    ("bad_hpack", "goaway(9)+closed"),
    ("endless_continuation", "goaway(1)+closed"),
])
def test_hostile_client_is_refused_within_bounds(proxy: ProxyProcess, case: str, expected: str) -> None:
    assert proxy.proc is not None
    outcome = hostile.attack(case, proxy.listen, proxy.proc.pid, hostile.CASES[case])
    print(outcome.line())
    assert outcome.result.startswith(expected), outcome.line()
    if case == "hooked_body_100MiB":  # refused long before the 100 MiB were sent (what the client wrote by
        # the time it read the answer includes what the socket buffers held meanwhile)
        assert int(outcome.result.split("@")[1].removesuffix("MiB")) <= 40, outcome.line()
    if case == "hooked_body_declared_100MiB":  # refused on the first frame: nothing buffered
        assert outcome.rss_peak_mib < 4, outcome.line()
    assert outcome.seconds < 10, outcome.line()
    assert outcome.rss_peak_mib < RSS_BOUND_MIB, outcome.line()
    assert outcome.bystander_failures == 0 and outcome.bystander_calls > 0, outcome.line()
    assert outcome.bystander_worst_ms < 2000, outcome.line()
    assert hostile.pid_alive(proxy.proc.pid)


def test_half_open_connections_are_closed_and_idle_handshaken_ones_kept(proxy: ProxyProcess) -> None:
    assert proxy.proc is not None
    silent = hostile.attack("silent", proxy.listen, proxy.proc.pid, lambda conn: hostile.silent(conn, 6))
    assert silent.result.startswith("goaway") and silent.seconds < 5, silent.line()
    stalled = hostile.attack("stalled_mid_frame", proxy.listen, proxy.proc.pid,
                             lambda conn: hostile.stalled_mid_frame(conn, 8))
    assert stalled.result.startswith("goaway") and stalled.seconds < 6, stalled.line()
    idle = hostile.attack("handshaken_then_idle", proxy.listen, proxy.proc.pid,
                          lambda conn: hostile.handshaken_then_idle(conn, 5))
    assert idle.result == "open", idle.line()


def test_refusals_are_counted(proxy: ProxyProcess) -> None:
    import urllib.request

    text = urllib.request.urlopen(f"http://127.0.0.1:{proxy.metrics_port}/metrics", timeout=5).read().decode()
    counted = {line.split('"')[1]: float(line.split()[-1]) for line in text.splitlines()
               if line.startswith("koord_runtimeproxy_refused_total{")}
    assert counted.get("too_large", 0) >= 3 and counted.get("protocol", 0) >= 3, counted
    assert counted.get("compression", 0) >= 1 and counted.get("idle", 0) >= 2, counted


def test_outcomes_file_is_not_needed(tmp_path: Path) -> None:
    """The attacks build valid HPACK for the requests they send (the proxy's own decoder reads them back)."""
    from runtimeproxy.hpack_decoder import Decoder

    decoded = Decoder().decode(hostile.request_headers(hostile.RUN_POD))
    assert (b":path", hostile.RUN_POD) in decoded
