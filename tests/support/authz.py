"""What a request to the project's API server may do, as kube-apiserver with ``--authorization-mode=Node,RBAC``
decides it.

- :func:`request_attributes` reads a request as k8s.io/apiserver's RequestInfoFactory does: the verb from the
  method (a GET without a name is ``list``, or ``watch`` with ``?watch=true``; a DELETE without one
  ``deletecollection``), the API group and version, namespace, resource, subresource and name from the path, and a
  list's ``metadata.name=<n>`` field selector as its name. ``/api``, ``/apis/<group>/<version>``, ``/healthz``... are
  non-resource requests with the method as verb.
- The authorizers, in the real server's order, the first to allow winning:
  1. the ``system:masters`` group: everything (the real server's privileged-group authorizer);
  2. the **Node** authorizer (plugin/pkg/auth/authorizer/node) for ``system:node:<name>`` in ``system:nodes``: its
     own Node (read; writes are left to admission), pods (get one bound to it, list/watch with a
     ``spec.nodeName=<name>`` field selector, create/delete mirror pods, status, eviction), the configmaps and
     service accounts (``serviceaccounts/token``) its pods use, its Lease, and for everything else the static
     rules of bootstrap policy's NodeRules: nothing on custom resources;
  3. **RBAC** over the ClusterRoles, Roles, ClusterRoleBindings and RoleBindings stored in the server (a RoleBinding
     applies in its namespace and may name a ClusterRole; a ClusterRole with an aggregationRule has the rules of
     the ClusterRoles its selectors pick), matched as rbac/v1 helpers match: verbs, apiGroups and resources with
     ``*``; ``resource/subresource`` exactly or ``*/subresource`` (never ``resource/*``); resourceNames only when
     the request names an object; nonResourceURLs exactly, ``*``, or by a prefix ending in ``*``.
- :func:`forbidden` is the refusal: a 403 ``Status`` with reason Forbidden, details {name, group, kind (the resource)}
  and the real message, the authorizers' reasons appended (``nodes "n2" is forbidden: User "system:node:n1" cannot
  get resource "nodes" in API group "" at the cluster scope: node 'n1' cannot read 'n2', only its own Node object``).
- :func:`node_admission` is the NodeRestriction admission plugin's part that matters here: a node writes only its
  own Node and the pods bound to it.

Deviations (also in apiserver.py's header): the privilege-escalation check of RBAC writes is not made (a user who
may create ClusterRoles may grant what it does not hold itself; only the admin writes RBAC in these tests); the
Node authorizer's graph covers what this server stores (pods, configmaps, service accounts), so secrets, PVCs,
PVs, ResourceClaims and VolumeAttachments, which it does not serve, are never related to a node.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tests.support.authn import UserInfo
from tests.support.kube import label_selector_object_matches

RBAC_GROUP = "rbac.authorization.k8s.io"
MASTERS = "system:masters"
NODES_GROUP = "system:nodes"
NODE_USER_PREFIX = "system:node:"
NODE_LEASE_NAMESPACE = "kube-node-lease"
_METHOD_VERBS = {"POST": "create", "GET": "get", "HEAD": "get", "PUT": "update", "PATCH": "patch",
                 "DELETE": "delete"}
_NAMESPACE_SUBRESOURCES = {"status", "finalize"}
_TRUE = {"1", "t", "T", "true", "TRUE", "True"}  # Go's strconv.ParseBool


@dataclass(frozen=True, slots=True)
class Attributes:
    """What is asked (k8s.io/apiserver authorizer.Attributes)."""

    user: UserInfo
    verb: str
    resource_request: bool
    path: str = ""
    api_group: str = ""
    api_version: str = ""
    resource: str = ""
    subresource: str = ""
    namespace: str = ""
    name: str = ""
    field_selector: str = ""

    @property
    def combined_resource(self) -> str:
        return f"{self.resource}/{self.subresource}" if self.subresource else self.resource


@dataclass(frozen=True, slots=True)
class Decision:
    allowed: bool
    reason: str = ""


def request_attributes(user: UserInfo, method: str, path: str, query: Mapping[str, str]) -> Attributes:
    """The attributes of a request to ``path`` (no query string) with ``method`` and ``query``."""
    method_verb = _METHOD_VERBS.get(method.upper(), "")
    parts = [part for part in path.strip("/").split("/") if part]
    non_resource = Attributes(user, method.lower(), False, path=path)
    if len(parts) < 3 or parts[0] not in ("api", "apis"):
        return non_resource
    rest = parts[1:]
    group = ""
    if parts[0] == "apis":
        if len(rest) < 3:
            return non_resource
        group, rest = rest[0], rest[1:]
    version, rest = rest[0], rest[1:]
    verb = method_verb
    if rest and rest[0] == "watch":  # the legacy /api/v1/watch/... form
        verb, rest = "watch", rest[1:]
    namespace = ""
    if rest and rest[0] == "namespaces" and len(rest) > 1:
        namespace = rest[1]
        if len(rest) > 2 and rest[2] not in _NAMESPACE_SUBRESOURCES:
            rest = rest[2:]
    resource = rest[0] if rest else ""
    name = rest[1] if len(rest) > 1 else ""
    subresource = rest[2] if len(rest) > 2 else ""
    selector = query.get("fieldSelector", "")
    if not name and verb == "get":
        verb = "watch" if query.get("watch", "") in _TRUE else "list"
    if not name and verb in ("list", "watch"):
        name = _exact_name(selector)
    if not name and verb == "delete":
        verb = "deletecollection"
    return Attributes(user, verb, True, path, group, version, resource, subresource, namespace, name, selector)


def _exact_name(selector: str) -> str:
    """The name a field selector requires exactly (``metadata.name=n`` or ``==``), else ""."""
    for requirement in selector.split(","):
        match = re.fullmatch(r"\s*metadata\.name\s*==?\s*([^,=!\s]+)\s*", requirement)
        if match:
            return match.group(1)
    return ""


# ---------------------------------------------------------------- RBAC rules (k8s.io/component-helpers rbac/v1)

def _has(values: Iterable[str] | None, wanted: str) -> bool:
    values = list(values or ())
    return "*" in values or wanted in values


def _resource_matches(rule_resources: Iterable[str] | None, combined: str, subresource: str) -> bool:
    for item in rule_resources or ():
        if item in ("*", combined):
            return True
        if subresource and item == f"*/{subresource}":
            return True
    return False


def _url_matches(urls: Iterable[str] | None, path: str) -> bool:
    for url in urls or ():
        if url in ("*", path) or (url.endswith("*") and path.startswith(url.rstrip("*"))):
            return True
    return False


def rule_allows(rule: Mapping[str, Any], attributes: Attributes) -> bool:
    if not _has(rule.get("verbs"), attributes.verb):
        return False
    if not attributes.resource_request:
        return _url_matches(rule.get("nonResourceURLs"), attributes.path)
    names = rule.get("resourceNames") or []
    return (_has(rule.get("apiGroups"), attributes.api_group)
            and _resource_matches(rule.get("resources"), attributes.combined_resource, attributes.subresource)
            and (not names or attributes.name in names))


def rules_allow(rules: Iterable[Mapping[str, Any]], attributes: Attributes) -> bool:
    return any(rule_allows(rule, attributes) for rule in rules)


# ---------------------------------------------------------------- what the authorizers read from the store

@dataclass(frozen=True, slots=True)
class RbacObjects:
    """The RBAC objects stored at one moment."""

    cluster_roles: Mapping[str, dict] = field(default_factory=dict)
    roles: Mapping[tuple[str, str], dict] = field(default_factory=dict)  # (namespace, name)
    cluster_role_bindings: tuple[dict, ...] = ()
    role_bindings: Mapping[str, tuple[dict, ...]] = field(default_factory=dict)  # namespace -> its bindings

    @classmethod
    def of(cls, objects: Iterable[tuple[str, dict]]) -> RbacObjects:
        """From (plural, object) pairs of the rbac.authorization.k8s.io group."""
        cluster_roles: dict[str, dict] = {}
        roles: dict[tuple[str, str], dict] = {}
        cluster_bindings: list[dict] = []
        bindings: dict[str, list[dict]] = {}
        for plural, obj in objects:
            meta = obj.get("metadata") or {}
            if plural == "clusterroles":
                cluster_roles[meta.get("name", "")] = obj
            elif plural == "roles":
                roles[(meta.get("namespace", ""), meta.get("name", ""))] = obj
            elif plural == "clusterrolebindings":
                cluster_bindings.append(obj)
            elif plural == "rolebindings":
                bindings.setdefault(meta.get("namespace", ""), []).append(obj)
        return cls(cluster_roles, roles, tuple(sorted(cluster_bindings, key=_name)),
                   {ns: tuple(sorted(items, key=_name)) for ns, items in bindings.items()})

    def cluster_role_rules(self, name: str) -> list[dict] | None:
        role = self.cluster_roles.get(name)
        if role is None:
            return None
        aggregation = role.get("aggregationRule")
        if not aggregation:
            return list(role.get("rules") or [])
        # What the clusterrole-aggregation controller writes into .rules: the rules of every ClusterRole a
        # selector picks (read here at once instead of after the controller's next pass).
        selectors = aggregation.get("clusterRoleSelectors") or []
        rules: list[dict] = []
        for other_name, other in sorted(self.cluster_roles.items()):
            labels = (other.get("metadata") or {}).get("labels") or {}
            if other_name != name and any(label_selector_object_matches(s, labels) for s in selectors):
                rules.extend(rule for rule in other.get("rules") or [] if rule not in rules)
        return rules


def _name(obj: dict) -> str:
    return (obj.get("metadata") or {}).get("name", "")


@dataclass(frozen=True, slots=True)
class NodeGraph:
    """What the Node authorizer reads: the pods bound to a node, and single objects by key."""

    pods_on: Callable[[str], list[dict]]  # node name -> pods with spec.nodeName of it


# ---------------------------------------------------------------- RBAC


def _subject_applies(subject: Mapping[str, Any], user: UserInfo, binding_namespace: str) -> bool:
    kind, name = subject.get("kind"), subject.get("name")
    if kind == "User":
        return user.name == name
    if kind == "Group":
        return name in user.groups
    if kind == "ServiceAccount":
        namespace = subject.get("namespace") or binding_namespace
        return bool(namespace) and user.name == f"system:serviceaccount:{namespace}:{name}"
    return False


def _describe_subject(subject: Mapping[str, Any], binding_namespace: str) -> str:
    if subject.get("kind") == "ServiceAccount":
        return f'ServiceAccount "{subject.get("name")}/{subject.get("namespace") or binding_namespace}"'
    return f'{subject.get("kind")} "{subject.get("name")}"'


def rbac_authorize(rbac: RbacObjects, attributes: Attributes) -> Decision:
    """plugin/pkg/auth/authorizer/rbac: ClusterRoleBindings, then the RoleBindings of the request's namespace."""
    errors: list[str] = []
    candidates: list[tuple[dict, str, str]] = [(b, "ClusterRoleBinding", "") for b in rbac.cluster_role_bindings]
    if attributes.namespace:
        candidates += [(b, "RoleBinding", attributes.namespace)
                       for b in rbac.role_bindings.get(attributes.namespace, ())]
    for binding, binding_kind, namespace in candidates:
        subject = next((s for s in binding.get("subjects") or []
                        if _subject_applies(s, attributes.user, namespace)), None)
        if subject is None:
            continue
        ref = binding.get("roleRef") or {}
        ref_kind, ref_name = ref.get("kind", ""), ref.get("name", "")
        if ref_kind == "ClusterRole":
            rules = rbac.cluster_role_rules(ref_name)
            missing = f'clusterrole.rbac.authorization.k8s.io "{ref_name}" not found'
        elif ref_kind == "Role" and binding_kind == "RoleBinding":
            role = rbac.roles.get((namespace, ref_name))
            rules = list(role.get("rules") or []) if role is not None else None
            missing = f'role.rbac.authorization.k8s.io "{ref_name}" not found'
        else:
            continue
        if rules is None:
            errors.append(missing)
            continue
        if rules_allow(rules, attributes):
            where = _name(binding) + (f"/{namespace}" if namespace else "")
            return Decision(True, f'RBAC: allowed by {binding_kind} "{where}" of {ref_kind} "{ref_name}" to '
                                  + _describe_subject(subject, namespace))
    return Decision(False, "RBAC: [" + ", ".join(errors) + "]" if len(errors) > 1 else
                    f"RBAC: {errors[0]}" if errors else "")


