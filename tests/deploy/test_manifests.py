"""The deploy/ manifests parse, validate strictly against the Kubernetes models, and render with values."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from koordlet.api.nodeslo import NodeSLOSpec, parse_node_slo_spec
from koordlet.api.quantity import parse_quantity
from tests.deploy.kube_schema import SchemaError, validate

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"


def _load_render() -> Any:
    spec = importlib.util.spec_from_file_location("deploy_render", DEPLOY / "render.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


render = _load_render()


def _by_kind(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {doc["kind"]: doc for doc in docs if doc["kind"] != "CustomResourceDefinition"}


def _koordlet(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return _by_kind(docs)["DaemonSet"]["spec"]["template"]["spec"]["containers"][0]


def test_every_manifest_parses_and_validates_strictly() -> None:
    docs = render.base_documents()
    kinds = sorted(doc["kind"] for doc in docs if doc["kind"] != "CustomResourceDefinition")
    assert kinds == sorted(
        ["Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "ConfigMap", "DaemonSet"]
    )
    for doc in docs:
        if doc["kind"] != "CustomResourceDefinition":  # the CRDs are checked with the API server tests
            validate(doc)


def test_strict_validation_rejects_a_misspelt_field_and_a_wrong_type() -> None:
    daemonset = _by_kind(render.base_documents())["DaemonSet"]
    daemonset["spec"]["template"]["spec"]["hostPid"] = True
    with pytest.raises(SchemaError, match="hostPid: unknown field"):
        validate(daemonset)
    daemonset = _by_kind(render.base_documents())["DaemonSet"]
    daemonset["spec"]["template"]["spec"]["hostPID"] = "yes"
    with pytest.raises(SchemaError, match="expected bool"):
        validate(daemonset)


def test_daemonset_runs_on_the_host_with_the_paths_koordlet_needs() -> None:
    daemonset = _by_kind(render.base_documents())["DaemonSet"]
    template = daemonset["spec"]["template"]
    pod = template["spec"]
    assert pod["hostPID"] is True and pod["hostNetwork"] is True
    assert template["metadata"]["labels"]["runtimeproxy.koordinator.sh/skip-hookserver"] == "true"
    assert set(daemonset["spec"]["selector"]["matchLabels"].items()) <= set(template["metadata"]["labels"].items())
    container = pod["containers"][0]
    host_paths = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"]}
    mounted = {host_paths[m["name"]]: m["mountPath"] for m in container["volumeMounts"]}
    for path in (
        "/sys/fs/cgroup",
        "/var/run/koordlet",
        "/etc/runtime/hookserver.d",
        "/var/lib/kubelet/device-plugins",
        "/dev",
    ):
        assert mounted.get(path) == path, f"{path} must be mounted at the same path"
    env = {e["name"]: e for e in container["env"]}
    assert env["NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    for probe in ("livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": 9316}


def test_resources_are_sized_from_the_measured_cost() -> None:
    resources = _koordlet(render.base_documents())["resources"]
    measured_rss = 76 * 2**20  # bench/agent_process.py: the whole agent at 150 pods (75.5 MiB)
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
    data = _by_kind(render.base_documents())["ConfigMap"]["data"]
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


def test_default_values_render_the_plain_manifests() -> None:
    assert render.render(render.load_values()) == render.base_documents()


def test_values_set_namespace_image_resources_gates_and_slo_overrides(tmp_path: Path) -> None:
    values_file = tmp_path / "values.yaml"
    values_file.write_text(
        yaml.safe_dump(
            {
                "namespace": "qos",
                "image": "registry.local/koordlet-py:1.2",
                "resources": {"limits": {"memory": "512Mi"}},
                "featureGates": {"TCNetworkQoS": True, "BECPUSuppress": False},
                "extraArgs": ["--kubelet-sync-interval=20s"],
                "sloControllerConfig": {"resource-threshold-config": {"clusterStrategy": {"enable": True}}},
            }
        )
    )
    docs = render.render(render.load_values(values_file))
    kinds = _by_kind(docs)
    assert kinds["Namespace"]["metadata"]["name"] == "qos"
    for kind in ("ServiceAccount", "ConfigMap", "DaemonSet"):
        assert kinds[kind]["metadata"]["namespace"] == "qos"
    assert "namespace" not in kinds["ClusterRole"]["metadata"]
    assert kinds["ClusterRoleBinding"]["subjects"][0]["namespace"] == "qos"
    container = _koordlet(docs)
    assert container["image"] == "registry.local/koordlet-py:1.2"
    assert container["resources"] == {
        "requests": {"cpu": "50m", "memory": "128Mi"},
        "limits": {"cpu": "500m", "memory": "512Mi"},
    }
    assert container["args"] == ["-addr=0.0.0.0:9316", "--feature-gates=BECPUSuppress=false,TCNetworkQoS=true",
                                 "--kubelet-sync-interval=20s"]
    threshold = json.loads(kinds["ConfigMap"]["data"]["resource-threshold-config"])["clusterStrategy"]
    assert threshold["enable"] is True and threshold["cpuSuppressThresholdPercent"] == 65
    for doc in docs:
        if doc["kind"] != "CustomResourceDefinition":
            validate(doc)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"imagee": "x"}, "unknown values: imagee"),
        ({"featureGates": {"TCNetworkQos": True}}, "unknown feature gates: TCNetworkQos"),
        ({"featureGates": {"TCNetworkQoS": "yes"}}, "expected true/false"),
    ],
)
def test_bad_values_are_refused(tmp_path: Path, values: dict[str, object], message: str) -> None:
    values_file = tmp_path / "values.yaml"
    values_file.write_text(yaml.safe_dump(values))
    with pytest.raises(render.ValuesError, match=message):
        render.load_values(values_file)


def test_render_script_prints_the_manifests_and_fails_cleanly_on_bad_values(tmp_path: Path) -> None:
    import sys

    done = subprocess.run([sys.executable, str(DEPLOY / "render.py")], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert [d["kind"] for d in yaml.safe_load_all(done.stdout)] == [d["kind"] for d in render.base_documents()]
    bad = tmp_path / "bad.yaml"
    bad.write_text("namespce: x\n")
    done = subprocess.run(
        [sys.executable, str(DEPLOY / "render.py"), "--values", str(bad)], capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 2 and "unknown values: namespce" in done.stderr


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl (with its built-in kustomize) is not installed")
def test_kustomize_build_matches_the_renderer_defaults() -> None:
    done = subprocess.run(["kubectl", "kustomize", str(DEPLOY)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    built = [doc for doc in yaml.safe_load_all(done.stdout) if doc]

    def key(doc: dict[str, Any]) -> tuple[str, str]:
        return doc["kind"], doc["metadata"]["name"]

    assert sorted(built, key=key) == sorted(render.base_documents(), key=key)


def test_the_koordlet_container_args_are_flags_koordlet_accepts() -> None:
    from koordlet.config import parse_config

    [daemonset] = [d for d in render.render(render.load_values(None)) if d["kind"] == "DaemonSet"]
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

    pod = _by_kind(render.base_documents())["DaemonSet"]["spec"]["template"]["spec"]
    container = _koordlet(render.base_documents())
    env = {e["name"]: e.get("value") for e in container["env"]}
    config = parse_config(container["args"], environ={"NODE_NAME": "n", "agent_mode": env["agent_mode"]})
    assert config.enable_nri_runtime_hook
    socket_dir = os.path.dirname(config.nri_socket_path)
    volumes = {v["name"]: v["hostPath"] for v in pod["volumes"]}
    mounts = {m["mountPath"]: volumes[m["name"]] for m in container["volumeMounts"]}
    assert mounts[socket_dir] == {"path": socket_dir, "type": "DirectoryOrCreate"}
