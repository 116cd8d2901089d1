"""The threads a started koordlet runs are the ones ARCHITECTURE.md lists ("Threads, loops and pools"), by name.

A koordlet starts in-process in local mode with every feature gate on, the NRI plugin, the audit log, the
pod-resources proxy, Terway's files, a NodeSLO asking for Terway's network QoS (so tc leaves the host's uplink
alone) and a fake NVML with two GPUs (the GPU service and the device plugin); what no kernel here has is a fixture
tree (the page-idle bitmap and its /proc files, the CPU list). Every thread it starts must match a row of the table,
every row that says it runs "at start" (and not only with an API server) must be running, and after the stop none
of them is left.
"""

from __future__ import annotations

import os
import re
import shutil
import struct
import tempfile
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from koordlet.agent.lifecycle import Koordlet
from koordlet.config import parse_config
from koordlet.metrics import Reply
from tests.koordlet.gpu.fake_nvml import FakeNvml, h100_gpus
from tests.support.waiting import wait_for

REPO = Path(__file__).resolve().parents[2]
SECTION = "## Threads, loops and pools"


def listed_threads() -> list[tuple[re.Pattern[str], str]]:
    """(name pattern, "started" cell) of every thread the table lists; ``<n>`` stands for a number."""
    text = (REPO / "ARCHITECTURE.md").read_text()
    assert SECTION in text, "ARCHITECTURE.md lost its concurrency section"
    body = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in body.splitlines():
        if not line.startswith("| `"):
            continue
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        for name in re.findall(r"`([^`]+)`", cells[0]):
            pattern = re.escape(name).replace(re.escape("<n>"), r"\d+")
            rows.append((re.compile(pattern), cells[1]))
    assert len(rows) > 20, body[:500]
    return rows


def _fixture_node(root: Path) -> tuple[Path, Path]:
    """A /sys and a /proc with what this machine lacks: the page-idle bitmap with kpageflags and kpagecgroup (one
    u64 a frame), the CPU list. The rest of /proc is the real one (read only: no sysctl lives there, as
    ``proc/sys`` is left out, so nothing under it can be written through this tree)."""
    sys_dir, proc_dir = root / "sys", root / "proc"
    (sys_dir / "devices/system/cpu").mkdir(parents=True)
    (sys_dir / "devices/system/cpu/online").write_text("0-1\n")
    frames = 4096
    (sys_dir / "kernel/mm/page_idle").mkdir(parents=True)
    (sys_dir / "kernel/mm/page_idle/bitmap").write_bytes(bytes(frames // 8))
    proc_dir.mkdir()
    for name in os.listdir("/proc"):
        if not name.isdigit() and name not in ("kpageflags", "kpagecgroup", "kpagecount", "sys"):
            os.symlink(f"/proc/{name}", proc_dir / name)
    for name in ("kpageflags", "kpagecgroup"):
        (proc_dir / name).write_bytes(struct.pack(f"={frames}Q", *([0] * frames)))
    return sys_dir, proc_dir


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[Koordlet]:
    sys_dir, proc_dir = _fixture_node(tmp_path)
    for qos in ("burstable", "besteffort"):  # the dirs PLEG watches (cgroup v1 layout, cgroupfs driver)
        (tmp_path / "cgroup/cpu/kubepods" / qos).mkdir(parents=True)
    (tmp_path / "slo.yaml").write_text("resourceQOSStrategy: {policies: {netQOSPolicy: terway-qos}}\n")
    sockets = Path(tempfile.mkdtemp(prefix="kth-", dir="/tmp"))  # unix socket paths: 107 bytes at most
    (sockets / "kubelet").mkdir()
    config = parse_config([
        "-local-mode", f"-node-slo-file={tmp_path / 'slo.yaml'}", f"-report-dir={tmp_path / 'reports'}",
        f"-cri-endpoint={tmp_path / 'no-cri.sock'}", f"-cgroup-root-dir={tmp_path / 'cgroup'}",
        f"-sys-root-dir={sys_dir}", f"-proc-root-dir={proc_dir}", f"-sys-fs-root-dir={tmp_path}",
        f"-var-lib-kubelet-dir={sockets / 'kubelet'}", f"-var-run-root-dir={sockets}", "-addr=127.0.0.1:0",
        "-feature-gates=AllAlpha=true,AllBeta=true", "-enable-resctrl-collector",
        f"-audit-log-dir={tmp_path / 'audit'}", f"-pod-resources-proxy-path={sockets / 'pod-resources'}",
        f"-terway-qos-dir={tmp_path / 'terway'}", f"-runtime-hooks-addr={sockets / 'koordlet.sock'}",
        f"-runtime-hooks-host-endpoint={sockets / 'koordlet.sock'}",
        f"-runtime-hooks-config-path={tmp_path / 'hookserver.d'}", "-enable-nri-runtime-hook=true",
        "-runtime-hooks-nri-socket-path=nri/nri.sock", f"-prediction-checkpoint-filepath={tmp_path / 'prediction'}",
        f"-system-config-record-file={tmp_path / 'records' / 'system.json'}",
    ], {"NODE_NAME": "threads"})
    agent = Koordlet(config, states_sync_timeout_s=0.5, nvml=FakeNvml(h100_gpus(2)))
    try:
        yield agent
    finally:
        agent.stop(5.0)
        shutil.rmtree(sockets, ignore_errors=True)


def test_a_started_koordlet_runs_exactly_the_threads_the_architecture_lists(agent: Koordlet) -> None:
    listed = listed_threads()
    before = {thread.ident for thread in threading.enumerate()}
    assert agent.start()

    def started() -> list[threading.Thread]:
        return [t for t in threading.enumerate() if t.ident not in before and t.is_alive()]

    at_start = [(pattern, when) for pattern, when in listed
                if when.startswith("at start") and "API server" not in when]
    # the page-idle pass starts at the collectors' first tick; the rest during start()
    assert wait_for(lambda: any(t.name == "coldpage-scan" for t in started()), timeout_s=10.0)
    names = sorted(t.name for t in started())
    assert [name for name in names if not any(p.fullmatch(name) for p, _ in listed)] == []
    assert [p.pattern for p, _ in at_start if not any(p.fullmatch(name) for name in names)] == []

    # a request is served on a thread of its own, named too
    server = agent.metrics_server
    assert server is not None
    server.route("/thread", lambda request: Reply(200, "text/plain", threading.current_thread().name.encode()))
    with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/thread", timeout=5) as response:
        assert response.read().decode() == "metrics-http-request"

    ours = started()
    agent.stop(5.0)
    assert wait_for(lambda: not [t for t in ours if t.is_alive()], timeout_s=5.0), [
        t.name for t in ours if t.is_alive()]