# ---------------------------------------------------------------- the Node authorizer

def node_name_of(user: UserInfo) -> str | None:
    """The node a user is (k8s.io/kubernetes pkg/auth/nodeidentifier): ``system:node:<name>`` in ``system:nodes``;
    "" for a node user without a name; None for anyone else."""
    if NODES_GROUP not in user.groups or not user.name.startswith(NODE_USER_PREFIX):
        return None
    return user.name[len(NODE_USER_PREFIX):]


def _rule(verbs: str, group: str, resources: str) -> dict:
    return {"verbs": verbs.split(), "apiGroups": [group], "resources": resources.split()}


# bootstrappolicy.NodeRules(): what every node may do on the resources the Node authorizer does not subdivide.
NODE_RULES = (
    _rule("create", "authentication.k8s.io", "tokenreviews"),
    _rule("create", "authorization.k8s.io", "subjectaccessreviews localsubjectaccessreviews"),
    _rule("get list watch", "", "services"),
    _rule("create update patch", "", "events"),
    _rule("create update patch", "events.k8s.io", "events"),
    _rule("get", "", "endpoints"),
    _rule("create get list watch", "certificates.k8s.io", "certificatesigningrequests"),
    _rule("get watch list", "storage.k8s.io", "csidrivers"),
    _rule("get list watch", "node.k8s.io", "runtimeclasses"),
)


