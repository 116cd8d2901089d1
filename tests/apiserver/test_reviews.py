"""TokenReview and SubjectAccessReview of the project's API server, asked by the real kubernetes client: tokens the
test registers authenticate, others do not; access is decided by the authorizers every request meets (RBAC over the
stored roles and bindings, the Node authorizer, system:masters)."""

from __future__ import annotations

import kubernetes.client
import pytest
from kubernetes.client.exceptions import ApiException

from tests.support.apiserver import ApiServer

NODE = "node-1"


def _token_review(api_client: kubernetes.client.ApiClient, token: str) -> dict:
    api = kubernetes.client.AuthenticationV1Api(api_client)
    return api.create_token_review({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
                                    "spec": {"token": token}}).to_dict()


def _may(api_client: kubernetes.client.ApiClient, user: str, groups: list[str], resource: dict) -> dict:
    api = kubernetes.client.AuthorizationV1Api(api_client)
    review = api.create_subject_access_review({
        "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
        "spec": {"user": user, "groups": groups, "resourceAttributes": resource}})
    return review.to_dict()["status"]


def _grant(server: ApiServer, name: str, rules: list[dict], subjects: list[dict]) -> None:
    server.seed({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": name},
                 "rules": rules})
    server.seed({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                 "metadata": {"name": name},
                 "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
                 "subjects": subjects})


NODE_PROXY = {"verb": "get", "resource": "nodes", "subresource": "proxy", "name": NODE}


def test_a_registered_token_authenticates_as_its_user_and_another_does_not(
        server: ApiServer, api_client: kubernetes.client.ApiClient) -> None:
    server.add_token("good", "alice", ("ops", "system:authenticated"), uid="u-1")
    status = _token_review(api_client, "good")["status"]
    assert status["authenticated"] is True
    assert status["user"] == {"username": "alice", "uid": "u-1", "groups": ["ops", "system:authenticated"],
                              "extra": None}
    status = _token_review(api_client, "forged")["status"]
    assert not status["authenticated"] and status["error"]
    with pytest.raises(ApiException) as info:
        _token_review(api_client, "")
    assert info.value.status == 422


def test_access_follows_cluster_role_bindings_of_users_groups_and_service_accounts(
        server: ApiServer, api_client: kubernetes.client.ApiClient) -> None:
    assert _may(api_client, "alice", [], NODE_PROXY) == {"allowed": False, "denied": None, "evaluation_error": None,
                                                         "reason": None}
    _grant(server, "node-debug", [{"apiGroups": [""], "resources": ["nodes/proxy"], "verbs": ["get"]}],
           [{"kind": "User", "name": "alice"}, {"kind": "Group", "name": "sre"},
            {"kind": "ServiceAccount", "name": "prom", "namespace": "monitoring"}])
    allowed = _may(api_client, "alice", [], NODE_PROXY)
    assert allowed["allowed"] is True
    assert allowed["reason"] == 'RBAC: allowed by ClusterRoleBinding "node-debug" of ClusterRole "node-debug" to ' \
                                'User "alice"'
    assert _may(api_client, "bob", ["sre"], NODE_PROXY)["allowed"] is True
    assert _may(api_client, "system:serviceaccount:monitoring:prom", [], NODE_PROXY)["allowed"] is True
    assert _may(api_client, "system:serviceaccount:default:prom", [], NODE_PROXY)["allowed"] is False
    assert _may(api_client, "alice", [], {**NODE_PROXY, "subresource": "stats"})["allowed"] is False
    assert _may(api_client, "alice", [], {**NODE_PROXY, "verb": "create"})["allowed"] is False
    assert _may(api_client, "alice", [], {"verb": "get", "resource": "nodes", "name": NODE})["allowed"] is False
    assert _may(api_client, "root", ["system:masters"], NODE_PROXY)["allowed"] is True


def test_resource_names_and_wildcards_as_rbac_matches_them(server: ApiServer,
                                                          api_client: kubernetes.client.ApiClient) -> None:
    _grant(server, "one-node", [{"apiGroups": [""], "resources": ["*/proxy"], "verbs": ["*"],
                                 "resourceNames": [NODE]}], [{"kind": "User", "name": "carol"}])
    assert _may(api_client, "carol", [], NODE_PROXY)["allowed"] is True
    assert _may(api_client, "carol", [], {**NODE_PROXY, "name": "node-2"})["allowed"] is False
    assert _may(api_client, "carol", [], {**NODE_PROXY, "subresource": "stats"})["allowed"] is False
    # "resource/*" is no wildcard in RBAC: only "*" and "*/subresource" are.
    _grant(server, "not-a-wildcard", [{"apiGroups": [""], "resources": ["nodes/*"], "verbs": ["*"]}],
           [{"kind": "User", "name": "dave"}])
    assert _may(api_client, "dave", [], NODE_PROXY)["allowed"] is False


def test_a_review_without_a_subject_is_invalid(server: ApiServer, api_client: kubernetes.client.ApiClient) -> None:
    api = kubernetes.client.AuthorizationV1Api(api_client)
    with pytest.raises(ApiException) as info:
        api.create_subject_access_review({"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
                                          "spec": {"resourceAttributes": NODE_PROXY}})
    assert info.value.status == 422
