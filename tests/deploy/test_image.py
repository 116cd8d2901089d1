"""The koordlet-py image (Containerfile, `make image`), run the way the DaemonSet runs it.

The image is built here with no registry (scripts/build-image.sh), imported into the project's containerd
and started as the chart's DaemonSet pod would be: the host paths its manifest mounts, host PID and network,
privileged, ``NODE_NAME`` from the node, the service account's token and CA, and the in-cluster API server
address. The API server is the project's own with the chart's RBAC applied, and kubelet's /pods the project's
kubelet: both authorize the service account's token as real ones do (tests/support/apiserver.py, kubelet.py). The
containerised koordlet must answer /healthz on the node's address, sync its pods, write its NodeMetric and make its
NodeResourceTopology with nothing refused, serve its hook socket on the host path and register it, and a BE pod
started through koord-runtime-proxy on the host then gets its hook values.
"""

from __future__ import annotations

import functools
import json
import os
import re
import subprocess
import tarfile
import tomllib
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.deploy.deploy_paths import service_account_volume
from tests.deploy.tools import ROOT, chart_documents
from tests.support.apiserver import ApiServer, create_objects
from tests.support.containerd import CGROUP_ROOT
from tests.support.cri import CriClient, PodFactory, container_config, sandbox_config
from tests.support.kubelet import Kubelet
from tests.support.proxy import ProxyProcess, free_port
from tests.support.waiting import wait_for
from wire import cri_pb2 as cri

# serial: the image build writes out/image, and the DaemonSet test takes its real host paths (and so does
# test_koordinator_chart.py's image test, in the same serial session).
# timeout: the first test builds the image (scripts/build-image.sh), minutes on a fresh clone beside the parallel stage.
pytestmark = [pytest.mark.containerd, pytest.mark.serial, pytest.mark.timeout(900)]

VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
IMAGE = f"koordlet-py:{VERSION}"
NODE = "image-test-node"
# The host paths the DaemonSet mounts that are not kernel roots: the test makes them and removes them after.
HOST_DIRS = ("/var/run/koordlet", "/etc/runtime/hookserver.d")
SPEC = {"containers": {"job": {"requests": {"kubernetes.io/batch-cpu": "500", "kubernetes.io/batch-memory": "64Mi"},
                               "limits": {"kubernetes.io/batch-cpu": "1500", "kubernetes.io/batch-memory": "96Mi"}}}}


@pytest.fixture(scope="module")
def image_archive() -> Path:
    return build_image_archive()


@functools.cache
def build_image_archive() -> Path:
    """`make image`: the OCI archive of koordlet-py:<version> (KOORDLET_IMAGE_ARCHIVE: one built already). Built once
    per test session: this module's tests and test_koordinator_chart.py's image test take the same archive of the
    same tree."""
    if os.environ.get("KOORDLET_IMAGE_ARCHIVE"):
        return Path(os.environ["KOORDLET_IMAGE_ARCHIVE"])
    done = subprocess.run(["bash", str(ROOT / "scripts" / "build-image.sh")], capture_output=True, text=True,
                          timeout=1200)
    assert done.returncode == 0, f"scripts/build-image.sh failed:\n{done.stderr[-4000:]}"
    return Path(done.stdout.strip().splitlines()[-1])


def _oci_config(archive: Path) -> dict[str, Any]:
    with tarfile.open(archive) as tar:
        def blob(digest: str) -> dict[str, Any]:
            return json.load(tar.extractfile("blobs/sha256/" + digest.split(":", 1)[1]))  # type: ignore[arg-type]

        index = json.load(tar.extractfile("index.json"))  # type: ignore[arg-type]
        manifest = blob(index["manifests"][0]["digest"])
        return blob(manifest["config"]["digest"])


def test_the_image_carries_oci_labels_and_runs_koordlet(image_archive: Path) -> None:
    config = _oci_config(image_archive)
    labels = config["config"]["Labels"]
    assert labels["org.opencontainers.image.version"] == VERSION
    assert labels["org.opencontainers.image.title"] == "koordlet-py"
    assert labels["org.opencontainers.image.revision"] and labels["org.opencontainers.image.source"]
    assert config["config"]["Entrypoint"] == ["/opt/koordlet-py/bin/koordlet"]
    assert "/opt/koordlet-py/bin" in next(e for e in config["config"]["Env"] if e.startswith("PATH="))
    with tarfile.open(image_archive) as tar:
        index = json.load(tar.extractfile("index.json"))  # type: ignore[arg-type]
    # Named as the CRI resolves the DaemonSet's `koordlet-py:<version>`, so an imported archive is found.
    assert index["manifests"][0]["annotations"]["org.opencontainers.image.ref.name"] == \
        f"docker.io/library/koordlet-py:{VERSION}"