def _uses(pod: dict, kind: str, namespace: str, name: str) -> bool:
    """Whether ``pod`` (in ``namespace``) refers to the configmap or service account ``name``."""
    meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
    if meta.get("namespace") != namespace:
        return False
    if kind == "serviceaccounts":
        return (spec.get("serviceAccountName") or "default") == name
    volumes = [v.get("configMap", {}).get("name") for v in spec.get("volumes") or [] if isinstance(v, dict)]
    projected = [s.get("configMap", {}).get("name") for v in spec.get("volumes") or [] if isinstance(v, dict)
                 for s in (v.get("projected") or {}).get("sources") or [] if isinstance(s, dict)]
    envs = [e.get("configMapRef", {}).get("name") for c in spec.get("containers") or [] for e in c.get("envFrom") or []]
    return name in volumes + projected + envs


def node_authorize(graph: NodeGraph, attributes: Attributes) -> Decision | None:
    """The Node authorizer's decision; None when the user is no node (no opinion)."""
    node = node_name_of(attributes.user)
    if node is None:
        return None
    if not node:
        return Decision(False, f'unknown node for user "{attributes.user.name}"')
    if attributes.resource_request:
        handled = _node_resource(graph, node, attributes)
        if handled is not None:
            return handled
    return Decision(rules_allow(NODE_RULES, attributes))


