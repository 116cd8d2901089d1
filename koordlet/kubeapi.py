"""The Kubernetes API calls koordlet makes, as plain JSON over the ``kubernetes`` package's ``ApiClient``.

The package's generated ``CoreV1Api`` and ``CustomObjectsApi`` are not used: importing ``CoreV1Api`` loads
some 250 model modules (~21 MiB of the agent's memory) to turn answers into model objects koordlet does not
need. :class:`CoreV1` and :class:`CustomObjects` make the same requests through the same ``ApiClient``
(kubeconfig / in-cluster configuration, bearer token, TLS, the user agent) and return the decoded JSON:
dicts with the API's camelCase field names, and any field newer than the client library.

What each request looks like is what the generated method sends: the same path, ``Accept: application/json``,
query parameters in the same order, no ``Content-Type`` on a POST or PUT (the API server takes JSON), and for
a patch with a dict body ``application/strategic-merge-patch+json`` (the generated client names JSON patch,
and its REST layer turns that into a strategic merge patch for anything but a list of operations).
Errors too: a non-2xx answer raises ``ApiException`` (the same subclasses: ``NotFoundException`` for 404,
``ConflictException`` for 409...; ``.status``, ``.reason``, ``.body``); the transport's errors
(``urllib3.exceptions.HTTPError``) pass through. ``_request_timeout`` is the generated client's: a total in
seconds, or a ``(connect, read)`` pair. ``_preload_content=False`` returns the raw urllib3 response (for a
watch, read with ``kubernetes.watch.watch.iter_resp_lines``; release it when done) once its status is 2xx.
Two differences: an empty name, namespace, group... is refused (``ValueError``) before any request is sent,
and an answer is decoded with :func:`koordlet.api.safeload.load_json` (at most :data:`MAX_API_BYTES`; a 2xx
answer that is not JSON raises its ``SafeLoadError``, a ``ValueError``).

:func:`section` reads nested objects of the answers with the None-safety the models had.

The method names and argument order are the generated client's: tests/deploy/rbac_scan.py derives the
RBAC rules from the calls (method name; group and plural of a custom-object call by position).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from kubernetes.client.exceptions import ApiException

from koordlet.access import API_SERVER, from_api_answer, refusals_of
from koordlet.api.safeload import load_json

if TYPE_CHECKING:
    from kubernetes.client import ApiClient

MAX_API_BYTES = 256 << 20  # one answer (or watch event) from the API server

Timeout = float | tuple[float, float] | None
Query = Sequence[tuple[str, Any]]

_ACCEPT = "application/json"
_AUTH = ["BearerToken"]


def section(obj: Any, *keys: str) -> Mapping[str, Any]:
    """``obj[k1][k2]...`` of a decoded object when each step is a JSON object, else an empty mapping: a
    missing or null field reads as empty (``section(pod, "metadata", "annotations").get(key)``)."""
    for key in keys:
        obj = obj.get(key) if isinstance(obj, Mapping) else None
    return obj if isinstance(obj, Mapping) else {}


def _patch_content_type(body: Any) -> str:
    """What the generated client sends: JSON patch for a list of operations, else strategic merge patch."""
    return "application/json-patch+json" if isinstance(body, list) else "application/strategic-merge-patch+json"


class _Client:
    def __init__(self, api_client: ApiClient) -> None:
        self.api_client = api_client

    def _request(
        self,
        method: str,
        path: str,
        path_params: dict[str, str],
        query: Query = (),
        body: Any = None,
        *,
        content_type: str | None = None,
        preload_content: bool = True,
        request_timeout: Timeout = None,
    ) -> Any:
        for key, value in path_params.items():
            if not isinstance(value, str) or not value:
                raise ValueError(f"{method} {path}: {key} must be a non-empty string, not {value!r}")
        headers = {"Accept": _ACCEPT}
        if content_type is not None:
            headers["Content-Type"] = content_type
        request = self.api_client.param_serialize(
            method,
            path,
            path_params=path_params,
            query_params=[(key, value) for key, value in query if value is not None],
            header_params=headers,
            body=body,
            auth_settings=list(_AUTH),
        )
        response = self.api_client.call_api(*request, _request_timeout=request_timeout)
        ok = 200 <= response.status <= 299
        if not preload_content:
            if not ok:
                self._note_access(method, request[1], response.status, response.read())
                raise ApiException.from_response(http_resp=response, body=None, data=None)
            self._note_access(method, request[1], response.status, b"")
            return response.response
        data = response.read()
        self._note_access(method, request[1], response.status, data)
        if not ok:
            raise ApiException.from_response(http_resp=response, body=data.decode("utf-8", "replace"), data=None)
        if not data:
            return None
        return load_json(data, f"answer to {method} {path}", max_bytes=MAX_API_BYTES)

    def _note_access(self, method: str, url: str, status: int, data: bytes | None) -> None:
        """A 401 or 403 goes to the agent's refusals (koordlet.access: logged with the rule that would allow the
        call, counted, shown by the health endpoints); a success ends a refusal of that kind of call."""
        refusals = refusals_of(self.api_client)
        if refusals is None:
            return
        path = urlsplit(url).path
        if 200 <= status <= 299:
            refusals.allowed(API_SERVER, f"{method} {path}")
            return
        refusal = from_api_answer(method, path, status, (data or b"").decode("utf-8", "replace"))
        if refusal is not None:
            refusals.refused(refusal)


class CoreV1(_Client):
    """The core/v1 calls koordlet makes (names and argument order of ``kubernetes.client.CoreV1Api``)."""

    # ------------------------------------------------------------------------------------------ nodes

    def read_node(self, name: str, pretty: str | None = None, *, _preload_content: bool = True,
                  _request_timeout: Timeout = None) -> Any:
        return self._request("GET", "/api/v1/nodes/{name}", {"name": name}, [("pretty", pretty)],
                             preload_content=_preload_content, request_timeout=_request_timeout)

    def patch_node(self, name: str, body: Any, pretty: str | None = None, dry_run: str | None = None,
                   field_manager: str | None = None, field_validation: str | None = None, force: bool | None = None,
                   *, _preload_content: bool = True, _request_timeout: Timeout = None) -> Any:
        query = [("pretty", pretty), ("dryRun", dry_run), ("fieldManager", field_manager),
                 ("fieldValidation", field_validation), ("force", force)]
        return self._request("PATCH", "/api/v1/nodes/{name}", {"name": name}, query, body,
                             content_type=_patch_content_type(body), preload_content=_preload_content,
                             request_timeout=_request_timeout)

    def list_node(self, pretty: str | None = None, allow_watch_bookmarks: bool | None = None,
                  _continue: str | None = None, field_selector: str | None = None, label_selector: str | None = None,
                  limit: int | None = None, resource_version: str | None = None,
                  resource_version_match: str | None = None, send_initial_events: bool | None = None,
                  shard_selector: str | None = None, timeout_seconds: int | None = None, watch: bool | None = None,
                  *, _preload_content: bool = True, _request_timeout: Timeout = None) -> Any:
        query = [("pretty", pretty), ("allowWatchBookmarks", allow_watch_bookmarks), ("continue", _continue),
                 ("fieldSelector", field_selector), ("labelSelector", label_selector), ("limit", limit),
                 ("resourceVersion", resource_version), ("resourceVersionMatch", resource_version_match),
                 ("sendInitialEvents", send_initial_events), ("shardSelector", shard_selector),
                 ("timeoutSeconds", timeout_seconds), ("watch", watch)]
        return self._request("GET", "/api/v1/nodes", {}, query, preload_content=_preload_content,
                             request_timeout=_request_timeout)

    # ------------------------------------------------------------------------------------------- pods

    def read_namespaced_pod(self, name: str, namespace: str, pretty: str | None = None, *,
                            _preload_content: bool = True, _request_timeout: Timeout = None) -> Any:
        return self._request("GET", "/api/v1/namespaces/{namespace}/pods/{name}",
                             {"name": name, "namespace": namespace}, [("pretty", pretty)],
                             preload_content=_preload_content, request_timeout=_request_timeout)

    def patch_namespaced_pod(self, name: str, namespace: str, body: Any, pretty: str | None = None,
                             dry_run: str | None = None, field_manager: str | None = None,
                             field_validation: str | None = None, force: bool | None = None, *,
                             _preload_content: bool = True, _request_timeout: Timeout = None) -> Any:
        query = [("pretty", pretty), ("dryRun", dry_run), ("fieldManager", field_manager),
                 ("fieldValidation", field_validation), ("force", force)]
        return self._request("PATCH", "/api/v1/namespaces/{namespace}/pods/{name}",
                             {"name": name, "namespace": namespace}, query, body,
                             content_type=_patch_content_type(body), preload_content=_preload_content,
                             request_timeout=_request_timeout)

    def list_pod_for_all_namespaces(self, allow_watch_bookmarks: bool | None = None, _continue: str | None = None,
                                    field_selector: str | None = None, label_selector: str | None = None,
                                    limit: int | None = None, pretty: str | None = None,
                                    resource_version: str | None = None, resource_version_match: str | None = None,
                                    send_initial_events: bool | None = None, shard_selector: str | None = None,
                                    timeout_seconds: int | None = None, watch: bool | None = None, *,
                                    _preload_content: bool = True, _request_timeout: Timeout = None) -> Any:
        query = [("allowWatchBookmarks", allow_watch_bookmarks), ("continue", _continue),
                 ("fieldSelector", field_selector), ("labelSelector", label_selector), ("limit", limit),
                 ("pretty", pretty), ("resourceVersion", resource_version),
                 ("resourceVersionMatch", resource_version_match), ("sendInitialEvents", send_initial_events),
                 ("shardSelector", shard_selector), ("timeoutSeconds", timeout_seconds), ("watch", watch)]
        return self._request("GET", "/api/v1/pods", {}, query, preload_content=_preload_content,
                             request_timeout=_request_timeout)

    def create_namespaced_pod_eviction(self, name: str, namespace: str, body: Any, dry_run: str | None = None,
                                       field_manager: str | None = None, field_validation: str | None = None,
                                       pretty: str | None = None, *, _preload_content: bool = True,
                                       _request_timeout: Timeout = None) -> Any:
        query = [("dryRun", dry_run), ("fieldManager", field_manager), ("fieldValidation", field_validation),
                 ("pretty", pretty)]
        return self._request("POST", "/api/v1/namespaces/{namespace}/pods/{name}/eviction",
                             {"name": name, "namespace": namespace}, query, body,
                             preload_content=_preload_content, request_timeout=_request_timeout)

    # ----------------------------------------------------------------------------------------- tokens

    def create_namespaced_service_account_token(self, name: str, namespace: str, body: Any,
                                                dry_run: str | None = None, field_manager: str | None = None,
                                                field_validation: str | None = None, pretty: str | None = None, *,
                                                _preload_content: bool = True, _request_timeout: Timeout = None) -> Any:
        """TokenRequest: the next token of koordlet's own service account on bare metal (koordlet/credentials.py)."""
        query = [("dryRun", dry_run), ("fieldManager", field_manager), ("fieldValidation", field_validation),
                 ("pretty", pretty)]
        return self._request("POST", "/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token",
                             {"name": name, "namespace": namespace}, query, body,
                             preload_content=_preload_content, request_timeout=_request_timeout)

    # ----------------------------------------------------------------------------------------- events

    def create_namespaced_event(self, namespace: str, body: Any, pretty: str | None = None,
                                dry_run: str | None = None, field_manager: str | None = None,
                                field_validation: str | None = None, *, _preload_content: bool = True,
                                _request_timeout: Timeout = None) -> Any:
        query = [("pretty", pretty), ("dryRun", dry_run), ("fieldManager", field_manager),
                 ("fieldValidation", field_validation)]
        return self._request("POST", "/api/v1/namespaces/{namespace}/events", {"namespace": namespace}, query,
                             body, preload_content=_preload_content, request_timeout=_request_timeout)


