"""The Helm chart (deploy/chart/koordlet-py), checked by real Helm and kubectl (scripts/fetch-tools.sh):
lint, the default render against kustomize's, every documented value, refused bad values, and the rendered
objects through the project's API server."""

from __future__ import annotations

import json
import os
import re
import tomllib
from pathlib import Path, PurePosixPath
from typing import Any

import kubernetes.client
import pytest
import yaml

from koordlet.config import parse_config
from koordlet.features import GATES
from tests.deploy.kube_schema import validate
from tests.deploy.tools import CHART, DEPLOY, ROOT, base_documents, chart_documents, helm_template, object_key, tool
from tests.support.apiserver import ApiServer, kube_api_client

VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
VALUES = yaml.safe_load((CHART / "values.yaml").read_text())


def _sorted(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(docs, key=object_key)


def _of_kind(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    [doc] = [d for d in docs if d["kind"] == kind]
    return doc


def _koordlet(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return _of_kind(docs, "DaemonSet")["spec"]["template"]["spec"]["containers"][0]


def test_chart_and_image_follow_the_projects_version() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["version"] == chart["appVersion"] == VERSION
    assert _koordlet(chart_documents())["image"] == _koordlet(base_documents())["image"] == f"koordlet-py:{VERSION}"


def test_helm_lint_strict_passes() -> None:
    import subprocess

    done = subprocess.run([tool("helm"), "lint", "--strict", str(CHART)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 chart(s) linted, 0 chart(s) failed" in done.stdout
    assert "[ERROR]" not in done.stdout and "[WARNING]" not in done.stdout


@pytest.mark.parametrize("kubectl", ["kubectl-1.35", "kubectl-1.32"])
def test_default_render_is_the_same_objects_kustomize_builds(kubectl: str) -> None:
    import subprocess

    done = subprocess.run([tool(kubectl), "kustomize", str(DEPLOY)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    built = [doc for doc in yaml.safe_load_all(done.stdout) if doc]
    assert _sorted(built) == _sorted(chart_documents()) == _sorted(base_documents())


_ONE_VALUE = {"sloControllerConfig.data", "koordlet.resources", "koordlet.nodeSelector", "koordlet.nodeAffinity"}


def _leaves(values: dict[str, Any], prefix: str = "") -> set[str]:
    """The documented values: every leaf of values.yaml; maps that are data (NodeSLO config, selectors) count
    as one value."""
    out: set[str] = set()
    for key, value in values.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value and path not in _ONE_VALUE:
            out |= _leaves(value, path + ".")
        else:
            out.add(path)
    return out


EVERY_VALUE: dict[str, Any] = {
    "installation": {"namespace": "qos-system", "createNamespace": False},
    "imageRepositoryHost": "registry.example.com/team",
    "imagePullSecrets": [{"name": "pull-secret"}],
    "koordlet": {
        "image": {"repository": "koordlet-py-custom", "tag": "9.9.9", "pullPolicy": "Always"},
        "resources": {"requests": {"cpu": "100m", "memory": "200Mi"}, "limits": {"cpu": "1", "memory": "512Mi"}},
        "features": "BEMemoryEvict=true,CPUBurst=false",
        "extraArgs": ["-collect-res-used-interval=2s", "--kubelet-sync-interval=20s"],
        "hostMode": True,
        "nri": {"enabled": False},
        "hostDirs": {"koordletSockDir": "/run/koordlet-alt", "koordProxyRegisterDir": "/etc/hooks.d",
                     "kubeletLibDir": "/data/kubelet"},
        "metrics": {"port": 19316},
        "priorityClassName": "node-agents",
        "nodeSelector": {"koordinator.sh/colocation": "true"},
        "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "kubernetes.io/os", "operator": "In", "values": ["linux"]}]}]}},
        "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "batch", "effect": "NoSchedule"}],
    },
    "sloControllerConfig": {"create": True, "data": {
        "resource-threshold-config": {"clusterStrategy": {"enable": True, "cpuSuppressThresholdPercent": 55}},
        "cpu-burst-config": {"clusterStrategy": {"policy": "auto"}}}},
}


def _all_paths_under_mounts(container: dict[str, Any], pod: dict[str, Any], paths: dict[str, str]) -> None:
    """Each koordlet path (as it sees it) lies under a mount of the host path it stands for."""
    host_of = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
    mounts = [(PurePosixPath(m["mountPath"]), PurePosixPath(host_of[m["name"]])) for m in container["volumeMounts"]]
    for seen, host in paths.items():
        inside = PurePosixPath(seen)
        match = [(mount, host_dir) for mount, host_dir in mounts if inside == mount or mount in inside.parents]
        assert match, f"{seen} is not under any volume mount"
        mount, host_dir = max(match, key=lambda m: len(m[0].parts))
        assert host_dir / inside.relative_to(mount) == PurePosixPath(host), f"{seen} is host {host_dir}, not {host}"


def test_every_documented_value_is_rendered(tmp_path: Path) -> None:
    assert _leaves(EVERY_VALUE) == _leaves(VALUES), "set every value of values.yaml here (a new value needs a test)"
    values_file = tmp_path / "values.yaml"
    values_file.write_text(yaml.safe_dump(EVERY_VALUE))
    docs = chart_documents("--values", str(values_file))
    kinds = sorted(d["kind"] for d in docs if d["kind"] != "CustomResourceDefinition")
    assert kinds == sorted(["ServiceAccount", "ClusterRole", "ClusterRoleBinding", "ConfigMap", "DaemonSet"])
    for doc in docs:
        if doc["kind"] != "CustomResourceDefinition":
            validate(doc)
            if doc["kind"] not in ("ClusterRole", "ClusterRoleBinding"):
                assert doc["metadata"]["namespace"] == "qos-system"
    assert _of_kind(docs, "ClusterRoleBinding")["subjects"][0]["namespace"] == "qos-system"
    daemonset = _of_kind(docs, "DaemonSet")
    pod = daemonset["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["image"] == "registry.example.com/team/koordlet-py-custom:9.9.9"
    assert container["imagePullPolicy"] == "Always"
    assert pod["imagePullSecrets"] == [{"name": "pull-secret"}]
    assert container["resources"] == EVERY_VALUE["koordlet"]["resources"]
    assert pod["priorityClassName"] == "node-agents"
    assert pod["nodeSelector"] == {"koordinator.sh/colocation": "true"}
    assert pod["affinity"] == {"nodeAffinity": EVERY_VALUE["koordlet"]["nodeAffinity"]}
    assert pod["tolerations"] == EVERY_VALUE["koordlet"]["tolerations"]
    assert container["ports"][0]["containerPort"] == 19316
    assert container["livenessProbe"]["httpGet"]["port"] == container["readinessProbe"]["httpGet"]["port"] == 19316
    assert container["args"][-3:] == ["-feature-gates=BEMemoryEvict=true,CPUBurst=false",
                                      "-collect-res-used-interval=2s", "--kubelet-sync-interval=20s"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    config = parse_config(container["args"], environ={"NODE_NAME": "node-1", "agent_mode": env["agent_mode"]})
    assert config.addr == "0.0.0.0:19316"
    assert not config.enable_nri_runtime_hook and "nri" not in {v["name"] for v in pod["volumes"]}
    assert config.feature_gates["BEMemoryEvict"] is True and config.feature_gates["CPUBurst"] is False
    _all_paths_under_mounts(container, pod, {
        config.runtime_hooks_addr: "/run/koordlet-alt/koordlet.sock",
        config.runtime_hooks_config_path: "/etc/hooks.d",
        config.device_plugin_dir: "/data/kubelet/device-plugins",
        config.cgroup_root_dir: "/sys/fs/cgroup"})
    data = _of_kind(docs, "ConfigMap")["data"]
    threshold = json.loads(data["resource-threshold-config"])["clusterStrategy"]
    assert (threshold["enable"], threshold["cpuSuppressThresholdPercent"], threshold["memoryEvictThresholdPercent"]) \
        == (True, 55, 70)  # set, set, and the default beside them kept
    assert json.loads(data["cpu-burst-config"])["clusterStrategy"]["policy"] == "auto"


def test_without_host_mode_the_pod_has_koordinators_layout_and_koordlet_finds_every_path() -> None:
    docs = chart_documents("--set", "koordlet.hostMode=false")
    pod = _of_kind(docs, "DaemonSet")["spec"]["template"]["spec"]
    container = pod["containers"][0]
    validate(_of_kind(docs, "DaemonSet"))
    assert "agent_mode" not in {e["name"] for e in container["env"]}
    config = parse_config(container["args"], environ={"NODE_NAME": "node-1"})
    assert config.cgroup_root_dir == "/host-cgroup/"
    # koordlet serves in the pod at /host-var-run-koordlet/ and registers the host path the proxy dials.
    assert config.runtime_hooks_host_endpoint == "/var/run/koordlet/koordlet.sock"
    assert config.enable_nri_runtime_hook
    _all_paths_under_mounts(container, pod, {
        config.prediction_checkpoint_filepath: "/var/run/koordlet/prediction-checkpoints",
        config.system_config_record_file: "/var/run/koordlet/system-config-originals.json",
        config.nri_socket_path: "/var/run/nri/nri.sock",
        config.runtime_hooks_addr: "/var/run/koordlet/koordlet.sock",
        config.runtime_hooks_config_path: "/etc/runtime/hookserver.d",
        config.cgroup_root_dir: "/sys/fs/cgroup",
        config.sys_root_dir: "/sys",
        config.sys_fs_root_dir: "/sys/fs",
        config.device_plugin_dir: "/var/lib/kubelet/device-plugins"})


def test_slo_controller_config_can_be_left_to_koordinators_own_chart() -> None:
    docs = chart_documents("--set", "sloControllerConfig.create=false", "--set", "installation.createNamespace=false")
    assert not [d for d in docs if d["kind"] in ("ConfigMap", "Namespace")]


@pytest.mark.parametrize(("setting", "key"), [
    ("koordlet.image.pullPolicy=Sometimes", "/koordlet/image/pullPolicy"),
    ("koordlet.image.repository=Not A Name", "/koordlet/image/repository"),
    ("koordlet.features=BECPUSupress=true", "/koordlet/features"),
    ("koordlet.features=BECPUSuppress=maybe", "/koordlet/features"),
    ("koordlet.extraArgs[0]=collect-res-used-interval=2s", "/koordlet/extraArgs/0"),
    ("koordlet.hostMode=yes", "/koordlet/hostMode"),
    ("koordlet.hostDirs.koordletSockDir=var/run/koordlet", "/koordlet/hostDirs/koordletSockDir"),
    ("koordlet.metrics.port=70000", "/koordlet/metrics/port"),
    ("koordlet.resources.limits.memory=lots", "/koordlet/resources/limits/memory"),
    ("koordlet.tolerations[0].operator=Sometimes", "/koordlet/tolerations/0/operator"),
    ("koordlet.nodeSelector.zone=null", "/koordlet/nodeSelector/zone"),
    ("koordlet.imagee.tag=1", "/koordlet"),
    ("installation.namespace=Koordinator_System", "/installation/namespace"),
    ("sloControllerConfig.data.resource-threshold-config.clusterStrategy.cpuSuppressThresholdPercent=150",
     "/sloControllerConfig/data/resource-threshold-config/clusterStrategy/cpuSuppressThresholdPercent"),
    ("sloControllerConfig.data.cpu-burst-config.clusterStrategy.policy=always",
     "/sloControllerConfig/data/cpu-burst-config/clusterStrategy/policy"),
])
def test_a_bad_value_fails_at_template_time_naming_its_key(setting: str, key: str) -> None:
    done = helm_template("--set", setting, check=False)
    assert done.returncode != 0, f"{setting} was accepted"
    assert f"at '{key}'" in done.stderr, done.stderr


def test_the_feature_gate_pattern_names_every_koordlet_gate() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    pattern = schema["properties"]["koordlet"]["properties"]["features"]["pattern"]
    names = set(re.search(r"\(\(([A-Za-z0-9|]+)\)=", pattern).group(1).split("|"))
    assert names == {g.name for g in GATES} | {"AllAlpha", "AllBeta"}


_PLURALS = {"Namespace": "namespaces", "ServiceAccount": "serviceaccounts", "ConfigMap": "configmaps",
            "DaemonSet": "daemonsets", "ClusterRole": "clusterroles", "ClusterRoleBinding": "clusterrolebindings",
            "CustomResourceDefinition": "customresourcedefinitions", "NodeSLO": "nodeslos", "NodeMetric": "nodemetrics"}


def _create(client: kubernetes.client.ApiClient, doc: dict[str, Any]) -> dict[str, Any]:
    group_version = doc["apiVersion"]
    base = "/api/v1" if group_version == "v1" else f"/apis/{group_version}"
    namespace = doc["metadata"].get("namespace")
    path = f"{base}/namespaces/{namespace}/{_PLURALS[doc['kind']]}" if namespace else f"{base}/{_PLURALS[doc['kind']]}"
    request = client.param_serialize("POST", path, header_params={"Content-Type": "application/json"}, body=doc)
    response = client.call_api(*request)
    data = response.read()
    if not 200 <= response.status <= 299:
        raise kubernetes.client.ApiException.from_response(http_resp=response, body=data.decode(), data=None)
    return json.loads(data)


def test_the_rendered_objects_apply_to_the_api_server_and_the_crds_serve_koordinators_objects(tmp_path: Path) -> None:
    values_file = tmp_path / "values.yaml"
    values_file.write_text(yaml.safe_dump(EVERY_VALUE | {"installation": {"namespace": "qos-system",
                                                                          "createNamespace": True}}))
    for docs in (chart_documents(), chart_documents("--values", str(values_file))):
        crds = [d for d in docs if d["kind"] == "CustomResourceDefinition"]
        with ApiServer(crd_dir=None) as server, kube_api_client(server) as client:
            for doc in crds + [d for d in docs if d["kind"] == "Namespace"]:
                _create(client, doc)
            for doc in docs:
                if doc["kind"] not in ("CustomResourceDefinition", "Namespace"):
                    validate(doc)
                    _create(client, doc)
            assert len(server.list_objects("customresourcedefinitions")) == 4
            # The CRDs are served now: the objects Koordinator's manager writes are accepted.
            _create(client, {"apiVersion": "slo.koordinator.sh/v1alpha1", "kind": "NodeSLO",
                             "metadata": {"name": "node-1"},
                             "spec": {"resourceUsedThresholdWithBE": {"enable": True,
                                                                      "cpuSuppressThresholdPercent": 65}}})
            _create(client, {"apiVersion": "slo.koordinator.sh/v1alpha1", "kind": "NodeMetric",
                             "metadata": {"name": "node-1"}, "spec": {"metricCollectPolicy": {
                                 "aggregateDurationSeconds": 300, "reportIntervalSeconds": 60}}})
            daemonset = server.get_object("daemonsets", "koordlet", _koordlet_namespace(docs))
            assert daemonset is not None


def _koordlet_namespace(docs: list[dict[str, Any]]) -> str:
    return _of_kind(docs, "DaemonSet")["metadata"]["namespace"]


def test_the_api_server_refuses_a_crd_that_is_not_structural() -> None:
    [crd] = [d for d in chart_documents() if d["kind"] == "CustomResourceDefinition"
             and d["metadata"]["name"] == "nodeslos.slo.koordinator.sh"]
    del crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["type"]
    with ApiServer(crd_dir=None) as server, kube_api_client(server) as client:
        with pytest.raises(kubernetes.client.ApiException) as refused:
            _create(client, crd)
        assert refused.value.status == 422
        assert server.list_objects("customresourcedefinitions") == []


def test_by_default_koordlet_reaches_containerds_nri_socket_at_its_host_path() -> None:
    docs = chart_documents()
    pod = _of_kind(docs, "DaemonSet")["spec"]["template"]["spec"]
    container = pod["containers"][0]
    config = parse_config(container["args"], environ={"NODE_NAME": "node-1", "agent_mode": "hostMode"})
    assert config.enable_nri_runtime_hook
    _all_paths_under_mounts(container, pod, {
        config.nri_socket_path: "/var/run/nri/nri.sock",
        config.prediction_checkpoint_filepath: "/var/run/koordlet/prediction-checkpoints",
        config.system_config_record_file: "/var/run/koordlet/system-config-originals.json",
        config.audit_log_dir: "/var/log/koordlet",
        config.pod_resources_proxy_path: "/var/run/koordlet/pod-resources",
        os.path.join(config.var_lib_kubelet_dir, "pod-resources", "kubelet.sock"):
            "/var/lib/kubelet/pod-resources/kubelet.sock"})


@pytest.mark.parametrize("host_mode", [True, False])
def test_the_vendor_gates_get_the_host_dirs_they_read(host_mode: bool) -> None:
    docs = chart_documents("--set", "koordlet.features=TerwayQoS=true\\,HamiCoreVGPUMonitor=true\\,GPUEnvInject=true",
                           "--set", f"koordlet.hostMode={str(host_mode).lower()}")
    pod = _of_kind(docs, "DaemonSet")["spec"]["template"]["spec"]
    container = pod["containers"][0]
    environ = {"NODE_NAME": "node-1", **({"agent_mode": "hostMode"} if host_mode else {})}
    config = parse_config(container["args"], environ=environ)
    assert config.gate("TerwayQoS") and config.gate("HamiCoreVGPUMonitor")
    _all_paths_under_mounts(container, pod, {
        config.terway_qos_dir: "/var/lib/terway/qos",
        config.hami_core_library_directory_path: "/usr/local/vgpu/libvgpu.so",
        config.audit_log_dir: "/var/log/koordlet"})
