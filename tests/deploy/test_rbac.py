"""The koordlet ClusterRole allows exactly the API calls koordlet's code makes: the plain manifests' role
(deploy/base/rbac.yaml) and the one the Helm chart renders."""

from __future__ import annotations

import textwrap
import types
from pathlib import Path

import pytest
import yaml

from tests.deploy.rbac_scan import role_permissions, scan_package, scan_source
from tests.deploy.tools import chart_documents

ROOT = Path(__file__).resolve().parents[2]
RBAC = ROOT / "deploy" / "base" / "rbac.yaml"
RBAC_KINDS = ("ServiceAccount", "ClusterRole", "ClusterRoleBinding")


def _docs(source: str = "kustomize") -> dict[str, dict]:
    docs = yaml.safe_load_all(RBAC.read_text()) if source == "kustomize" else chart_documents()
    return {doc["kind"]: doc for doc in docs if doc and doc["kind"] in RBAC_KINDS + ("DaemonSet",)}


@pytest.fixture(params=["kustomize", "helm"])
def role_source(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(scope="module")
def code_calls() -> list:
    calls, problems = scan_package(ROOT, "koordlet")
    assert problems == [], "the RBAC scan cannot map these calls:\n" + "\n".join(problems)
    return calls


def test_scan_maps_calls_watch_streams_and_custom_object_plurals() -> None:
    source = textwrap.dedent(
        """
        from kubernetes import watch
        GROUP = "slo.koordinator.sh"
        def run(core, custom):
            for event in watch.Watch().stream(core.list_node, field_selector="metadata.name=n"):
                pass
            core.list_namespaced_pod("ns", watch=True)
            custom.list_cluster_custom_object(GROUP, "v1alpha1", "nodeslos")
            custom.patch_cluster_custom_object_status(group=GROUP, version="v1alpha1", plural="nodemetrics",
                                                      name="n", body={})
            core.create_namespaced_pod_eviction("p", "ns", {})
            watcher = Watcher(core.list_namespaced_event)  # a list method handed to a list/watch helper
            def list_metrics(**kwargs):
                return custom.list_cluster_custom_object(GROUP, "v1alpha1", "nodemetrics", **kwargs)
        """
    )
    module = types.SimpleNamespace(GROUP="slo.koordinator.sh")
    calls, problems = scan_source(source, "snippet.py", module)
    assert problems == []
    assert set().union(*(c.permissions for c in calls)) == {
        ("", "nodes", "list"),
        ("", "nodes", "watch"),
        ("", "pods", "list"),
        ("", "pods", "watch"),
        ("slo.koordinator.sh", "nodeslos", "list"),
        ("slo.koordinator.sh", "nodemetrics/status", "patch"),
        ("", "pods/eviction", "create"),
        ("", "events", "list"),
        ("", "events", "watch"),
        ("slo.koordinator.sh", "nodemetrics", "list"),
        ("slo.koordinator.sh", "nodemetrics", "watch"),  # **kwargs may carry watch=True
    }


def test_scan_reports_a_plural_it_cannot_resolve() -> None:
    source = "def f(custom, plural):\n    custom.get_cluster_custom_object('g', 'v1', plural, 'n')\n"
    calls, problems = scan_source(source, "snippet.py", types.SimpleNamespace())
    assert calls == []
    assert len(problems) == 1 and "get_cluster_custom_object" in problems[0]


def test_every_kubernetes_call_in_koordlet_is_allowed_by_the_role(code_calls: list, role_source: str) -> None:
    assert code_calls, "the scan found no kubernetes-client calls at all in koordlet/"
    granted = role_permissions(_docs(role_source)["ClusterRole"])
    missing = sorted(
        f"{call.where}: {call.method} needs {group or 'core'} {resource} {verb}"
        for call in code_calls
        for group, resource, verb in call.permissions
        if (group, resource, verb) not in granted
    )
    assert missing == [], "add these to deploy/base/rbac.yaml and the chart's templates/rbac.yaml:\n" + "\n".join(
        missing)


def test_the_role_grants_nothing_koordlet_does_not_call(code_calls: list, role_source: str) -> None:
    needed = set().union(*(call.permissions for call in code_calls))
    granted = role_permissions(_docs(role_source)["ClusterRole"])
    assert not any("*" in part for perm in granted for part in perm), "no wildcards in the koordlet role"
    unused = sorted(granted - needed)
    assert unused == [], f"no code in koordlet/ needs these grants; remove them from deploy/base/rbac.yaml: {unused}"


def test_role_is_bound_to_the_service_account_the_daemonset_runs_as(role_source: str) -> None:
    docs = _docs(role_source)
    daemonset = docs.get("DaemonSet") or yaml.safe_load((ROOT / "deploy" / "base" / "koordlet.yaml").read_text())
    account = docs["ServiceAccount"]["metadata"]
    binding = docs["ClusterRoleBinding"]
    # The release's name (koordlet-py), never Koordinator's "koordlet": the two charts install side by side.
    assert daemonset["spec"]["template"]["spec"]["serviceAccountName"] == account["name"] == "koordlet-py"
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": docs["ClusterRole"]["metadata"]["name"],
    }
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "koordlet-py",
                                    "namespace": account["namespace"]}]