class CustomObjects(_Client):
    """The cluster-scoped custom object calls koordlet makes (``kubernetes.client.CustomObjectsApi``'s names
    and argument order)."""

    _COLLECTION = "/apis/{group}/{version}/{plural}"
    _OBJECT = "/apis/{group}/{version}/{plural}/{name}"

    def get_cluster_custom_object(self, group: str, version: str, plural: str, name: str, *,
                                  _preload_content: bool = True, _request_timeout: Timeout = None) -> Any:
        return self._request("GET", self._OBJECT, {"group": group, "version": version, "plural": plural,
                                                   "name": name},
                             preload_content=_preload_content, request_timeout=_request_timeout)

    def create_cluster_custom_object(self, group: str, version: str, plural: str, body: Any,
                                     pretty: str | None = None, dry_run: str | None = None,
                                     field_manager: str | None = None, field_validation: str | None = None, *,
                                     _preload_content: bool = True, _request_timeout: Timeout = None) -> Any:
        query = [("pretty", pretty), ("dryRun", dry_run), ("fieldManager", field_manager),
                 ("fieldValidation", field_validation)]
        return self._request("POST", self._COLLECTION, {"group": group, "version": version, "plural": plural},
                             query, body, preload_content=_preload_content, request_timeout=_request_timeout)

    def replace_cluster_custom_object(self, group: str, version: str, plural: str, name: str, body: Any,
                                      dry_run: str | None = None, field_manager: str | None = None,
                                      field_validation: str | None = None, *, _preload_content: bool = True,
                                      _request_timeout: Timeout = None) -> Any:
        query = [("dryRun", dry_run), ("fieldManager", field_manager), ("fieldValidation", field_validation)]
        return self._request("PUT", self._OBJECT, {"group": group, "version": version, "plural": plural,
                                                   "name": name},
                             query, body, preload_content=_preload_content, request_timeout=_request_timeout)

    def replace_cluster_custom_object_status(self, group: str, version: str, plural: str, name: str, body: Any,
                                             dry_run: str | None = None, field_manager: str | None = None,
                                             field_validation: str | None = None, *, _preload_content: bool = True,
                                             _request_timeout: Timeout = None) -> Any:
        query = [("dryRun", dry_run), ("fieldManager", field_manager), ("fieldValidation", field_validation)]
        return self._request("PUT", self._OBJECT + "/status", {"group": group, "version": version,
                                                               "plural": plural, "name": name},
                             query, body, preload_content=_preload_content, request_timeout=_request_timeout)

    def list_cluster_custom_object(self, group: str, version: str, plural: str, pretty: str | None = None,
                                   allow_watch_bookmarks: bool | None = None, _continue: str | None = None,
                                   field_selector: str | None = None, label_selector: str | None = None,
                                   limit: int | None = None, resource_version: str | None = None,
                                   resource_version_match: str | None = None, timeout_seconds: int | None = None,
                                   watch: bool | None = None, *, _preload_content: bool = True,
                                   _request_timeout: Timeout = None) -> Any:
        query = [("pretty", pretty), ("allowWatchBookmarks", allow_watch_bookmarks), ("continue", _continue),
                 ("fieldSelector", field_selector), ("labelSelector", label_selector), ("limit", limit),
                 ("resourceVersion", resource_version), ("resourceVersionMatch", resource_version_match),
                 ("timeoutSeconds", timeout_seconds), ("watch", watch)]
        return self._request("GET", self._COLLECTION, {"group": group, "version": version, "plural": plural},
                             query, preload_content=_preload_content, request_timeout=_request_timeout)


