"""`make demo`'s program runs end to end, tells its story, and cleans up after itself."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests.support.containerd import REPO


# alone: its CPU suppression has something to show only when the node has a core to spare (the threshold sits a core
# above what the rest of the node uses), and it runs in the demo's fixed dirs (/run/koordlet-py/demo).
@pytest.mark.alone
@pytest.mark.skipif(os.geteuid() != 0, reason="the demo needs root")
def test_demo_runs_and_stops_everything() -> None:
    out = subprocess.run([sys.executable, "-m", "demo"], cwd=REPO, capture_output=True, text=True, timeout=300,
                         check=False)
    text = out.stdout
    assert out.returncode == 0, text[-3000:] + out.stderr[-3000:]
    assert "koordlet_node_used_cpu_cores" in text
    assert re.search(r"zone node-0 \(Node\): cpu \d+, memory \d+", text), text[:4000]
    assert "node.koordinator.sh/cpu-shared-pools: [{" in text, text[:4000]
    assert re.search(r"pod default/batch-job: qos BE, priority koord-batch", text)
    busy = [int(q) for q in re.findall(r"LS busy +\d s: besteffort quota (-?\d+)", text)]
    idle_before = int(re.search(r"LS idle: +besteffort quota (-?\d+)", text).group(1))
    assert busy and 0 < min(busy) < idle_before, "BE quota did not shrink under LS load:\n" + text[-4000:]
    assert "BE container stopped" in text and "evicted default/batch-job (BEMemoryEvict)" in text, text[-4000:]
    assert "the LS pod is untouched: CONTAINER_RUNNING" in text
    # koordlet explain of the BE pod: the hook plugins' answers and the suppress strategy's last write on its QoS dir
    assert re.search(r"Pod default/batch-job \(uid [0-9a-f-]+\) on node demo-node", text), text[-6000:]
    assert "batchresource      cpu_shares=512" in text and "cpusuppress: cpu.cfs_quota_us = " in text, text[-6000:]
    assert "device plugin registered with kubelet as nvidia.com/gpu (fake NVML: 2 GPUs)" in text, text[:4000]
    assert len(re.findall(r"GPU-[0-9a-f-]+ Healthy", text)) == 2, text[:4000]
    assert "kubelet restarted (kubelet.sock re-created): device plugin registered again" in text, text[:4000]
    assert not os.path.exists("/run/koordlet-py/demo/containerd/containerd.pid")
