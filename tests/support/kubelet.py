"""kubelet's HTTPS API (port 10250) for tests: ``/pods`` from a payload the test sets, behind kubelet's own
authentication and authorization against the project's API server (tests/support/apiserver.py).

As a kubelet with ``authentication.webhook.enabled``, ``authentication.anonymous.enabled: false`` and
``authorization.mode: Webhook`` (kubeadm's configuration) decides, every request is:

1. **authenticated**: a client certificate signed by the cluster CA (CN the user, O the groups), or a bearer token
   the API server's TokenReview accepts; anything else is ``401 Unauthorized``;
2. **authorized** by SubjectAccessReviews to the API server, for the attributes kubelet's
   ``nodeAuthorizerAttributesGetter`` gives the path (pkg/kubelet/server/auth.go): verb from the method (GET get, POST
   create, PUT update, PATCH patch, DELETE delete), resource ``nodes``, the node's name, and the subresource
   ``stats`` (/stats/...), ``metrics`` (/metrics/...), ``log`` (/logs/...), ``checkpoint`` (/checkpoint/...) or
   ``proxy`` (everything else); with ``fine_grained_authz`` (KubeletFineGrainedAuthz: beta and on from 1.33, GA in
   1.36) ``/pods`` and ``/runningpods/`` ask ``pods`` first, ``/healthz`` ``healthz`` and ``/configz`` ``configz``,
   each falling back to ``proxy``. None allowed: ``403 Forbidden (user=…, verb=…, resource=nodes,
   subresource(s)=[pods proxy])``. A review the API server does not answer: ``500 Authorization error (…)``.

Kubelet reviews with its own identity, ``system:node:<name>`` (a client certificate), which the API server's Node
authorizer lets create TokenReviews and SubjectAccessReviews. Only then is the path served: ``/pods`` and
``/runningpods/`` (GET only, else 405), ``/healthz``; anything else is 404.

Deviations: no cache of review answers (the real one keeps allowed answers 5 minutes and denials 30 s, tokens 2
minutes): a test sees a changed role at once; the serving certificate is signed by the cluster CA (kubeadm's
kubelet makes a self-signed one unless serverTLSBootstrap is on; koordlet verifies neither unless given a CA).
"""

from __future__ import annotations

import json
import logging
import ssl
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self
from urllib.parse import urlsplit

import kubernetes.client

from tests.support.apiserver import ACCESS_REVIEWS, TOKEN_REVIEWS, ApiServer, create_objects, kube_api_client
from tests.support.authn import UserInfo, bearer_token, user_of_certificate
from tests.support.pki import cluster_ca, serving_sans, subject_fields

log = logging.getLogger(__name__)

LS_UID = "5f3a1c2e-0d4b-4c6a-9e8f-1a2b3c4d5e6f"
BE_UID = "0b7c9d1e-2f3a-4b5c-8d6e-7f8091a2b3c4"
_METHOD_VERBS = {"POST": "create", "GET": "get", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}
_FINE_GRAINED = (("/pods", "pods"), ("/healthz", "healthz"), ("/configz", "configz"), ("/statusz", "statusz"),
                 ("/runningpods/", "pods"))
_COARSE = (("/stats/", "stats"), ("/metrics", "metrics"), ("/logs/", "log"), ("/checkpoint/", "checkpoint"))


def kubelet_pod_list() -> dict:
    """Two pods as kubelet's /pods serves them (trimmed of fields koordlet does not read)."""
    return {
        "kind": "PodList", "apiVersion": "v1", "metadata": {},
        "items": [
            {
                "metadata": {"name": "web-0", "namespace": "shop", "uid": LS_UID,
                             "labels": {"koordinator.sh/qosClass": "LSR", "app": "web"},
                             "annotations": {"kubernetes.io/config.source": "api"}},
                "spec": {
                    "priority": 9500, "priorityClassName": "koord-prod", "nodeName": "node-1",
                    "initContainers": [{"name": "init", "image": "busybox",
                                        "resources": {"requests": {"cpu": "100m", "memory": "16Mi"},
                                                      "limits": {"cpu": "100m", "memory": "16Mi"}}}],
                    "containers": [{"name": "web", "image": "nginx",
                                    "resources": {"requests": {"cpu": "2", "memory": "1Gi"},
                                                  "limits": {"cpu": "2", "memory": "1Gi"}}}],
                },
                "status": {
                    "phase": "Running", "qosClass": "Guaranteed",
                    "podIP": "10.244.1.7", "podIPs": [{"ip": "10.244.1.7"}, {"ip": "fd00:10:244:1::7"}],
                    "containerStatuses": [{"name": "web", "ready": True, "restartCount": 0,
                                           "containerID": "containerd://" + "a" * 64, "image": "nginx"}],
                    "initContainerStatuses": [{"name": "init", "ready": True, "restartCount": 0,
                                               "containerID": "containerd://" + "b" * 64}],
                },
            },
            {
                "metadata": {"name": "spark-1", "namespace": "batch", "uid": BE_UID,
                             "labels": {"koordinator.sh/qosClass": "BE"}},
                "spec": {
                    "priority": 5500, "nodeName": "node-1",
                    "containers": [{"name": "executor", "image": "spark",
                                    "resources": {"requests": {"kubernetes.io/batch-cpu": "1000",
                                                               "kubernetes.io/batch-memory": "2Gi"},
                                                  "limits": {"kubernetes.io/batch-cpu": "2000",
                                                             "kubernetes.io/batch-memory": "4Gi"}}}],
                },
                "status": {"phase": "Pending", "qosClass": "BestEffort"},
            },
        ],
    }


