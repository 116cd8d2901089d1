"""What the project's API server lets a user do: RBAC over the roles and bindings applied to it, the Node authorizer
for kubelets, NodeRestriction, and Kubernetes' Forbidden Status for everything else."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import kubernetes.client
from kubernetes.client.exceptions import ApiException

from tests.support.apiserver import ApiServer, Credentials, kube_api_client

RBAC = "rbac.authorization.k8s.io/v1"
NODE = "node-1"
METRIC = ("slo.koordinator.sh", "v1alpha1", "nodemetrics")


def _as(server: ApiServer, credentials: Credentials, call: Callable[[kubernetes.client.ApiClient], Any]) -> Any:
    """What ``call`` returns for ``credentials``, or the refusal's (status, Status body)."""
    with kube_api_client(server, credentials) as client:
        try:
            return call(client)
        except ApiException as refused:
            return refused.status, json.loads(refused.body)


def _grant(server: ApiServer, name: str, rules: list[dict], user: str = "alice", namespace: str = "",
           role_kind: str = "ClusterRole") -> Credentials:
    role = {"apiVersion": RBAC, "kind": role_kind, "metadata": {"name": name}, "rules": rules}
    binding = {"apiVersion": RBAC, "kind": "RoleBinding" if namespace else "ClusterRoleBinding",
               "metadata": {"name": name},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": role_kind, "name": name},
               "subjects": [{"kind": "User", "name": user}]}
    for obj in (role, binding):
        if obj["kind"] in ("Role", "RoleBinding"):
            obj["metadata"]["namespace"] = namespace
        server.seed(obj)
    return server.client_credentials(user)


def _metric(server: ApiServer) -> None:
    server.seed({"apiVersion": "slo.koordinator.sh/v1alpha1", "kind": "NodeMetric", "metadata": {"name": NODE}})


def _update_status(client: kubernetes.client.ApiClient) -> dict:
    custom = kubernetes.client.CustomObjectsApi(client)
    current = custom.get_cluster_custom_object(*METRIC, NODE)
    return custom.replace_cluster_custom_object_status(*METRIC, NODE, {**current, "status": {}})


def test_a_refusal_is_a_forbidden_status_naming_the_user_verb_resource_and_scope(server: ApiServer) -> None:
    _metric(server)
    alice = _grant(server, "metric-reader", [{"apiGroups": ["slo.koordinator.sh"], "resources": ["nodemetrics"],
                                              "verbs": ["get"]}])
    code, status = _as(server, alice, _update_status)
    assert code == 403
    assert status == {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "code": 403,
                      "reason": "Forbidden",
                      "details": {"name": NODE, "group": "slo.koordinator.sh", "kind": "nodemetrics"},
                      "message": 'nodemetrics.slo.koordinator.sh "node-1" is forbidden: User "alice" cannot update '
                                 'resource "nodemetrics/status" in API group "slo.koordinator.sh" at the cluster '
                                 'scope'}
    code, status = _as(server, alice, lambda c: kubernetes.client.CoreV1Api(c).list_namespaced_pod("shop"))
    assert status["message"] == 'pods is forbidden: User "alice" cannot list resource "pods" in API group "" in ' \
                                'the namespace "shop"'
    assert status["details"] == {"kind": "pods"}


def test_the_subresource_is_its_own_grant(server: ApiServer) -> None:
    _metric(server)
    alice = _grant(server, "metric-status", [
        {"apiGroups": ["slo.koordinator.sh"], "resources": ["nodemetrics"], "verbs": ["get"]},
        {"apiGroups": ["slo.koordinator.sh"], "resources": ["nodemetrics/status"], "verbs": ["update"]}])
    assert _as(server, alice, _update_status)["metadata"]["name"] == NODE
    code, status = _as(server, alice, lambda c: kubernetes.client.CustomObjectsApi(c).replace_cluster_custom_object(
        *METRIC, NODE, server.get_object("nodemetrics", NODE)))
    assert code == 403 and 'cannot update resource "nodemetrics" in API group' in status["message"]


