"""A small, real Kubernetes API server for tests and the local demo.

It speaks the real REST paths and JSON of the API server so the real `kubernetes` client (and any
other HTTP client) can talk to it; no API server binary can be installed here (docs/design.md §7).

Served (everything in memory, one lock, thread-safe):
- core/v1 nodes, pods, events, namespaces (implicit: any namespace exists, and is listed once
  used), policy/v1 poddisruptionbudgets, events.k8s.io/v1 events, flowcontrol.apiserver.k8s.io/v1 flowschemas and
  prioritylevelconfigurations (stored, not enforced: tests/support/fleetserver.py plays API Priority and Fairness's
  429s);
- the CRDs of deploy/chart/koordlet-py/files/crds (NodeSLO, NodeMetric, Device, NodeResourceTopology): objects are
  defaulted, pruned of unknown fields (reported in a `Warning` header; `?fieldValidation=Strict` rejects them with
  400 instead) and validated against the CRD's openAPIV3Schema (422 Invalid with field causes);
- CRDs with several versions as the real server serves them with conversion strategy None: every served version
  answers, an object is stored at the storage version and read at the version asked for, only apiVersion changing,
  each conversion defaulting and pruning by the target version's schema; a created CRD gets its status
  (acceptedNames, Established, storedVersions); a CRD asking for Webhook conversion is refused (no webhooks here);
- verbs get, list (label and field selectors, all namespaces), watch (chunked JSON lines,
  resourceVersion and timeoutSeconds honoured, 410 ERROR event when the version is too old),
  create, update (PUT), patch (json-patch, merge-patch, strategic-merge-patch for built-ins;
  custom resources reject strategic merge with 415 like the real server), delete (finalizers
  honoured), `/status` subresources, and pods/eviction that honours PodDisruptionBudgets;
- resourceVersion on every object from one increasing counter; a PUT or a patch whose body
  carries a stale metadata.resourceVersion fails 409 Conflict;
- discovery (/api, /apis, /apis/<group>, /apis/<group>/<version>), /version, /healthz;
- TokenReview (the tokens a test registers with ``add_token``) and SubjectAccessReview (RBAC over the stored
  ClusterRoles and ClusterRoleBindings), tests/support/authreview.py.

Deliberate simplifications: no authentication (unless a bearer token is given: then a request
without `Authorization: Bearer <token>` is 401 Unauthorized); deletes are immediate (no kubelet, no grace
period) unless finalizers remain; PodDisruptionBudget status is computed by the server at
eviction time (it plays the disruption controller; pods it evicted stay "expected", as if a
controller would recreate them); a Running pod without a Ready condition
counts as healthy; `limit`/`continue` are ignored (lists are complete); server-side apply is not
supported (415).

Use:
    with ApiServer() as server:
        api = kubernetes.client.CoreV1Api(kube_api_client(server))
        server.fail_next("PATCH", r"/nodemetrics/node-1/status$", status=409, count=2)
        ...
        assert server.requests("PATCH", r"/status$")
"""

from __future__ import annotations

import copy
import json
import logging
import math
import re
import secrets
import socket
import ssl
import threading
import time
import uuid
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Self
from urllib.parse import parse_qs, urlsplit

import kubernetes.client

from tests.support import authreview
from tests.support.kube import (
    FieldError,
    PatchError,
    SelectorError,
    apply_defaults,
    crd_problems,
    field_selector_matches,
    json_merge_patch,
    json_patch,
    label_selector_matches,
    label_selector_object_matches,
    load_crds,
    prune_unknown_fields,
    strategic_merge_patch,
    validate_schema,
)

log = logging.getLogger(__name__)

JSON = Any
DEFAULT_CRD_DIR = Path(__file__).resolve().parents[2] / "deploy" / "chart" / "koordlet-py" / "files" / "crds"
WATCH_LOG_SIZE = 4096
WATCH_POLL_SECONDS = 0.5
MAX_WATCH_SECONDS = 1800
IDLE_CONNECTION_SECONDS = 60

_REASONS = {400: "BadRequest", 401: "Unauthorized", 404: "NotFound", 405: "MethodNotAllowed", 409: "Conflict",
            410: "Expired", 415: "UnsupportedMediaType", 422: "Invalid", 429: "TooManyRequests",
            500: "InternalError", 503: "ServiceUnavailable", 504: "Timeout"}


