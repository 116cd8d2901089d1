"""The deploy tests' tools: Helm and kubectl from scripts/fetch-tools.sh (pinned, in the project's prefix),
the plain manifests as kustomize lists them, and `helm template` of the chart."""

from __future__ import annotations

import copy
import functools
import json
import subprocess
from pathlib import Path
from typing import Any

import kubernetes.client
import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
CHART = DEPLOY / "chart" / "koordlet-py"
NAMESPACE = "koordinator-system"  # the README's namespace, and deploy/base's
HELM_ONLY_LABELS = ("helm.sh/chart", "app.kubernetes.io/managed-by")  # what the chart adds to deploy/base's objects


@functools.cache
def tool(name: str) -> str:
    """The path of ``helm``, ``kubectl-1.35`` or ``kubectl-1.32``, fetched and checked on first use."""
    done = subprocess.run(["bash", str(ROOT / "scripts" / "fetch-tools.sh"), name], capture_output=True,
                          text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"scripts/fetch-tools.sh {name} failed:\n{done.stderr[-2000:]}")
    return done.stdout.strip()


def documents(text: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(text) if doc]


def kustomization_documents(directory: Path = DEPLOY) -> list[dict[str, Any]]:
    """Every object of a kustomization's resources, in its order, directories followed (what `kubectl apply -k`
    sends for these plain kustomizations, which transform nothing)."""
    kustomization = yaml.safe_load((directory / "kustomization.yaml").read_text())
    out: list[dict[str, Any]] = []
    for name in kustomization["resources"]:
        path = directory / name
        out.extend(kustomization_documents(path) if path.is_dir() else documents(path.read_text()))
    return out


def base_documents() -> list[dict[str, Any]]:
    """The objects of deploy/kustomization.yaml (koordlet alone: no CRD, no Namespace)."""
    return kustomization_documents(DEPLOY)


def helm_template(*args: str, check: bool = True, release: str = "koordlet-py") -> subprocess.CompletedProcess[str]:
    """`helm template RELEASE deploy/chart/koordlet-py ARGS`, in the namespace koordinator-system unless ARGS name
    one."""
    namespace = [] if {"-n", "--namespace"} & set(args) else ["--namespace", NAMESPACE]
    done = subprocess.run([tool("helm"), "template", release, str(CHART), *namespace, *args],
                          capture_output=True, text=True, timeout=120)
    if check and done.returncode != 0:
        raise AssertionError(f"helm template {' '.join(args)} failed:\n{done.stderr}")
    return done


def chart_documents(*args: str, release: str = "koordlet-py") -> list[dict[str, Any]]:
    return documents(helm_template(*args, release=release).stdout)


def without_helm_labels(doc: dict[str, Any]) -> dict[str, Any]:
    """``doc`` without the labels only Helm sets (on the object and on a DaemonSet's pod template)."""
    doc = copy.deepcopy(doc)
    for meta in (doc["metadata"], doc.get("spec", {}).get("template", {}).get("metadata", {})):
        labels = meta.get("labels") or {}
        for key in HELM_ONLY_LABELS:
            labels.pop(key, None)
    return doc


def object_key(doc: dict[str, Any]) -> tuple[str, str, str]:
    return doc["kind"], doc["metadata"].get("namespace", ""), doc["metadata"]["name"]


# The plural of every kind the tests create on the project's API server.
PLURALS = {"Namespace": "namespaces", "ServiceAccount": "serviceaccounts", "ConfigMap": "configmaps",
           "Service": "services",
           "DaemonSet": "daemonsets", "ClusterRole": "clusterroles", "ClusterRoleBinding": "clusterrolebindings",
           "CustomResourceDefinition": "customresourcedefinitions", "NodeSLO": "nodeslos", "NodeMetric": "nodemetrics",
           "NodeResourceTopology": "noderesourcetopologies", "ServiceMonitor": "servicemonitors",
           "PodMonitor": "podmonitors", "PrometheusRule": "prometheusrules", "FlowSchema": "flowschemas",
           "PriorityLevelConfiguration": "prioritylevelconfigurations"}


def request(client: kubernetes.client.ApiClient, verb: str, path: str, body: dict[str, Any] | None = None,
             ) -> dict[str, Any]:
    """One API request with a JSON body; the decoded answer, or ApiException."""
    prepared = client.param_serialize(verb, path, header_params={"Content-Type": "application/json"}, body=body)
    response = client.call_api(*prepared)
    data = response.read()
    if not 200 <= response.status <= 299:
        raise kubernetes.client.ApiException.from_response(http_resp=response, body=data.decode(), data=None)
    return json.loads(data)


def object_path(doc: dict[str, Any], named: bool = False) -> str:
    """The REST path of ``doc``'s collection, or with ``named`` of the object itself."""
    group_version = doc["apiVersion"]
    base = "/api/v1" if group_version == "v1" else f"/apis/{group_version}"
    namespace = doc["metadata"].get("namespace")
    path = f"{base}/namespaces/{namespace}/{PLURALS[doc['kind']]}" if namespace else f"{base}/{PLURALS[doc['kind']]}"
    return f"{path}/{doc['metadata']['name']}" if named else path


def create_object(client: kubernetes.client.ApiClient, doc: dict[str, Any]) -> dict[str, Any]:
    """POST ``doc`` to the API server ``client`` talks to (as `kubectl create -f` would)."""
    return request(client, "POST", object_path(doc), doc)
