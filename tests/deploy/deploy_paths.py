"""The ways of deploying koordlet on a cluster, each as what it applies, and a node of a cluster to run it on.

A :class:`DeployPath` is what one way ships: the README's commands rendered (Helm for the charts, the kustomizations
as kubectl reads them, Koordinator's chart from the recorded facts of tests/deploy/koordinator_v1_8_0.py), hence
its CRDs, its RBAC and the DaemonSet koordlet runs as.

:func:`cluster_node` makes one node of a cluster for it: the project's API server (tests/support/apiserver.py) with
the path's CRDs and RBAC created by the admin as ``kubectl apply``/``helm install`` would, the node's kubelet
(tests/support/kubelet.py, which asks that server who a caller is and what it may do), the Node, and a token of the
DaemonSet's service account from the TokenRequest API, as kubelet projects one into the pod.
:class:`HostKoordlet` runs koordlet there as a process on this host with the DaemonSet's args, its identity that
token (a kubeconfig, and ``-kubelet-token-file``), and the host paths it writes moved into a scratch dir.
"""

from __future__ import annotations

import copy
import os
import shlex
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.deploy import koordinator_v1_8_0 as koordinator
from tests.deploy.koordinator_crds import crd_documents
from tests.deploy.tools import DEPLOY, ROOT, documents, kustomization_documents, tool
from tests.support.apiserver import ApiServer, Credentials, create_objects, write_kubeconfig
from tests.support.kubelet import Kubelet
from tests.support.proxy import free_port
from tests.support.waiting import wait_for

NODE = "worker-1"
RBAC_KINDS = ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")
# Flags of `helm install`/`upgrade` that `helm template` has no use for (they act on a release in a cluster).
_RELEASE_ONLY = {"--reuse-values", "--wait", "--atomic", "--create-namespace"}

# How long a test waits for koordlet's first NodeMetric report, or for the refusal of its write: the first report
# comes at a random point of its 60 s interval (koordlet/ticker.py), and one due before the node's usage is
# collected writes nothing and waits for the next, 54-66 s later.
REPORT_WAIT_S = 150.0


@dataclass(frozen=True)
class DeployPath:
    """What one way of deploying applies."""

    name: str
    docs: tuple[dict[str, Any], ...]  # every object, CRDs first
    daemonset: dict[str, Any]  # the DaemonSet that runs koordlet
    manager: bool  # whether koord-manager runs beside it (it makes each node's NodeMetric)

    @property
    def crds(self) -> list[dict[str, Any]]:
        return [d for d in self.docs if d["kind"] == "CustomResourceDefinition"]

    @property
    def rbac(self) -> list[dict[str, Any]]:
        return [d for d in self.docs if d["kind"] in RBAC_KINDS]

    @property
    def pod(self) -> dict[str, Any]:
        return self.daemonset["spec"]["template"]["spec"]

    @property
    def account(self) -> tuple[str, str]:
        return self.daemonset["metadata"]["namespace"], self.pod["serviceAccountName"]

    def without(self, role: str, resource: str) -> DeployPath:
        """This path with ``resource`` taken out of ``role``'s rules (a rule left with no resource goes)."""
        docs = copy.deepcopy(list(self.docs))
        [target] = [d for d in docs if d["kind"] == "ClusterRole" and d["metadata"]["name"] == role]
        target["rules"] = rules_without(target["rules"], resource)
        return DeployPath(f"{self.name} without {resource}", tuple(docs), self.daemonset, self.manager)


def rules_without(rules: list[dict[str, Any]], resource: str) -> list[dict[str, Any]]:
    """A role's ``rules`` with ``resource`` taken out (a rule left with no resource goes); fails when none grants it."""
    kept_rules = []
    for rule in rules:
        kept = [r for r in rule.get("resources", []) if r != resource]
        if kept or not rule.get("resources"):
            kept_rules.append({**rule, "resources": kept} if rule.get("resources") else rule)
    assert kept_rules != rules, f"no rule grants {resource}"
    return kept_rules


