"""``koordlet explain`` and ``/debug/*`` on the real node stack: koordlet (local mode) and the proxy as processes in
front of real containerd, a BE pod created through the proxy, real cgroup v1 files."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.cri import PodFactory
from tests.support.stack import Stack, http_get
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.containerd, pytest.mark.cgroupv1]
KOORDLET = str(Path(sys.executable).with_name("koordlet"))  # the console script


@pytest.fixture
def stack(containerd_socket: str, tmp_path: Path):
    running = Stack(tmp_path, containerd_socket).start()
    try:
        yield running
    finally:
        running.stop()


def explain(stack: Stack, pod: str, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([KOORDLET, "explain", pod, "--server", f"http://127.0.0.1:{stack.koordlet.port}", *extra],
                          capture_output=True, text=True, timeout=60)


def test_explain_tells_what_the_hooks_answered_what_the_files_hold_and_what_acts_next(stack: Stack) -> None:
    assert stack.client is not None
    pods = PodFactory(stack.client)
    try:
        sandbox, _, cid = stack.run_be_pod(pods, "be-explained")
        uid = sandbox.metadata.uid
        base = f"http://127.0.0.1:{stack.koordlet.port}"
        shown = wait_for(lambda: (lambda text: json.loads(text) if text.startswith("{") else None)(
            _get(f"{base}/debug/pods/default/be-explained")), 20.0, 0.2)
        assert shown, "the pod never showed up at /debug/pods"
        assert shown["pod"]["uid"] == uid and shown["pod"]["qosClass"] == "BE"
        job = shown["hooks"]["containers"]["job"]
        assert (job["stage"], job["by"]) == ("PreCreateContainer", "hookserver")
        batch = next(p for p in job["plugins"] if p["plugin"] == "batchresource")
        assert batch["answered"]["cpu_shares"] == 512 and batch["answered"]["cfs_quota_us"] == 150000
        assert shown["hooks"]["pod"]["result"]["memory_limit_bytes"] == 96 << 20
        assert {"plugin": "gpu", "why": "feature gate GPUEnvInject off"} in shown["hooks"]["notRun"]
        pod_files, container_files = shown["cgroups"]
        assert pod_files["level"] == "pod" and pod_files["dir"].endswith(f"pod{uid}")
        assert container_files["dir"].endswith(cid) and container_files["values"]["cpu.shares"] == "512"
        assert pod_files["values"]["cpu.cfs_quota_us"] == "150000"
        names = [row["name"] for row in shown["strategies"]]
        assert names == ["cpusuppress", "cpuburst", "resctrl"]  # the default gates

        done = explain(stack, "default/be-explained")
        assert done.returncode == 0, done.stderr
        text = done.stdout
        assert text.startswith(f"Pod default/be-explained (uid {uid}) on node fault-node\n")
        assert "  container job: PreCreateContainer via hookserver at " in text
        assert "    batchresource      cpu_shares=512, cfs_quota_us=150000, memory_limit_bytes=100663296" in text
        assert "    cpu.shares = 512" in text and "Next to act on this pod: " in text
        assert json.loads(explain(stack, "default/be-explained", "--json").stdout)["pod"]["uid"] == uid
    finally:
        pods.cleanup()


def test_nodeslo_shows_the_file_in_effect_and_a_refused_one(stack: Stack) -> None:
    base = f"http://127.0.0.1:{stack.koordlet.port}"
    slo = stack.state / "slo.yaml"
    shown = json.loads(http_get(f"{base}/debug/nodeslo"))
    assert shown["source"]["source"] == "defaults" and shown["source"]["detail"] == f"no file at {slo}"
    slo.write_text("resourceUsedThresholdWithBE: {enable: true, cpuSuppressThresholdPercent: 40}\n")
    shown = wait_for(lambda: (lambda got: got if got["source"]["source"] == "file" else None)(
        json.loads(http_get(f"{base}/debug/nodeslo"))), 10.0, 0.1)
    assert shown and shown["source"]["path"] == str(slo) and shown["source"]["detail"].startswith("sha256 ")
    assert shown["spec"]["resourceUsedThresholdWithBE"] == {
        "enable": True, "cpuSuppressThresholdPercent": 40, "cpuSuppressPolicy": "cpuset",
        "memoryEvictThresholdPercent": 70, "cpuEvictBEUsageThresholdPercent": 90,
        "cpuEvictPolicy": "evictByRealLimit"}
    slo.write_text("resourceUsedThresholdWithBE: {cpuSuppressThresholdPercent: 400}\n")
    refused = wait_for(lambda: json.loads(http_get(f"{base}/debug/nodeslo"))["lastRejected"], 10.0, 0.1)
    assert refused and "cpuSuppressThresholdPercent: 400 is above the maximum 100" in refused["reason"]
    still = json.loads(http_get(f"{base}/debug/nodeslo"))
    assert still["spec"]["resourceUsedThresholdWithBE"]["cpuSuppressThresholdPercent"] == 40  # the last good one


def test_explain_says_what_went_wrong(stack: Stack, tmp_path: Path) -> None:
    done = explain(stack, "default/not-here")
    assert done.returncode == 1 and "404 pod default/not-here is not on node fault-node" in done.stderr
    done = subprocess.run([KOORDLET, "explain", "default/x", "--server", "http://127.0.0.1:1"], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 1 and "cannot reach koordlet at http://127.0.0.1:1" in done.stderr
    done = subprocess.run([KOORDLET, "explain", "no-slash"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "NAMESPACE/NAME" in done.stderr


def _get(url: str) -> str:
    """The body, or "" while the pod is not listed yet (404) or the agent is busy."""
    try:
        return http_get(url)
    except OSError:
        return ""
