"""Our chart beside Koordinator's control plane (README, "Beside Koordinator's control plane", way (b)): the README's
own commands, rendered with Helm with their exact arguments and applied to the project's API server, share no object
name with Koordinator v1.8.0's chart, keep Koordinator's koordlet off our nodes and ours off the others, and ship no
CRD older than Koordinator's.

Koordinator's chart is not part of this repository: what it renders is recorded in koordinator_v1_8_0.py, and
where a checkout of koordinator-sh/charts is named by ``KOORDINATOR_CHARTS_DIR`` the facts are checked against it
with real Helm.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
from pathlib import Path
from typing import Any

from koordlet.reporters.nrt import NRT_VERSION
from tests.deploy import koordinator_v1_8_0 as koordinator
from tests.deploy.tools import CHART, ROOT, create_object, documents, object_key, tool
from tests.support.apiserver import ApiServer, kube_api_client, write_kubeconfig
from tests.test_docs_commands import extract

# Flags of `helm upgrade`/`install` that `helm template` has no use for (they act on a release in a cluster).
_RELEASE_ONLY_FLAGS = {"--reuse-values", "--wait", "--atomic", "--create-namespace"}


def _readme_way_b() -> list[str]:
    """The commands of the README's way (b), in order."""
    text = (ROOT / "README.md").read_text()
    start = text.index("#### (b) Our chart beside Koordinator's control plane")
    section = text[start:min(text.index("\n### ", start), text.index("\n#### ", start))]
    return [c.text for c in extract("README.md", section) if not c.inline]


def _command(verb: str, release: str) -> list[str]:
    [words] = [shlex.split(c) for c in _readme_way_b() if shlex.split(c)[:3] == ["helm", verb, release]]
    return words


def _template_args(words: list[str]) -> tuple[str, str, list[str]]:
    """(release, chart, flags) of `helm upgrade|install RELEASE CHART FLAGS`, without the release-only flags and the
    --version of a repository chart."""
    release, chart, flags = words[2], words[3], words[4:]
    kept: list[str] = []
    skip = False
    for flag in flags:
        if skip:
            skip = False
        elif flag == "--version":
            skip = True
        elif flag not in _RELEASE_ONLY_FLAGS:
            kept.append(flag)
    return release, chart, kept