def _related(graph: NodeGraph, node: str, kind: str, attributes: Attributes) -> Decision:
    if not attributes.name:
        return Decision(False, "No Object name found")
    if any(_uses(pod, kind, attributes.namespace, attributes.name) for pod in graph.pods_on(node)):
        return Decision(True)
    return Decision(False, f"no relationship found between node '{node}' and this object")


def _node_nodes(graph: NodeGraph, node: str, a: Attributes) -> Decision:
    if a.subresource == "" and a.verb in ("create", "update", "patch"):
        return Decision(True)  # NodeRestriction admission limits it to its own Node
    if a.subresource == "" and a.verb in ("get", "list", "watch"):
        if a.name == node:
            return Decision(True)
        what = "all nodes" if not a.name else f"'{a.name}'"
        return Decision(False, f"node '{node}' cannot read {what}, only its own Node object")
    return Decision(a.subresource == "status" and a.verb in ("update", "patch"))


def _node_configmaps(graph: NodeGraph, node: str, a: Attributes) -> Decision:
    if a.verb not in ("get", "list", "watch"):
        return Decision(False, "can only read resources of this type")
    if a.subresource:
        return Decision(False, "cannot read subresource")
    return _related(graph, node, "configmaps", a)


def _node_token(graph: NodeGraph, node: str, a: Attributes) -> Decision:
    if a.verb != "create" or not a.name:
        return Decision(False, "can only create tokens for individual service accounts")
    if a.subresource != "token":
        return Decision(False, "can only create token subresource of serviceaccount")
    return _related(graph, node, "serviceaccounts", a)


