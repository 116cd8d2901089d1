"""Find the Kubernetes API permissions a Python package's code needs, from its kubernetes-client calls.

Each call of a ``CoreV1Api`` / ``PolicyV1Api`` / ``EventsV1Api`` / ``CoordinationV1Api`` /
``AuthenticationV1Api`` / ``AuthorizationV1Api`` / ``CustomObjectsApi`` method is mapped to (apiGroup,
resource[/subresource], verb) from the method name (``create_namespaced_pod_eviction`` -> ("", "pods/eviction",
"create")); a method passed to
``Watch().stream``, handed to a helper uncalled, or called with ``watch=True`` / a variable ``watch`` /
``**kwargs`` needs ``watch`` too. For custom objects the group and
plural are the call's arguments, evaluated in the calling module (constants such as ``api.DEVICE_PLURAL``).
Anything the scan cannot map is reported, so a new kind of call fails loudly instead of slipping by.

Calls to kubelet's API (``KUBELET_CALLS`` of koordlet/statesinformer/kubelet.py) need ``nodes/<subresource>`` as
kubelet maps the path (tests/support/kubelet.py, from pkg/kubelet/server/auth.go): :func:`kubelet_permissions`
gives the fine-grained one kubelet 1.33+ asks first (``nodes/pods`` for ``/pods/``), or the one older kubelets ask
alone (``nodes/proxy``).
"""

from __future__ import annotations

import ast
import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kubernetes.client

Permission = tuple[str, str, str]  # (apiGroup, resource, verb)

_API_GROUPS = {
    "CoreV1Api": "",
    "PolicyV1Api": "policy",
    "EventsV1Api": "events.k8s.io",
    "CoordinationV1Api": "coordination.k8s.io",
    "AuthenticationV1Api": "authentication.k8s.io",
    "AuthorizationV1Api": "authorization.k8s.io",
}
_VERBS = (
    ("delete_collection_", "deletecollection"),
    ("read_", "get"),
    ("list_", "list"),
    ("create_", "create"),
    ("replace_", "update"),
    ("patch_", "patch"),
    ("delete_", "delete"),
    ("get_", "get"),
)
# Resources whose methods koordlet could plausibly call; extend when the scan reports an unknown one.
_RESOURCES = {
    "node": "nodes",
    "pod": "pods",
    "event": "events",
    "namespace": "namespaces",
    "config_map": "configmaps",
    "secret": "secrets",
    "service": "services",
    "service_account": "serviceaccounts",
    "persistent_volume_claim": "persistentvolumeclaims",
    "persistent_volume": "persistentvolumes",
    "pod_disruption_budget": "poddisruptionbudgets",
    "lease": "leases",
    "token_review": "tokenreviews",
    "subject_access_review": "subjectaccessreviews",
}
_IGNORED = {"close", "get_api_resources", "api_client"}
# Positions of (group, plural) in CustomObjectsApi calls.
_CUSTOM_ARGS = {"cluster": (0, 2), "namespaced": (0, 3), "for_all_namespaces": (0, 2)}


@dataclass(frozen=True)
class Call:
    where: str  # file:line
    method: str
    permissions: frozenset[Permission]


def _api_methods() -> dict[str, str]:
    methods: dict[str, str] = {}
    for cls_name in (*_API_GROUPS, "CustomObjectsApi"):
        cls = getattr(kubernetes.client, cls_name)
        for name in dir(cls):
            if name.startswith("_") or name in _IGNORED or name.endswith("_with_http_info"):
                continue
            methods.setdefault(name, cls_name)
    return methods


API_METHODS = _api_methods()


def _verb(method: str) -> tuple[str, str]:
    for prefix, verb in _VERBS:
        if method.startswith(prefix):
            return verb, method[len(prefix) :]
    raise LookupError(f"{method}: no known verb prefix")


def core_permission(method: str) -> Permission:
    """``CoreV1Api.create_namespaced_pod_eviction`` -> ("", "pods/eviction", "create")."""
    verb, rest = _verb(method)
    rest = rest.removeprefix("namespaced_").removesuffix("_for_all_namespaces")
    for snake in sorted(_RESOURCES, key=len, reverse=True):
        if rest == snake or rest.startswith(snake + "_"):
            sub = rest[len(snake) + 1 :].replace("_", "")
            resource = _RESOURCES[snake] + (f"/{sub}" if sub else "")
            return _API_GROUPS[API_METHODS[method]], resource, verb
    raise LookupError(f"{method}: resource {rest!r} not in the scan's table")


def _custom_permission(method: str, group: str, plural: str) -> Permission:
    verb, rest = _verb(method)
    sub = ""
    for suffix in ("_status", "_scale"):
        if rest.endswith(suffix):
            sub = "/" + suffix[1:]
    return group, plural + sub, verb


def _custom_positions(method: str) -> tuple[int, int]:
    for key, positions in _CUSTOM_ARGS.items():
        if key in method:
            return positions
    raise LookupError(f"{method}: unknown CustomObjectsApi method shape")


def _evaluate(expr: ast.expr, module: Any) -> str:
    if isinstance(expr, ast.Constant) and isinstance(expr.value, str):
        return expr.value
    value = eval(compile(ast.Expression(expr), "<arg>", "eval"), vars(module))  # module constants only
    if not isinstance(value, str):
        raise LookupError(f"{ast.unparse(expr)} is not a string")
    return value