def _is_subpath(path: str, prefix: str) -> bool:
    """pkg/kubelet/server/auth.go isSubpath."""
    prefix = prefix.rstrip("/")
    return path == prefix or (path.startswith(prefix) and path[len(prefix)] == "/")


def subresources_for(path: str, fine_grained_authz: bool) -> list[str]:
    """The ``nodes`` subresources kubelet asks about for ``path``, in order (pkg/kubelet/server/auth.go)."""
    found = [sub for prefix, sub in _FINE_GRAINED if _is_subpath(path, prefix)][:1] if fine_grained_authz else []
    coarse = next((sub for prefix, sub in _COARSE if _is_subpath(path, prefix)), "proxy")
    return [*found, coarse]


@dataclass(frozen=True, slots=True)
class KubeletRequest:
    method: str
    path: str
    status: int
    user: str  # who kubelet authenticated ("" when it did not)
    authorization: str  # the Authorization header as sent
    client_cert_user: str  # the CN of the client certificate, if one was sent


@dataclass
class Kubelet:
    """kubelet's API for ``node``, authenticating and authorizing through ``api``."""

    api: ApiServer
    node: str
    payload: dict = field(default_factory=kubelet_pod_list)
    fine_grained_authz: bool = True
    status: int = 200  # what /pods answers once a request is through (500: a kubelet failing)
    delay_s: float = 0.0  # how long /pods takes once a request is through
    configz: dict | None = None  # kubelet's KubeletConfiguration, /configz's {"kubeletconfig": ...} (None: 404)
    host: str = "127.0.0.1"  # where it listens (its serving certificate names it too)
    requests: list[KubeletRequest] = field(default_factory=list)
    _server: ThreadingHTTPServer | None = field(default=None, init=False, repr=False)
    _thread: threading.Thread | None = field(default=None, init=False, repr=False)
    _reviewer: kubernetes.client.ApiClient | None = field(default=None, init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    # ------------------------------------------------------------ lifecycle

    def start(self) -> Self:
        pki = cluster_ca()
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        serving = pki.serving("kubelet", serving_sans(self.host))
        context.load_cert_chain(serving.cert, serving.key)
        context.verify_mode = ssl.CERT_OPTIONAL  # authentication.x509.clientCAFile: the cluster CA
        context.load_verify_locations(pki.ca.cert)
        self._reviewer = kube_api_client(self.api, self.api.node_credentials(self.node))
        server = _HttpServer((self.host, 0), _Handler, self)
        server.socket = context.wrap_socket(server.socket, server_side=True, do_handshake_on_connect=False)
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1},
                                        name="test-kubelet", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(5)
            self._thread = None
        if self._reviewer is not None:
            self._reviewer.close()
            self._reviewer = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        assert self._server is not None, "the kubelet is not started"
        return int(self._server.server_address[1])

    @property
    def address(self) -> str:
        """The node's InternalIP as its Node says: where this kubelet listens (loopback when on every address)."""
        return "127.0.0.1" if self.host in ("", "0.0.0.0") else self.host

    @property
    def url(self) -> str:
        return f"https://{self.address}:{self.port}"

    def node_object(self, status: dict | None = None, **metadata: Any) -> dict:
        """The Node of this kubelet as the API server stores it: its address and port, plus ``status``."""
        return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": self.node, **metadata},
                "status": {"addresses": [{"type": "InternalIP", "address": self.address}],
                           "daemonEndpoints": {"kubeletEndpoint": {"Port": self.port}}, **(status or {})}}

    @property
    def authorizations(self) -> list[str]:
        """The Authorization headers of the requests so far, in order."""
        with self._lock:
            return [request.authorization for request in self.requests]

    def refusals(self) -> list[KubeletRequest]:
        with self._lock:
            return [request for request in self.requests if request.status in (401, 403)]

    # ------------------------------------------------------------ the filter (pkg/kubelet/server/server.go)

    def serve(self, method: str, raw_path: str, headers: dict[str, str], peer_cert: dict | None) -> tuple[int, str,
                                                                                                           bytes]:
        """(status, content type, body) for one request."""
        path = urlsplit(raw_path).path
        authorization = headers.get("Authorization", "")
        peer_user = subject_fields(peer_cert)[0] if peer_cert else ""
        user = self._authenticate(authorization, peer_cert)
        if user is None:
            status, content_type, body = 401, "text/plain", b"Unauthorized"
        else:
            status, content_type, body = self._authorized(user, method, path)
        with self._lock:
            self.requests.append(KubeletRequest(method, path, status, user.name if user else "", authorization,
                                                peer_user))
        return status, content_type, body

    def _authenticate(self, authorization: str, peer_cert: dict | None) -> UserInfo | None:
        if peer_cert:
            return user_of_certificate(*subject_fields(peer_cert))
        token = bearer_token(authorization)
        if token is None:
            return None
        answer = self._review(TOKEN_REVIEWS, {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
                                              "spec": {"token": token}})
        status = (answer or {}).get("status") or {}
        if not status.get("authenticated"):
            log.debug("kubelet: token not authenticated: %s", status.get("error"))
            return None
        user = status.get("user") or {}
        return UserInfo(user.get("username", ""), user.get("uid", ""), tuple(user.get("groups") or ()),
                        {key: tuple(values) for key, values in (user.get("extra") or {}).items()})

    def _authorized(self, user: UserInfo, method: str, path: str) -> tuple[int, str, bytes]:
        verb = _METHOD_VERBS.get(method, "")
        subresources = subresources_for(path, self.fine_grained_authz)
        for subresource in subresources:
            spec: dict[str, Any] = {
                "user": user.name, "uid": user.uid, "groups": list(user.groups),
                "resourceAttributes": {"verb": verb, "group": "", "version": "v1", "resource": "nodes",
                                       "subresource": subresource, "name": self.node}}
            if user.extra:
                spec["extra"] = {key: list(values) for key, values in user.extra.items()}
            answer = self._review(ACCESS_REVIEWS, {"apiVersion": "authorization.k8s.io/v1",
                                                   "kind": "SubjectAccessReview", "spec": spec})
            if answer is None:
                return 500, "text/plain", (f"Authorization error (user={user.name}, verb={verb}, resource=nodes, "
                                           f"subresource={subresource})").encode()
            if (answer.get("status") or {}).get("allowed"):
                return self._handle(method, path)
        # Go's %v of a []string: [pods proxy]
        return 403, "text/plain", (f"Forbidden (user={user.name}, verb={verb}, resource=nodes, "
                                   f"subresource(s)=[{' '.join(subresources)}])\n").encode()

    def _review(self, path: str, body: dict) -> dict | None:
        """The API server's answer to a review, as kubelet's webhook client asks it; None when it failed."""
        assert self._reviewer is not None
        try:
            request = self._reviewer.param_serialize("POST", path, header_params={"Content-Type": "application/json"},
                                                     body=body)
            response = self._reviewer.call_api(*request, _request_timeout=10)
            data = response.read()
        except Exception:  # noqa: BLE001 - the API server unreachable: kubelet answers 500 (or 401)
            log.warning("kubelet: review at %s failed", path, exc_info=True)
            return None
        if response.status != 201:
            log.warning("kubelet: review at %s answered %s: %s", path, response.status, data[:200])
            return None
        return json.loads(data)

    def _handle(self, method: str, path: str) -> tuple[int, str, bytes]:
        if path.rstrip("/") in ("/pods", "/runningpods"):
            if method != "GET":
                return 405, "text/plain", b"Method Not Allowed"
            if self.delay_s:
                time.sleep(self.delay_s)
            return self.status, "application/json", json.dumps(self.payload).encode()
        if path == "/healthz":
            return 200, "text/plain", b"ok"
        if path == "/configz" and method == "GET" and self.configz is not None:
            return 200, "application/json", json.dumps({"kubeletconfig": self.configz}).encode()
        return 404, "text/plain", b"404 page not found\n"