def _readme_command(heading: str, starts: str) -> list[str]:
    """The README's command that starts with ``starts`` in the section under ``heading``, as a shell splits it."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index(heading):]
    start = section.index(starts)
    command = section[start:section.index("\n```", start)]
    return shlex.split(command.replace("\\\n", " "))


def _helm_template(words: list[str]) -> list[dict[str, Any]]:
    """`helm template` of `helm install|upgrade RELEASE CHART FLAGS`, without the flags that act on a release."""
    release, chart, flags = words[2], words[3], [f for f in words[4:] if f not in _RELEASE_ONLY]
    done = subprocess.run([tool("helm"), "template", release, str(ROOT / chart), *flags], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return documents(done.stdout)


def _ordered(docs: list[dict[str, Any]]) -> tuple[dict[str, Any], ...]:
    crds = [d for d in docs if d["kind"] == "CustomResourceDefinition"]
    return tuple(crds + [d for d in docs if d["kind"] != "CustomResourceDefinition"])


def _daemonset(docs: list[dict[str, Any]]) -> dict[str, Any]:
    [daemonset] = [d for d in docs if d["kind"] == "DaemonSet"]
    return daemonset


def koordinators_koordlet_objects() -> list[dict[str, Any]]:
    """Koordinator v1.8.0's koordlet objects as its chart renders them: its service account, ``koordlet-role``
    (the recorded rules) bound to it, and its DaemonSet."""
    namespace, rbac = koordinator.NAMESPACE, "rbac.authorization.k8s.io/v1"
    account = koordinator.DAEMONSET_POD["spec"]["serviceAccountName"]
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": account, "namespace": namespace}},
        {"apiVersion": rbac, "kind": "ClusterRole", "metadata": {"name": "koordlet-role"},
         "rules": copy.deepcopy(koordinator.KOORDLET_ROLE_RULES)},
        {"apiVersion": rbac, "kind": "ClusterRoleBinding", "metadata": {"name": "koordlet-rolebinding"},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "koordlet-role"},
         "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": namespace}]},
        {"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "koordlet", "namespace": namespace},
         "spec": {"selector": {"matchLabels": koordinator.DAEMONSET_POD["metadata"]["labels"]},
                  "template": copy.deepcopy(koordinator.DAEMONSET_POD)}},
    ]


def our_chart_alone() -> DeployPath:
    """README 3a: our chart, CRDs included, no Koordinator."""
    docs = _helm_template(_readme_command("### 3a. koordlet alone, with Helm", "helm install koordlet-py"))
    return DeployPath("our chart alone", _ordered(docs), _daemonset(docs), manager=False)


def our_chart_beside_koordinator() -> DeployPath:
    """README 3b (b): our chart (no CRDs, no slo-controller-config) beside Koordinator's control plane, whose CRDs
    and koordlet RBAC are there too."""
    ours = _helm_template(_readme_command("#### (b) Our chart beside Koordinator's control plane",
                                          "helm install koordlet-py"))
    theirs = [d for d in koordinators_koordlet_objects() if d["kind"] != "DaemonSet"]
    return DeployPath("our chart beside Koordinator", _ordered(crd_documents() + theirs + ours), _daemonset(ours),
                      manager=True)


def kustomize() -> DeployPath:
    """README 3c: `kubectl apply -k deploy/crds/` and `kubectl apply -k deploy/`."""
    docs = kustomization_documents(DEPLOY / "crds") + kustomization_documents(DEPLOY)
    return DeployPath("deploy/ (kustomize)", _ordered(docs), _daemonset(docs), manager=False)


def koordinators_chart() -> DeployPath:
    """README 3b (a): Koordinator's chart with our image: its DaemonSet, its CRDs and its own koordlet role."""
    docs = crd_documents() + koordinators_koordlet_objects()
    return DeployPath("Koordinator's chart", _ordered(docs), _daemonset(docs), manager=True)


PATHS: dict[str, Callable[[], DeployPath]] = {"chart": our_chart_alone, "beside": our_chart_beside_koordinator,
                                              "kustomize": kustomize, "koordinator": koordinators_chart}


# ------------------------------------------------------------------------------------------ a node of a cluster

def own_pod(path: DeployPath) -> dict[str, Any]:
    """koordlet's own DaemonSet pod, as kubelet's /pods lists it on the node."""
    template = path.daemonset["spec"]["template"]
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"{path.daemonset['metadata']['name']}-x1",
                         "uid": "7d0b1f6e-1c52-4a29-9b7e-0d4c5e6f7a81",
                         "namespace": path.daemonset["metadata"]["namespace"],
                         "labels": template["metadata"].get("labels", {})},
            "spec": {"nodeName": NODE, "hostNetwork": True, "serviceAccountName": path.account[1],
                     "containers": [{"name": c["name"], "image": c["image"], "resources": c.get("resources", {})}
                                    for c in template["spec"]["containers"]]},
            "status": {"phase": "Running", "qosClass": "Burstable"}}


