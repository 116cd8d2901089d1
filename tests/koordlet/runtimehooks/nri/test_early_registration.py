"""koordlet registers with NRI before its states informer has the pod list, and a pod created meanwhile gets its
values from what the NRI request carries (issue 32: Koordinator's args and its koordlet's service account and role,
the project's API server and kubelet, which authorize that account's token; the kubelet answered an empty pod list,
which koordlet, like Koordinator,
takes for a kubelet that is restarting, so the sync waited out its 60 s bound, and only then did NRI register).

The koordlet process reaches containerd's NRI socket through a read-only bind mount of its dir, as under
Koordinator's chart (``/host-var-run/`` is mounted read-only): connecting to a socket needs no write access to
the filesystem it is on.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.deploy.deploy_paths import koordinators_chart
from tests.deploy.koordinator_v1_8_0 import DAEMONSET_POD
from tests.support.apiserver import ApiServer, Credentials, create_objects, write_kubeconfig
from tests.support.containerd import CGROUP_ROOT
from tests.support.cri import CriClient, PodFactory
from tests.support.kubelet import Kubelet, kubelet_pod_list
from tests.support.nri import NriContainerd, clean_up_dead_instances
from tests.support.proxy import free_port
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.containerd, pytest.mark.cgroupv1]

REPO = Path(__file__).resolve().parents[4]
NODE = "early-node"
SPEC = {"containers": {"job": {"requests": {"kubernetes.io/batch-cpu": "500", "kubernetes.io/batch-memory": "64Mi"},
                               "limits": {"kubernetes.io/batch-cpu": "1500", "kubernetes.io/batch-memory": "96Mi"}}}}
# Koordinator v1.8.0's chart args but the klog flags, as the issue ran them; the paths below are made to fit a
# koordlet on this host (its DaemonSet mounts are tests/deploy/test_koordinator_chart.py's business).
CHART_ARGS = [a for a in DAEMONSET_POD["spec"]["containers"][0]["args"] if not a.startswith(("--v=", "--logtostderr"))]


@pytest.fixture(scope="module")
def runtime() -> Iterator[NriContainerd]:
    if os.geteuid() != 0 or not shutil.which("runc") or not Path("/sys/fs/cgroup/cpu").is_dir():
        pytest.skip("needs root, runc and cgroup v1 to run containerd")
    clean_up_dead_instances()
    instance = NriContainerd.for_process("2.1", instance="early").up()
    try:
        yield instance
    finally:
        instance.down()


@pytest.fixture
def read_only_var_run(runtime: NriContainerd, tmp_path: Path) -> Iterator[str]:
    """``runtime``'s var-run dir bind-mounted read-only, as Koordinator's chart mounts /var/run at /host-var-run/."""
    target = tmp_path / "host-var-run"
    target.mkdir()
    subprocess.run(["mount", "--bind", runtime.var_run_dir, str(target)], check=True, timeout=30)
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(target)], check=True, timeout=30)
        with pytest.raises(OSError):
            (target / "probe").write_text("x")  # really read-only
        yield str(target) + "/"
    finally:
        subprocess.run(["umount", str(target)], check=False, timeout=30)


def test_nri_registers_and_serves_a_be_pod_while_the_pod_list_is_not_there(
        runtime: NriContainerd, read_only_var_run: str, tmp_path: Path) -> None:
    client = CriClient(runtime.socket)
    pods = PodFactory(client)
    log_path = tmp_path / "koordlet.log"
    proc = None
    try:
        with ApiServer() as api, Kubelet(api, NODE, {"kind": "PodList", "apiVersion": "v1", "metadata": {},
                                                     "items": []}) as kubelet:
            koordinator = koordinators_chart()
            create_objects(api, koordinator.rbac)
            api.seed(kubelet.node_object())
            namespace, account = koordinator.account
            token = api.service_account_token(namespace, account)
            (tmp_path / "token").write_text(token)
            kubeconfig = write_kubeconfig(api, tmp_path / "kubeconfig", Credentials(account, token=token))
            (tmp_path / "hooks").mkdir()
            args = [sys.executable, "-m", "koordlet.main", *CHART_ARGS,
                    "-cgroup-root-dir=/sys/fs/cgroup/", f"-kubelet-cgroup-root={CGROUP_ROOT}",
                    f"-addr=127.0.0.1:{free_port()}", f"-var-run-root-dir={read_only_var_run}",
                    f"-kubeconfig={kubeconfig}", f"-kubelet-token-file={tmp_path / 'token'}",
                    f"-runtime-hooks-addr={tmp_path / 'koordlet.sock'}",
                    f"-runtime-hooks-config-path={tmp_path / 'hooks'}",
                    f"-prediction-checkpoint-filepath={tmp_path / 'prediction'}",
                    f"-system-config-record-file={tmp_path / 'originals.json'}",
                    f"-var-lib-kubelet-dir={tmp_path / 'kubelet'}", "-runtime-hooks-nri-backoff-duration=200ms"]
            env = {**os.environ, "NODE_NAME": NODE, "agent_mode": "hostMode", "PYTHONPATH": str(REPO)}
            env.pop("KOORDLET_LOG_LEVEL", None)
            started = time.monotonic()
            with open(log_path, "wb") as log:
                proc = subprocess.Popen(args, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
            logs = lambda: log_path.read_text(errors="replace")  # noqa: E731

            assert wait_for(lambda: "NRI: registered as 00-koordlet_nri" in logs(), 10), logs()
            registered_s = time.monotonic() - started
            assert "states informer synced" not in logs()
            assert wait_for(lambda: "empty pod list" in logs(), 10), logs()  # the stall's cause, said, not hidden

            spec = {"node.koordinator.sh/extended-resource-spec": json.dumps(SPEC)}
            _, cid, sandbox = pods.start_pod("job", labels={"koordinator.sh/qosClass": "BE"}, annotations=spec)
            cpu = Path("/sys/fs/cgroup/cpu") / sandbox.linux.cgroup_parent.lstrip("/") / cid
            memory = Path("/sys/fs/cgroup/memory") / sandbox.linux.cgroup_parent.lstrip("/") / cid
            assert (cpu / "cpu.cfs_quota_us").read_text().strip() == "150000"
            assert (cpu / "cpu.shares").read_text().strip() == "512"
            assert (memory / "memory.limit_in_bytes").read_text().strip() == str(96 << 20)
            assert "states informer synced" not in logs()  # all of it before the pod list came

            kubelet.payload = kubelet_pod_list()  # kubelet is up: the sync completes at the next poll
            assert wait_for(lambda: "states informer synced: 2 pods" in logs(), 20), logs()
            print(f"NRI registered {registered_s:.1f} s after the process started, before the states sync")
    finally:
        if proc is not None and proc.poll() is None:
            proc.terminate()
            proc.wait(30)
        pods.cleanup()
        client.close()
