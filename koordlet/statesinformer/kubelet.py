"""Pods from kubelet's ``GET /pods`` (docs/koordinator.md §8.1), and the pod JSON → PodMeta conversion.

HTTPS on the kubelet port with a bearer token (the service account's, re-read every request so a
rotated token is picked up) or a client certificate, and TLS verification off like Koordinator
(kubelet serving certificates are often self-signed; a CA file turns verification on). With
``insecure`` it is plain HTTP on the read-only port. Timeout 3 s; an empty list is a failure
(kubelet just restarted and has not re-listed its pods yet: taking it would make every pod vanish).
"""

from __future__ import annotations

import http.client
import logging
import ssl
import time
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any
from urllib.parse import urlsplit

from koordlet.access import KUBELET, Refusals, from_kubelet_answer
from koordlet.api.pod import ContainerMeta, PodMeta, is_pod_level_resource, split_container_id
from koordlet.api.qos import KubeQoS, parse_kube_qos
from koordlet.api.quantity import QuantityError, parse_resource_quantity
from koordlet.api.safeload import load_json
from koordlet.statesinformer.informer import PodSourceError
from koordlet.system.kubepods import CgroupPathError, KubeCgroupLayout

logger = logging.getLogger(__name__)

DEFAULT_KUBELET_PORT = 10250
PODS_PATH = "/pods/"
CONFIGZ_PATH = "/configz"
# Every call koordlet makes to kubelet's API, (method, path): tests/deploy/test_rbac.py derives the RBAC it needs
# from kubelet's own mapping of paths to nodes/<subresource> (GET /pods/: nodes/pods, GET /configz: nodes/configz,
# each falling back to nodes/proxy). /configz is asked only for kubelet's memory QoS, and not at all with
# -disable-query-kubelet-config or -kubelet-config-file.
KUBELET_CALLS = (("GET", PODS_PATH), ("GET", CONFIGZ_PATH))
_MAX_BODY_BYTES = 256 << 20


class PodParseError(ValueError):
    """A pod object from kubelet that cannot become a PodMeta."""


