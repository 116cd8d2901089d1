"""The node stack as operators run it, for fault tests and the soak bench: a real koordlet process (local
mode, serving the runtime hooks) and a real proxy process in front of a containerd, both stopped by PID.

``lifecycle`` runs one BE pod through the proxy (sandbox, container, start, stop, remove); ``figures`` reads
each process's open fds and RSS and the proxy's store size.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from tests.support.containerd import CGROUP_ROOT, REPO
from tests.support.cri import CriClient, PodFactory, container_config, sandbox_config
from tests.support.proxy import ProxyProcess, free_port, wait_for_socket
from wire import cri_pb2 as cri

SPEC = {"containers": {"job": {"requests": {"kubernetes.io/batch-cpu": "500", "kubernetes.io/batch-memory": "64Mi"},
                               "limits": {"kubernetes.io/batch-cpu": "1500", "kubernetes.io/batch-memory": "96Mi"}}}}
BE_ANNOTATIONS = {"node.koordinator.sh/extended-resource-spec": json.dumps(SPEC)}
BE_LABELS = {"koordinator.sh/qosClass": "BE"}
CGROUP_V1 = Path("/sys/fs/cgroup")
NODE = "fault-node"


def http_get(url: str, timeout_s: float = 2.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout_s) as response:
        return response.read().decode()


class KoordletProcess:
    """``python -m koordlet.main`` in local mode, serving the runtime hooks on ``hook_socket``."""

    def __init__(self, state: Path, cri_socket: str, hook_dir: str) -> None:
        self.state = state
        self.port = free_port()
        self.hook_socket = str(state / "koordlet.sock")
        self.log_path = state / "koordlet.log"
        (state / "reports").mkdir(exist_ok=True)
        self.args = [
            sys.executable, "-m", "koordlet.main", "-local-mode",
            f"-node-slo-file={state / 'slo.yaml'}", f"-cri-endpoint={cri_socket}", f"-report-dir={state / 'reports'}",
            "-cgroup-root-dir=/sys/fs/cgroup/", f"-kubelet-cgroup-root={CGROUP_ROOT}", "-sys-root-dir=/sys/",
            f"-addr=127.0.0.1:{self.port}", "-kubelet-sync-interval=1s",
            f"-runtime-hooks-config-path={hook_dir}", f"-runtime-hooks-addr={self.hook_socket}",
            f"-runtime-hooks-host-endpoint={self.hook_socket}", "-runtime-hooks-reconcile-interval=2s",
            f"-var-lib-kubelet-dir={state / 'kubelet'}",
            f"-prediction-checkpoint-filepath={state / 'prediction'}",
            f"-system-config-record-file={state / 'system-config-originals.json'}",
        ]
        self.proc: subprocess.Popen | None = None

    def start(self, timeout_s: float = 30.0) -> KoordletProcess:
        env = {**os.environ, "NODE_NAME": NODE, "PYTHONPATH": str(REPO)}
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(self.args, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("koordlet exited:\n" + self.log_path.read_text(errors="replace")[-3000:])
            try:
                if "ok" in http_get(f"http://127.0.0.1:{self.port}/healthz"):
                    wait_for_socket(self.hook_socket, max(1.0, deadline - time.monotonic()), self.proc)
                    return self
            except OSError:
                pass
            time.sleep(0.2)
        self.kill()
        raise RuntimeError("koordlet did not become healthy:\n" + self.log_path.read_text(errors="replace")[-3000:])

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.kill()


def fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS:")) / 1024


@dataclass
class Figures:
    proxy_fds: int
    proxy_rss_mib: float
    proxy_store: int
    koordlet_fds: int
    koordlet_rss_mib: float

    def line(self) -> str:
        return (f"proxy: {self.proxy_fds} fds, {self.proxy_rss_mib:.1f} MiB, store {self.proxy_store} | "
                f"koordlet: {self.koordlet_fds} fds, {self.koordlet_rss_mib:.1f} MiB")


class Stack:
    """koordlet + proxy in front of ``containerd_socket``; ``client`` talks to the proxy like kubelet."""

    def __init__(self, state: Path, containerd_socket: str) -> None:
        self.state = state
        self.containerd_socket = containerd_socket
        self.proxy = ProxyProcess(str(state / "proxy.sock"), containerd_socket, state_dir=str(state))
        self.koordlet = KoordletProcess(state, containerd_socket, self.proxy.hook_dir)
        self.client: CriClient | None = None

    def start(self) -> Stack:
        os.makedirs(self.proxy.hook_dir, exist_ok=True)
        self.koordlet.start()
        self.proxy.start()
        self.client = CriClient(self.proxy.listen)
        return self

    def stop(self) -> None:
        if self.client is not None:
            self.client.close()
        if self.proxy.proc is not None:
            self.proxy.terminate()
        self.koordlet.stop()

    def store_entries(self) -> int:
        text = http_get(f"http://127.0.0.1:{self.proxy.metrics_port}/metrics")
        return int(sum(float(line.split()[-1]) for line in text.splitlines()
                       if line.startswith("koord_runtimeproxy_store_entries{")))

    def figures(self) -> Figures:
        assert self.proxy.proc is not None and self.koordlet.proc is not None
        return Figures(fds(self.proxy.proc.pid), rss_mib(self.proxy.proc.pid), self.store_entries(),
                       fds(self.koordlet.proc.pid), rss_mib(self.koordlet.proc.pid))

    def run_be_pod(self, pods: PodFactory, name: str) -> tuple[cri.PodSandboxConfig, str, str]:
        """A BE pod and its started container, through the proxy: (sandbox config, sandbox id, container id)."""
        sandbox = sandbox_config(name, labels=BE_LABELS, annotations=BE_ANNOTATIONS)
        sid = pods.run_pod(sandbox)
        cid = pods.create_container(sid, sandbox, container_config("job"))
        pods.client.runtime.StartContainer(cri.StartContainerRequest(container_id=cid), timeout=60)
        return sandbox, sid, cid

    def lifecycle(self, index: int) -> None:
        """One whole pod life through the proxy, as kubelet runs it, removed at the end."""
        assert self.client is not None
        pods = PodFactory(self.client)
        try:
            _, sid, cid = self.run_be_pod(pods, f"soak-{index}")
            rt = self.client.runtime
            rt.StopContainer(cri.StopContainerRequest(container_id=cid, timeout=5), timeout=60)
            rt.RemoveContainer(cri.RemoveContainerRequest(container_id=cid), timeout=60)
            pods.containers.remove(cid)
            rt.StopPodSandbox(cri.StopPodSandboxRequest(pod_sandbox_id=sid), timeout=60)
            rt.RemovePodSandbox(cri.RemovePodSandboxRequest(pod_sandbox_id=sid), timeout=60)
            pods.sandboxes.remove(sid)
        finally:
            pods.cleanup()


def container_value(sandbox: cri.PodSandboxConfig, container_id: str, controller: str, name: str) -> str:
    path = CGROUP_V1 / controller / sandbox.linux.cgroup_parent.lstrip("/") / container_id / name
    return path.read_text().strip()