def test_resource_names_bind_get_and_a_list_by_name_but_not_a_list_of_all(server: ApiServer) -> None:
    server.seed({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
    server.seed({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-2"}})
    alice = _grant(server, "one-node", [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"],
                                         "resourceNames": [NODE]}])
    core = kubernetes.client.CoreV1Api
    assert _as(server, alice, lambda c: core(c).read_node(NODE)).metadata.name == NODE
    assert _as(server, alice, lambda c: core(c).read_node("node-2"))[0] == 403
    # A list with a metadata.name field selector is authorized as that name (RequestInfoFactory).
    assert [n.metadata.name for n in _as(server, alice, lambda c: core(c).list_node(
        field_selector=f"metadata.name={NODE}")).items] == [NODE]
    code, status = _as(server, alice, lambda c: core(c).list_node())
    assert (code, status["message"]) == (403, 'nodes is forbidden: User "alice" cannot list resource "nodes" in API '
                                              'group "" at the cluster scope')


def test_wildcards_match_as_rbac_matches_them(server: ApiServer) -> None:
    _metric(server)
    alice = _grant(server, "koord-like", [{"apiGroups": ["slo.koordinator.sh"], "resources": ["*"], "verbs": ["*"]}])
    assert _as(server, alice, _update_status)["metadata"]["name"] == NODE  # "*" covers subresources too
    bob = _grant(server, "status-only", [{"apiGroups": ["*"], "resources": ["*/status"], "verbs": ["update"]}],
                 user="bob")
    assert _as(server, bob, _update_status)[0] == 403  # */status does not give the get before it
    carol = _grant(server, "no-such-wildcard", [{"apiGroups": ["slo.koordinator.sh"],
                                                 "resources": ["nodemetrics", "nodemetrics/*"], "verbs": ["*"]}],
                   user="carol")
    assert _as(server, carol, _update_status)[0] == 403


def test_non_resource_urls_match_exactly_or_by_a_star_prefix(server: ApiServer) -> None:
    import urllib.error
    import urllib.request

    from tests.support.apiserver import ssl_context

    def get(path: str, credentials: Credentials) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(server.url + path, timeout=5,
                                        context=ssl_context(server, credentials)) as answer:
                return answer.status, ""
        except urllib.error.HTTPError as refused:
            return refused.code, json.loads(refused.read())["message"]

    stranger = server.client_credentials("stranger")
    assert get("/healthz", stranger)[0] == 200  # system:public-info-viewer and system:discovery, for everyone
    assert get("/apis/slo.koordinator.sh/v1alpha1", stranger)[0] == 200
    assert get("/metrics", stranger) == (403, 'forbidden: User "stranger" cannot get path "/metrics"')
    _grant(server, "metrics", [{"nonResourceURLs": ["/metrics*"], "verbs": ["get"]}], user="stranger")
    assert get("/metrics", stranger)[0] == 404  # allowed now, and not served


def test_a_role_binding_grants_in_its_namespace_only_and_may_name_a_cluster_role(server: ApiServer) -> None:
    core = kubernetes.client.CoreV1Api
    alice = _grant(server, "pod-reader", [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}],
                   namespace="shop", role_kind="Role")
    assert _as(server, alice, lambda c: core(c).list_namespaced_pod("shop")).items == []
    assert _as(server, alice, lambda c: core(c).list_namespaced_pod("batch"))[0] == 403
    assert _as(server, alice, lambda c: core(c).list_pod_for_all_namespaces())[0] == 403
    server.seed({"apiVersion": RBAC, "kind": "ClusterRole", "metadata": {"name": "event-reader"},
                 "rules": [{"apiGroups": [""], "resources": ["events"], "verbs": ["list"]}]})
    server.seed({"apiVersion": RBAC, "kind": "RoleBinding", "metadata": {"name": "events", "namespace": "batch"},
                 "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "event-reader"},
                 "subjects": [{"kind": "User", "name": "alice"}]})
    assert _as(server, alice, lambda c: core(c).list_namespaced_event("batch")).items == []
    assert _as(server, alice, lambda c: core(c).list_namespaced_event("shop"))[0] == 403


def test_a_binding_to_a_missing_role_says_so_and_an_aggregated_role_has_its_parts_rules(server: ApiServer) -> None:
    server.seed({"apiVersion": RBAC, "kind": "ClusterRoleBinding", "metadata": {"name": "dangling"},
                 "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "gone"},
                 "subjects": [{"kind": "User", "name": "alice"}]})
    alice = server.client_credentials("alice")
    code, status = _as(server, alice, lambda c: kubernetes.client.CoreV1Api(c).list_node())
    assert code == 403 and status["message"].endswith(': RBAC: clusterrole.rbac.authorization.k8s.io "gone" not found')
    server.seed({"apiVersion": RBAC, "kind": "ClusterRole", "metadata": {"name": "gone"},
                 "aggregationRule": {"clusterRoleSelectors": [{"matchLabels": {"aggregate-to-gone": "true"}}]}})
    server.seed({"apiVersion": RBAC, "kind": "ClusterRole",
                 "metadata": {"name": "node-lister", "labels": {"aggregate-to-gone": "true"}},
                 "rules": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["list"]}]})
    assert _as(server, alice, lambda c: kubernetes.client.CoreV1Api(c).list_node()).items == []