@dataclass(frozen=True, slots=True)
class ResourceType:
    """One served resource: where it lives in the URL space and how it behaves."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool
    status_subresource: bool
    singular: str = ""
    schema: dict | None = None  # openAPIV3Schema for custom resources
    returns_deleted_object: bool = False
    storage: bool = True  # the version objects of this resource are stored at (a CRD's storage version)
    short_names: tuple[str, ...] = ()

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def qualified(self) -> str:
        return f"{self.plural}.{self.group}" if self.group else self.plural

    @property
    def custom(self) -> bool:
        return self.schema is not None


BUILTIN_RESOURCES = (
    ResourceType("", "v1", "nodes", "Node", False, True, "node"),
    ResourceType("", "v1", "pods", "Pod", True, True, "pod", returns_deleted_object=True),
    ResourceType("", "v1", "events", "Event", True, False, "event"),
    ResourceType("", "v1", "namespaces", "Namespace", False, True, "namespace"),
    ResourceType("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget", True, True,
                 "poddisruptionbudget"),
    ResourceType("events.k8s.io", "v1", "events", "Event", True, False, "event"),
    # What an installation (kubectl apply -k deploy/, the Helm chart) creates besides custom resources.
    ResourceType("", "v1", "serviceaccounts", "ServiceAccount", True, False, "serviceaccount"),
    ResourceType("", "v1", "configmaps", "ConfigMap", True, False, "configmap"),
    ResourceType("", "v1", "services", "Service", True, True, "service", short_names=("svc",)),
    ResourceType("apps", "v1", "daemonsets", "DaemonSet", True, True, "daemonset"),
    ResourceType("rbac.authorization.k8s.io", "v1", "clusterroles", "ClusterRole", False, False, "clusterrole"),
    ResourceType("rbac.authorization.k8s.io", "v1", "clusterrolebindings", "ClusterRoleBinding", False, False,
                 "clusterrolebinding"),
    # API Priority and Fairness: the FlowSchema and PriorityLevelConfiguration the chart and deploy/ ship (stored only).
    ResourceType("flowcontrol.apiserver.k8s.io", "v1", "flowschemas", "FlowSchema", False, True, "flowschema"),
    ResourceType("flowcontrol.apiserver.k8s.io", "v1", "prioritylevelconfigurations", "PriorityLevelConfiguration",
                 False, True, "prioritylevelconfiguration"),
    # A created CRD is checked (structural schema, names) and its versions are served from then on.
    ResourceType("apiextensions.k8s.io", "v1", "customresourcedefinitions", "CustomResourceDefinition", False,
                 True, "customresourcedefinition", short_names=("crd", "crds")),
)


def resource_types_of_crd(crd: dict) -> list[ResourceType]:
    """The resources one CRD declares (served versions only), in the order the real server prefers them."""
    spec = crd["spec"]
    versions = sorted(spec["versions"], key=lambda v: kube_version_priority(v["name"]))
    return [ResourceType(spec["group"], version["name"], spec["names"]["plural"], spec["names"]["kind"],
                         spec["scope"] == "Namespaced", "status" in (version.get("subresources") or {}),
                         spec["names"].get("singular", ""), version["schema"]["openAPIV3Schema"],
                         storage=bool(version.get("storage")),
                         short_names=tuple(spec["names"].get("shortNames") or ()))
            for version in versions if version.get("served", True)]


_KUBE_VERSION = re.compile(r"^v(\d+)(?:(alpha|beta)(\d+))?$")


def kube_version_priority(name: str) -> tuple[int, int, int, str]:
    """Sort key of Kubernetes' version priority (apimachinery's CompareKubeAwareVersionStrings): GA before beta before
    alpha, higher numbers first, then names that are no Kubernetes version, alphabetically."""
    match = _KUBE_VERSION.match(name)
    if match is None:
        return (3, 0, 0, name)
    major, stage, minor = match.groups()
    return ({None: 0, "beta": 1, "alpha": 2}[stage], -int(major), -int(minor or 0), "")


def resource_types_from_crds(crd_dir: Path | None) -> list[ResourceType]:
    """The resources declared by the CRD YAML files of `crd_dir` (none: no custom resources until a CRD is
    created through the API)."""
    return [t for crd in (load_crds(crd_dir) if crd_dir is not None else []) for t in resource_types_of_crd(crd)]


class ApiStatusError(Exception):
    """An API error answered as a metav1.Status body with this HTTP code."""

    def __init__(self, code: int, message: str, *, reason: str | None = None,
                 causes: list[FieldError] | None = None, details: dict | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.reason = reason or _REASONS.get(code, "Unknown")
        self.details = dict(details or {})
        if causes:
            self.details["causes"] = [{"reason": cause.reason, "message": cause.detail, "field": cause.field}
                                      for cause in causes]
        self.headers = headers or {}

    def status(self) -> dict:
        body = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": self.message, "reason": self.reason, "code": self.code}
        if self.details:
            body["details"] = self.details
        return body


@dataclass(slots=True)
class InjectedFailure:
    """Answer the next `remaining` requests matching (verb, path regex) with an error status."""

    verb: str
    path_pattern: re.Pattern[str]
    status: int
    remaining: int
    reason: str | None = None
    message: str | None = None
    retry_after_seconds: int | None = None

    def matches(self, verb: str, path: str) -> bool:
        return self.remaining > 0 and self.verb in ("*", verb) and bool(self.path_pattern.search(path))


@dataclass(frozen=True, slots=True)
class RecordedRequest:
    verb: str
    path: str
    query: dict[str, str]
    content_type: str
    body: JSON
    status: int
    headers: dict[str, str] = field(default_factory=dict)  # as sent, names in canonical form (Content-Type)


@dataclass(frozen=True, slots=True)
class _WatchEvent:
    resource_version: int
    event_type: str  # ADDED, MODIFIED, DELETED
    rtype: ResourceType
    old: dict | None
    new: dict


@dataclass(frozen=True, slots=True)
class _Response:
    code: int
    body: JSON
    headers: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class _Route:
    rtype: ResourceType
    namespace: str | None
    name: str | None
    subresource: str | None


def _bearer_matches(authorization: str, token: str) -> bool:
    """The auth scheme is case-insensitive (RFC 7235): the client's in-cluster config sends ``bearer <token>``."""
    scheme, _, credentials = authorization.partition(" ")
    return scheme.lower() == "bearer" and credentials == token


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _meta(obj: dict) -> dict:
    meta = obj.get("metadata")
    if not isinstance(meta, dict):
        meta = obj["metadata"] = {}
    return meta


def _without_volatile(obj: dict) -> dict:
    """The object minus what the server changes on every write (for no-op detection)."""
    clean = copy.deepcopy(obj)
    _meta(clean).pop("resourceVersion", None)
    _meta(clean).pop("managedFields", None)
    return clean


def _spec_part(obj: dict) -> dict:
    return {key: value for key, value in obj.items() if key not in ("metadata", "status")}


def _pod_qos_class(pod: dict) -> str:
    """Kubernetes pod QoS class from requests/limits of cpu and memory (kubelet's rule)."""
    spec = pod.get("spec") or {}
    containers = list(spec.get("containers") or []) + list(spec.get("initContainers") or [])
    guaranteed, any_set = True, False
    for container in containers:
        resources = container.get("resources") or {}
        requests, limits = resources.get("requests") or {}, resources.get("limits") or {}
        for name in ("cpu", "memory"):
            any_set = any_set or name in requests or name in limits
            if name not in limits or requests.get(name, limits[name]) != limits[name]:
                guaranteed = False
    if not any_set:
        return "BestEffort"
    return "Guaranteed" if guaranteed else "Burstable"