def _amounts(resources: Mapping[str, Any] | None, pod_key: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for resource, text in (resources or {}).items():
        try:
            out[str(resource)] = parse_resource_quantity(str(resource), str(text))
        except QuantityError as err:
            raise PodParseError(f"pod {pod_key}: resource {resource}: {err}") from err
    return out


_QOS_RESOURCES = ("cpu", "memory")


def _resource_qos(requests: Mapping[str, int], limits: Mapping[str, int]) -> KubeQoS:
    """One set of requests and limits (a container's, or the pod-level ones): kubelet's resourceQOS, with the API
    server's defaulting (a request not set is its limit) done here for pods that did not go through it."""
    if not requests and not limits:
        return KubeQoS.BESTEFFORT
    qos: KubeQoS | None = None
    for resource in _QOS_RESOURCES:
        limit = limits.get(resource, 0)
        request = requests.get(resource, limit)
        if request != limit:
            return KubeQoS.BURSTABLE
        best_effort = request == 0
        if qos is None:
            qos = KubeQoS.BESTEFFORT if best_effort else KubeQoS.GUARANTEED
        elif best_effort != (qos is KubeQoS.BESTEFFORT):
            return KubeQoS.BURSTABLE
    return qos or KubeQoS.BESTEFFORT


def kube_qos_of(containers: list[ContainerMeta], pod_requests: Mapping[str, int] | None = None,
                pod_limits: Mapping[str, int] | None = None) -> KubeQoS:
    """kubelet's ComputePodQOS: pod-level resources, where the pod sets them, decide alone; else each container
    (init containers too) is BestEffort (nothing set), Guaranteed (cpu and memory limits, requests equal) or
    Burstable, and the pod is that class when all agree, Burstable otherwise."""
    if pod_requests or pod_limits:
        return _resource_qos(pod_requests or {}, pod_limits or {})
    pod_qos: KubeQoS | None = None
    for container in containers:
        qos = _resource_qos(container.requests, container.limits)
        if qos is KubeQoS.BURSTABLE or (pod_qos is not None and qos is not pod_qos):
            return KubeQoS.BURSTABLE
        pod_qos = qos
    return pod_qos or KubeQoS.BESTEFFORT


# What kubelet carries out and reports back of a running container after a resize (kubelet_pods.go,
# convertContainerStatusResources): cpu and memory; other resources (batch-cpu and the other extended
# resources) are not resizable, and the spec's stand.
_ACTUATED = ("cpu", "memory")


def _actual(spec: dict[str, int], reported: Mapping[str, Any] | None, allocated: Mapping[str, Any] | None,
            key: str) -> dict[str, int]:
    """The amounts a container (or pod) really has: cpu and memory from ``reported`` (status.resources, what kubelet
    enacted) when kubelet reports it, else from ``allocated`` (status.allocatedResources, requests only: admitted,
    maybe not enacted yet), else the spec (component-helpers containerActuatedRequests/Limits, resource by
    resource so the extended resources of the spec stay)."""
    source = reported if isinstance(reported, Mapping) else allocated if isinstance(allocated, Mapping) else None
    if source is None:
        return spec
    amounts = _amounts(source, key)
    actual = {name: value for name, value in spec.items() if name not in _ACTUATED}
    actual.update((name, amounts[name]) for name in _ACTUATED if name in amounts)
    return actual


def _resources_of(status: Mapping[str, Any] | None) -> tuple[Mapping[str, Any] | None, Mapping[str, Any] | None,
                                                           Mapping[str, Any] | None]:
    """(status.resources.requests, status.resources.limits, status.allocatedResources) of a container or pod status;
    None for what is not reported."""
    if not isinstance(status, Mapping):
        return None, None, None
    reported = status.get("resources")
    reported = reported if isinstance(reported, Mapping) else {}
    return reported.get("requests"), reported.get("limits"), status.get("allocatedResources")


def pod_meta_from_pod(pod: Mapping[str, Any], layout: KubeCgroupLayout, default_runtime: str = "containerd") -> PodMeta:
    """A core/v1 Pod (as JSON) → PodMeta; raises PodParseError."""
    metadata = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    name, namespace, uid = metadata.get("name"), metadata.get("namespace"), metadata.get("uid")
    if not (name and namespace and uid):
        raise PodParseError(f"pod without name/namespace/uid: {metadata!r:.200}")
    key = f"{namespace}/{name}"
    ids: dict[str, tuple[str, str]] = {}
    statuses: dict[str, Mapping[str, Any]] = {}
    for field in ("containerStatuses", "initContainerStatuses"):
        for container_status in status.get(field) or ():
            if not isinstance(container_status, Mapping):
                continue
            statuses[container_status.get("name", "")] = container_status
            raw_id = container_status.get("containerID") or ""
            if raw_id:
                ids[container_status.get("name", "")] = split_container_id(raw_id, default_runtime)
    containers: list[ContainerMeta] = []
    for field, is_init in (("initContainers", True), ("containers", False)):
        for container in spec.get(field) or ():
            resources = container.get("resources") or {}
            runtime, bare_id = ids.get(container.get("name", ""), (default_runtime, ""))
            reported_requests, reported_limits, allocated = _resources_of(statuses.get(container.get("name", "")))
            containers.append(ContainerMeta(
                name=container.get("name", ""), container_id=bare_id, runtime=runtime,
                requests=_actual(_amounts(resources.get("requests"), key), reported_requests, allocated, key),
                limits=_actual(_amounts(resources.get("limits"), key), reported_limits, None, key),
                is_init=is_init,
            ))
    pod_requests, pod_limits = _pod_level(spec, status, key)
    kube_qos = parse_kube_qos(status.get("qosClass") or "") or kube_qos_of(containers, pod_requests, pod_limits)
    try:
        cgroup_parent = "/" + layout.pod_dir(uid, kube_qos).strip("/")
    except CgroupPathError as err:
        raise PodParseError(f"pod {key}: {err}") from err
    priority = spec.get("priority")
    ips = tuple(str(entry.get("ip")) for entry in status.get("podIPs") or () if isinstance(entry, Mapping)
                and entry.get("ip"))
    if not ips and status.get("podIP"):
        ips = (str(status["podIP"]),)
    return PodMeta(
        name=name, namespace=namespace, uid=uid,
        labels=dict(metadata.get("labels") or {}), annotations=dict(metadata.get("annotations") or {}),
        kube_qos=kube_qos, cgroup_parent=cgroup_parent,
        priority=priority if isinstance(priority, int) else None,
        containers=tuple(containers), phase=status.get("phase") or "", ips=ips,
        created_at=_timestamp(metadata.get("creationTimestamp")), deleting=bool(metadata.get("deletionTimestamp")),
        pod_requests=pod_requests, pod_limits=pod_limits,
    )


def _pod_level(spec: Mapping[str, Any], status: Mapping[str, Any], key: str) -> tuple[dict[str, int], dict[str, int]]:
    """The pod-level (requests, limits): spec.resources' cpu, memory and hugepages (component-helpers
    IsPodLevelResourcesSet: other names there do not make a pod-level pod), what kubelet enacted
    (status.resources, InPlacePodLevelResourcesVerticalScaling) where it reports it. Empty when not set."""
    resources = spec.get("resources")
    if not isinstance(resources, Mapping):
        return {}, {}
    requests = {n: v for n, v in _amounts(resources.get("requests"), key).items() if is_pod_level_resource(n)}
    limits = {n: v for n, v in _amounts(resources.get("limits"), key).items() if is_pod_level_resource(n)}
    if not requests and not limits:
        return {}, {}
    reported_requests, reported_limits, allocated = _resources_of(status)
    return _actual(requests, reported_requests, allocated, key), _actual(limits, reported_limits, None, key)


def _timestamp(text: object) -> float | None:
    """An RFC 3339 metadata timestamp as Unix seconds; None when absent or unreadable."""
    if not isinstance(text, str):
        return None
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return moment.timestamp() if moment.tzinfo is not None else None


def kubelet_url(node: Mapping[str, Any], address_type: str = "InternalIP", port: int = 0,
                insecure: bool = False, read_only_port: int = 10255) -> str | None:
    """Base URL of the node's kubelet from a core/v1 Node (docs/koordinator.md §8.1).

    None when the Node has no such address."""
    status = node.get("status") or {}
    address = next((a.get("address") for a in status.get("addresses") or () if a.get("type") == address_type), None)
    if not address:
        return None
    host = f"[{address}]" if ":" in address else address
    if insecure:
        return f"http://{host}:{read_only_port}"
    endpoint_port = (((status.get("daemonEndpoints") or {}).get("kubeletEndpoint") or {}).get("Port")) or 0
    return f"https://{host}:{port or endpoint_port or DEFAULT_KUBELET_PORT}"


class KubeletPodSource:
    """:class:`koordlet.statesinformer.informer.PodSource` over kubelet ``/pods``."""

    name = "kubelet"

    def __init__(
        self,
        base_url: Callable[[], str | None] | str,
        layout: KubeCgroupLayout,
        timeout_s: float = 3.0,
        token_file: str = "",
        client_cert: str = "",
        client_key: str = "",
        ca_file: str = "",
        default_runtime: str = "containerd",
        observe: Callable[[str, float], None] | None = None,
        refusals: Refusals | None = None,
        token: Callable[[], str] | None = None,
    ) -> None:
        """``refusals``: where a 401 or 403 of kubelet goes (koordlet.access), and a success ends it. ``token``: asked
        for the bearer token at each request instead of reading ``token_file`` (koordlet/credentials.py, which renews
        a due token)."""
        self._base_url = base_url if callable(base_url) else (lambda: base_url)
        self._refusals = refusals
        self._layout = layout
        self._timeout_s = timeout_s
        self._token_file = token_file
        self._token_provider = token
        self._default_runtime = default_runtime
        self._observe = observe
        context = ssl.create_default_context(cafile=ca_file or None)
        if not ca_file:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        if client_cert:
            context.load_cert_chain(client_cert, client_key or None)
        self._ssl = context

    def _token(self) -> str:
        if self._token_provider is not None:
            return self._token_provider()
        if not self._token_file:
            return ""
        try:
            with open(self._token_file, encoding="utf-8") as handle:
                return handle.read().strip()
        except OSError:
            return ""

    def _get(self, path: str) -> bytes:
        """The body of kubelet's ``GET <path>`` (200 only); raises PodSourceError."""
        base = self._base_url()
        if not base:
            raise PodSourceError("kubelet address not known yet")
        parts = urlsplit(base)
        if parts.scheme == "https":
            conn: http.client.HTTPConnection = http.client.HTTPSConnection(
                parts.hostname or "", parts.port or DEFAULT_KUBELET_PORT, timeout=self._timeout_s, context=self._ssl)
        else:
            conn = http.client.HTTPConnection(parts.hostname or "", parts.port or 80, timeout=self._timeout_s)
        headers = {"Accept": "application/json", "User-Agent": "koordlet"}
        token = self._token()
        if token:
            headers["Authorization"] = f"Bearer {token}"
        started = time.perf_counter()
        code = "error"
        try:
            conn.request("GET", parts.path.rstrip("/") + path, headers=headers)
            response = conn.getresponse()
            code = str(response.status)
            body = response.read(_MAX_BODY_BYTES + 1)
        except (OSError, http.client.HTTPException) as err:
            raise PodSourceError(f"GET {base}{path}: {err}") from err
        finally:
            conn.close()
            if self._observe is not None:
                self._observe(code, time.perf_counter() - started)
        self._check_access(f"{base}{path}", response.status, body)
        if response.status != 200:
            raise PodSourceError(f"GET {base}{path}: HTTP {response.status}: {body[:200]!r}")
        if len(body) > _MAX_BODY_BYTES:
            raise PodSourceError(f"GET {base}{path}: answer larger than {_MAX_BODY_BYTES} bytes")
        return body

    def fetch(self) -> list[dict[str, Any]]:
        """The raw pod items of ``/pods``; raises PodSourceError."""
        body = self._get("/pods/")
        try:
            items = load_json(body, "GET /pods/", max_bytes=_MAX_BODY_BYTES).get("items")
        except (ValueError, AttributeError) as err:
            raise PodSourceError(f"GET /pods/: not a PodList: {err}") from err
        if not isinstance(items, list) or not items:
            raise PodSourceError("GET /pods/: empty pod list (kubelet restarting?)")
        return items

    def kubelet_config(self) -> dict[str, Any]:
        """kubelet's KubeletConfiguration in effect, from ``GET /configz`` (``{"kubeletconfig": {...}}``, what
        Koordinator's koordlet reads too); raises PodSourceError."""
        try:
            config = load_json(self._get(CONFIGZ_PATH), "GET /configz", max_bytes=_MAX_BODY_BYTES).get("kubeletconfig")
        except (ValueError, AttributeError) as err:
            raise PodSourceError(f"GET /configz: not kubelet's configz: {err}") from err
        if not isinstance(config, dict):
            raise PodSourceError("GET /configz: no kubeletconfig object")
        return config

    def _check_access(self, call: str, status: int, body: bytes) -> None:
        """A 401 or 403 is a refusal (koordlet.access: the rule that would allow the call); a 200 ends one."""
        refusal = from_kubelet_answer("GET", call, status, body[:1024].decode("utf-8", "replace"))
        if self._refusals is not None:
            if refusal is not None:
                self._refusals.refused(refusal)
            elif status == 200:
                self._refusals.allowed(KUBELET, f"GET {call}")
        if refusal is not None:
            raise PodSourceError(refusal.describe())

    def list_pods(self) -> tuple[PodMeta, ...]:
        pods = []
        for item in self.fetch():
            try:
                pods.append(pod_meta_from_pod(item, self._layout, self._default_runtime))
            except PodParseError as err:
                logger.warning("skipping a pod kubelet listed: %s", err)
        return tuple(pods)