def _node_lease(graph: NodeGraph, node: str, a: Attributes) -> Decision:
    if a.verb not in ("get", "create", "update", "patch", "delete"):
        return Decision(False, "can only get, create, update, patch, or delete a node lease")
    if a.namespace != NODE_LEASE_NAMESPACE:
        return Decision(False, f'can only access leases in the "{NODE_LEASE_NAMESPACE}" system namespace')
    if a.verb != "create" and a.name != node:
        return Decision(False, "can only access node lease with the same name as the requesting node")
    return Decision(True)


def _node_unrelated(graph: NodeGraph, node: str, a: Attributes) -> Decision:
    """Kinds the graph would relate through objects this server does not store: never related here."""
    return Decision(False, f"no relationship found between node '{node}' and this object")


def _node_resource(graph: NodeGraph, node: str, a: Attributes) -> Decision | None:
    """The Node authorizer's own rule for the resources it subdivides; None for the others (static rules)."""
    rule = _NODE_RESOURCES.get((a.api_group, a.resource))
    return rule(graph, node, a) if rule is not None else None


def _node_pod(graph: NodeGraph, node: str, a: Attributes) -> Decision:
    if a.subresource == "":
        if a.verb == "get":
            return _pod_on(graph, node, a)
        if a.verb in ("list", "watch"):
            if re.search(rf"(^|,)\s*spec\.nodeName\s*==?\s*{re.escape(node)}\s*(,|$)", a.field_selector):
                return Decision(True)
            if a.name:
                return _pod_on(graph, node, a)
            return Decision(False, "can only list/watch pods with spec.nodeName field selector")
        return Decision(a.verb in ("create", "delete"))  # mirror pods; NodeRestriction admission checks them
    if a.subresource == "status":
        return Decision(a.verb in ("update", "patch"))
    return Decision(a.subresource == "eviction" and a.verb == "create")


def _pod_on(graph: NodeGraph, node: str, a: Attributes) -> Decision:
    if any((pod.get("metadata") or {}).get("name") == a.name
           and (pod.get("metadata") or {}).get("namespace") == a.namespace for pod in graph.pods_on(node)):
        return Decision(True)
    return Decision(False, f"no relationship found between node '{node}' and this object")