class ApiServer:
    """The in-memory API server, its HTTP front end on 127.0.0.1 and its serving thread."""

    def __init__(self, crd_dir: Path | None = DEFAULT_CRD_DIR, host: str = "127.0.0.1", port: int = 0,
                 watch_log_size: int = WATCH_LOG_SIZE, token: str | None = None,
                 tls: tuple[Path, Path] | None = None) -> None:
        """``tls``: (certificate, key) to serve HTTPS, as in-cluster clients (a pod's service account) need."""
        self._token = token
        self.tls = tls
        self._types = list(BUILTIN_RESOURCES) + resource_types_from_crds(crd_dir)
        self._cond = threading.Condition(threading.RLock())
        self._objects: dict[tuple[str, str, str], dict] = {}  # (qualified plural, namespace, name)
        self._resource_version = 0
        self._events: deque[_WatchEvent] = deque(maxlen=watch_log_size)  # for watches that resume
        self._failures: list[InjectedFailure] = []
        self._users: dict[str, dict] = {}  # bearer token -> the user a TokenReview names (add_token)
        self._requests: list[RecordedRequest] = []
        self._stopping = threading.Event()
        self._connections: set[socket.socket] = set()
        self._httpd = _HttpServer((host, port), _Handler, self)
        if tls is not None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(*tls)
            self._httpd.socket = context.wrap_socket(self._httpd.socket, server_side=True)
        self._thread: threading.Thread | None = None
        for namespace in ("default", "kube-system"):
            self._ensure_namespace(namespace)

    # ------------------------------------------------------------ lifecycle

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"{'https' if self.tls else 'http'}://{host}:{port}"

    def start(self) -> Self:
        if self._thread is None:
            self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.1},
                                            name="test-apiserver", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving: end watches, close client connections, join every server thread."""
        if self._stopping.is_set():
            return
        self._stopping.set()
        with self._cond:
            self._cond.notify_all()
        if self._thread is not None:
            self._httpd.shutdown()
            self._thread.join()
        with self._cond:
            connections = list(self._connections)
        for connection in connections:
            try:
                connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # already closed by the client
        self._httpd.server_close()  # joins the per-connection handler threads

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # ------------------------------------------------------------ test helpers

    def fail_next(self, verb: str, path_regex: str, status: int = 500, count: int = 1, *,
                  reason: str | None = None, message: str | None = None,
                  retry_after_seconds: int | None = None) -> InjectedFailure:
        """Make the next `count` requests whose verb (GET, POST, PUT, PATCH, DELETE or "*") and
        path (re.search, no query string) match fail with `status` and a Status body."""
        failure = InjectedFailure(verb.upper(), re.compile(path_regex), status, count, reason, message,
                                  retry_after_seconds)
        with self._cond:
            self._failures.append(failure)
        return failure

    def add_token(self, token: str, username: str, groups: tuple[str, ...] = ("system:authenticated",),
                  uid: str = "") -> None:
        """Make TokenReviews of ``token`` authenticate as ``username`` in ``groups``."""
        with self._cond:
            self._users[token] = {"username": username, "uid": uid or str(uuid.uuid4()), "groups": list(groups)}

    def clear_failures(self) -> None:
        with self._cond:
            self._failures.clear()

    def requests(self, verb: str | None = None, path_regex: str | None = None) -> list[RecordedRequest]:
        """Recorded requests in arrival order, optionally filtered by verb and path regex."""
        with self._cond:
            recorded = list(self._requests)
        return [request for request in recorded
                if (verb is None or request.verb == verb.upper())
                and (path_regex is None or re.search(path_regex, request.path))]

    def clear_requests(self) -> None:
        with self._cond:
            self._requests.clear()

    def seed(self, obj: dict) -> dict:
        """Store an object as given, status included (what controllers and kubelet would have
        written), bypassing create-time resets; custom objects are still validated."""
        rtype = self._type_for_object(obj)
        namespace = _meta(obj).get("namespace", "default") if rtype.namespaced else None
        return self._create(rtype, namespace, copy.deepcopy(obj), keep_status=True)

    def get_object(self, plural: str, name: str, namespace: str | None = None) -> dict | None:
        """A copy of a stored object (at its storage version); `plural` may be qualified ("events.events.k8s.io")."""
        rtype = self._type_by_name(plural)
        with self._cond:
            stored = self._objects.get((rtype.qualified, namespace or "", name))
            return copy.deepcopy(stored) if stored is not None else None

    def list_objects(self, plural: str, namespace: str | None = None) -> list[dict]:
        rtype = self._type_by_name(plural)
        with self._cond:
            return [copy.deepcopy(obj) for (qualified, ns, _), obj in sorted(self._objects.items())
                    if qualified == rtype.qualified and (namespace is None or ns == namespace)]

    @property
    def resource_version(self) -> int:
        with self._cond:
            return self._resource_version

    # ------------------------------------------------------------ request entry

    def handle(self, verb: str, raw_path: str, content_type: str, raw_body: bytes,
               headers: dict[str, str] | None = None) -> _Response | Iterator[bytes]:
        """Answer one request: a response, or for a watch an iterator of JSON lines."""
        headers = {name.title(): value for name, value in (headers or {}).items()}  # canonical, as Go's http.Header
        parts = urlsplit(raw_path)
        path = parts.path.rstrip("/") or "/"
        query = {key: values[-1] for key, values in parse_qs(parts.query, keep_blank_values=True).items()}
        body: JSON = None
        sent: JSON = None  # the body as the client sent it (handling may fill in the parsed one)
        try:
            if self._token is not None and not _bearer_matches(headers.get("Authorization", ""), self._token):
                raise ApiStatusError(401, "Unauthorized")
            if raw_body:
                try:
                    body = json.loads(raw_body)
                except ValueError as exc:
                    raise ApiStatusError(400, f"request body is not JSON: {exc}") from exc
                sent = copy.deepcopy(body)
            self._raise_injected_failure(verb, path)
            result: _Response | Iterator[bytes] = self._route_request(verb, path, query, content_type, body)
        except ApiStatusError as error:
            result = _Response(error.code, error.status(), error.headers)
        except Exception as exc:  # a bug here must answer 500, not hang or drop the client
            log.exception("test API server failed on %s %s", verb, path)
            result = _Response(500, ApiStatusError(500, f"internal error: {exc!r}").status())
        code = result.code if isinstance(result, _Response) else 200
        with self._cond:
            self._requests.append(RecordedRequest(verb, path, query, content_type, sent, code, headers))
        return result

    def _raise_injected_failure(self, verb: str, path: str) -> None:
        with self._cond:
            failure = next((f for f in self._failures if f.matches(verb, path)), None)
            if failure is None:
                return
            failure.remaining -= 1
        headers, details = {}, {}
        if failure.retry_after_seconds is not None:
            headers["Retry-After"] = str(failure.retry_after_seconds)
            details["retryAfterSeconds"] = failure.retry_after_seconds
        raise ApiStatusError(failure.status, failure.message or f"injected failure for {verb} {path}",
                             reason=failure.reason, details=details, headers=headers)

    def _route_request(self, verb: str, path: str, query: dict[str, str], content_type: str,
                       body: JSON) -> _Response | Iterator[bytes]:
        fixed = self._fixed_response(path)
        if fixed is not None:
            return fixed
        if path in (authreview.TOKEN_REVIEWS, authreview.ACCESS_REVIEWS):
            return self._review(verb, path, body)
        route = self._parse_route(path)
        if route.subresource == "eviction" and verb != "POST":
            raise ApiStatusError(405, f"{verb} is not supported on {path}")
        if verb == "GET":
            if route.name is None:
                if query.get("watch", "").lower() in ("true", "1"):
                    return self._watch(route, query)
                return _Response(200, self._list(route, query))
            return _Response(200, self._get(route))
        response = self._write_response(verb, route, query, content_type.split(";")[0].strip().lower(), body)
        if response is None:
            raise ApiStatusError(405, f"{verb} is not supported on {path}")
        return response

    def _review(self, verb: str, path: str, body: JSON) -> _Response:
        if verb != "POST":
            raise ApiStatusError(405, f"{verb} is not supported on {path}")
        with self._cond:
            try:
                if path == authreview.TOKEN_REVIEWS:
                    return _Response(201, authreview.token_review(body, self._users))
                roles = {obj["metadata"]["name"]: obj for (plural, _, _), obj in self._objects.items()
                         if plural == "clusterroles.rbac.authorization.k8s.io"}
                bindings = [obj for (plural, _, _), obj in self._objects.items()
                            if plural == "clusterrolebindings.rbac.authorization.k8s.io"]
                return _Response(201, authreview.access_review(body, roles, bindings))
            except authreview.ReviewError as err:
                raise ApiStatusError(err.code, str(err)) from err

    def _fixed_response(self, path: str) -> _Response | None:
        """Health, version and discovery: answers that name no resource."""
        if path in ("/healthz", "/readyz", "/livez"):
            return _Response(200, "ok")
        if path == "/version":
            return _Response(200, {"major": "1", "minor": "31", "gitVersion": "v1.31.0-koordlet-py-test",
                                   "gitCommit": "0" * 40, "gitTreeState": "clean",
                                   "buildDate": "2024-08-13T00:00:00Z", "goVersion": "go1.22.5",
                                   "compiler": "gc", "platform": "linux/amd64"})
        discovery = self._discovery(path)
        return None if discovery is None else _Response(200, discovery)

    def _write_response(self, verb: str, route: _Route, query: dict[str, str], content_type: str,
                        body: JSON) -> _Response | None:
        """POST, PUT, PATCH and DELETE on a resource; None for a verb the route does not take."""
        if verb == "POST":
            if route.name is None:
                return self._create_response(route, query, body)
            if route.rtype.plural == "pods" and route.subresource == "eviction":
                return _Response(201, self._evict(route, body))
        if verb in ("PUT", "PATCH") and route.name is not None and route.subresource in (None, "status"):
            if verb == "PUT":
                return self._updated_response(self._replace(route, body, query))
            return self._updated_response(self._patch(route, body, content_type, query))
        if verb == "DELETE" and route.name is not None and route.subresource is None:
            return _Response(200, self._delete(route, body))
        return None

    # ------------------------------------------------------------ routing and discovery

    def _type_by_name(self, name: str) -> ResourceType:
        for rtype in self._types:
            if name in (rtype.qualified, rtype.plural):
                return rtype
        raise KeyError(f"no served resource named {name!r}")

    def _type_for_object(self, obj: dict) -> ResourceType:
        for rtype in self._types:
            if rtype.api_version == obj.get("apiVersion") and rtype.kind == obj.get("kind"):
                return rtype
        raise ApiStatusError(400, f"no resource serves {obj.get('apiVersion')}/{obj.get('kind')}")

    def _parse_route(self, path: str) -> _Route:
        parts = path.strip("/").split("/")
        if parts[0] == "api" and len(parts) >= 3:
            group, version, rest = "", parts[1], parts[2:]
        elif parts[0] == "apis" and len(parts) >= 4:
            group, version, rest = parts[1], parts[2], parts[3:]
        else:
            raise ApiStatusError(404, "the server could not find the requested resource")
        namespace = None
        if rest[0] == "namespaces" and len(rest) >= 3:
            namespace, rest = rest[1], rest[2:]
        rtype = next((t for t in self._types
                      if (t.group, t.version, t.plural) == (group, version, rest[0])), None)
        subresource = rest[2] if len(rest) > 2 else None
        known_subresources = {None} | ({"status"} if rtype and rtype.status_subresource else set()) | (
            {"eviction"} if rtype and rtype.plural == "pods" else set())
        if rtype is None or len(rest) > 3 or (namespace is not None and not rtype.namespaced) or \
                subresource not in known_subresources:
            raise ApiStatusError(404, "the server could not find the requested resource")
        return _Route(rtype, namespace, rest[1] if len(rest) > 1 else None, subresource)

    def _discovery(self, path: str) -> dict | None:
        groups: dict[str, list[str]] = {}
        for rtype in self._types:
            if rtype.group and rtype.version not in groups.setdefault(rtype.group, []):
                groups[rtype.group].append(rtype.version)

        def group_doc(name: str) -> dict:
            # The real server lists a group's versions by Kubernetes version priority, the preferred first.
            versions = [{"groupVersion": f"{name}/{v}", "version": v}
                        for v in sorted(groups[name], key=kube_version_priority)]
            return {"name": name, "versions": versions, "preferredVersion": versions[0]}

        if path == "/api":
            return {"kind": "APIVersions", "versions": ["v1"],
                    "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0",
                                                    "serverAddress": self.url.split("://", 1)[1]}]}
        if path == "/apis":
            return {"kind": "APIGroupList", "apiVersion": "v1", "groups": [group_doc(g) for g in groups]}
        parts = path.strip("/").split("/")
        if parts[0] == "apis" and len(parts) == 2 and parts[1] in groups:
            return {"kind": "APIGroup", "apiVersion": "v1", **group_doc(parts[1])}
        if path == "/api/v1" or (parts[0] == "apis" and len(parts) == 3):
            group_version = "v1" if path == "/api/v1" else f"{parts[1]}/{parts[2]}"
            served = [t for t in self._types if t.api_version == group_version]
            if not served:
                return None
            resources = []
            for rtype in served:
                verbs = ["create", "delete", "get", "list", "patch", "update", "watch"]
                resources.append({"name": rtype.plural, "singularName": rtype.singular,
                                  "namespaced": rtype.namespaced, "kind": rtype.kind, "verbs": verbs,
                                  **({"shortNames": list(rtype.short_names)} if rtype.short_names else {})})
                if rtype.status_subresource:
                    resources.append({"name": f"{rtype.plural}/status", "singularName": "",
                                      "namespaced": rtype.namespaced, "kind": rtype.kind,
                                      "verbs": ["get", "patch", "update"]})
                if rtype.plural == "pods":
                    resources.append({"name": "pods/eviction", "singularName": "", "namespaced": True,
                                      "group": "policy", "version": "v1", "kind": "Eviction",
                                      "verbs": ["create"]})
            return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": group_version,
                    "resources": resources}
        return None

    # ------------------------------------------------------------ store primitives (hold _cond)

    def _key(self, rtype: ResourceType, namespace: str | None, name: str) -> tuple[str, str, str]:
        return (rtype.qualified, namespace or "", name)

    def _existing(self, route: _Route) -> dict:
        stored = self._objects.get(self._key(route.rtype, route.namespace, route.name or ""))
        if stored is None:
            raise ApiStatusError(404, f'{route.rtype.qualified} "{route.name}" not found',
                                 details={"name": route.name, "group": route.rtype.group,
                                          "kind": route.rtype.plural})
        return stored

    def _record(self, event_type: str, rtype: ResourceType, old: dict | None, new: dict) -> None:
        self._events.append(_WatchEvent(self._resource_version, event_type, rtype, old, copy.deepcopy(new)))
        self._cond.notify_all()

    def _next_resource_version(self) -> str:
        self._resource_version += 1
        return str(self._resource_version)

    def _ensure_namespace(self, namespace: str) -> None:
        rtype = self._type_by_name("namespaces")
        with self._cond:
            if self._key(rtype, None, namespace) in self._objects:
                return
            obj = {"apiVersion": "v1", "kind": "Namespace",
                   "metadata": {"name": namespace, "uid": str(uuid.uuid4()), "creationTimestamp": _now(),
                                "resourceVersion": self._next_resource_version()},
                   "spec": {"finalizers": ["kubernetes"]}, "status": {"phase": "Active"}}
            self._objects[self._key(rtype, None, namespace)] = obj
            self._record("ADDED", rtype, None, obj)

    # ------------------------------------------------------------ admission: defaults, pruning, validation

    def _admit(self, rtype: ResourceType, obj: dict, query: dict[str, str]) -> list[str]:
        """Check metadata, and for custom resources default, prune and validate; returns warnings."""
        meta = _meta(obj)
        for key in ("labels", "annotations"):
            values = meta.get(key)
            if values is not None and (not isinstance(values, dict)
                                       or not all(isinstance(v, str) for v in values.values())):
                raise ApiStatusError(400, f"metadata.{key} must be a map of string to string")
            if values == {}:
                del meta[key]  # omitempty, as the real server serialises ObjectMeta
        if rtype.schema is None:
            return []
        apply_defaults(obj, rtype.schema)
        pruned = prune_unknown_fields(obj, rtype.schema)
        if pruned and query.get("fieldValidation") == "Strict":
            raise ApiStatusError(400, "strict decoding error: " + ", ".join(
                f'unknown field "{path}"' for path in pruned))
        errors = validate_schema(obj, rtype.schema)
        if errors:
            shown = str(errors[0]) if len(errors) == 1 else "[" + ", ".join(map(str, errors)) + "]"
            raise ApiStatusError(
                422, f'{rtype.kind}.{rtype.group} "{meta.get("name")}" is invalid: {shown}', causes=errors,
                details={"name": meta.get("name"), "group": rtype.group, "kind": rtype.kind})
        return [f'unknown field "{path}"' for path in pruned]

    # ------------------------------------------------------------ versions (conversion strategy None)

    def _storage_type(self, rtype: ResourceType) -> ResourceType:
        """The served type objects of ``rtype``'s resource are stored as (itself for built-ins)."""
        if not rtype.custom:
            return rtype
        return next((t for t in self._types if t.qualified == rtype.qualified and t.storage), rtype)

    @staticmethod
    def _converted(obj: dict, rtype: ResourceType) -> dict:
        """A copy of ``obj`` at ``rtype``'s version: with conversion None only apiVersion changes, then the target
        version's schema defaults and prunes it, as the real server does after every conversion."""
        out = copy.deepcopy(obj)
        if not rtype.custom or out.get("apiVersion") == rtype.api_version:
            return out
        out["apiVersion"] = rtype.api_version
        apply_defaults(out, rtype.schema)
        prune_unknown_fields(out, rtype.schema)
        return out

    # ------------------------------------------------------------ verbs

    def _get(self, route: _Route) -> dict:
        with self._cond:
            return self._converted(self._existing(route), route.rtype)

    def _matching(self, route: _Route, query: dict[str, str]) -> list[dict]:
        try:
            return [obj for (qualified, ns, _), obj in sorted(self._objects.items())
                    if qualified == route.rtype.qualified and (route.namespace is None or ns == route.namespace)
                    and label_selector_matches(query.get("labelSelector", ""), _meta(obj).get("labels") or {})
                    and field_selector_matches(query.get("fieldSelector", ""), obj)]
        except SelectorError as exc:
            raise ApiStatusError(400, str(exc)) from exc

    def _list(self, route: _Route, query: dict[str, str]) -> dict:
        with self._cond:
            items = [self._converted(obj, route.rtype) for obj in self._matching(route, query)]
            version = str(self._resource_version)
        return {"kind": f"{route.rtype.kind}List", "apiVersion": route.rtype.api_version,
                "metadata": {"resourceVersion": version}, "items": items}

    def _create_response(self, route: _Route, query: dict[str, str], body: JSON) -> _Response:
        if not isinstance(body, dict):
            raise ApiStatusError(400, "the request body must be a JSON object")
        body_ns = _meta(body).get("namespace")
        if route.rtype.namespaced:
            if route.namespace is None:
                raise ApiStatusError(405, f"create {route.rtype.plural} needs a namespace in the path")
            if body_ns not in (None, "", route.namespace):
                raise ApiStatusError(400, "the namespace of the provided object does not match the namespace "
                                          "sent on the request")
        warnings: list[str] = []
        created = self._create(route.rtype, route.namespace, body, keep_status=False, query=query,
                               warnings=warnings)
        return _Response(201, created, self._warning_headers(warnings))

    def _create(self, rtype: ResourceType, namespace: str | None, obj: dict, *, keep_status: bool,
                query: dict[str, str] | None = None, warnings: list[str] | None = None) -> dict:
        query = query or {}
        name = self._new_object(rtype, namespace, obj, keep_status)
        (warnings if warnings is not None else []).extend(self._admit(rtype, obj, query))
        if rtype.plural == "customresourcedefinitions":
            self._admit_crd(obj)
        if namespace is not None:
            self._ensure_namespace(namespace)
        with self._cond:
            key = self._key(rtype, namespace, name)
            if key in self._objects:
                raise ApiStatusError(409, f'{rtype.qualified} "{name}" already exists', reason="AlreadyExists",
                                     details={"name": name, "group": rtype.group, "kind": rtype.plural})
            if query.get("dryRun"):
                return copy.deepcopy(obj)
            stored = self._converted(obj, self._storage_type(rtype))
            _meta(stored)["resourceVersion"] = self._next_resource_version()
            self._objects[key] = stored
            self._record("ADDED", rtype, None, stored)
            if rtype.plural == "customresourcedefinitions":
                served = {(t.group, t.version, t.plural) for t in self._types}
                self._types.extend(t for t in resource_types_of_crd(stored)
                                   if (t.group, t.version, t.plural) not in served)
            return self._converted(stored, rtype)

    def _new_object(self, rtype: ResourceType, namespace: str | None, obj: dict, keep_status: bool) -> str:
        """``obj`` made a new object of ``rtype`` as the API server stores it (type checked, name generated,
        namespace, uid and timestamps set, status reset unless ``keep_status``); returns its name."""
        if obj.setdefault("apiVersion", rtype.api_version) != rtype.api_version or \
                obj.setdefault("kind", rtype.kind) != rtype.kind:
            raise ApiStatusError(400, f"expected {rtype.api_version} {rtype.kind}, got "
                                      f"{obj['apiVersion']} {obj['kind']}")
        meta = _meta(obj)
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + secrets.token_hex(3)[:5]
        name = meta.get("name")
        if not name:
            error = FieldError("metadata.name", "FieldValueRequired", "Required value: name or generateName "
                                                                      "is required")
            raise ApiStatusError(422, f'{rtype.kind} "" is invalid: {error}', causes=[error])
        if rtype.namespaced:
            meta["namespace"] = namespace
        else:
            meta.pop("namespace", None)
        if not keep_status:
            if rtype.custom and rtype.status_subresource:
                obj.pop("status", None)
            elif rtype.plural == "pods":
                obj["status"] = {"phase": "Pending", "qosClass": _pod_qos_class(obj)}
        for key in ("resourceVersion", "deletionTimestamp"):
            meta.pop(key, None)
        meta.update(uid=str(uuid.uuid4()), creationTimestamp=_now())
        if rtype.custom:
            meta["generation"] = 1
        return name

    @staticmethod
    def _admit_crd(crd: dict) -> None:
        """A CRD the real API server would refuse (not structural, wrong names) is refused here too; an accepted
        one is defaulted (conversion None) and given the status the real server gives it once established."""
        problems = crd_problems(crd)
        name = _meta(crd).get("name")
        if problems:
            raise ApiStatusError(422, f'CustomResourceDefinition.apiextensions.k8s.io "{name}" is invalid: '
                                      + "; ".join(problems))
        conversion = crd["spec"].setdefault("conversion", {"strategy": "None"})
        if conversion.get("strategy") != "None":
            raise ApiStatusError(422, f'CustomResourceDefinition.apiextensions.k8s.io "{name}": conversion strategy '
                                      f'{conversion.get("strategy")!r} needs a webhook, which this test server '
                                      "cannot call; only None is served")
        now = _now()
        crd["status"] = {
            "acceptedNames": copy.deepcopy(crd["spec"]["names"]),
            "conditions": [{"type": kind, "status": "True", "reason": reason, "lastTransitionTime": now,
                            "message": message} for kind, reason, message in (
                ("NamesAccepted", "NoConflicts", "no conflicts found"),
                ("Established", "InitialNamesAccepted", "the initial names have been accepted"))],
            "storedVersions": [v["name"] for v in crd["spec"]["versions"] if v.get("storage")]}

    def _conflict(self, route: _Route) -> ApiStatusError:
        return ApiStatusError(409, f'Operation cannot be fulfilled on {route.rtype.qualified} "{route.name}": '
                                   "the object has been modified; please apply your changes to the latest "
                                   "version and try again",
                              details={"name": route.name, "group": route.rtype.group,
                                       "kind": route.rtype.plural})

    def _replace(self, route: _Route, body: JSON, query: dict[str, str]) -> tuple[dict, list[str]]:
        if not isinstance(body, dict):
            raise ApiStatusError(400, "the request body must be a JSON object")
        if _meta(body).get("name") != route.name:
            raise ApiStatusError(400, f"the name of the object ({_meta(body).get('name')}) does not match the "
                                      f"name on the URL ({route.name})")
        with self._cond:
            old = self._converted(self._existing(route), route.rtype)
            sent_version = _meta(body).get("resourceVersion")
            if sent_version and sent_version != _meta(old)["resourceVersion"]:
                raise self._conflict(route)
            return self._commit_update(route, old, body, query)

    def _patch(self, route: _Route, body: JSON, content_type: str,
               query: dict[str, str]) -> tuple[dict, list[str]]:
        with self._cond:
            old = self._converted(self._existing(route), route.rtype)
            try:
                if content_type == "application/json-patch+json":
                    patched = json_patch(old, body)
                elif content_type == "application/merge-patch+json":
                    patched = json_merge_patch(old, body)
                elif content_type == "application/strategic-merge-patch+json" and not route.rtype.custom:
                    patched = strategic_merge_patch(old, body)
                else:
                    raise ApiStatusError(415, f"the body of the request was in an unknown format - accepted "
                                              f"media types include: application/json-patch+json, "
                                              f"application/merge-patch+json (got {content_type!r})")
            except PatchError as exc:
                raise ApiStatusError(422, f"the server rejected our request due to an error in our request: "
                                          f"{exc}") from exc
            if not isinstance(patched, dict):
                raise ApiStatusError(422, "the patched object is not a JSON object")
            # A resourceVersion carried by the patch is a precondition, like the real server's.
            if _meta(patched).get("resourceVersion") != _meta(old)["resourceVersion"]:
                raise self._conflict(route)
            if _meta(patched).get("name") != route.name:
                raise ApiStatusError(400, "a patch may not change metadata.name")
            return self._commit_update(route, old, patched, query)

    def _commit_update(self, route: _Route, old: dict, new: dict, query: dict[str, str]) -> tuple[dict, list[str]]:
        """Apply status-subresource rules, admission, no-op detection, generation and storage."""
        rtype = route.rtype
        if route.subresource == "status":
            result = copy.deepcopy(old)
            if "status" in new:
                result["status"] = copy.deepcopy(new["status"])
            else:
                result.pop("status", None)
        else:
            result = copy.deepcopy(new)
            if rtype.status_subresource:
                result.pop("status", None)
                if "status" in old:
                    result["status"] = copy.deepcopy(old["status"])
        result["apiVersion"], result["kind"] = rtype.api_version, rtype.kind
        meta, old_meta = _meta(result), _meta(old)
        for key in ("uid", "creationTimestamp", "namespace", "generation", "deletionTimestamp"):
            if key in old_meta:
                meta[key] = old_meta[key]
            else:
                meta.pop(key, None)
        meta["resourceVersion"] = old_meta["resourceVersion"]
        warnings = self._admit(rtype, result, query)
        if query.get("dryRun"):
            return result, warnings
        if _without_volatile(result) == _without_volatile(old):
            return copy.deepcopy(old), warnings  # a no-op write keeps the resourceVersion
        if rtype.custom and _spec_part(result) != _spec_part(old):
            meta["generation"] = old_meta.get("generation", 1) + 1
        meta["resourceVersion"] = self._next_resource_version()
        key = self._key(rtype, route.namespace, route.name or "")
        stored_old, stored = self._objects[key], self._converted(result, self._storage_type(rtype))
        if meta.get("deletionTimestamp") and not meta.get("finalizers"):
            del self._objects[key]
            self._record("DELETED", rtype, stored_old, stored)
        else:
            self._objects[key] = stored
            self._record("MODIFIED", rtype, stored_old, stored)
        return self._converted(stored, rtype), warnings

    def _updated_response(self, outcome: tuple[dict, list[str]]) -> _Response:
        obj, warnings = outcome
        return _Response(200, obj, self._warning_headers(warnings))

    @staticmethod
    def _warning_headers(warnings: list[str]) -> dict[str, str]:
        quoted = [text.replace("\\", "\\\\").replace('"', '\\"') for text in warnings]
        return {"Warning": ", ".join(f'299 - "{text}"' for text in quoted)} if warnings else {}

    def _delete(self, route: _Route, body: JSON) -> dict:
        options = body if isinstance(body, dict) else {}
        preconditions = options.get("preconditions") or {}
        with self._cond:
            old = self._existing(route)
            meta = _meta(old)
            for key in ("resourceVersion", "uid"):
                if preconditions.get(key) and preconditions[key] != meta.get(key):
                    raise self._conflict(route)
            if options.get("dryRun"):
                return copy.deepcopy(old)
            key = self._key(route.rtype, route.namespace, route.name or "")
            if meta.get("finalizers"):
                if not meta.get("deletionTimestamp"):
                    updated = copy.deepcopy(old)
                    _meta(updated).update(deletionTimestamp=_now(), resourceVersion=self._next_resource_version())
                    self._objects[key] = updated
                    self._record("MODIFIED", route.rtype, old, updated)
                    return copy.deepcopy(updated)
                return copy.deepcopy(old)
            deleted = copy.deepcopy(old)
            _meta(deleted)["resourceVersion"] = self._next_resource_version()
            del self._objects[key]
            self._record("DELETED", route.rtype, old, deleted)
        if route.rtype.returns_deleted_object:
            return deleted
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                "details": {"name": route.name, "group": route.rtype.group, "kind": route.rtype.plural,
                            "uid": meta.get("uid")}}

    # ------------------------------------------------------------ eviction (policy/v1)

    def _evict(self, route: _Route, body: JSON) -> dict:
        """Evict a pod unless a matching PodDisruptionBudget forbids it (429), like the real server."""
        if not isinstance(body, dict) or body.get("kind") != "Eviction":
            raise ApiStatusError(400, "the body of an eviction must be a policy Eviction")
        if _meta(body).get("name") not in (None, route.name):
            raise ApiStatusError(400, "name in URL does not match name in Eviction object")
        options = body.get("deleteOptions") or {}
        pdb_type = self._type_by_name("poddisruptionbudgets")
        with self._cond:
            pod = self._existing(_Route(route.rtype, route.namespace, route.name, None))
            labels = _meta(pod).get("labels") or {}
            phase = (pod.get("status") or {}).get("phase")
            if phase not in ("Succeeded", "Failed", "Pending") and not _meta(pod).get("deletionTimestamp"):
                budgets = [pdb for (qualified, ns, _), pdb in sorted(self._objects.items())
                           if qualified == pdb_type.qualified and ns == route.namespace
                           and label_selector_object_matches((pdb.get("spec") or {}).get("selector"), labels)]
                if len(budgets) > 1:
                    raise ApiStatusError(500, "This pod has more than one PodDisruptionBudget, which the "
                                              "eviction subresource does not support.")
                if budgets:
                    self._charge_budget(pdb_type, budgets[0], pod, bool(options.get("dryRun")))
            if not options.get("dryRun"):
                self._delete(_Route(route.rtype, route.namespace, route.name, None), options)
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}

    def _charge_budget(self, pdb_type: ResourceType, pdb: dict, pod: dict, dry_run: bool) -> None:
        spec = pdb.get("spec") or {}
        selected = [obj for (qualified, ns, _), obj in self._objects.items()
                    if qualified == "pods" and ns == _meta(pdb).get("namespace")
                    and label_selector_object_matches(spec.get("selector"), _meta(obj).get("labels") or {})]
        healthy = sum(1 for obj in selected if self._pod_healthy(obj))
        # Pods this budget already let go still count as expected: their controller would recreate them.
        present = {_meta(obj)["name"] for obj in selected}
        evicted = set((pdb.get("status") or {}).get("disruptedPods") or {}) - present
        expected = len(selected) + len(evicted)

        def scaled(value: int | str) -> int:
            if isinstance(value, str) and value.endswith("%"):
                return math.ceil(expected * int(value[:-1]) / 100)
            return int(value)

        if "minAvailable" in spec:
            desired = scaled(spec["minAvailable"])
        elif "maxUnavailable" in spec:
            desired = max(expected - scaled(spec["maxUnavailable"]), 0)
        else:
            desired = 0
        allowed = healthy - desired
        pod_unhealthy_ok = not self._pod_healthy(pod) and (
            spec.get("unhealthyPodEvictionPolicy") == "AlwaysAllow" or healthy >= desired)
        name = _meta(pdb)["name"]
        if allowed <= 0 and not pod_unhealthy_ok:
            raise ApiStatusError(
                429, "Cannot evict pod as it would violate the pod's disruption budget.",
                details={"causes": [{"reason": "DisruptionBudget", "message":
                                     f"The disruption budget {name} needs {desired} healthy pods and has "
                                     f"{healthy} currently"}]})
        if dry_run:
            return
        updated = copy.deepcopy(pdb)
        disrupted = dict((updated.get("status") or {}).get("disruptedPods") or {})
        disrupted[_meta(pod)["name"]] = _now()
        updated["status"] = {"currentHealthy": healthy, "desiredHealthy": desired, "expectedPods": expected,
                             "disruptionsAllowed": max(allowed - 1, 0), "disruptedPods": disrupted,
                             "observedGeneration": _meta(pdb).get("generation", 1)}
        _meta(updated)["resourceVersion"] = self._next_resource_version()
        self._objects[self._key(pdb_type, _meta(pdb)["namespace"], name)] = updated
        self._record("MODIFIED", pdb_type, pdb, updated)

    @staticmethod
    def _pod_healthy(pod: dict) -> bool:
        status = pod.get("status") or {}
        if status.get("phase") != "Running" or _meta(pod).get("deletionTimestamp"):
            return False
        ready = [c for c in status.get("conditions") or [] if c.get("type") == "Ready"]
        return not ready or ready[0].get("status") == "True"

    # ------------------------------------------------------------ watch

    def _watch(self, route: _Route, query: dict[str, str]) -> Iterator[bytes]:
        timeout = min(float(query.get("timeoutSeconds") or MAX_WATCH_SECONDS), MAX_WATCH_SECONDS)
        requested = query.get("resourceVersion", "")
        with self._cond:
            if requested in ("", "0"):
                initial = [("ADDED", self._converted(obj, route.rtype)) for obj in self._matching(route, query)]
                since = self._resource_version
            else:
                try:
                    since = int(requested)
                except ValueError as exc:
                    raise ApiStatusError(400, f"invalid resourceVersion {requested!r}") from exc
                initial = []
                oldest = self._events[0].resource_version if self._events else self._resource_version + 1
                if len(self._events) == self._events.maxlen and since < oldest - 1:
                    gone = ApiStatusError(410, f"too old resource version: {since} ({oldest - 1})", reason="Expired")
                    return iter([self._event_line("ERROR", gone.status())])
        return self._watch_stream(route, query, since, initial, time.monotonic() + timeout)

    def _watch_stream(self, route: _Route, query: dict[str, str], since: int,
                      initial: list[tuple[str, dict]], deadline: float) -> Iterator[bytes]:
        for event_type, obj in initial:
            yield self._event_line(event_type, obj)
        while not self._stopping.is_set():
            with self._cond:
                pending = [event for event in self._events if event.resource_version > since]
                if not pending:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return
                    self._cond.wait(min(left, WATCH_POLL_SECONDS))
                    continue
                since = pending[-1].resource_version
                lines = [line for event in pending if (line := self._filtered(route, query, event)) is not None]
            yield from lines

    def _filtered(self, route: _Route, query: dict[str, str], event: _WatchEvent) -> bytes | None:
        """The event as the watcher of `route` sees it, at the watched version: selectors turn leaving objects into
        DELETED."""
        if event.rtype.qualified != route.rtype.qualified or (
                route.namespace is not None and _meta(event.new).get("namespace") != route.namespace):
            return None

        def selected(obj: dict | None) -> bool:
            return obj is not None and label_selector_matches(
                query.get("labelSelector", ""), _meta(obj).get("labels") or {}) and field_selector_matches(
                query.get("fieldSelector", ""), obj)

        now_selected, was_selected = selected(event.new), selected(event.old)
        new = self._converted(event.new, route.rtype)
        if event.event_type == "DELETED":
            return self._event_line("DELETED", new) if was_selected else None
        if now_selected:
            return self._event_line("MODIFIED" if was_selected else "ADDED", new)
        return self._event_line("DELETED", new) if was_selected else None

    @staticmethod
    def _event_line(event_type: str, obj: dict) -> bytes:
        return json.dumps({"type": event_type, "object": obj}).encode() + b"\n"


