"""The koordlet ClusterRole allows exactly the calls koordlet's code makes, to the API server and to kubelet: the
plain manifests' role (deploy/base/rbac.yaml) and the one the Helm chart renders; deploy/kubelet-proxy/ (the chart's
koordlet.kubeletNodesProxy) adds exactly what kubelets before 1.33 ask instead. The project's API server, with the
role applied, allows every one of those calls to koordlet's service account, and nodes/proxy to none.

One call is bare metal's alone: the renewal of koordlet's own token outside a pod (koordlet/credentials.py,
TokenRequest). A pod's token is kubelet's to renew, so the DaemonSet's role does not grant it; deploy/baremetal/
grants it, for that one service account."""

from __future__ import annotations

import json
import textwrap
import types
from pathlib import Path

import pytest
import yaml

from koordlet.statesinformer.kubelet import KUBELET_CALLS
from tests.deploy.rbac_scan import kubelet_permissions, role_permissions, scan_package, scan_source
from tests.deploy.tools import DEPLOY, chart_documents
from tests.support.apiserver import ApiServer, create_objects, kube_api_client

ROOT = Path(__file__).resolve().parents[2]
RBAC = ROOT / "deploy" / "base" / "rbac.yaml"
RBAC_KINDS = ("ServiceAccount", "ClusterRole", "ClusterRoleBinding")
BARE_METAL_ONLY = "koordlet/credentials.py"  # the calls of this module: deploy/baremetal/'s token.yaml grants them


def _docs(source: str = "kustomize") -> dict[str, dict]:
    docs = yaml.safe_load_all(RBAC.read_text()) if source == "kustomize" else chart_documents()
    return {doc["kind"]: doc for doc in docs if doc and doc["kind"] in RBAC_KINDS + ("DaemonSet",)}


@pytest.fixture(params=["kustomize", "helm"])
def role_source(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(scope="module")
def all_calls() -> list:
    calls, problems = scan_package(ROOT, "koordlet")
    assert problems == [], "the RBAC scan cannot map these calls:\n" + "\n".join(problems)
    return calls


@pytest.fixture(scope="module")
def code_calls(all_calls: list) -> list:
    """The calls koordlet makes wherever it runs (not the bare-metal token renewal)."""
    return [call for call in all_calls if not call.where.startswith(BARE_METAL_ONLY)]


def test_the_bare_metal_token_renewal_is_granted_for_its_own_account_only(all_calls: list) -> None:
    renewal = {perm for call in all_calls if call.where.startswith(BARE_METAL_ONLY) for perm in call.permissions}
    assert renewal == {("", "serviceaccounts/token", "create")}
    role, binding = yaml.safe_load_all((DEPLOY / "baremetal" / "token.yaml").read_text())
    [rule] = role["rules"]
    assert (rule["apiGroups"], rule["resources"], rule["verbs"]) == ([""], ["serviceaccounts/token"], ["create"])
    # the account deploy/baremetal/ makes (deploy/'s, renamed by its nameSuffix), and no other
    suffix = yaml.safe_load((DEPLOY / "baremetal" / "kustomization.yaml").read_text())["nameSuffix"]
    assert rule["resourceNames"] == [_docs()["ServiceAccount"]["metadata"]["name"] + suffix]
    assert binding["roleRef"]["name"] == role["metadata"]["name"] and binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "koordlet-py", "namespace": role["metadata"]["namespace"]}]


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


def test_every_kubelet_call_of_koordlet_is_allowed_by_the_role_on_kubelets_from_1_33(role_source: str) -> None:
    granted = role_permissions(_docs(role_source)["ClusterRole"])
    assert kubelet_permissions(KUBELET_CALLS) == {("", "nodes/pods", "get"), ("", "nodes/configz", "get")}
    assert kubelet_permissions(KUBELET_CALLS) <= granted
    assert not {perm for perm in granted if perm[1] == "nodes/proxy"}, "nodes/proxy opens exec: not by default"


def test_the_kubelet_proxy_objects_grant_what_older_kubelets_ask_and_nothing_else() -> None:
    for docs in (list(yaml.safe_load_all((DEPLOY / "kubelet-proxy" / "rbac.yaml").read_text())),
                 [d for d in chart_documents("--set", "koordlet.kubeletNodesProxy=true")
                  if d["metadata"]["name"] == "koordlet-py-kubelet-proxy"]):
        role, binding = docs
        assert role_permissions(role) == kubelet_permissions(KUBELET_CALLS, fine_grained_authz=False) == {
            ("", "nodes/proxy", "get")}
        assert binding["roleRef"]["name"] == role["metadata"]["name"]
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "koordlet-py",
                                        "namespace": "koordinator-system"}]


def test_the_role_grants_nothing_koordlet_does_not_call(code_calls: list, role_source: str) -> None:
    needed = set().union(*(call.permissions for call in code_calls)) | kubelet_permissions(KUBELET_CALLS)
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


def test_the_api_server_allows_every_call_to_the_service_account_under_the_role(code_calls: list,
                                                                              role_source: str) -> None:
    """The role applied to the project's API server (the authorizer a request meets) as the chart or deploy/ ship it:
    a SubjectAccessReview of each permission the calls need, for koordlet's service account, is allowed; nodes/proxy
    (exec, attach) and a write of a NodeMetric's spec are not."""
    docs = _docs(role_source)
    needed = set().union(*(call.permissions for call in code_calls)) | kubelet_permissions(KUBELET_CALLS)
    account = docs["ServiceAccount"]["metadata"]
    user = f"system:serviceaccount:{account['namespace']}:{account['name']}"
    groups = ["system:serviceaccounts", f"system:serviceaccounts:{account['namespace']}", "system:authenticated"]

    def allowed(group: str, resource: str, verb: str) -> bool:
        name, _, subresource = resource.partition("/")
        review = {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
                  "spec": {"user": user, "groups": groups, "resourceAttributes": {
                      "group": group, "resource": name, "subresource": subresource, "verb": verb, "name": "node-1"}}}
        with kube_api_client(server) as client:
            request = client.param_serialize("POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews",
                                             header_params={"Content-Type": "application/json"}, body=review)
            response = client.call_api(*request)
            return bool(json.loads(response.read())["status"]["allowed"])

    with ApiServer() as server:
        create_objects(server, [docs[kind] for kind in RBAC_KINDS])
        refused = sorted(perm for perm in needed if not allowed(*perm))
        assert refused == [], refused
        assert not allowed("", "nodes/proxy", "get") and not allowed("", "nodes/proxy", "create")
        assert not allowed("slo.koordinator.sh", "nodemetrics", "update")