def service_account_volume(api: ApiServer, namespace: str, account: str, directory: Path) -> Path:
    """What kubelet mounts at /var/run/secrets/kubernetes.io/serviceaccount of a pod running as ``account``: a token
    from the TokenRequest API, the cluster's CA and the namespace."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "token").write_text(api.service_account_token(namespace, account))
    (directory / "ca.crt").write_bytes(api.ca_file.read_bytes())
    (directory / "namespace").write_text(namespace)
    return directory


@dataclass
class ClusterNode:
    path: DeployPath
    api: ApiServer
    kubelet: Kubelet
    token_file: Path
    kubeconfig: Path
    account_user: str


@contextmanager
def cluster_node(tmp_path: Path, path: DeployPath, *, fine_grained_authz: bool = True) -> Iterator[ClusterNode]:
    """One node of a cluster that ``path`` was applied to (see the module docstring)."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    with ApiServer(crd_dir=None) as api:
        create_objects(api, path.crds)  # CRDs first: `kubectl apply` and Helm install them before the rest
        create_objects(api, [d for d in path.docs if d["kind"] != "CustomResourceDefinition"])
        with Kubelet(api, NODE, {"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": [own_pod(path)]},
                     fine_grained_authz=fine_grained_authz) as kubelet:
            api.seed(kubelet.node_object({"capacity": {"cpu": "4", "memory": "8Gi"},
                                          "allocatable": {"cpu": "4", "memory": "8Gi"}}))
            if path.manager:  # koord-manager makes each node's NodeMetric; koordlet fills its status
                api.seed({"apiVersion": "slo.koordinator.sh/v1alpha1", "kind": "NodeMetric",
                          "metadata": {"name": NODE},
                          "spec": {"metricCollectPolicy": {"aggregateDurationSeconds": 60,
                                                           "reportIntervalSeconds": 60}}})
            namespace, account = path.account
            token = api.service_account_token(namespace, account)
            token_file = tmp_path / "token"
            token_file.write_text(token)
            kubeconfig = write_kubeconfig(api, tmp_path / "kubeconfig", Credentials(account, token=token))
            yield ClusterNode(path, api, kubelet, token_file, kubeconfig,
                              f"system:serviceaccount:{namespace}:{account}")


@dataclass
class HostKoordlet:
    """koordlet as a process on this host with ``node``'s DaemonSet args and identity; writes only under
    ``state``."""

    node: ClusterNode
    state: Path
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def log_path(self) -> Path:
        return self.state / "koordlet.log"

    def args(self) -> list[str]:
        [container] = self.node.path.pod["containers"]
        state = self.state
        create = [] if self.node.path.manager else ["-create-node-metric"]  # nobody else makes the NodeMetric
        return [sys.executable, "-m", "koordlet.main", *container["args"],
                f"-kubeconfig={self.node.kubeconfig}", f"-kubelet-token-file={self.node.token_file}",
                f"-addr=127.0.0.1:{self.port}", f"-cgroup-root-dir={state / 'cgroup'}", f"-sys-fs-root-dir={state}",
                "-sys-root-dir=/sys/", f"-var-run-root-dir={state / 'var-run'}/",
                f"-var-lib-kubelet-dir={state / 'kubelet'}", f"-runtime-hooks-addr={state / 'koordlet.sock'}",
                f"-runtime-hooks-host-endpoint={state / 'koordlet.sock'}",
                f"-runtime-hooks-config-path={state / 'hooks'}", f"-audit-log-dir={state / 'audit'}",
                f"-prediction-checkpoint-filepath={state / 'prediction'}",
                f"-system-config-record-file={state / 'originals.json'}", "-enable-nri-runtime-hook=false",
                "-report-interval=2s", "-kubelet-sync-interval=1s", *create]

    def env(self) -> dict[str, str]:
        [container] = self.node.path.pod["containers"]
        fields = {"spec.nodeName": NODE}
        env = {e["name"]: e["value"] if "value" in e else fields[e["valueFrom"]["fieldRef"]["fieldPath"]]
               for e in container.get("env", [])}
        return {"PATH": os.environ["PATH"], "PYTHONPATH": str(ROOT), **env}

    def start(self) -> HostKoordlet:
        for directory in ("cgroup", "var-run", "kubelet", "hooks"):
            (self.state / directory).mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(self.args(), cwd=ROOT, env=self.env(), stdout=log, stderr=subprocess.STDOUT)
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)

    def __enter__(self) -> HostKoordlet:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def logs(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def get(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=3) as answer:  # noqa: S310
                return answer.status, answer.read().decode()
        except urllib.error.HTTPError as err:
            return err.code, err.read().decode()
        except OSError as err:
            return 0, str(err)

    def wait_log(self, text: str, timeout_s: float) -> bool:
        return bool(wait_for(lambda: text in self.logs() or self.proc is None or self.proc.poll() is not None,
                             timeout_s)) and text in self.logs()

    def running_for(self, seconds: float) -> bool:
        """Whether it is still running after ``seconds`` more (a refusal must never end it)."""
        time.sleep(seconds)
        return self.proc is not None and self.proc.poll() is None