def _koordlet_pod(docs: list[dict[str, Any]], api_port: int, service_account: Path, log_dir: Path,
                  ) -> tuple[cri.PodSandboxConfig, cri.ContainerConfig]:
    """The CRI requests kubelet would send for the chart's DaemonSet pod on this node."""
    [daemonset] = [d for d in docs if d["kind"] == "DaemonSet"]
    template = daemonset["spec"]["template"]
    spec = template["spec"]
    [container] = spec["containers"]
    uid = str(uuid.uuid4())
    host = cri.NamespaceOption(network=cri.NODE if spec["hostNetwork"] else cri.POD,
                               pid=cri.NODE if spec["hostPID"] else cri.CONTAINER, ipc=cri.POD)
    privileged = bool(container["securityContext"]["privileged"])
    sandbox = cri.PodSandboxConfig(
        metadata=cri.PodSandboxMetadata(name=f"koordlet-{uid[:5]}", uid=uid,
                                        namespace=daemonset["metadata"]["namespace"]),
        labels=template["metadata"]["labels"], log_directory=str(log_dir),
        linux=cri.LinuxPodSandboxConfig(
            cgroup_parent=f"{CGROUP_ROOT}/kubepods/burstable/pod{uid}",
            security_context=cri.LinuxSandboxSecurityContext(namespace_options=host, privileged=privileged)))
    volumes = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"]}
    mounts = [cri.Mount(container_path=m["mountPath"], host_path=volumes[m["name"]], readonly=m.get("readOnly", False))
              for m in container["volumeMounts"]]
    mounts.append(cri.Mount(container_path="/var/run/secrets/kubernetes.io/serviceaccount",
                            host_path=str(service_account), readonly=True))
    field_values = {"spec.nodeName": NODE}
    envs = {e["name"]: e["value"] if "value" in e else field_values[e["valueFrom"]["fieldRef"]["fieldPath"]]
            for e in container["env"]}
    # What kubelet adds to every container: the in-cluster API server address.
    envs |= {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": str(api_port)}
    config = cri.ContainerConfig(
        metadata=cri.ContainerMetadata(name=container["name"]),
        image=cri.ImageSpec(image=container["image"]),
        command=container["command"], args=container["args"],
        envs=[cri.KeyValue(key=k, value=v.encode()) for k, v in envs.items()],
        mounts=mounts, log_path="koordlet.log",
        linux=cri.LinuxContainerConfig(
            resources=cri.LinuxContainerResources(cpu_shares=51, memory_limit_in_bytes=256 << 20),
            security_context=cri.LinuxContainerSecurityContext(privileged=privileged, namespace_options=host)))
    return sandbox, config


def _http_get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=2) as response:  # noqa: S310 (loopback)
        return response.read().decode()


def _own_pod() -> dict[str, Any]:
    """The koordlet's DaemonSet pod as kubelet's /pods lists it."""
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "koordlet-py-test", "namespace": "koordinator-system", "uid": str(uuid.uuid4()),
                         "labels": {"app.kubernetes.io/name": "koordlet-py"}},
            "spec": {"nodeName": NODE, "hostNetwork": True,
                     "containers": [{"name": "koordlet", "image": "koordlet-py:test",
                                     "resources": {"requests": {"cpu": "100m", "memory": "256Mi"},
                                                   "limits": {"cpu": "1", "memory": "1Gi"}}}]},
            "status": {"phase": "Running", "qosClass": "Burstable"}}


def _healthy(port: int) -> bool:
    try:
        return _http_get(f"http://127.0.0.1:{port}/healthz").strip() == "ok"
    except OSError:
        return False


@pytest.fixture
def host_dirs() -> Iterator[None]:
    """The DaemonSet's own host paths, made for the test and removed after; refuses to touch a node's own."""
    made: list[str] = []
    for path in HOST_DIRS:
        if os.path.exists(path) and os.listdir(path):
            pytest.fail(f"{path} exists and is not empty: this machine runs a koordlet or a proxy of its own; "
                        "the image test uses the DaemonSet's real host paths and will not touch them")
        missing = path
        while not os.path.exists(missing):  # every dir this test makes, parents included
            made.append(missing)
            missing = os.path.dirname(missing)
        os.makedirs(path, exist_ok=True)
    try:
        yield
    finally:
        for path in reversed(HOST_DIRS):
            for entry in os.listdir(path) if os.path.isdir(path) else []:
                os.unlink(os.path.join(path, entry))
        for path in sorted(made, key=len, reverse=True):
            os.rmdir(path)


