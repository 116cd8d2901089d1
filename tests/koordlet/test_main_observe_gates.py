"""The agent process with every gate of issue 28 on, in local mode against the project's containerd: it starts
and stops cleanly, names none of them as inert, serves ``/events`` (audited hook writes) and the per-CPU
gauges, the pod-resources proxy socket and Terway's files, and says once for each collector this machine
cannot feed (no PMU, no resctrl, neither kidled nor the page-idle bitmap, no RDMA device)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.koordlet import test_main
from tests.koordlet.test_main import NODE, REPO, _needs_cgroup_v1, _tail, free_port, get
from tests.support.containerd import CGROUP_ROOT
from tests.support.cri import PodFactory
from tests.support.waiting import wait_for

GATES = ("AuditEvents", "AuditEventsHTTPHandler", "CPICollector", "Libpfm4", "ResctrlCollector", "PerCPUMetric",
         "HugePageReport", "ColdPageCollector", "RDMADevices", "RDMADeviceInject", "PodResourcesProxy",
         "HamiCoreVGPUMonitor", "TerwayQoS")
SPEC = {"containers": {"job": {"requests": {"kubernetes.io/batch-cpu": "500", "kubernetes.io/batch-memory": "64Mi"},
                               "limits": {"kubernetes.io/batch-cpu": "1500",
                                          "kubernetes.io/batch-memory": "96Mi"}}}}


pods = test_main.pods  # the fixture: pods through the project's containerd, removed after


@pytest.mark.containerd
@pytest.mark.cgroupv1
def test_the_agent_runs_every_gate_of_issue_28(containerd_socket: str, pods: PodFactory, tmp_path: Path) -> None:
    _needs_cgroup_v1()
    pods.start_pod("job", labels={"koordinator.sh/qosClass": "BE"},
                   annotations={"node.koordinator.sh/extended-resource-spec": json.dumps(SPEC)})
    slo = tmp_path / "nodeslo.yaml"
    slo.write_text("resourceQOSStrategy: {policies: {netQOSPolicy: terway-qos}}\n")
    port = free_port()
    argv = [
        sys.executable, "-m", "koordlet.main", "-local-mode", f"-node-slo-file={slo}",
        f"-cri-endpoint={containerd_socket}", f"-report-dir={tmp_path / 'reports'}",
        "-cgroup-root-dir=/sys/fs/cgroup/", f"-kubelet-cgroup-root={CGROUP_ROOT}", f"-addr=127.0.0.1:{port}",
        "-kubelet-sync-interval=1s", "-sys-root-dir=/sys/", f"-sys-fs-root-dir={tmp_path / 'sysfs'}",
        f"-runtime-hooks-config-path={tmp_path / 'hookserver.d'}",
        f"-runtime-hooks-addr={tmp_path / 'koordlet.sock'}", f"-runtime-hooks-host-endpoint={tmp_path / 'k.sock'}",
        "-runtime-hooks-reconcile-interval=1s", f"-audit-log-dir={tmp_path / 'audit'}",
        f"-pod-resources-proxy-path={tmp_path / 'pod-resources'}", f"-terway-qos-dir={tmp_path / 'terway'}",
        f"-var-lib-kubelet-dir={tmp_path / 'kubelet'}", "-enable-resctrl-collector",
        "-feature-gates=" + ",".join(f"{gate}=true" for gate in GATES),
    ]
    env = {**os.environ, "NODE_NAME": NODE, "PYTHONPATH": str(REPO)}
    log = (tmp_path / "koordlet.log").open("w+")
    proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        base = f"http://127.0.0.1:{port}"
        assert wait_for(lambda: get(base + "/healthz")[0] == 200, 20.0, 0.2), _tail(log)
        per_cpu = wait_for(lambda: "koordlet_node_used_cpu_cores_per_cpu{" in get(base + "/metrics")[1], 20.0, 0.2)
        assert per_cpu, _tail(log)

        def audited() -> list[dict]:
            status, body = get(base + "/events?pod=default/job")
            return [json.loads(line) for line in body.splitlines()] if status == 200 else []

        events = wait_for(audited, 20.0, 0.2)  # the reconciler's batch-resource writes on the BE pod
        assert events, _tail(log)
        assert all(e["type"] == "pod" and e["name"] == "job" for e in events)
        assert any(e["message"].startswith("cpu.shares of ") and " by reconciler" in e["message"] for e in events)
        assert (tmp_path / "pod-resources" / "kubelet.sock").is_socket()
        assert wait_for(lambda: (tmp_path / "terway" / "pod.json").exists(), 20.0, 0.2), _tail(log)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0, _tail(log)
        text = _tail(log, 200_000)
        assert "Traceback" not in text
        assert "feature gates on but not implemented" not in text
        for said in ("CPI collector off: the kernel lacks the cycles counter",
                     "resctrl collector off:", "cold page collector off:", "RDMA devices: none on this node"):
            assert text.count(said) == 1, (said, text[-3000:])
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        log.close()
