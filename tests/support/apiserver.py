"""A small, real Kubernetes API server for tests and the local demo.

It speaks the real REST paths and JSON of the API server so the real `kubernetes` client, kubectl and any other
HTTP client can talk to it; no API server binary can be installed here (docs/design.md §7). Like kube-apiserver it
serves HTTPS only, and every request goes through one pipeline: **authenticate → authorize → admit → handle**.

- **Authentication** (tests/support/authn.py): a client certificate the cluster CA signed (CN the user, O the
  groups; tests/support/pki.py), a service-account token the server issued (TokenRequest), or a static token the test
  registered (``add_token``, as ``--token-auth-file``). A request with none of them, or with a token that is not
  good (expired, wrong audience, its service account or bound pod deleted), is 401 with a Status body.
- **Authorization** (tests/support/authz.py): ``system:masters``, then the Node authorizer for
  ``system:node:<name>``, then RBAC over the Roles, ClusterRoles, RoleBindings and ClusterRoleBindings stored here
  (the real server's bootstrap roles are there from the start: cluster-admin bound to ``system:masters``,
  system:discovery, system:basic-user and system:public-info-viewer bound to the authenticated). A refusal is 403
  with Kubernetes' Forbidden Status: ``nodemetrics.slo.koordinator.sh "n1" is forbidden: User "…" cannot update
  resource "nodemetrics/status" in API group "slo.koordinator.sh" at the cluster scope``, details {name, group,
  kind}.
- **Admission**: NodeRestriction (a node writes only its own Node and the pods bound to it), then the CRDs' schemas.
- **The identities a test uses**: :attr:`ApiServer.admin` (a client certificate in ``system:masters``, kubeadm's
  admin.conf; what :func:`kube_api_client` uses unless told otherwise), :meth:`ApiServer.client_credentials` (any
  user and groups, e.g. :meth:`ApiServer.node_credentials`), :meth:`ApiServer.service_account_token` (a bound,
  expiring token from the TokenRequest API, asked as the admin) and :meth:`ApiServer.add_token`.

Served (everything in memory, one lock, thread-safe):
- core/v1 nodes, pods, events, namespaces (implicit: any namespace exists, and is listed once
  used), serviceaccounts (with the ``token`` subresource: TokenRequest), configmaps, services,
  policy/v1 poddisruptionbudgets, events.k8s.io/v1 events, apps/v1 daemonsets, rbac.authorization.k8s.io/v1 roles,
  rolebindings, clusterroles and clusterrolebindings, flowcontrol.apiserver.k8s.io/v1 flowschemas and
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
- TokenReview (the server's own authenticators, with the review's audiences), SubjectAccessReview (the same
  authorizers a request meets), TokenRequest (``expirationSeconds`` at least ``min_token_expiration_s``, 10 minutes
  as the real server; ``boundObjectRef`` to a Pod or Node; the expiry and the binding enforced on every use).

Deviations left, and why:
- One cluster CA per test process (tests/support/pki.py): making certificates is the slow part of a start, and no
  test needs two servers that distrust each other.
- A client certificate the CA did not sign fails the TLS handshake instead of getting a 401: Python's ssl module
  has no mode that asks for a client certificate without verifying it.
- Service-account tokens are HMAC-signed (HS256) by a key only the server holds, not RS256 with a published key:
  nothing outside the server verifies them here. ``min_token_expiration_s`` may be set below the real 10 minutes so
  that a test can watch a token expire.
- No privilege-escalation check on RBAC writes (only the admin writes RBAC here); the Node authorizer's graph knows
  only what this server stores (pods, configmaps, service accounts: no secrets, PVCs or volume attachments).
- ``seed``, ``get_object`` and ``list_objects`` read and write the store directly: they stand for what controllers
  and the test's own eyes do, never for a client's request.
- No impersonation headers, no API Priority and Fairness (``fail_next`` injects its answers), no audit log.
- Deletes are immediate (no kubelet, no grace period) unless finalizers remain; PodDisruptionBudget status is
  computed by the server at eviction time (it plays the disruption controller; pods it evicted stay "expected", as
  if a controller would recreate them); a Running pod without a Ready condition counts as healthy; `limit`/
  `continue` are ignored (lists are complete); server-side apply is not supported (415).

Use:
    with ApiServer() as server:
        api = kubernetes.client.CoreV1Api(kube_api_client(server))  # the admin
        token = server.service_account_token("koordinator-system", "koordlet-py")
        server.fail_next("PATCH", r"/nodemetrics/node-1/status$", status=409, count=2)
        ...
        assert server.requests("PATCH", r"/status$")
"""
from __future__ import annotations