def _import(containerd_socket: str, archive: Path) -> None:
    done = subprocess.run(["ctr", "--address", containerd_socket, "--namespace", "k8s.io", "images", "import",
                           str(archive)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr


@pytest.mark.owns_node_paths
def test_the_containerised_koordlet_serves_health_and_hooks_on_the_host_paths(
        image_archive: Path, containerd_socket: str, host_dirs: None, tmp_path: Path) -> None:
    _import(containerd_socket, image_archive)
    metrics_port = free_port()
    # Our chart alone has no koord-manager to make the NodeMetric: koordlet makes it (the role's create), and reports
    # soon rather than after the default minute.
    docs = chart_documents("--set", f"koordlet.metrics.port={metrics_port}", "--set",
                           f"koordlet.extraArgs={{-kubelet-cgroup-root={CGROUP_ROOT},-create-node-metric,"
                           "-report-interval=5s}")
    # A real kubelet lists at least the koordlet's own DaemonSet pod; an empty list is what a restarting kubelet
    # answers, and the states informer (as Koordinator's) does not count it as a sync, so /healthz stays unready.
    payload = {"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": [_own_pod()]}
    runtime = CriClient(containerd_socket)
    koordlet_pods = PodFactory(runtime)
    proxy = None
    try:
        with ApiServer() as api, Kubelet(api, NODE, payload) as kubelet:
            create_objects(api, [d for d in docs if d["kind"] in ("ServiceAccount", "ClusterRole",
                                                                  "ClusterRoleBinding")])
            [account] = [d for d in docs if d["kind"] == "ServiceAccount"]
            service_account = service_account_volume(api, account["metadata"]["namespace"],
                                                      account["metadata"]["name"], tmp_path / "serviceaccount")
            api.seed(kubelet.node_object())
            api_port = int(api.url.rsplit(":", 1)[1])
            sandbox, config = _koordlet_pod(docs, api_port, service_account, tmp_path / "logs")
            sid = koordlet_pods.run_pod(sandbox)
            cid = koordlet_pods.create_container(sid, sandbox, config)
            runtime.runtime.StartContainer(cri.StartContainerRequest(container_id=cid), timeout=60)
            logs = lambda: _container_log(runtime, cid)  # noqa: E731
            assert wait_for(lambda: _healthy(metrics_port), 120), f"no /healthz from the container:\n{logs()}"
            sock = Path("/var/run/koordlet/koordlet.sock")
            registration = Path("/etc/runtime/hookserver.d/koordlet.json")
            assert wait_for(lambda: sock.is_socket() and registration.is_file(), 30), logs()
            assert json.loads(registration.read_text())["remote-endpoint"] == str(sock)
            user = "system:serviceaccount:koordinator-system:koordlet-py"
            assert any(r.verb == "GET" and r.path.startswith("/api/v1/nodes") and r.user == user
                       for r in api.requests()), "koordlet never reached the API server with its service account"
            assert wait_for(lambda: kubelet.requests, 30), f"koordlet never asked kubelet for /pods:\n{logs()}"
            assert (kubelet.requests[0].user, kubelet.requests[0].status) == (user, 200)
            assert kubelet.authorizations[0] == f"Bearer {(service_account / 'token').read_text()}"
            assert wait_for(lambda: ((api.get_object("nodemetrics", NODE) or {}).get("status") or {})
                            .get("nodeMetric"), 60), logs()
            assert wait_for(lambda: api.get_object("noderesourcetopologies", NODE), 60), logs()
            assert [(r.verb, r.path) for r in api.requests() if r.status in (401, 403)] == []
            assert kubelet.refusals() == [] and re.search(r"\((401|403)\)|HTTP 40[13]", logs()) is None, logs()

            proxy = ProxyProcess(str(tmp_path / "proxy.sock"), containerd_socket, "--runtime-hook-config-dir",
                                 str(registration.parent), state_dir=str(tmp_path)).start()
            _be_pod_gets_its_hook_values(proxy.listen)
    finally:
        if proxy is not None:
            proxy.terminate()
        koordlet_pods.cleanup()
        runtime.close()


def _container_log(runtime: CriClient, cid: str) -> str:
    try:
        status = runtime.runtime.ContainerStatus(cri.ContainerStatusRequest(container_id=cid), timeout=10)
        return Path(status.status.log_path).read_text()[-3000:] if status.status.log_path else "(no log path)"
    except Exception as exc:  # noqa: BLE001 (diagnostics only)
        return f"(no log: {exc})"


def _be_pod_gets_its_hook_values(proxy_socket: str) -> None:
    client = CriClient(proxy_socket)
    try:
        be_pod_gets_its_batch_values(client)
    finally:
        client.close()


def be_pod_gets_its_batch_values(client: CriClient) -> None:
    """A BE pod made through ``client`` (the proxy, or containerd with NRI) gets its batch values from koordlet."""
    pods = PodFactory(client)
    try:
        sandbox = sandbox_config("job", labels={"koordinator.sh/qosClass": "BE"},
                                 annotations={"node.koordinator.sh/extended-resource-spec": json.dumps(SPEC)})
        sid = pods.run_pod(sandbox)
        cid = pods.create_container(sid, sandbox, container_config("job"))
        client.runtime.StartContainer(cri.StartContainerRequest(container_id=cid), timeout=60)
        cgroup = Path("/sys/fs/cgroup/cpu") / sandbox.linux.cgroup_parent.lstrip("/") / cid
        memory = Path("/sys/fs/cgroup/memory") / sandbox.linux.cgroup_parent.lstrip("/") / cid
        # batch-cpu 1500 milli -> quota 150000 µs a 100 ms period; batch-memory 96Mi; BE shares from 500 milli.
        assert (cgroup / "cpu.cfs_quota_us").read_text().strip() == "150000"
        assert (cgroup / "cpu.shares").read_text().strip() == "512"
        assert (memory / "memory.limit_in_bytes").read_text().strip() == str(96 << 20)
    finally:
        pods.cleanup()
