"""TokenReview and SubjectAccessReview for the project's API server (tests/support/apiserver.py), as kubelet, kube-rbac-
proxy and koordlet's debug endpoints ask them.

- ``POST /apis/authentication.k8s.io/v1/tokenreviews``: the tokens the test registered (``ApiServer.add_token``)
  authenticate as their user; any other is ``authenticated: false`` with an error, as the real server answers an
  unknown bearer token. A review without ``spec.token`` is 422.
- ``POST /apis/authorization.k8s.io/v1/subjectaccessreviews``: decided by RBAC over the ClusterRoles and
  ClusterRoleBindings stored in the server (subjects User, Group, ServiceAccount; apiGroups, resources with
  ``resource/subresource``, verbs, resourceNames and nonResourceURLs, ``*`` where RBAC allows it), and the
  ``system:masters`` group; allowed answers carry RBAC's reason (``RBAC: allowed by ClusterRoleBinding "b" of
  ClusterRole "r" to User "u"``). A review with neither a user nor a group, or with neither attribute kind, is 422.
  Namespaced Roles and RoleBindings are not served by this server, so they are not consulted.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from typing import Any

TOKEN_REVIEWS = "/apis/authentication.k8s.io/v1/tokenreviews"
ACCESS_REVIEWS = "/apis/authorization.k8s.io/v1/subjectaccessreviews"
SUPERUSER_GROUP = "system:masters"


class ReviewError(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


def _spec(body: Any, kind: str) -> dict:
    if not isinstance(body, dict) or not isinstance(body.get("spec"), dict):
        raise ReviewError(400, f"a {kind} needs a spec object")
    return body["spec"]


def token_review(body: Any, users: Mapping[str, dict]) -> dict:
    spec = _spec(body, "TokenReview")
    token = spec.get("token")
    if not isinstance(token, str) or not token:
        raise ReviewError(422, 'TokenReview.authentication.k8s.io "" is invalid: spec.token: Required value')
    user = users.get(token)
    status: dict[str, Any] = ({"authenticated": True, "user": copy.deepcopy(user), "audiences": list(
        spec.get("audiences") or [])} if user is not None else {"user": {}, "error": "invalid bearer token"})
    return {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "metadata": {"creationTimestamp": None},
            "spec": copy.deepcopy(spec), "status": status}


def _subject_matches(subject: Mapping[str, Any], user: str, groups: Iterable[str]) -> bool:
    kind, name = subject.get("kind"), subject.get("name")
    if kind == "User":
        return name == user
    if kind == "Group":
        return name in set(groups)
    if kind == "ServiceAccount":
        return user == f"system:serviceaccount:{subject.get('namespace', '')}:{name}"
    return False


def _has(values: Iterable[str] | None, wanted: str) -> bool:
    values = list(values or [])
    return "*" in values or wanted in values


def _resource_matches(rules_resources: Iterable[str] | None, resource: str, subresource: str) -> bool:
    wanted = f"{resource}/{subresource}" if subresource else resource
    for item in rules_resources or []:
        if item in ("*", wanted):
            return True
        if subresource and item in (f"{resource}/*", f"*/{subresource}"):
            return True
    return False


def _url_matches(urls: Iterable[str] | None, path: str) -> bool:
    for url in urls or []:
        if url == "*" or url == path or (url.endswith("*") and path.startswith(url[:-1])):
            return True
    return False


def _rule_allows(rule: Mapping[str, Any], attributes: Mapping[str, Any], non_resource: bool) -> bool:
    verb = str(attributes.get("verb", ""))
    if not _has(rule.get("verbs"), verb):
        return False
    if non_resource:
        return _url_matches(rule.get("nonResourceURLs"), str(attributes.get("path", "")))
    if not _has(rule.get("apiGroups"), str(attributes.get("group", ""))):
        return False
    if not _resource_matches(rule.get("resources"), str(attributes.get("resource", "")),
                             str(attributes.get("subresource", ""))):
        return False
    names = rule.get("resourceNames") or []
    return not names or str(attributes.get("name", "")) in names


def access_review(body: Any, roles: Mapping[str, dict], bindings: Iterable[dict]) -> dict:
    spec = _spec(body, "SubjectAccessReview")
    user, groups = str(spec.get("user") or ""), [str(g) for g in spec.get("groups") or []]
    resource, non_resource = spec.get("resourceAttributes"), spec.get("nonResourceAttributes")
    if not user and not groups:
        raise ReviewError(422, "SubjectAccessReview.authorization.k8s.io is invalid: spec.user: at least one of user "
                               "or group must be specified")
    if (resource is None) == (non_resource is None):
        raise ReviewError(422, "SubjectAccessReview.authorization.k8s.io is invalid: exactly one of "
                               "resourceAttributes or nonResourceAttributes must be specified")
    attributes = resource if resource is not None else non_resource
    status: dict[str, Any] = {"allowed": False}
    if SUPERUSER_GROUP in groups:
        status = {"allowed": True}
    else:
        for binding in bindings:
            role_ref = binding.get("roleRef") or {}
            if role_ref.get("kind") != "ClusterRole":
                continue
            if not any(_subject_matches(s, user, groups) for s in binding.get("subjects") or []):
                continue
            role = roles.get(str(role_ref.get("name")))
            if role is None:
                continue
            if any(_rule_allows(rule, attributes, non_resource is not None) for rule in role.get("rules") or []):
                subject = f'User "{user}"' if user else f'Group "{groups[0]}"'
                status = {"allowed": True, "reason": f'RBAC: allowed by ClusterRoleBinding '
                                                     f'"{binding["metadata"]["name"]}" of ClusterRole '
                                                     f'"{role_ref["name"]}" to {subject}'}
                break
    return {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
            "metadata": {"creationTimestamp": None}, "spec": copy.deepcopy(spec), "status": status}