class _HttpServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler], kubelet: Kubelet) -> None:
        self.kubelet = kubelet
        super().__init__(address, handler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        log.debug("kubelet: connection from %s ended", client_address, exc_info=True)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _HttpServer

    def setup(self) -> None:
        self.request.settimeout(30)
        self.request.do_handshake()  # in this connection's thread: a slow client never holds up accept
        super().setup()

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        log.debug("kubelet: %s", format % args)

    def _serve(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        status, content_type, body = self.server.kubelet.serve(self.command, self.path, dict(self.headers.items()),
                                                               self.connection.getpeercert() or None)
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _serve


def grant_kubelet_access(api: ApiServer, namespace: str = "default", account: str = "kubelet-reader",
                         subresources: tuple[str, ...] = ("pods",)) -> str:
    """A service account that may ``get nodes/<subresource>`` for ``subresources`` and nothing else, made as the
    admin (a ServiceAccount, a ClusterRole and its binding); returns a token of it."""
    name = f"{namespace}:{account}"
    create_objects(api, [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": account, "namespace": namespace}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": name},
         "rules": [{"apiGroups": [""], "resources": [f"nodes/{sub}" for sub in subresources], "verbs": ["get"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": name},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
         "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": namespace}]}])
    return api.service_account_token(namespace, account)