def _argument(call_args: list[ast.expr], keywords: dict[str | None, ast.expr], index: int, name: str) -> ast.expr:
    if name in keywords:
        return keywords[name]
    if index < len(call_args):
        return call_args[index]
    raise LookupError(f"argument {name} not given")


def _permissions(
    method: str, args: list[ast.expr], keywords: dict[str | None, ast.expr], module: Any
) -> set[Permission]:
    if API_METHODS[method] == "CustomObjectsApi":
        group_at, plural_at = _custom_positions(method)
        group = _evaluate(_argument(args, keywords, group_at, "group"), module)
        plural_name = "resource_plural" if "for_all_namespaces" in method else "plural"
        plural = _evaluate(_argument(args, keywords, plural_at, plural_name), module)
        found = {_custom_permission(method, group, plural)}
    else:
        found = {core_permission(method)}
    watch = keywords.get("watch")
    # watch=True, watch=<a variable> or **kwargs passed through: the list may be a watch.
    may_watch = (isinstance(watch, ast.Constant) and watch.value is True) or (
        watch is not None and not isinstance(watch, ast.Constant)
    )
    if may_watch or None in keywords:
        found |= {(g, r, "watch") for g, r, v in found if v == "list"}
    return found


def scan_source(source: str, filename: str, module: Any) -> tuple[list[Call], list[str]]:
    """(calls, problems) of one module's source; ``module`` is where argument constants are looked up."""
    tree = ast.parse(source, filename)
    calls: list[Call] = []
    problems: list[str] = []
    seen_attrs: set[int] = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        found = _api_call(node)
        if found is None:
            continue
        target, args, watch = found
        seen_attrs.add(id(target))
        keywords: dict[str | None, ast.expr] = {k.arg: k.value for k in node.keywords}  # None: **kwargs
        try:
            perms = _permissions(target.attr, args, keywords, module)
        except (LookupError, NameError, AttributeError, SyntaxError) as exc:
            problems.append(f"{filename}:{node.lineno}: {target.attr}: cannot tell the permission it needs ({exc})")
            continue
        if watch:
            perms |= {(g, r, "watch") for g, r, _v in perms}
        calls.append(Call(f"{filename}:{node.lineno}", target.attr, frozenset(perms)))
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in API_METHODS and id(node) not in seen_attrs:
            _method_reference(node, f"{filename}:{node.lineno}", calls, problems)
    return calls, problems


def _api_call(node: ast.Call) -> tuple[ast.Attribute, list[ast.expr], bool] | None:
    """(the API method, its arguments, whether it is watched) of a call of an API method, directly or as the
    first argument of ``Watch().stream``; None for any other call."""
    assert isinstance(node.func, ast.Attribute)
    args = list(node.args)
    if node.func.attr in API_METHODS:
        return node.func, args, False
    if node.func.attr == "stream" and args and isinstance(args[0], ast.Attribute) and args[0].attr in API_METHODS:
        return args[0], args[1:], True
    return None


def _method_reference(node: ast.Attribute, where: str, calls: list[Call], problems: list[str]) -> None:
    """An API method used other than in a call: a core list method handed to a list/watch helper
    (``Watcher(core.list_node)``) needs list + watch; any other use is a problem."""
    if node.attr.startswith("list_") and API_METHODS[node.attr] != "CustomObjectsApi":
        try:
            perm = core_permission(node.attr)
        except LookupError as exc:
            problems.append(f"{where}: {node.attr}: cannot tell the permission it needs ({exc})")
            return
        calls.append(Call(where, node.attr, frozenset({perm, (perm[0], perm[1], "watch")})))
        return
    problems.append(f"{where}: {node.attr} used other than as a call or Watch().stream arg")


def scan_package(root: Path, package: str) -> tuple[list[Call], list[str]]:
    calls: list[Call] = []
    problems: list[str] = []
    for path in sorted((root / package).rglob("*.py")):
        source = path.read_text()
        if not any(name in source for name in API_METHODS if len(name) > 8):
            continue
        relative = path.relative_to(root)
        module_name = ".".join(relative.with_suffix("").parts).removesuffix(".__init__")
        module = importlib.import_module(module_name)
        found, bad = scan_source(source, str(relative), module)
        calls.extend(found)
        problems.extend(bad)
    return calls, problems


_KUBELET_VERBS = {"GET": "get", "POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}


def kubelet_permissions(calls: tuple[tuple[str, str], ...], fine_grained_authz: bool = True) -> set[Permission]:
    """What each kubelet call needs: the first subresource kubelet asks about for its path (with
    ``fine_grained_authz``, kubelet 1.33+), or the only one older kubelets ask about."""
    from tests.support.kubelet import subresources_for

    return {("", f"nodes/{subresources_for(path, fine_grained_authz)[0]}", _KUBELET_VERBS[method])
            for method, path in calls}


def role_permissions(cluster_role: dict[str, Any]) -> set[Permission]:
    granted: set[Permission] = set()
    for rule in cluster_role.get("rules", []):
        for group in rule.get("apiGroups", []):
            for resource in rule.get("resources", []):
                for verb in rule.get("verbs", []):
                    granted.add((group, resource, verb))
    return granted