def test_a_service_account_subject_matches_its_namespace(server: ApiServer) -> None:
    for namespace in ("koordinator-system", "default"):
        server.seed({"apiVersion": "v1", "kind": "ServiceAccount",
                     "metadata": {"name": "koordlet", "namespace": namespace}})
    server.seed({"apiVersion": RBAC, "kind": "ClusterRole", "metadata": {"name": "lister"},
                 "rules": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["list"]}]})
    server.seed({"apiVersion": RBAC, "kind": "ClusterRoleBinding", "metadata": {"name": "lister"},
                 "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "lister"},
                 "subjects": [{"kind": "ServiceAccount", "name": "koordlet", "namespace": "koordinator-system"}]})

    def lists(namespace: str) -> Any:
        token = Credentials("koordlet", token=server.service_account_token(namespace, "koordlet"))
        return _as(server, token, lambda c: kubernetes.client.CoreV1Api(c).list_node())

    assert lists("koordinator-system").items == []
    assert lists("default")[0] == 403


# ---------------------------------------------------------------- the Node authorizer and NodeRestriction

def _node(server: ApiServer, name: str) -> None:
    server.seed({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}})


def _pod(server: ApiServer, name: str, node: str, **spec: Any) -> None:
    server.seed({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
                 "spec": {"nodeName": node, "containers": [{"name": "c", "image": "i"}], **spec}})


def test_a_kubelet_reads_its_own_node_and_pods_and_no_others(server: ApiServer) -> None:
    _node(server, NODE)
    _node(server, "node-2")
    _pod(server, "here", NODE)
    _pod(server, "there", "node-2")
    kubelet = server.node_credentials(NODE)
    core = kubernetes.client.CoreV1Api
    assert _as(server, kubelet, lambda c: core(c).read_node(NODE)).metadata.name == NODE
    assert [n.metadata.name for n in _as(server, kubelet, lambda c: core(c).list_node(
        field_selector=f"metadata.name={NODE}")).items] == [NODE]
    code, status = _as(server, kubelet, lambda c: core(c).read_node("node-2"))
    assert (code, status["message"]) == (403, 'nodes "node-2" is forbidden: User "system:node:node-1" cannot get '
                                              'resource "nodes" in API group "" at the cluster scope: node \'node-1\' '
                                              "cannot read 'node-2', only its own Node object")
    assert _as(server, kubelet, lambda c: core(c).read_namespaced_pod("here", "default")).metadata.name == "here"
    assert _as(server, kubelet, lambda c: core(c).read_namespaced_pod("there", "default"))[0] == 403
    assert [p.metadata.name for p in _as(server, kubelet, lambda c: core(c).list_pod_for_all_namespaces(
        field_selector=f"spec.nodeName={NODE}")).items] == ["here"]
    code, status = _as(server, kubelet, lambda c: core(c).list_pod_for_all_namespaces())
    assert code == 403 and status["message"].endswith("can only list/watch pods with spec.nodeName field selector")