import base64
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
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Self
from urllib.parse import parse_qs, urlsplit

import kubernetes.client

from tests.support import authz
from tests.support.authn import (
    API_AUDIENCES,
    AuthenticationError,
    BoundObject,
    ServiceAccountTokens,
    UserInfo,
    bearer_token,
    user_of_certificate,
    with_authenticated,
)
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
from tests.support.pki import KeyPair, cluster_ca, serving_sans, subject_fields

log = logging.getLogger(__name__)

JSON = Any
DEFAULT_CRD_DIR = Path(__file__).resolve().parents[2] / "deploy" / "chart" / "koordlet-py" / "files" / "crds"
WATCH_LOG_SIZE = 4096
WATCH_POLL_SECONDS = 0.5
MAX_WATCH_SECONDS = 1800
IDLE_CONNECTION_SECONDS = 60
MIN_TOKEN_EXPIRATION_S = 600  # the real TokenRequest validation: "may not specify a duration less than 10 minutes"
MAX_TOKEN_EXPIRATION_S = 1 << 32
MAX_REQUEST_BYTES = 3 << 20  # kube-apiserver's --max-request-bytes for a write (3 MiB)
DEFAULT_TOKEN_EXPIRATION_S = 3600
ADMIN_USER, ADMIN_GROUPS = "kubernetes-admin", ("system:masters",)
TOKEN_REVIEWS = "/apis/authentication.k8s.io/v1/tokenreviews"
ACCESS_REVIEWS = "/apis/authorization.k8s.io/v1/subjectaccessreviews"

_REASONS = {400: "BadRequest", 401: "Unauthorized", 403: "Forbidden", 404: "NotFound", 405: "MethodNotAllowed",
            409: "Conflict", 410: "Expired", 415: "UnsupportedMediaType", 422: "Invalid", 429: "TooManyRequests",
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
    ResourceType("rbac.authorization.k8s.io", "v1", "roles", "Role", True, False, "role"),
    ResourceType("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding", True, False, "rolebinding"),
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
    user: str = ""  # who the server authenticated ("" when it did not)


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


@dataclass(frozen=True, slots=True)
class Credentials:
    """How a client proves who it is to the server: a client certificate, or a bearer token."""

    user: str
    cert: KeyPair | None = None
    token: str | None = None


def _bootstrap_rbac() -> list[dict]:
    """The real server's default roles that matter to a client (plugin/pkg/auth/authorizer/rbac/bootstrappolicy), and
    their bindings."""
    def role(name: str, rules: list[dict]) -> dict:
        return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                "metadata": {"name": name, "labels": {"kubernetes.io/bootstrapping": "rbac-defaults"}},
                "rules": rules}

    def binding(name: str, groups: tuple[str, ...]) -> dict:
        return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                "metadata": {"name": name, "labels": {"kubernetes.io/bootstrapping": "rbac-defaults"}},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
                "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": g} for g in groups]}

    public = ["/livez", "/readyz", "/healthz", "/version", "/version/"]
    return [
        role("cluster-admin", [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]},
                               {"nonResourceURLs": ["*"], "verbs": ["*"]}]),
        binding("cluster-admin", ("system:masters",)),
        role("system:discovery", [{"nonResourceURLs": [*public, "/openapi", "/openapi/*", "/api", "/api/*", "/apis",
                                                       "/apis/*"], "verbs": ["get"]}]),
        binding("system:discovery", ("system:authenticated",)),
        role("system:basic-user", [{"apiGroups": ["authorization.k8s.io"], "verbs": ["create"],
                                    "resources": ["selfsubjectaccessreviews", "selfsubjectrulesreviews"]}]),
        binding("system:basic-user", ("system:authenticated",)),
        role("system:public-info-viewer", [{"nonResourceURLs": public, "verbs": ["get"]}]),
        binding("system:public-info-viewer", ("system:authenticated", "system:unauthenticated")),
        role("system:kubelet-api-admin", [
            {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch", "proxy"]},
            {"apiGroups": [""], "resources": ["nodes/log", "nodes/metrics", "nodes/proxy", "nodes/stats"],
             "verbs": ["*"]}]),
    ]


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