def _helm_template(release: str, chart: str | Path, flags: list[str]) -> list[dict[str, Any]]:
    done = subprocess.run([tool("helm"), "template", release, str(chart), *flags], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return documents(done.stdout)


def _ours() -> list[dict[str, Any]]:
    release, chart, flags = _template_args(_command("install", "koordlet-py"))
    assert (ROOT / chart).resolve() == CHART
    return _helm_template(release, chart, flags)


def _koordinator_values(tmp_path: Path) -> dict[str, Any]:
    """The values the README's `helm upgrade koordinator ...` sets, as Helm parses them (a chart of ours that only
    prints its values stands in for Koordinator's)."""
    release, _, flags = _template_args(_command("upgrade", "koordinator"))
    probe = tmp_path / "values-probe"
    (probe / "templates").mkdir(parents=True)
    (probe / "Chart.yaml").write_text("apiVersion: v2\nname: values-probe\nversion: 1.8.0\n")
    (probe / "templates" / "values.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: values\ndata:\n  values: {{ toJson .Values | quote }}\n")
    [config_map] = _helm_template(release, probe, flags)
    return json.loads(config_map["data"]["values"])


def _koordinator_koordlet_affinity(values: dict[str, Any]) -> dict[str, Any]:
    """Koordinator's koordlet pod's affinity: its chart renders koordlet.nodeAffinity as given (recorded fact)."""
    value: dict[str, Any] = values
    for key in koordinator.KOORDLET_AFFINITY_VALUE.split("."):
        value = value.get(key) or {}
    return value


def _label_from_readme() -> tuple[str, str]:
    [words] = [shlex.split(c) for c in _readme_way_b() if c.startswith("kubectl label node")]
    key, _, value = words[-1].partition("=")
    return key, value


def _expression_matches(expression: dict[str, Any], labels: dict[str, str]) -> bool:
    key, operator, values = expression["key"], expression["operator"], expression.get("values") or []
    if operator == "In":
        return labels.get(key) in values
    if operator == "NotIn":
        return labels.get(key) not in values
    if operator == "Exists":
        return key in labels
    if operator == "DoesNotExist":
        return key not in labels
    if operator in ("Gt", "Lt") and key in labels:
        number, bound = int(labels[key]), int(values[0])
        return number > bound if operator == "Gt" else number < bound
    return False


def schedules_on(pod: dict[str, Any], labels: dict[str, str]) -> bool:
    """Whether the scheduler's node selector and required node affinity let ``pod`` onto a node with ``labels``."""
    if any(labels.get(key) != value for key, value in (pod.get("nodeSelector") or {}).items()):
        return False
    required = ((pod.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution")
    if not required:
        return True
    return any(all(_expression_matches(e, labels) for e in term.get("matchExpressions") or [])
               for term in required["nodeSelectorTerms"])


def test_our_objects_share_no_name_with_koordinators_chart() -> None:
    ours = {object_key(d) for d in _ours()}
    assert ours, "the README's way (b) renders nothing"
    assert not ours & (koordinator.OBJECTS | koordinator.SERVICE_MONITOR_OBJECTS)
    # With the chart's defaults, only the two things the README's arguments leave to Koordinator would collide.
    _, chart, flags = _template_args(_command("install", "koordlet-py"))
    defaults = {object_key(d) for d in _helm_template("koordlet-py", chart, ["--namespace", koordinator.NAMESPACE])}
    shared = {name for _, _, name in defaults & koordinator.OBJECTS}
    assert shared == {"slo-controller-config", *koordinator.CRD_VERSIONS}
    assert {"--set", "crds.managed=false"} <= set(flags) and "sloControllerConfig.create=false" in flags
    monitored = _helm_template("koordlet-py", chart, [*flags, "--set", "koordlet.enableServiceMonitor=true"])
    assert not {object_key(d) for d in monitored} & (koordinator.OBJECTS | koordinator.SERVICE_MONITOR_OBJECTS)


def test_our_crds_carry_every_version_koordinator_serves_and_its_storage_version() -> None:
    crds = {d["metadata"]["name"]: d for d in _helm_template("koordlet-py", CHART, []) if
            d["kind"] == "CustomResourceDefinition"}
    assert set(crds) == set(koordinator.CRD_VERSIONS)
    for name, (served, storage) in koordinator.CRD_VERSIONS.items():
        versions = crds[name]["spec"]["versions"]
        assert set(served) <= {v["name"] for v in versions if v["served"]}, name
        assert [v["name"] for v in versions if v["storage"]] == [storage], name
        assert crds[name]["spec"].get("conversion", {"strategy": "None"}) == {"strategy": "None"}
    # koordlet writes the version Koordinator v1.8.0's scheduler reads (its Go code imports the NRT API's v1alpha1).
    assert NRT_VERSION == "v1alpha1" and NRT_VERSION in koordinator.CRD_VERSIONS[
        "noderesourcetopologies.topology.node.k8s.io"][0]


def test_the_readme_way_b_puts_exactly_one_koordlet_on_each_node(tmp_path: Path) -> None:
    """The README's commands: ours rendered and applied to the project's API server beside stand-ins for every
    object of Koordinator's chart that server serves (no name is refused as taken), the README's `kubectl label`
    run for real against it, and each node admits exactly one koordlet DaemonSet."""
    ours = _ours()
    koordinator_affinity = _koordinator_koordlet_affinity(_koordinator_values(tmp_path))
    assert koordinator_affinity, "the README's Koordinator command sets no koordlet.nodeAffinity"
    key, value = _label_from_readme()
    [label_command] = [c for c in _readme_way_b() if c.startswith("kubectl label node")]
    node_name = shlex.split(label_command)[3]
    with ApiServer(crd_dir=None) as server, kube_api_client(server) as client:
        for name in (node_name, "worker-2"):
            server.seed({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name,
                                                                          "labels": {"kubernetes.io/os": "linux"}}})
        for kind, namespace, name in sorted(koordinator.OBJECTS):
            stand_in = _stand_in(kind, namespace, name)
            if stand_in is not None:
                create_object(client, stand_in)
        for doc in ours:
            create_object(client, doc)  # 409 AlreadyExists on a shared name
        env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path),
               "KUBECONFIG": str(write_kubeconfig(server, tmp_path / "kubeconfig"))}
        done = subprocess.run([tool("kubectl-1.35"), *shlex.split(label_command)[1:]], env=env, capture_output=True,
                              text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        labels = {n["metadata"]["name"]: n["metadata"]["labels"] for n in server.list_objects("nodes")}
    assert labels[node_name][key] == value and key not in labels["worker-2"]
    [daemonset] = [d for d in ours if d["kind"] == "DaemonSet"]
    our_pod = daemonset["spec"]["template"]["spec"]
    their_pod = {"affinity": koordinator_affinity}  # Koordinator's koordlet has no nodeSelector
    placed = {name: [who for who, pod in (("ours", our_pod), ("koordinator", their_pod)) if schedules_on(pod, node)]
              for name, node in labels.items()}
    assert placed == {node_name: ["ours"], "worker-2": ["koordinator"]}


def _stand_in(kind: str, namespace: str, name: str) -> dict[str, Any] | None:
    """A minimal object of Koordinator's with that name, for the kinds the project's API server serves."""
    meta = {"name": name, **({"namespace": namespace} if namespace else {})}
    bodies = {"ServiceAccount": ("v1", {}), "ConfigMap": ("v1", {"data": {}}),
              "Service": ("v1", {"spec": {"ports": [{"port": 443}]}}),
              "ClusterRole": ("rbac.authorization.k8s.io/v1", {"rules": []}),
              "ClusterRoleBinding": ("rbac.authorization.k8s.io/v1", {"roleRef": {
                  "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name}, "subjects": []}),
              "DaemonSet": ("apps/v1", {"spec": {"selector": {"matchLabels": {"koord-app": name}}, "template": {
                  "metadata": {"labels": {"koord-app": name}}, "spec": {"containers": [{"name": name,
                                                                                        "image": name}]}}}})}
    if kind == "CustomResourceDefinition" and name in koordinator.CRD_VERSIONS:
        [crd] = [d for d in _helm_template("koordlet-py", CHART, []) if d["metadata"]["name"] == name]
        return crd  # the same versions as Koordinator's (checked above)
    if kind not in bodies:
        return None
    api_version, body = bodies[kind]
    return {"apiVersion": api_version, "kind": kind, "metadata": meta, **body}


def test_the_recorded_facts_are_koordinators_chart(koordinator_chart: Path, tmp_path: Path) -> None:
    default = _helm_template("koordinator", koordinator_chart, ["--namespace", koordinator.NAMESPACE])
    assert {object_key(d) for d in default} == koordinator.OBJECTS
    monitored = _helm_template("koordinator", koordinator_chart, ["--namespace", koordinator.NAMESPACE, "--set",
                                                                  "koordlet.enableServiceMonitor=true"])
    assert {object_key(d) for d in monitored} - koordinator.OBJECTS == koordinator.SERVICE_MONITOR_OBJECTS
    crds = {d["metadata"]["name"]: d["spec"] for d in default if d["kind"] == "CustomResourceDefinition"}
    for name, (served, storage) in koordinator.CRD_VERSIONS.items():
        assert tuple(v["name"] for v in crds[name]["versions"] if v["served"]) == served
        assert [v["name"] for v in crds[name]["versions"] if v["storage"]] == [storage]
    # The README's Koordinator command, with its exact arguments, on the real chart: its koordlet's affinity is the
    # value as the probe chart read it, and it has no node selector.
    release, _, flags = _template_args(_command("upgrade", "koordinator"))
    [koordlet] = [d for d in _helm_template(release, koordinator_chart, flags)
                  if d["kind"] == "DaemonSet" and d["metadata"]["name"] == "koordlet"]
    pod = koordlet["spec"]["template"]["spec"]
    assert pod["affinity"] == _koordinator_koordlet_affinity(_koordinator_values(tmp_path))
    assert "nodeSelector" not in pod


def _readme_affinity_flags() -> list[str]:
    """The README's `--set-json koordlet.nodeAffinity=...` for Koordinator's chart, as it is written."""
    _, _, flags = _template_args(_command("upgrade", "koordinator"))
    [value] = [flags[i + 1] for i, flag in enumerate(flags) if flag == "--set-json"
               and flags[i + 1].startswith("koordlet.nodeAffinity=")]
    return ["--set-json", value]


def _koordlet_pod(docs: list[dict[str, Any]]) -> dict[str, Any]:
    [daemonset] = [d for d in docs if d["kind"] == "DaemonSet"]
    return daemonset["spec"]["template"]["spec"]


def test_the_readmes_node_affinity_value_gives_our_koordlet_the_affinity_it_gives_koordinators(
        tmp_path: Path) -> None:
    """koordlet.nodeAffinity keeps Koordinator's name and meaning: the pod's whole affinity (recorded fact of its
    chart), so the value the README gives Koordinator's chart renders the same affinity in ours."""
    ours = _koordlet_pod(_helm_template("koordlet-py", CHART, ["--namespace", koordinator.NAMESPACE,
                                                               *_readme_affinity_flags()]))
    assert ours["affinity"] == _koordinator_koordlet_affinity(_koordinator_values(tmp_path))


def test_one_node_affinity_value_renders_the_same_affinity_in_both_charts(koordinator_chart: Path) -> None:
    flags = ["--namespace", koordinator.NAMESPACE, *_readme_affinity_flags()]
    [theirs] = [d for d in _helm_template("koordinator", koordinator_chart, flags)
                if d["kind"] == "DaemonSet" and d["metadata"]["name"] == "koordlet"]
    ours = _koordlet_pod(_helm_template("koordlet-py", CHART, flags))
    assert ours["affinity"] == theirs["spec"]["template"]["spec"]["affinity"]
