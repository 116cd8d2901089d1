"""The Helm chart (deploy/chart/koordlet-py), checked by real Helm and kubectl (scripts/fetch-tools.sh):
lint, the default render against kustomize's, names and labels from the release, every documented value, refused
bad values, and the rendered objects through the project's API server. Where every path koordlet opens lies:
tests/deploy/test_paths.py; beside Koordinator's chart: tests/deploy/test_beside_koordinator.py."""

from __future__ import annotations

import json
import os
import re
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from koordlet.config import parse_config
from koordlet.features import GATES
from tests.deploy.kube_schema import validate
from tests.deploy.tools import (
    CHART,
    DEPLOY,
    NAMESPACE,
    ROOT,
    base_documents,
    chart_documents,
    create_object,
    helm_template,
    object_key,
    request,
    tool,
    without_helm_labels,
)
from tests.support.apiserver import ApiServer, kube_api_client

VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
CHART_VERSION = yaml.safe_load((CHART / "Chart.yaml").read_text())["version"]  # its own: CHANGELOG.md
VALUES = yaml.safe_load((CHART / "values.yaml").read_text())


def _sorted(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(docs, key=object_key)


def _of_kind(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    [doc] = [d for d in docs if d["kind"] == kind]
    return doc


def _koordlet(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return _of_kind(docs, "DaemonSet")["spec"]["template"]["spec"]["containers"][0]


def test_the_charts_app_version_and_image_follow_the_projects_version() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["appVersion"] == VERSION  # the chart's own version: tests/deploy/test_chart_version.py
    assert _koordlet(chart_documents())["image"] == _koordlet(base_documents())["image"] == f"koordlet-py:{VERSION}"


def test_helm_lint_strict_passes() -> None:
    done = subprocess.run([tool("helm"), "lint", "--strict", str(CHART)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 chart(s) linted, 0 chart(s) failed" in done.stdout
    assert "[ERROR]" not in done.stdout and "[WARNING]" not in done.stdout


def _kustomize(kubectl: str, directory: Path) -> list[dict[str, Any]]:
    done = subprocess.run([tool(kubectl), "kustomize", str(directory)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


@pytest.mark.parametrize("kubectl", ["kubectl-1.35", "kubectl-1.32"])
def test_default_render_is_the_same_objects_kustomize_builds(kubectl: str) -> None:
    """deploy/ (koordlet alone), deploy/crds/ and deploy/slo-controller-config/ together are the chart's default
    render, Helm's own labels aside."""
    rendered = [without_helm_labels(doc) for doc in chart_documents()]
    koordlet, crds, config = (_kustomize(kubectl, DEPLOY / part) for part in ("", "crds", "slo-controller-config"))
    assert _sorted(koordlet) == _sorted(base_documents())
    assert {d["kind"] for d in crds} == {"CustomResourceDefinition"} and [d["kind"] for d in config] == ["ConfigMap"]
    assert _sorted(koordlet + crds + config) == _sorted(rendered)
    # For kubelets before 1.33: deploy/kubelet-proxy/ beside them is the render with koordlet.kubeletNodesProxy=true.
    proxy = _kustomize(kubectl, DEPLOY / "kubelet-proxy")
    assert [(d["kind"], d["metadata"]["name"]) for d in proxy] == [("ClusterRole", "koordlet-py-kubelet-proxy"),
                                                                  ("ClusterRoleBinding", "koordlet-py-kubelet-proxy")]
    with_proxy = [without_helm_labels(doc) for doc in chart_documents("--set", "koordlet.kubeletNodesProxy=true")]
    assert _sorted(koordlet + proxy + crds + config) == _sorted(with_proxy)


def test_every_object_carries_the_standard_labels_and_the_release_name() -> None:
    for release, namespace in (("koordlet-py", "koordinator-system"), ("edge", "edge-agents")):
        for doc in chart_documents("--namespace", namespace, release=release):
            labels = doc["metadata"].get("labels") or {}
            if doc["kind"] == "CustomResourceDefinition":
                continue  # shared by every release: no release labels, and kept on uninstall
            assert labels == {"helm.sh/chart": f"koordlet-py-{CHART_VERSION}", "app.kubernetes.io/name": "koordlet-py",
                              "app.kubernetes.io/instance": release, "app.kubernetes.io/version": VERSION,
                              "app.kubernetes.io/managed-by": "Helm"}, doc["kind"]
            if doc["kind"] != "ConfigMap":  # slo-controller-config: koord-manager reads it by that name
                assert doc["metadata"]["name"] == ("koordlet-py" if release == "koordlet-py" else "edge-koordlet-py")
            if doc["kind"] not in ("ClusterRole", "ClusterRoleBinding"):
                assert doc["metadata"]["namespace"] == namespace
        daemonset = _of_kind(chart_documents("--namespace", namespace, release=release), "DaemonSet")
        selector = daemonset["spec"]["selector"]["matchLabels"]
        assert selector == {"app.kubernetes.io/name": "koordlet-py", "app.kubernetes.io/instance": release}
        assert selector.items() <= daemonset["spec"]["template"]["metadata"]["labels"].items()


def test_the_chart_makes_no_namespace_and_keeps_its_crds() -> None:
    docs = chart_documents()
    assert "Namespace" not in {d["kind"] for d in docs}
    crds = [d for d in docs if d["kind"] == "CustomResourceDefinition"]
    assert {d["metadata"]["name"] for d in crds} == {
        "nodeslos.slo.koordinator.sh", "nodemetrics.slo.koordinator.sh", "devices.scheduling.koordinator.sh",
        "noderesourcetopologies.topology.node.k8s.io"}
    assert all(d["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep" for d in crds)
    assert not [d for d in chart_documents("--set", "crds.managed=false") if d["kind"] == "CustomResourceDefinition"]


def test_an_upgraded_release_of_the_earlier_chart_keeps_its_namespace() -> None:
    """The earlier chart owned its Namespace; `--reuse-values` carries installation.createNamespace=true and the
    namespace of that chart, and the Namespace is rendered again with the keep policy, so Helm neither deletes it
    in the upgrade nor at a later uninstall. Another namespace value than the release's is refused."""
    reused = ("--set", "installation.createNamespace=true", "--set", f"installation.namespace={NAMESPACE}")
    [namespace] = [d for d in chart_documents(*reused) if d["kind"] == "Namespace"]
    assert namespace["metadata"]["name"] == NAMESPACE
    assert namespace["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    done = helm_template("--set", "installation.namespace=elsewhere", check=False)
    assert done.returncode != 0 and "is not the release's namespace" in done.stderr


def test_two_releases_share_no_object_name_but_slo_controller_config() -> None:
    first = {object_key(d) for d in chart_documents()}
    second = {object_key(d) for d in chart_documents(release="koordlet-py-gpu")}
    assert first & second == {("ConfigMap", NAMESPACE, "slo-controller-config")} | {
        object_key(d) for d in chart_documents() if d["kind"] == "CustomResourceDefinition"}
    alone = chart_documents("--set", "sloControllerConfig.create=false", "--set", "crds.managed=false",
                            release="koordlet-py-gpu")
    assert not first & {object_key(d) for d in alone}


def test_a_name_koordinators_chart_gives_its_koordlet_is_refused() -> None:
    for setting in ("fullnameOverride=koordlet", "fullnameOverride=koordlet-role"):
        done = helm_template("--set", setting, check=False)
        assert done.returncode != 0 and "one Koordinator's chart gives its own koordlet's objects" in done.stderr


def test_the_notes_say_how_to_check_the_install() -> None:
    """NOTES.txt, as `helm install` prints it (--dry-run=client: no cluster needed), names this release's objects."""
    done = subprocess.run([tool("helm"), "install", "edge", str(CHART), "--namespace", "edge-agents",
                           "--dry-run=client", "--set", "koordlet.metrics.port=19316"],
                          capture_output=True, text=True, timeout=120, env={"PATH": os.environ["PATH"],
                                                                         "KUBECONFIG": os.devnull})
    assert done.returncode == 0, done.stderr
    notes = done.stdout.split("NOTES:\n", 1)[1]
    assert "kubectl -n edge-agents rollout status daemonset/edge-koordlet-py" in notes
    assert "-l app.kubernetes.io/instance=edge" in notes
    assert ":19316/healthz" in notes and "deploy/examples/" in notes


_ONE_VALUE = {"sloControllerConfig.data", "koordlet.resources", "koordlet.nodeSelector", "koordlet.nodeAffinity",
              "koordlet.podAnnotations", "koordlet.podLabels", "koordlet.securityContext", "koordlet.updateStrategy",
              "koordlet.monitor.labels", "prometheusRule.labels"}


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
    "nameOverride": "qos-agent",
    "fullnameOverride": "edge-qos",
    "installation": {"createNamespace": True, "namespace": "qos-system"},
    "crds": {"managed": False},
    "imageRepositoryHost": "registry.example.com/team",
    "imagePullSecrets": [{"name": "pull-secret"}],
    "koordlet": {
        "image": {"repository": "koordlet-py-custom", "tag": "9.9.9", "pullPolicy": "Always"},
        "resources": {"requests": {"cpu": "100m", "memory": "200Mi"}, "limits": {"cpu": "1", "memory": "512Mi"}},
        "features": "BEMemoryEvict=true,CPUBurst=false",
        "extraArgs": ["-collect-res-used-interval=2s", "--kubelet-sync-interval=20s"],
        "hostMode": True,
        "nri": {"enabled": False, "pluginName": "qos", "pluginIndex": "07"},
        "hostDirs": {"koordletSockDir": "/run/koordlet-alt", "koordProxyRegisterDir": "/etc/hooks.d",
                     "kubeletLibDir": "/data/kubelet"},
        "metrics": {"port": 19316},
        "tls": {"certFile": "/data/kubelet/pki/kubelet-server-current.pem",
                "keyFile": "/data/kubelet/pki/kubelet-server-current.pem"},
        "service": {"enabled": True},
        "enableServiceMonitor": True,
        "enablePodMonitor": False,  # not both: the schema refuses it (test_the_chart_refuses_both_monitors_on)
        "monitor": {"interval": "15s", "labels": {"release": "prometheus"}},
        "priorityClassName": "node-agents",
        "nodeSelector": {"koordinator.sh/colocation": "true"},
        "nodeAffinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "kubernetes.io/os", "operator": "In", "values": ["linux"]}]}]}},
            "podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 1, "podAffinityTerm": {
                "topologyKey": "kubernetes.io/hostname", "labelSelector": {"matchLabels": {"app": "noisy"}}}}]}},
        "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "batch", "effect": "NoSchedule"}],
        "podAnnotations": {"example.com/scrape": "true"},
        "podLabels": {"team": "platform"},
        "extraEnv": [{"name": "KOORDLET_LOG_LEVEL", "value": "DEBUG"},
                     {"name": "NODE_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}}],
        "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}},
        "kubeletNodesProxy": True,
        "securityContext": {"privileged": True, "readOnlyRootFilesystem": True},
    },
    "sloControllerConfig": {"create": True, "data": {
        "resource-threshold-config": {"clusterStrategy": {"enable": True, "cpuSuppressThresholdPercent": 55}},
        "cpu-burst-config": {"clusterStrategy": {"policy": "auto"}}}},
    "prometheusRule": {"enabled": True, "labels": {"release": "prometheus"},
                       "runbookURL": "https://git.example.com/ops/koordlet-py/blob/v0.1.0/docs/operations.md"},
}


def _every_value_docs(tmp_path: Path) -> list[dict[str, Any]]:
    values_file = tmp_path / "values.yaml"
    values_file.write_text(yaml.safe_dump(EVERY_VALUE))
    return chart_documents("--namespace", "qos-system", "--values", str(values_file))


def _without_kubelet_proxy(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``docs`` without the two objects koordlet.kubeletNodesProxy adds, checked: nodes/proxy, bound to koordlet."""
    proxy = [d for d in docs if d["metadata"]["name"] == "edge-qos-kubelet-proxy"]
    assert [d["kind"] for d in proxy] == ["ClusterRole", "ClusterRoleBinding"]
    assert proxy[0]["rules"] == [{"apiGroups": [""], "resources": ["nodes/proxy"], "verbs": ["get"]}]
    assert proxy[1]["roleRef"]["name"] == "edge-qos-kubelet-proxy"
    assert proxy[1]["subjects"] == [{"kind": "ServiceAccount", "name": "edge-qos", "namespace": "qos-system"}]
    return [d for d in docs if d not in proxy]


def test_every_documented_value_is_rendered(tmp_path: Path) -> None:
    assert _leaves(EVERY_VALUE) == _leaves(VALUES), "set every value of values.yaml here (a new value needs a test)"
    docs = _every_value_docs(tmp_path)
    kinds = sorted(d["kind"] for d in docs)
    assert kinds == sorted(["Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "ConfigMap",
                            "DaemonSet", "Service", "ServiceMonitor", "PrometheusRule",
                            "ClusterRole", "ClusterRoleBinding"])  # kubeletNodesProxy: nodes/proxy, on its own
    docs = _without_kubelet_proxy(docs)
    namespace = _of_kind(docs, "Namespace")
    assert namespace["metadata"]["name"] == "qos-system"
    assert namespace["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}
    docs = [d for d in docs if d["kind"] != "Namespace"]
    for doc in docs:
        assert doc["metadata"]["name"] == ("slo-controller-config" if doc["kind"] == "ConfigMap" else "edge-qos")
        assert doc["metadata"]["labels"]["app.kubernetes.io/name"] == "qos-agent"
        if doc["kind"] not in ("ServiceMonitor", "PodMonitor", "PrometheusRule"):  # the Operator's CRDs: no models
            validate(doc)
        if doc["kind"] not in ("ClusterRole", "ClusterRoleBinding"):
            assert doc["metadata"]["namespace"] == "qos-system"
    assert _of_kind(docs, "ClusterRoleBinding")["subjects"][0]["namespace"] == "qos-system"
    daemonset = _of_kind(docs, "DaemonSet")
    template = daemonset["spec"]["template"]
    pod = template["spec"]
    container = pod["containers"][0]
    assert container["image"] == "registry.example.com/team/koordlet-py-custom:9.9.9"
    assert container["imagePullPolicy"] == "Always"
    assert pod["imagePullSecrets"] == [{"name": "pull-secret"}]
    assert container["resources"] == EVERY_VALUE["koordlet"]["resources"]
    assert pod["priorityClassName"] == "node-agents"
    # Helm merges maps: the default kubernetes.io/os stays unless set to null.
    assert pod["nodeSelector"] == {"kubernetes.io/os": "linux", "koordinator.sh/colocation": "true"}
    assert pod["affinity"] == EVERY_VALUE["koordlet"]["nodeAffinity"]  # the whole affinity, as Koordinator's
    assert pod["tolerations"] == EVERY_VALUE["koordlet"]["tolerations"]
    assert template["metadata"]["annotations"] == {"example.com/scrape": "true"}
    assert template["metadata"]["labels"]["team"] == "platform"
    assert daemonset["spec"]["updateStrategy"] == EVERY_VALUE["koordlet"]["updateStrategy"]
    assert container["securityContext"] == EVERY_VALUE["koordlet"]["securityContext"]
    assert container["env"][-2:] == EVERY_VALUE["koordlet"]["extraEnv"]
    assert container["ports"][0]["containerPort"] == 19316
    for probe in ("startupProbe", "livenessProbe"):  # HTTPS: koordlet.tls is set
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": 19316, "scheme": "HTTPS"}
    # ready = started and the states informer synced; /healthz also fails on a stalled loop (docs/operations.md)
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": 19316, "scheme": "HTTPS"}
    assert container["args"][-3:] == ["-feature-gates=BEMemoryEvict=true,CPUBurst=false",
                                      "-collect-res-used-interval=2s", "--kubelet-sync-interval=20s"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    config = parse_config(container["args"], environ={"NODE_NAME": "node-1", "agent_mode": env["agent_mode"]})
    assert config.addr == "0.0.0.0:19316"
    assert not config.enable_nri_runtime_hook and "nri" not in {v["name"] for v in pod["volumes"]}
    assert (config.runtime_hooks_nri_plugin_name, config.runtime_hooks_nri_plugin_index) == ("qos", "07")
    assert config.feature_gates["BEMemoryEvict"] is True and config.feature_gates["CPUBurst"] is False
    assert (config.runtime_hooks_addr, config.runtime_hooks_config_path) == ("/run/koordlet-alt/koordlet.sock",
                                                                            "/etc/hooks.d")
    assert config.device_plugin_dir == "/data/kubelet/device-plugins"
    assert config.serving_tls == ("/data/kubelet/pki/kubelet-server-current.pem",) * 2
    data = _of_kind(docs, "ConfigMap")["data"]
    threshold = json.loads(data["resource-threshold-config"])["clusterStrategy"]
    assert (threshold["enable"], threshold["cpuSuppressThresholdPercent"], threshold["memoryEvictThresholdPercent"]) \
        == (True, 55, 70)  # set, set, and the default beside them kept
    assert json.loads(data["cpu-burst-config"])["clusterStrategy"]["policy"] == "auto"


def test_the_service_and_the_monitors_scrape_this_releases_pods(tmp_path: Path) -> None:
    docs = _every_value_docs(tmp_path)
    selector = _of_kind(docs, "DaemonSet")["spec"]["selector"]["matchLabels"]
    values_file = tmp_path / "pod-monitor.yaml"
    values_file.write_text(yaml.safe_dump({**EVERY_VALUE, "koordlet": {
        **EVERY_VALUE["koordlet"], "enableServiceMonitor": False, "enablePodMonitor": True}}))
    pod_monitor = _of_kind(chart_documents("--namespace", "qos-system", "--values", str(values_file)), "PodMonitor")
    service, monitors = _of_kind(docs, "Service"), [_of_kind(docs, "ServiceMonitor"), pod_monitor]
    assert service["spec"]["selector"] == selector and service["spec"]["clusterIP"] == "None"
    assert service["spec"]["ports"] == [{"name": "http-metrics", "port": 19316, "targetPort": "http-metrics",
                                         "protocol": "TCP"}]
    for monitor in monitors:
        assert monitor["spec"]["selector"] == {"matchLabels": selector}
        assert monitor["metadata"]["labels"]["release"] == "prometheus"
    assert monitors[0]["spec"]["endpoints"][0]["port"] == monitors[1]["spec"]["podMetricsEndpoints"][0]["port"] \
        == "http-metrics"
    assert monitors[0]["spec"]["endpoints"][0]["interval"] == "15s"
    for endpoint in (monitors[0]["spec"]["endpoints"][0], monitors[1]["spec"]["podMetricsEndpoints"][0]):
        assert (endpoint["scheme"], endpoint["tlsConfig"]) == ("https", {"insecureSkipVerify": True})  # koordlet.tls
    # Koordinator's value name alone brings the Service with the ServiceMonitor; by default there is neither.
    kinds = {d["kind"] for d in chart_documents("--set", "koordlet.enableServiceMonitor=true")}
    assert {"Service", "ServiceMonitor"} <= kinds and "PodMonitor" not in kinds
    assert not {"Service", "ServiceMonitor", "PodMonitor"} & {d["kind"] for d in chart_documents()}


@pytest.mark.parametrize("command", ["template", "lint"])
def test_the_chart_refuses_both_monitors_on_saying_why(command: str) -> None:
    """A ServiceMonitor and a PodMonitor over the same pods would scrape every koordlet twice."""
    done = subprocess.run([tool("helm"), command, *(["x"] if command == "template" else []), str(CHART),
                           "--set", "koordlet.enableServiceMonitor=true", "--set", "koordlet.enablePodMonitor=true"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert ("enableServiceMonitor and enablePodMonitor are exclusive (both on scrape every koordlet twice): turn one "
            "off") in done.stdout + done.stderr


def test_without_host_mode_the_pod_has_koordinators_layout() -> None:
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


def test_slo_controller_config_can_be_left_to_koordinators_own_chart() -> None:
    docs = chart_documents("--set", "sloControllerConfig.create=false")
    assert not [d for d in docs if d["kind"] == "ConfigMap"]


@pytest.mark.parametrize(("setting", "key"), [
    ("koordlet.image.pullPolicy=Sometimes", "/koordlet/image/pullPolicy"),
    ("koordlet.image.repository=Not A Name", "/koordlet/image/repository"),
    ("koordlet.features=BECPUSupress=true", "/koordlet/features"),
    ("koordlet.features=BECPUSuppress=maybe", "/koordlet/features"),
    ("koordlet.extraArgs[0]=collect-res-used-interval=2s", "/koordlet/extraArgs/0"),
    ("koordlet.hostMode=yes", "/koordlet/hostMode"),
    ("koordlet.hostDirs.koordletSockDir=var/run/koordlet", "/koordlet/hostDirs/koordletSockDir"),
    ("koordlet.metrics.port=70000", "/koordlet/metrics/port"),
    ("koordlet.tls.certFile=pki/kubelet.crt", "/koordlet/tls/certFile"),
    ("koordlet.resources.limits.memory=lots", "/koordlet/resources/limits/memory"),
    ("koordlet.tolerations[0].operator=Sometimes", "/koordlet/tolerations/0/operator"),
    ("koordlet.nodeAffinity.nodeSelectorTerms=x", "/koordlet/nodeAffinity"),
    ("koordlet.nodeSelector.zone=null", "/koordlet/nodeSelector/zone"),
    ("koordlet.imagee.tag=1", "/koordlet"),
    ("koordlet.nri.pluginIndex=7", "/koordlet/nri/pluginIndex"),
    ("koordlet.nri.pluginName=koordlet nri", "/koordlet/nri/pluginName"),
    ("koordlet.monitor.interval=soon", "/koordlet/monitor/interval"),
    ("koordlet.updateStrategy.type=Sometimes", "/koordlet/updateStrategy/type"),
    ("koordlet.extraEnv[0].name=1 BAD", "/koordlet/extraEnv/0/name"),
    ("fullnameOverride=Koordlet_Py", "/fullnameOverride"),
    ("crds.managed=maybe", "/crds/managed"),
    ("prometheusRule.runbookURL=docs/operations.md", "/prometheusRule/runbookURL"),
    ("prometheusRule.runbookURL=https://git.example.com/operations.md#koordletdown", "/prometheusRule/runbookURL"),
    ("sloControllerConfig.data.resource-threshold-config.clusterStrategy.cpuSuppressThresholdPercent=150",
     "/sloControllerConfig/data/resource-threshold-config/clusterStrategy/cpuSuppressThresholdPercent"),
    ("sloControllerConfig.data.cpu-burst-config.clusterStrategy.policy=always",
     "/sloControllerConfig/data/cpu-burst-config/clusterStrategy/policy"),
])
def test_a_bad_value_fails_at_template_time_naming_its_key(setting: str, key: str) -> None:
    done = helm_template("--set", setting, check=False)
    assert done.returncode != 0, f"{setting} was accepted"
    assert f"at '{key}'" in done.stderr, done.stderr


@pytest.mark.parametrize(("settings", "message"), [
    (("koordlet.tls.certFile=/var/lib/kubelet/pki/kubelet.crt",),
     "koordlet.tls.certFile and koordlet.tls.keyFile go together"),
    (("koordlet.tls.certFile=/etc/kubernetes/pki/node.crt", "koordlet.tls.keyFile=/var/lib/kubelet/pki/kubelet.key"),
     "koordlet.tls: /etc/kubernetes/pki/node.crt is not under koordlet.hostDirs.kubeletLibDir (/var/lib/kubelet)"),
])
def test_tls_files_go_together_and_lie_where_the_pod_sees_them(settings: tuple[str, ...], message: str) -> None:
    done = helm_template(*(x for setting in settings for x in ("--set", setting)), check=False)
    assert done.returncode != 0 and message in done.stderr, done.stderr


def test_without_tls_the_probes_and_monitors_speak_plain_http() -> None:
    docs = chart_documents("--set", "koordlet.enableServiceMonitor=true")
    container = _koordlet(docs)
    assert "scheme" not in container["livenessProbe"]["httpGet"]
    assert not [a for a in container["args"] if a.startswith("-tls-")]
    assert "scheme" not in _of_kind(docs, "ServiceMonitor")["spec"]["endpoints"][0]


def test_a_bare_node_affinity_block_is_refused_saying_where_it_goes() -> None:
    """koordlet.nodeAffinity is the pod's whole affinity (Koordinator's meaning): the block that used to be the value
    here, with its keys at the top, is refused with the place they belong, not rendered as a doubled key."""
    for key in ("requiredDuringSchedulingIgnoredDuringExecution", "preferredDuringSchedulingIgnoredDuringExecution"):
        done = helm_template("--set-json", f'koordlet.nodeAffinity={{"{key}":{{}}}}', check=False)
        assert done.returncode != 0
        assert f"at '/koordlet/nodeAffinity/{key}'" in done.stderr
        assert "moved under koordlet.nodeAffinity.nodeAffinity" in done.stderr, done.stderr


def test_the_feature_gate_pattern_names_every_koordlet_gate() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    pattern = schema["properties"]["koordlet"]["properties"]["features"]["pattern"]
    names = set(re.search(r"\(\(([A-Za-z0-9|]+)\)=", pattern).group(1).split("|"))
    assert names == {g.name for g in GATES} | {"AllAlpha", "AllBeta"}


def _prometheus_operator_crd(kind: str) -> dict[str, Any]:
    """A stand-in for the Prometheus Operator's CRD of ``kind`` (its group, names and scope; spec left open), as
    a cluster that runs the operator has it."""
    plural = kind.lower() + "s"
    return {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": f"{plural}.monitoring.coreos.com"},
            "spec": {"group": "monitoring.coreos.com", "scope": "Namespaced",
                     "names": {"kind": kind, "listKind": f"{kind}List", "plural": plural, "singular": kind.lower()},
                     "versions": [{"name": "v1", "served": True, "storage": True, "schema": {"openAPIV3Schema": {
                         "type": "object", "properties": {"spec": {"type": "object",
                                                                   "x-kubernetes-preserve-unknown-fields": True}}}}}]}}


def test_the_rendered_objects_apply_to_the_api_server_and_the_crds_serve_koordinators_objects(tmp_path: Path) -> None:
    crds = [d for d in chart_documents() if d["kind"] == "CustomResourceDefinition"]
    for docs in (chart_documents(), _every_value_docs(tmp_path)):
        with ApiServer(crd_dir=None) as server, kube_api_client(server) as client:
            for doc in crds + [_prometheus_operator_crd(kind) for kind in ("ServiceMonitor", "PodMonitor",
                                                                           "PrometheusRule")]:
                create_object(client, doc)
            for doc in docs:
                if doc["kind"] != "CustomResourceDefinition":
                    create_object(client, doc)
            assert len(server.list_objects("customresourcedefinitions")) == 7
            # The CRDs are served now: the objects Koordinator's manager writes are accepted.
            create_object(client, {"apiVersion": "slo.koordinator.sh/v1alpha1", "kind": "NodeSLO",
                             "metadata": {"name": "node-1"},
                             "spec": {"resourceUsedThresholdWithBE": {"enable": True,
                                                                      "cpuSuppressThresholdPercent": 65}}})
            create_object(client, {"apiVersion": "slo.koordinator.sh/v1alpha1", "kind": "NodeMetric",
                             "metadata": {"name": "node-1"}, "spec": {"metricCollectPolicy": {
                                 "aggregateDurationSeconds": 300, "reportIntervalSeconds": 60}}})
            daemonset = _of_kind(docs, "DaemonSet")["metadata"]
            assert server.get_object("daemonsets", daemonset["name"], daemonset["namespace"]) is not None


def test_the_nrt_crd_serves_both_versions_and_stores_v1alpha2() -> None:
    """koordlet writes v1alpha1 (what Koordinator v1.8.0's scheduler reads); the object is stored as v1alpha2 and
    reads back in either version, only apiVersion changing (conversion None)."""
    [nrt_crd] = [d for d in chart_documents() if d["metadata"]["name"].startswith("noderesourcetopologies.")]
    zones = [{"name": "node-0", "type": "Node", "resources": [
        {"name": "cpu", "capacity": "8", "allocatable": "8", "available": "6"}]}]
    with ApiServer(crd_dir=None) as server, kube_api_client(server) as client:
        created = create_object(client, nrt_crd)
        assert created["status"]["storedVersions"] == ["v1alpha2"]
        create_object(client, {"apiVersion": "topology.node.k8s.io/v1alpha1", "kind": "NodeResourceTopology",
                         "metadata": {"name": "node-1"}, "topologyPolicies": ["None"], "zones": zones})
        assert server.get_object("noderesourcetopologies", "node-1")["apiVersion"] == "topology.node.k8s.io/v1alpha2"
        for version in ("v1alpha1", "v1alpha2"):
            read = request(client, "GET", f"/apis/topology.node.k8s.io/{version}/noderesourcetopologies/node-1")
            assert read["apiVersion"] == f"topology.node.k8s.io/{version}"
            assert (read["zones"], read["topologyPolicies"]) == (zones, ["None"])