def test_a_kubelet_has_no_right_on_custom_resources(server: ApiServer) -> None:
    _metric(server)
    kubelet = server.node_credentials(NODE)
    code, status = _as(server, kubelet, _update_status)
    assert code == 403 and status["message"].startswith(
        'nodemetrics.slo.koordinator.sh "node-1" is forbidden: User "system:node:node-1" cannot get resource '
        '"nodemetrics" in API group "slo.koordinator.sh" at the cluster scope')


def test_node_restriction_keeps_a_kubelet_to_its_own_node_and_pods(server: ApiServer) -> None:
    _node(server, NODE)
    _node(server, "node-2")
    _pod(server, "there", "node-2")
    kubelet = server.node_credentials(NODE)
    core = kubernetes.client.CoreV1Api
    label = {"metadata": {"labels": {"x": "y"}}}
    assert _as(server, kubelet, lambda c: core(c).patch_node(NODE, label)).metadata.labels == {"x": "y"}
    code, status = _as(server, kubelet, lambda c: core(c).patch_node("node-2", label))
    assert (code, status["message"]) == (403, 'nodes "node-2" is forbidden: node "node-1" is not allowed to modify '
                                              'node "node-2"')
    code, status = _as(server, kubelet, lambda c: core(c).delete_namespaced_pod("there", "default"))
    assert code == 403 and "can only delete pods with spec.nodeName set to itself" in status["message"]


def test_a_kubelet_may_review_tokens_and_access_for_its_own_api(server: ApiServer) -> None:
    alice = server.add_token("alice-token", "alice")
    kubelet = server.node_credentials(NODE)
    review = _as(server, kubelet, lambda c: kubernetes.client.AuthenticationV1Api(c).create_token_review(
        {"spec": {"token": alice.token}}))
    assert review.status.user.username == "alice"
    access = _as(server, kubelet, lambda c: kubernetes.client.AuthorizationV1Api(c).create_subject_access_review(
        {"spec": {"user": "alice", "groups": ["system:authenticated"], "resourceAttributes": {
            "verb": "get", "resource": "nodes", "subresource": "pods", "name": NODE}}}))
    assert access.status.allowed is False
    assert _as(server, alice, lambda c: kubernetes.client.AuthorizationV1Api(c).create_subject_access_review(
        {"spec": {"user": "alice", "nonResourceAttributes": {"verb": "get", "path": "/healthz"}}}))[0] == 403


def test_a_token_request_is_authorized_for_the_account_it_names(server: ApiServer) -> None:
    for name in ("koordlet", "other"):
        server.seed({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name, "namespace": "default"}})
    server.seed({"apiVersion": RBAC, "kind": "Role", "metadata": {"name": "renew", "namespace": "default"},
                 "rules": [{"apiGroups": [""], "resources": ["serviceaccounts/token"], "verbs": ["create"],
                            "resourceNames": ["koordlet"]}]})
    server.seed({"apiVersion": RBAC, "kind": "RoleBinding", "metadata": {"name": "renew", "namespace": "default"},
                 "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "renew"},
                 "subjects": [{"kind": "ServiceAccount", "name": "koordlet"}]})
    own = Credentials("koordlet", token=server.service_account_token("default", "koordlet"))

    def renew(name: str) -> Callable[[kubernetes.client.ApiClient], Any]:
        return lambda c: kubernetes.client.CoreV1Api(c).create_namespaced_service_account_token(
            name, "default", {"spec": {"expirationSeconds": 3600}})

    assert _as(server, own, renew("koordlet")).status.token
    code, status = _as(server, own, renew("other"))
    assert (code, status["details"]) == (403, {"name": "other", "kind": "serviceaccounts"})
    assert 'cannot create resource "serviceaccounts/token" in API group "" in the namespace "default"' \
           in status["message"]
    assert [r.status for r in server.requests("POST", r"/serviceaccounts/(koordlet|other)/token$")][-2:] == [201, 403]