class _HttpServer(ThreadingHTTPServer):
    daemon_threads = False  # handler threads are joined by server_close() in ApiServer.stop()
    block_on_close = True

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler], api: ApiServer) -> None:
        self.api = api
        super().__init__(address, handler)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Headers and body go out in separate writes; with Nagle on, every request after the first on a
    # kept-alive connection waited ~40 ms for the client's delayed ACK.
    disable_nagle_algorithm = True
    timeout = IDLE_CONNECTION_SECONDS
    server: _HttpServer

    def setup(self) -> None:
        super().setup()
        with self.server.api._cond:
            self.server.api._connections.add(self.connection)

    def finish(self) -> None:
        with self.server.api._cond:
            self.server.api._connections.discard(self.connection)
        try:
            super().finish()
        except OSError:
            pass  # the peer went away; nothing left to flush

    def log_message(self, format: str, *args: object) -> None:
        log.debug("%s %s", self.address_string(), format % args)

    def _serve(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw_body = self.rfile.read(length) if length else b""
        result = self.server.api.handle(self.command, self.path, self.headers.get("Content-Type", ""), raw_body,
                                        dict(self.headers.items()))
        if isinstance(result, _Response):
            payload = result.body.encode() if isinstance(result.body, str) else json.dumps(result.body).encode()
            self.send_response(result.code)
            self.send_header("Content-Type", "text/plain" if isinstance(result.body, str) else "application/json")
            self.send_header("Content-Length", str(len(payload)))
            for name, value in result.headers.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(payload)
            return
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        # Said, not only done: a client that does not hear it pools the connection and may send its next request
        # (a POST, which it does not retry) on it just as it closes.
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        try:
            for line in result:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
        except OSError:
            log.debug("watch client went away")
        finally:
            close = getattr(result, "close", None)
            if close is not None:
                close()

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _serve


def kubeconfig(server: ApiServer, context: str = "koordlet-py-test") -> dict:
    """A kubeconfig document for `server` (write it as YAML or JSON for a subprocess's KUBECONFIG)."""
    return {"apiVersion": "v1", "kind": "Config", "current-context": context,
            "clusters": [{"name": context, "cluster": {"server": server.url}}],
            "users": [{"name": context, "user": {}}],
            "contexts": [{"name": context, "context": {"cluster": context, "user": context}}]}


def write_kubeconfig(server: ApiServer, path: Path) -> Path:
    """Write kubeconfig(server) to `path` (JSON, which every YAML reader accepts); returns `path`."""
    path.write_text(json.dumps(kubeconfig(server), indent=2), encoding="utf-8")
    return path


def kube_client_config(server: ApiServer) -> kubernetes.client.Configuration:
    """A kubernetes client Configuration that talks to `server`."""
    config = kubernetes.client.Configuration()
    config.host = server.url
    if server.tls is not None:
        config.ssl_ca_cert = str(server.tls[0])  # the self-signed certificate is its own CA
    return config


def kube_api_client(server: ApiServer) -> kubernetes.client.ApiClient:
    """An ApiClient for `server`; close it (or use it as a context manager) when done."""
    return kubernetes.client.ApiClient(kube_client_config(server))


def main(argv: list[str] | None = None) -> int:
    """Serve until interrupted: `python -m tests.support.apiserver --port 6443 --kubeconfig kc.json`."""
    import argparse
    import signal

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--crd-dir", type=Path, default=DEFAULT_CRD_DIR)
    parser.add_argument("--kubeconfig", type=Path, help="write a kubeconfig for the server here")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO)
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    with ApiServer(args.crd_dir, port=args.port) as server:
        if args.kubeconfig:
            write_kubeconfig(server, args.kubeconfig)
        log.info("test API server listening on %s", server.url)
        stop.wait()
        log.info("stopping")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