_NODE_RESOURCES: dict[tuple[str, str], Callable[[NodeGraph, str, Attributes], Decision]] = {
    ("", "nodes"): _node_nodes,
    ("", "pods"): _node_pod,
    ("", "configmaps"): _node_configmaps,
    ("", "serviceaccounts"): _node_token,
    ("coordination.k8s.io", "leases"): _node_lease,
    **dict.fromkeys((("", "secrets"), ("", "persistentvolumeclaims"), ("", "persistentvolumes"),
                     ("resource.k8s.io", "resourceclaims"), ("storage.k8s.io", "volumeattachments")), _node_unrelated),
}


def node_admission(attributes: Attributes, existing: Callable[[], dict | None], body: Any) -> str | None:
    """NodeRestriction (plugin/pkg/admission/noderestriction): why a node may not make this write, or None."""
    node = node_name_of(attributes.user)
    if not node or attributes.verb not in ("create", "update", "patch", "delete") or attributes.api_group != "":
        return None
    if attributes.resource == "nodes":
        target = attributes.name
        if not target and isinstance(body, dict):
            target = (body.get("metadata") or {}).get("name", "")
        if target != node:
            return f'node "{node}" is not allowed to modify node "{target}"'
        return None
    if attributes.resource != "pods":
        return None
    pod = existing() if attributes.verb != "create" else body
    bound = ((pod or {}).get("spec") or {}).get("nodeName") if isinstance(pod, dict) else None
    if bound == node:
        return None
    if attributes.subresource == "status":
        return f'node "{node}" can only update pod status for pods with spec.nodeName set to itself'
    if attributes.subresource == "eviction":
        return f'node "{node}" can only evict pods with spec.nodeName set to itself'
    if attributes.subresource == "":
        action = "create" if attributes.verb == "create" else "delete"
        return f'node "{node}" can only {action} pods with spec.nodeName set to itself'
    return None


# ---------------------------------------------------------------- the chain and its refusal

def authorize(rbac: RbacObjects, graph: NodeGraph, attributes: Attributes) -> Decision:
    """The union of the authorizers, in the real server's order; the reasons of those that did not allow."""
    if MASTERS in attributes.user.groups:
        return Decision(True)
    reasons: list[str] = []
    node = node_authorize(graph, attributes)
    if node is not None:
        if node.allowed:
            return node
        if node.reason:
            reasons.append(node.reason)
    decision = rbac_authorize(rbac, attributes)
    if decision.allowed:
        return decision
    if decision.reason:
        reasons.append(decision.reason)
    return Decision(False, ", ".join(reasons))


def forbidden_message(attributes: Attributes) -> str:
    """k8s.io/apiserver responsewriters.forbiddenMessage."""
    user = attributes.user.name
    if not attributes.resource_request:
        return f'User "{user}" cannot {attributes.verb} path "{attributes.path}"'
    where = (f'in the namespace "{attributes.namespace}"' if attributes.namespace else "at the cluster scope")
    return (f'User "{user}" cannot {attributes.verb} resource "{attributes.combined_resource}" in API group '
            f'"{attributes.api_group}" {where}')


def forbidden_status(attributes: Attributes, reason: str) -> tuple[str, dict[str, str]]:
    """(message, details) of the 403 Status for a refusal with the authorizers' ``reason``."""
    error = forbidden_message(attributes) + (f": {reason}" if reason else "")
    return forbidden_error(attributes, error)


def forbidden_error(attributes: Attributes, error: str) -> tuple[str, dict[str, str]]:
    """apierrors.NewForbidden(group resource, name, error): (message, details)."""
    qualified = f"{attributes.resource}.{attributes.api_group}" if attributes.api_group else attributes.resource
    if not attributes.resource_request or not qualified:
        return f"forbidden: {error}", {}
    subject = f'{qualified} "{attributes.name}"' if attributes.name else qualified
    details = {"name": attributes.name, "group": attributes.api_group, "kind": attributes.resource}
    return f"{subject} is forbidden: {error}", {key: value for key, value in details.items() if value}