class AuthV1(_Client):
    """The authentication.k8s.io/v1 and authorization.k8s.io/v1 reviews koordlet asks for its debug endpoints
    (``kubernetes.client.AuthenticationV1Api.create_token_review`` and
    ``AuthorizationV1Api.create_subject_access_review``: their names and argument order)."""

    def create_token_review(self, body: Any, dry_run: str | None = None, field_manager: str | None = None,
                            field_validation: str | None = None, pretty: str | None = None, *,
                            _preload_content: bool = True, _request_timeout: Timeout = None) -> Any:
        query = [("dryRun", dry_run), ("fieldManager", field_manager), ("fieldValidation", field_validation),
                 ("pretty", pretty)]
        return self._request("POST", "/apis/authentication.k8s.io/v1/tokenreviews", {}, query, body,
                             preload_content=_preload_content, request_timeout=_request_timeout)

    def create_subject_access_review(self, body: Any, dry_run: str | None = None, field_manager: str | None = None,
                                     field_validation: str | None = None, pretty: str | None = None, *,
                                     _preload_content: bool = True, _request_timeout: Timeout = None) -> Any:
        query = [("dryRun", dry_run), ("fieldManager", field_manager), ("fieldValidation", field_validation),
                 ("pretty", pretty)]
        return self._request("POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews", {}, query, body,
                             preload_content=_preload_content, request_timeout=_request_timeout)
