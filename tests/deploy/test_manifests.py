"""The plain manifests (deploy/base, `kubectl apply -k deploy/`; deploy/slo-controller-config) parse, validate strictly
against the Kubernetes models, and carry what koordlet needs. The Helm chart renders the same objects:
tests/deploy/test_chart.py."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any

import pytest

from koordlet.api.nodeslo import NodeSLOSpec, parse_node_slo_spec
from koordlet.api.quantity import parse_quantity
from tests.deploy.baremetal_cluster import ACCOUNT, baremetal_documents
from tests.deploy.kube_schema import SchemaError, validate
from tests.deploy.tools import DEPLOY, base_documents, kustomization_documents


def _by_kind(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {doc["kind"]: doc for doc in docs if doc["kind"] != "CustomResourceDefinition"}


def _koordlet(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return _by_kind(docs)["DaemonSet"]["spec"]["template"]["spec"]["containers"][0]


def test_every_manifest_parses_and_validates_strictly() -> None:
    docs = base_documents()
    kinds = sorted(doc["kind"] for doc in docs if doc["kind"] != "CustomResourceDefinition")
    assert kinds == sorted(["ServiceAccount", "ClusterRole", "ClusterRoleBinding", "DaemonSet"])
    assert len(docs) == len(kinds), "deploy/ holds no CRD: they are deploy/crds/, applied on their own"
    for doc in docs + kustomization_documents(DEPLOY / "slo-controller-config"):
        validate(doc)


def test_strict_validation_rejects_a_misspelt_field_and_a_wrong_type() -> None:
    daemonset = _by_kind(base_documents())["DaemonSet"]
    daemonset["spec"]["template"]["spec"]["hostPid"] = True
    with pytest.raises(SchemaError, match="hostPid: unknown field"):
        validate(daemonset)
    daemonset = _by_kind(base_documents())["DaemonSet"]
    daemonset["spec"]["template"]["spec"]["hostPID"] = "yes"
    with pytest.raises(SchemaError, match="expected bool"):
        validate(daemonset)


def test_daemonset_runs_on_the_host_with_the_paths_koordlet_needs() -> None:
    daemonset = _by_kind(base_documents())["DaemonSet"]
    template = daemonset["spec"]["template"]
    pod = template["spec"]
    assert pod["hostPID"] is True and pod["hostNetwork"] is True
    assert template["metadata"]["labels"]["runtimeproxy.koordinator.sh/skip-hookserver"] == "true"
    assert set(daemonset["spec"]["selector"]["matchLabels"].items()) <= set(template["metadata"]["labels"].items())
    container = pod["containers"][0]
    host_paths = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"]}
    mounted = {host_paths[m["name"]]: m["mountPath"] for m in container["volumeMounts"]}
    for path in (
        "/sys",
        "/var/run/koordlet",
        "/etc/runtime/hookserver.d",
        "/var/lib/kubelet/device-plugins",
        "/dev",
    ):
        assert mounted.get(path) == path, f"{path} must be mounted at the same path"
    env = {e["name"]: e for e in container["env"]}
    assert env["NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    for probe in ("startupProbe", "livenessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": 9316}
    # ready = started and the states informer synced; /healthz also fails on a stalled loop (docs/operations.md)
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": 9316}


def test_resources_are_sized_from_the_measured_cost() -> None:
    resources = _koordlet(base_documents())["resources"]
    measured_rss = 76 * 2**20  # docs/benchmarks.md: the whole agent at 150 pods (bench/agent_process.py)
    assert parse_quantity(resources["requests"]["memory"]) >= measured_rss
    assert parse_quantity(resources["limits"]["memory"]) >= 2 * measured_rss
    assert parse_quantity(resources["limits"]["memory"]) < 341 * 2**20  # below what Koordinator needs
    assert resources["requests"]["cpu"] == "50m" and resources["limits"]["cpu"] == "500m"


def _dump(obj: object) -> object:
    """A NodeSLOSpec dataclass as its JSON (field metadata ``json`` names), unset (None) fields left out."""
    if dataclasses.is_dataclass(obj):
        out = {}
        for field in dataclasses.fields(obj):
            key = field.metadata.get("json")
            value = _dump(getattr(obj, field.name))
            if key is not None and value not in (None, {}, []):
                out[key] = value
        return out
    if isinstance(obj, Mapping):
        return {k: _dump(v) for k, v in obj.items()}
    if isinstance(obj, tuple):
        return [_dump(v) for v in obj]
    return obj


def test_slo_controller_config_carries_exactly_koordlets_nodeslo_defaults() -> None:
    [config_map] = kustomization_documents(DEPLOY / "slo-controller-config")
    data = config_map["data"]
    strategy = {
        "resourceUsedThresholdWithBE": json.loads(data["resource-threshold-config"])["clusterStrategy"],
        "resourceQOSStrategy": json.loads(data["resource-qos-config"])["clusterStrategy"],
        "cpuBurstStrategy": json.loads(data["cpu-burst-config"])["clusterStrategy"],
        "systemStrategy": json.loads(data["system-config"])["clusterStrategy"],
    }
    parse_node_slo_spec(strategy)  # valid NodeSLO spec
    strategy["systemStrategy"]["totalNetworkBandwidth"] = parse_quantity(
        strategy["systemStrategy"]["totalNetworkBandwidth"]
    )
    assert strategy == _dump(NodeSLOSpec())
    colocation = json.loads(data["colocation-config"])
    assert (colocation["metricAggregateDurationSeconds"], colocation["metricReportIntervalSeconds"]) == (300, 60)


def test_the_koordlet_container_args_are_flags_koordlet_accepts() -> None:
    from koordlet.config import parse_config

    [daemonset] = [d for d in base_documents() if d["kind"] == "DaemonSet"]
    container = next(c for c in daemonset["spec"]["template"]["spec"]["containers"] if c["name"] == "koordlet")
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["agent_mode"] == "hostMode"
    config = parse_config(container["args"], environ={"NODE_NAME": "node-1", "agent_mode": "hostMode"})
    assert config.cgroup_root_dir.rstrip("/") == "/sys/fs/cgroup"


def test_daemonset_mounts_the_nri_socket_dir_where_koordlet_dials_it() -> None:
    """NRI mode (docs/nri.md): the directory of the socket koordlet's flags name, at the same path, so a socket
    containerd creates later (or again after a restart) is seen inside the pod."""
    import os

    from koordlet.config import parse_config

    pod = _by_kind(base_documents())["DaemonSet"]["spec"]["template"]["spec"]
    container = _koordlet(base_documents())
    env = {e["name"]: e.get("value") for e in container["env"]}
    config = parse_config(container["args"], environ={"NODE_NAME": "n", "agent_mode": env["agent_mode"]})
    assert config.enable_nri_runtime_hook
    socket_dir = os.path.dirname(config.nri_socket_path)
    volumes = {v["name"]: v["hostPath"] for v in pod["volumes"]}
    mounts = {m["mountPath"]: volumes[m["name"]] for m in container["volumeMounts"]}
    assert mounts[socket_dir] == {"path": socket_dir, "type": "DirectoryOrCreate"}


def test_the_bare_metal_overlay_is_deploys_rbac_under_its_own_names_and_validates_strictly() -> None:
    docs = baremetal_documents()  # kubectl kustomize deploy/baremetal/, as `kubectl apply -k` sends it
    for doc in docs:
        validate(doc)
    names = sorted((doc["kind"], doc["metadata"]["name"]) for doc in docs)
    assert names == sorted([("ServiceAccount", ACCOUNT), ("ClusterRole", ACCOUNT), ("ClusterRoleBinding", ACCOUNT),
                            ("Role", "koordlet-py-token-baremetal"), ("RoleBinding", "koordlet-py-token-baremetal")])
    by_kind = _by_kind(docs)
    assert by_kind["ClusterRole"]["rules"] == _by_kind(base_documents())["ClusterRole"]["rules"]
    for binding in (by_kind["ClusterRoleBinding"], by_kind["RoleBinding"]):
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": ACCOUNT, "namespace": "koordinator-system"}]
    assert by_kind["Role"]["rules"] == [{"apiGroups": [""], "resources": ["serviceaccounts/token"],
                                         "resourceNames": [ACCOUNT], "verbs": ["create"]}]