def _subresources(rtype: ResourceType) -> list[dict]:
    """The discovery entries of ``rtype``'s subresources."""
    entries = []
    if rtype.status_subresource:
        entries.append({"name": f"{rtype.plural}/status", "singularName": "", "namespaced": rtype.namespaced,
                        "kind": rtype.kind, "verbs": ["get", "patch", "update"]})
    if rtype.plural == "pods":
        entries.append({"name": "pods/eviction", "singularName": "", "namespaced": True, "group": "policy",
                        "version": "v1", "kind": "Eviction", "verbs": ["create"]})
    if rtype.plural == "serviceaccounts" and not rtype.group:
        entries.append({"name": "serviceaccounts/token", "singularName": "", "namespaced": True,
                        "group": "authentication.k8s.io", "version": "v1", "kind": "TokenRequest",
                        "verbs": ["create"]})
    return entries


class ApiServer:
    """The in-memory API server, its HTTP front end on 127.0.0.1 and its serving thread."""

    def __init__(self, crd_dir: Path | None = DEFAULT_CRD_DIR, host: str = "127.0.0.1", port: int = 0,
                 watch_log_size: int = WATCH_LOG_SIZE, *, clock: Callable[[], float] = time.time,
                 min_token_expiration_s: int = MIN_TOKEN_EXPIRATION_S) -> None:
        """``clock``: Unix seconds, what token expiry is measured by; ``min_token_expiration_s``: the shortest
        ``expirationSeconds`` a TokenRequest may ask for (the real server's 10 minutes unless a test lowers it)."""
        self._pki = cluster_ca()
        self.ca_file = self._pki.ca.cert  # what clients verify the server by (a pod's ca.crt)
        self._clock = clock
        self._min_token_expiration_s = min_token_expiration_s
        self._types = list(BUILTIN_RESOURCES) + resource_types_from_crds(crd_dir)
        self._cond = threading.Condition(threading.RLock())
        self._objects: dict[tuple[str, str, str], dict] = {}  # (qualified plural, namespace, name)
        self._resource_version = 0
        self._events: deque[_WatchEvent] = deque(maxlen=watch_log_size)  # for watches that resume
        self._failures: list[InjectedFailure] = []
        self._static_tokens: dict[str, UserInfo] = {}  # --token-auth-file (add_token)
        self._account_tokens = ServiceAccountTokens(clock)
        self._rbac: authz.RbacObjects | None = None  # the RBAC objects, read again after an RBAC write
        self._requests: list[RecordedRequest] = []
        self._stopping = threading.Event()
        self._connections: set[socket.socket] = set()
        self._httpd = _HttpServer((host, port), _Handler, self)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        serving = self._pki.serving("kube-apiserver", serving_sans(host))
        context.load_cert_chain(serving.cert, serving.key)
        context.verify_mode = ssl.CERT_OPTIONAL  # a client certificate, when one is sent, must be the CA's
        context.load_verify_locations(self._pki.ca.cert)
        # The handshake is each connection's own (in its handler thread), so one slow client never holds up accept.
        self._httpd.socket = context.wrap_socket(self._httpd.socket, server_side=True, do_handshake_on_connect=False)
        self._thread: threading.Thread | None = None
        for namespace in ("default", "kube-system"):
            self._ensure_namespace(namespace)
        for obj in _bootstrap_rbac():
            self.seed(obj)

    # ------------------------------------------------------------ lifecycle

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"https://{host}:{port}"

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
                  uid: str = "") -> Credentials:
        """A static token (``--token-auth-file``): ``token`` authenticates as ``username`` in ``groups`` (and
        ``system:authenticated``), in requests and TokenReviews alike."""
        with self._cond:
            self._static_tokens[token] = with_authenticated(UserInfo(username, uid or str(uuid.uuid4()),
                                                                     tuple(groups)))
        return Credentials(username, token=token)

    @property
    def admin(self) -> Credentials:
        """The cluster admin: a client certificate in ``system:masters`` (kubeadm's admin.conf)."""
        return self.client_credentials(ADMIN_USER, ADMIN_GROUPS)

    def client_credentials(self, user: str, groups: tuple[str, ...] = ()) -> Credentials:
        """A client certificate of ``user`` in ``groups``, signed by the cluster CA."""
        return Credentials(user, cert=self._pki.client(user, groups))

    def node_credentials(self, node: str) -> Credentials:
        """Kubelet's own identity on ``node`` (its kubelet.conf): ``system:node:<node>`` in ``system:nodes``."""
        return self.client_credentials(f"{authz.NODE_USER_PREFIX}{node}", (authz.NODES_GROUP,))

    def service_account_token(self, namespace: str, name: str, expiration_seconds: int = DEFAULT_TOKEN_EXPIRATION_S,
                              audiences: tuple[str, ...] = (), bound_pod: tuple[str, str] | None = None) -> str:
        """A token of the service account ``namespace/name`` from the TokenRequest API, asked as the admin (as
        kubelet asks for a pod's projected token); ``bound_pod`` (name, uid) binds it to that pod."""
        spec: dict[str, Any] = {"expirationSeconds": expiration_seconds, "audiences": list(audiences)}
        if bound_pod is not None:
            spec["boundObjectRef"] = {"kind": "Pod", "apiVersion": "v1", "name": bound_pod[0], "uid": bound_pod[1]}
        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec}
        with kube_api_client(self) as client:
            request = client.param_serialize("POST", f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token",
                                             header_params={"Content-Type": "application/json"}, body=body)
            response = client.call_api(*request)
            answer = json.loads(response.read() or b"{}")
        if response.status != 201:
            raise ApiStatusError(response.status, str(answer.get("message") or answer))
        return str(answer["status"]["token"])

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
               headers: dict[str, str] | None = None, peer_cert: dict | None = None) -> _Response | Iterator[bytes]:
        """Answer one request: a response, or for a watch an iterator of JSON lines. ``peer_cert``: the client
        certificate TLS verified (``getpeercert()``), if the client sent one."""
        headers = {name.title(): value for name, value in (headers or {}).items()}  # canonical, as Go's http.Header
        parts = urlsplit(raw_path)
        path = parts.path.rstrip("/") or "/"
        query = {key: values[-1] for key, values in parse_qs(parts.query, keep_blank_values=True).items()}
        body: JSON = None
        sent: JSON = None  # the body as the client sent it (handling may fill in the parsed one)
        user: UserInfo | None = None
        try:
            user = self._authenticate(headers.get("Authorization", ""), peer_cert)
            if raw_body:
                try:
                    body = json.loads(raw_body)
                except ValueError as exc:
                    raise ApiStatusError(400, f"request body is not JSON: {exc}") from exc
                sent = copy.deepcopy(body)
            self._raise_injected_failure(verb, path)  # where API Priority and Fairness answers: after authn
            attributes = authz.request_attributes(user, verb, path, query)
            self._authorize(attributes)
            self._admit_node(attributes, body)
            result: _Response | Iterator[bytes] = self._route_request(verb, path, query, content_type, body)
        except ApiStatusError as error:
            result = _Response(error.code, error.status(), error.headers)
        except Exception as exc:  # a bug here must answer 500, not hang or drop the client
            log.exception("test API server failed on %s %s", verb, path)
            result = _Response(500, ApiStatusError(500, f"internal error: {exc!r}").status())
        code = result.code if isinstance(result, _Response) else 200
        with self._cond:
            self._requests.append(RecordedRequest(verb, path, query, content_type, sent, code, headers,
                                                  user.name if user is not None else ""))
        return result

    # ------------------------------------------------------------ authentication, authorization, admission

    def _authenticate(self, authorization: str, peer_cert: dict | None) -> UserInfo:
        """The request's user, as the real union authenticator finds it; 401 without one."""
        if peer_cert:
            return user_of_certificate(*subject_fields(peer_cert))
        token = bearer_token(authorization)
        if token is not None:
            try:
                found = self._token_user(token, API_AUDIENCES)
            except AuthenticationError as err:
                log.debug("Unable to authenticate the request: %s", err)
                found = None
            if found is not None:
                return found[0]
        raise ApiStatusError(401, "Unauthorized")

    def _token_user(self, token: str, audiences: tuple[str, ...]) -> tuple[UserInfo, tuple[str, ...]] | None:
        """(user, accepted audiences) of a bearer token; None for an unknown one; AuthenticationError for one of
        ours that is no longer good."""
        with self._cond:
            static = self._static_tokens.get(token)
        if static is not None:
            return static, audiences
        return self._account_tokens.authenticate(token, audiences, self._account_uid, self._object_uid)

    def _account_uid(self, namespace: str, name: str) -> str | None:
        return self._stored_uid("serviceaccounts", namespace, name)

    def _object_uid(self, kind: str, namespace: str, name: str) -> str | None:
        return self._stored_uid("pods" if kind == "Pod" else "nodes", namespace, name)

    def _stored_uid(self, qualified: str, namespace: str, name: str) -> str | None:
        """The uid of a stored core object (no copy: every request with a token asks)."""
        with self._cond:
            stored = self._objects.get((qualified, namespace, name))
            return _meta(stored).get("uid") if stored is not None else None

    def _decide(self, attributes: authz.Attributes) -> authz.Decision:
        with self._cond:
            if self._rbac is None:
                self._rbac = authz.RbacObjects.of(
                    (qualified.split(".", 1)[0], obj) for (qualified, _, _), obj in self._objects.items()
                    if qualified.endswith("." + authz.RBAC_GROUP))
            rbac = self._rbac
        return authz.authorize(rbac, authz.NodeGraph(self._pods_on), attributes)

    def _pods_on(self, node: str) -> list[dict]:
        with self._cond:
            return [obj for (qualified, _, _), obj in self._objects.items()
                    if qualified == "pods" and (obj.get("spec") or {}).get("nodeName") == node]

    def _authorize(self, attributes: authz.Attributes) -> None:
        decision = self._decide(attributes)
        if not decision.allowed:
            message, details = authz.forbidden_status(attributes, decision.reason)
            raise ApiStatusError(403, message, reason="Forbidden", details=details)

    def _admit_node(self, attributes: authz.Attributes, body: JSON) -> None:
        """NodeRestriction: a node writes only its own Node and the pods bound to it."""
        def existing() -> dict | None:
            return self.get_object("pods", attributes.name, attributes.namespace or None)

        refusal = authz.node_admission(attributes, existing, body)
        if refusal is not None:
            message, details = authz.forbidden_error(attributes, refusal)
            raise ApiStatusError(403, message, reason="Forbidden", details=details)

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
        if path in (TOKEN_REVIEWS, ACCESS_REVIEWS):
            return self._review(verb, path, body)
        route = self._parse_route(path)
        if route.subresource in ("eviction", "token") and verb != "POST":
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
        if not isinstance(body, dict) or not isinstance(body.get("spec"), dict):
            raise ApiStatusError(400, f"a {'TokenReview' if path == TOKEN_REVIEWS else 'SubjectAccessReview'} needs "
                                      "a spec object")
        spec = body["spec"]
        review = {"apiVersion": body.get("apiVersion"), "kind": body.get("kind"),
                  "metadata": {"creationTimestamp": None}, "spec": copy.deepcopy(spec)}
        if path == TOKEN_REVIEWS:
            return _Response(201, {**review, "status": self._token_review_status(spec)})
        return _Response(201, {**review, "status": self._access_review_status(spec)})

    def _token_review_status(self, spec: dict) -> dict:
        """What the server's authenticators say of ``spec.token`` for ``spec.audiences`` (its own when none)."""
        token = spec.get("token")
        if not isinstance(token, str) or not token:
            raise ApiStatusError(422, 'TokenReview.authentication.k8s.io "" is invalid: spec.token: Required value')
        wanted = tuple(spec.get("audiences") or ()) or API_AUDIENCES
        try:
            found = self._token_user(token, wanted)
        except AuthenticationError as err:
            return {"user": {}, "error": f"[{err}]"}
        if found is None:
            return {"user": {}, "error": "[invalid bearer token, token lookup failed]"}
        user, accepted = found
        return {"authenticated": True, "user": user.as_review(), "audiences": list(accepted)}

    def _access_review_status(self, spec: dict) -> dict:
        """The decision of the same authorizers a request meets, for the user and attributes of ``spec``."""
        groups = tuple(str(g) for g in spec.get("groups") or ())
        name = str(spec.get("user") or "")
        resource, non_resource = spec.get("resourceAttributes"), spec.get("nonResourceAttributes")
        if not name and not groups:
            raise ApiStatusError(422, "SubjectAccessReview.authorization.k8s.io is invalid: spec.user: Invalid value: "
                                      '"": at least one of user or group must be specified')
        if (resource is None) == (non_resource is None):
            raise ApiStatusError(422, "SubjectAccessReview.authorization.k8s.io is invalid: spec.resourceAttributes: "
                                      "Invalid value: exactly one of nonResourceAttributes or resourceAttributes "
                                      "must be specified")
        extra = {str(k): tuple(v) for k, v in (spec.get("extra") or {}).items()}
        user = UserInfo(name, str(spec.get("uid") or ""), groups, extra)
        if resource is not None:
            attributes = authz.Attributes(
                user, str(resource.get("verb", "")), True, "", str(resource.get("group", "")),
                str(resource.get("version", "")), str(resource.get("resource", "")),
                str(resource.get("subresource", "")), str(resource.get("namespace", "")),
                str(resource.get("name", "")), str((resource.get("fieldSelector") or {}).get("rawSelector", "")))
        else:
            attributes = authz.Attributes(user, str(non_resource.get("verb", "")), False,
                                          str(non_resource.get("path", "")))
        decision = self._decide(attributes)
        status: dict[str, Any] = {"allowed": decision.allowed}
        if decision.reason:
            status["reason"] = decision.reason
        return status

    def _token_request(self, route: _Route, body: JSON) -> dict:
        """TokenRequest: a token of the service account ``route.name``, bound and expiring as asked."""
        with self._cond:
            account = self._existing(_Route(route.rtype, route.namespace, route.name, None))
        spec = (body or {}).get("spec") if isinstance(body, dict) else None
        if not isinstance(spec, dict):
            raise ApiStatusError(400, "the body of a token request must be an authentication.k8s.io TokenRequest")
        expiration = spec.get("expirationSeconds") or DEFAULT_TOKEN_EXPIRATION_S
        invalid = f'TokenRequest.authentication.k8s.io "{route.name}" is invalid: spec.expirationSeconds: Invalid ' \
                  f"value: {expiration}: "
        if not isinstance(expiration, int) or expiration < self._min_token_expiration_s:
            raise ApiStatusError(422, invalid + f"may not specify a duration less than "
                                                f"{self._min_token_expiration_s // 60} minutes")
        if expiration > MAX_TOKEN_EXPIRATION_S:
            raise ApiStatusError(422, invalid + "may not specify a duration larger than 2^32 seconds")
        bound = self._bound_object(route.namespace or "", spec.get("boundObjectRef"))
        audiences = tuple(spec.get("audiences") or ()) or API_AUDIENCES
        issued = self._account_tokens.issue(route.namespace or "", route.name or "", _meta(account)["uid"],
                                            audiences, expiration, bound)
        expires = datetime.fromtimestamp(issued.expires_at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        out_spec = {**spec, "audiences": list(audiences), "expirationSeconds": expiration}
        return {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                "metadata": {"name": route.name, "namespace": route.namespace, "creationTimestamp": _now()},
                "spec": out_spec, "status": {"token": issued.token, "expirationTimestamp": expires}}

    def _bound_object(self, namespace: str, ref: Any) -> BoundObject | None:
        if not ref:
            return None
        kind, name = (ref.get("kind"), ref.get("name")) if isinstance(ref, dict) else (None, None)
        if kind not in ("Pod", "Node"):
            raise ApiStatusError(422, f'spec.boundObjectRef.kind: Unsupported value: "{kind}": supported values: '
                                      '"Pod", "Node"')
        if not name:
            raise ApiStatusError(422, "spec.boundObjectRef.name: Required value")
        obj = self.get_object("pods" if kind == "Pod" else "nodes", name, namespace if kind == "Pod" else None)
        if obj is None:
            raise ApiStatusError(404, f'{"pods" if kind == "Pod" else "nodes"} "{name}" not found',
                                 reason="NotFound")
        uid = _meta(obj).get("uid", "")
        if ref.get("uid") and ref["uid"] != uid:
            raise ApiStatusError(409, f"the UID in the bound object reference ({ref['uid']}) does not match the "
                                      f"UID in record. The object might have been deleted and then recreated",
                                 reason="Conflict")
        return BoundObject(kind, name, uid)

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
            if route.rtype.plural == "serviceaccounts" and route.subresource == "token":
                return _Response(201, self._token_request(route, body))
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
            {"eviction"} if rtype and rtype.plural == "pods" else set()) | (
            {"token"} if rtype and rtype.plural == "serviceaccounts" and not rtype.group else set())
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
                resources.extend(_subresources(rtype))
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
        if rtype.group == authz.RBAC_GROUP:
            self._rbac = None  # read the RBAC objects again at the next decision
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

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that fails the TLS handshake (a certificate the CA did not sign, plain HTTP) or goes away is
        that client's problem, logged, not a traceback on the test's stderr."""
        log.debug("connection from %s ended", client_address, exc_info=True)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Headers and body go out in separate writes; with Nagle on, every request after the first on a
    # kept-alive connection waited ~40 ms for the client's delayed ACK.
    disable_nagle_algorithm = True
    timeout = IDLE_CONNECTION_SECONDS
    server: _HttpServer

    def setup(self) -> None:
        self.request.settimeout(IDLE_CONNECTION_SECONDS)
        self.request.do_handshake()  # here, in the connection's thread (see ApiServer.__init__)
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

    def _read_chunked(self) -> bytes | tuple[int, str]:
        """A request body in HTTP/1.1 chunks (RFC 9112, section 7.1), or the error to answer: 413 past
        MAX_REQUEST_BYTES, the real server's limit, 400 for a chunk size that is no hex number. Chunk extensions and
        trailers are read past."""
        body = bytearray()
        while True:
            line = self.rfile.readline(1024)
            try:
                size = int(line.split(b";", 1)[0].strip() or b"0", 16)
            except ValueError:
                self.close_connection = True  # where the next request would start is unknown
                return 400, f"bad chunk size {line[:40]!r}"
            if size == 0:
                while self.rfile.readline(8192) not in (b"\r\n", b"\n", b""):
                    pass
                return bytes(body)
            if len(body) + size > MAX_REQUEST_BYTES:
                self.close_connection = True  # the rest of the body is not read
                return 413, f"Request entity too large: limit is {MAX_REQUEST_BYTES}"
            body += self.rfile.read(size)
            self.rfile.readline(8)  # the CRLF after the chunk

    def _serve(self) -> None:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            raw_body = self._read_chunked()  # `kubectl create --raw -f FILE` sends its body so, as Go's client may
            if isinstance(raw_body, tuple):
                self.send_error(*raw_body)
                return
        else:
            length = int(self.headers.get("Content-Length") or 0)
            raw_body = self.rfile.read(length) if length else b""
        result = self.server.api.handle(self.command, self.path, self.headers.get("Content-Type", ""), raw_body,
                                        dict(self.headers.items()), self.connection.getpeercert() or None)
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


def _pem_data(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


def kubeconfig(server: ApiServer, credentials: Credentials | None = None, context: str = "koordlet-py-test") -> dict:
    """A kubeconfig document for `server` as ``credentials`` (the admin unless given), with the CA and the
    certificate or token inline (write it as YAML or JSON for a subprocess's KUBECONFIG)."""
    credentials = credentials or server.admin
    user: dict[str, str] = {}
    if credentials.cert is not None:
        user = {"client-certificate-data": _pem_data(credentials.cert.cert),
                "client-key-data": _pem_data(credentials.cert.key)}
    if credentials.token is not None:
        user["token"] = credentials.token
    return {"apiVersion": "v1", "kind": "Config", "current-context": context,
            "clusters": [{"name": context, "cluster": {"server": server.url,
                                                       "certificate-authority-data": _pem_data(server.ca_file)}}],
            "users": [{"name": credentials.user, "user": user}],
            "contexts": [{"name": context, "context": {"cluster": context, "user": credentials.user}}]}


def write_kubeconfig(server: ApiServer, path: Path, credentials: Credentials | None = None) -> Path:
    """Write kubeconfig(server, credentials) to `path` (JSON, which every YAML reader accepts); returns `path`."""
    path.write_text(json.dumps(kubeconfig(server, credentials), indent=2), encoding="utf-8")
    path.chmod(0o600)
    return path


def kube_client_config(server: ApiServer, credentials: Credentials | None = None) -> kubernetes.client.Configuration:
    """A kubernetes client Configuration that talks to `server` as ``credentials`` (the admin unless given)."""
    credentials = credentials or server.admin
    config = kubernetes.client.Configuration()
    config.host = server.url
    config.ssl_ca_cert = str(server.ca_file)
    if credentials.cert is not None:
        config.cert_file, config.key_file = str(credentials.cert.cert), str(credentials.cert.key)
    if credentials.token is not None:
        config.api_key = {"authorization": f"Bearer {credentials.token}"}
    return config


def ssl_context(server: ApiServer, credentials: Credentials | None = None) -> ssl.SSLContext:
    """A client TLS context for plain HTTP clients (urllib, http.client): the cluster CA, and the client
    certificate of ``credentials`` (the admin unless given; a token is the caller's to send)."""
    credentials = credentials or server.admin
    context = ssl.create_default_context(cafile=str(server.ca_file))
    if credentials.cert is not None:
        context.load_cert_chain(credentials.cert.cert, credentials.cert.key)
    return context


def kube_api_client(server: ApiServer, credentials: Credentials | None = None) -> kubernetes.client.ApiClient:
    """An ApiClient for `server` as ``credentials`` (the admin unless given); close it (or use it as a context
    manager) when done."""
    return kubernetes.client.ApiClient(kube_client_config(server, credentials))


def create_objects(server: ApiServer, docs: list[dict], credentials: Credentials | None = None) -> list[dict]:
    """POST each of ``docs`` to its collection as ``credentials`` (the admin unless given), as ``kubectl create -f``
    does; the created objects, or ApiStatusError for the first refusal."""
    created = []
    with kube_api_client(server, credentials) as client:
        for doc in docs:
            rtype = server._type_for_object(doc)
            namespace = _meta(doc).get("namespace") or ("default" if rtype.namespaced else None)
            base = f"/apis/{rtype.api_version}" if rtype.group else "/api/v1"
            path = f"{base}/namespaces/{namespace}/{rtype.plural}" if namespace else f"{base}/{rtype.plural}"
            request = client.param_serialize("POST", path, header_params={"Content-Type": "application/json"},
                                             body=doc, auth_settings=["BearerToken"])  # a token, when one is given
            response = client.call_api(*request)
            answer = json.loads(response.read() or b"{}")
            if response.status != 201:
                raise ApiStatusError(response.status, str(answer.get("message") or answer),
                                     reason=answer.get("reason"))
            created.append(answer)
    return created


def main(argv: list[str] | None = None) -> int:
    """Serve until interrupted: `python -m tests.support.apiserver --port 6443 --kubeconfig kc.json`."""
    import argparse
    import signal

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--crd-dir", type=Path, default=DEFAULT_CRD_DIR)
    parser.add_argument("--kubeconfig", type=Path, help="write a kubeconfig for the server's admin here")
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
