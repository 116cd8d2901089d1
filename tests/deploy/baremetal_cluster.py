"""A cluster for a bare-metal node to join, and koordlet run from what the installer wrote.

:func:`bare_metal_cluster` starts the project's authorizing API server (tests/support/apiserver.py) with the CRDs
(deploy/crds/), the node's kubelet (tests/support/kubelet.py: TokenReview and SubjectAccessReview against that server),
the Node kubelet registered, the NodeMetric koord-manager makes for it, and the operator's credentials: kubeadm's
admin.conf (a ``system:masters`` client certificate) and kubectl. `scripts/install-baremetal.sh --admin-kubeconfig`
then makes koordlet's identity there as on a real cluster. The server serves no OpenAPI document (one of its
deviations), which ``kubectl apply`` reads to validate what it sends: the kubectl given to the installer passes
``--validate=false`` to ``apply`` for that reason alone (what deploy/baremetal/ holds is validated against
Kubernetes' schemas by tests/deploy/test_manifests.py).

:func:`installed_koordlet` is koordlet as koordlet.service starts it from the installer's files (the unit's
``Environment=`` and ``/etc/default/koordlet``, its command line ``koordlet $KOORDLET_ARGS``), as a process of this
host (tests/deploy/deploy_paths.HostKoordlet: the host paths it writes moved into a scratch dir), the node paths the
files name read under the installer's ``--root``.
"""

from __future__ import annotations

import shlex
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.deploy.deploy_paths import ClusterNode, DeployPath, HostKoordlet
from tests.deploy.test_systemd import parse_unit, values
from tests.deploy.tools import DEPLOY, documents, kustomization_documents, tool
from tests.support.apiserver import ApiServer, create_objects, write_kubeconfig
from tests.support.kubelet import Kubelet, kubelet_pod_list

NODE = "worker-1"
NAMESPACE, ACCOUNT = "koordinator-system", "koordlet-py-baremetal"
USER = f"system:serviceaccount:{NAMESPACE}:{ACCOUNT}"
# The shortest token the server issues here: the real server's is 10 minutes; a test lives a token's life in seconds.
MIN_TOKEN_S = 10


@dataclass
class Cluster:
    api: ApiServer
    kubelet: Kubelet
    admin_kubeconfig: Path  # kubeadm's /etc/kubernetes/admin.conf: the operator's credentials
    kubectl: Path  # what the installer runs as kubectl (KUBECTL)

    def installer_env(self) -> dict[str, str]:
        return {"KUBECTL": str(self.kubectl)}


def baremetal_documents() -> list[dict[str, Any]]:
    """deploy/baremetal/ as `kubectl apply -k` sends it (kustomize's nameSuffix applied)."""
    done = subprocess.run([tool("kubectl-1.35"), "kustomize", str(DEPLOY / "baremetal")], capture_output=True,
                          text=True, timeout=120, check=True)
    return documents(done.stdout)


@contextmanager
def bare_metal_cluster(tmp_path: Path, host: str = "127.0.0.1", report_interval_s: int = 2) -> Iterator[Cluster]:
    """The cluster (see the module docstring); ``host``: where the server and kubelet listen; ``report_interval_s``:
    the NodeMetric's report interval (koord-manager's default is 60; a test sees several reports in a token's life)."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    kubectl = tmp_path / "kubectl"
    real = tool("kubectl-1.35")
    kubectl.write_text("#!/bin/sh\n# kubectl, with apply's validation off: this test server has no OpenAPI document.\n"
                       f'for word; do [ "$word" = apply ] && exec {real} "$@" --validate=false; done\n'
                       f'exec {real} "$@"\n')
    kubectl.chmod(0o755)
    with ApiServer(crd_dir=None, host=host, min_token_expiration_s=MIN_TOKEN_S) as api:
        create_objects(api, kustomization_documents(DEPLOY / "crds"))
        pods = kubelet_pod_list()
        for pod in pods["items"]:
            pod["spec"]["nodeName"] = NODE
        with Kubelet(api, NODE, pods, host=host) as kubelet:
            api.seed(kubelet.node_object({"capacity": {"cpu": "4", "memory": "8Gi"},
                                          "allocatable": {"cpu": "4", "memory": "8Gi"}}))
            api.seed({"apiVersion": "slo.koordinator.sh/v1alpha1", "kind": "NodeMetric", "metadata": {"name": NODE},
                      "spec": {"metricCollectPolicy": {"aggregateDurationSeconds": 60,
                                                       "reportIntervalSeconds": report_interval_s}}})
            admin = write_kubeconfig(api, tmp_path / "admin.conf")
            yield Cluster(api, kubelet, admin, kubectl)


def unit_environment(root: Path) -> dict[str, str]:
    """koordlet.service's environment as systemd makes it from the installed files: the unit's Environment=, then its
    EnvironmentFile (/etc/default/koordlet), which wins."""
    unit = parse_unit((root / "etc/systemd/system/koordlet.service").read_text())
    env = dict(word.split("=", 1) for value in values(unit, "Service", "Environment") for word in shlex.split(value))
    for name in values(unit, "Service", "EnvironmentFile"):
        path = root / name.lstrip("-/")
        for line in path.read_text().splitlines() if path.exists() else ():
            if line and not line.startswith("#") and "=" in line:
                key, _, value = line.partition("=")
                env[key] = " ".join(shlex.split(value))
    return env


def _under(root: Path, text: str) -> str:
    """``text`` with the node paths the installer writes koordlet's identity to read under ``root``."""
    for node_path in ("/etc/koordlet/", "/var/lib/koordlet/"):
        text = text.replace(node_path, f"{root}{node_path}")
    return text


def installed_koordlet(cluster: Cluster, root: Path, state: Path) -> HostKoordlet:
    """koordlet as koordlet.service runs it from ``root``'s files (see the module docstring); not started."""
    env = unit_environment(root)
    assert env["agent_mode"] == "hostMode" and env["KUBECONFIG"] == "/etc/koordlet/kubeconfig", env
    kubeconfig = root / "etc/koordlet/kubeconfig"
    mapped = state / "kubeconfig"
    state.mkdir(parents=True, exist_ok=True)
    mapped.write_text(_under(root, kubeconfig.read_text()))
    args = [_under(root, arg) for arg in shlex.split(env.get("KOORDLET_ARGS", ""))]
    container = {"name": "koordlet", "image": "koordlet.service", "args": args,
                 "env": [{"name": key, "value": env[key]} for key in ("NODE_NAME", "agent_mode") if key in env]}
    unit_as_pod = {"metadata": {"name": "koordlet", "namespace": NAMESPACE},
                   "spec": {"template": {"metadata": {"labels": {}},
                                         "spec": {"serviceAccountName": ACCOUNT, "containers": [container]}}}}
    path = DeployPath("bare metal (koordlet.service)", tuple(baremetal_documents()), unit_as_pod, manager=True)
    node = ClusterNode(path, cluster.api, cluster.kubelet, root / "var/lib/koordlet/token", mapped, USER)
    return HostKoordlet(node, state)
