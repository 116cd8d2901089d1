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
from koordlet.api.pod import ContainerMeta, PodMeta, split_container_id
from koordlet.api.qos import KubeQoS, parse_kube_qos
from koordlet.api.quantity import QuantityError, parse_resource_quantity
from koordlet.api.safeload import load_json
from koordlet.statesinformer.informer import PodSourceError
from koordlet.system.kubepods import CgroupPathError, KubeCgroupLayout

logger = logging.getLogger(__name__)

DEFAULT_KUBELET_PORT = 10250
PODS_PATH = "/pods/"
# Every call koordlet makes to kubelet's API, (method, path): tests/deploy/test_rbac.py derives the RBAC it needs
# from kubelet's own mapping of paths to nodes/<subresource> (GET /pods/: nodes/pods, else nodes/proxy).
KUBELET_CALLS = (("GET", PODS_PATH),)
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


def kube_qos_of(containers: list[ContainerMeta]) -> KubeQoS:
    """Kubelet's QoS rule on cpu and memory: no requests or limits → BestEffort; every container with
    limits for both and requests equal to them → Guaranteed; else Burstable."""
    relevant = ("cpu", "memory")
    if not any(c.requests.get(r) or c.limits.get(r) for c in containers for r in relevant):
        return KubeQoS.BESTEFFORT
    for container in containers:
        for resource in relevant:
            limit = container.limits.get(resource)
            request = container.requests.get(resource, limit)
            if not limit or request != limit:
                return KubeQoS.BURSTABLE
    return KubeQoS.GUARANTEED


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
    for field in ("containerStatuses", "initContainerStatuses"):
        for container_status in status.get(field) or ():
            raw_id = container_status.get("containerID") or ""
            if raw_id:
                ids[container_status.get("name", "")] = split_container_id(raw_id, default_runtime)
    containers: list[ContainerMeta] = []
    for field, is_init in (("initContainers", True), ("containers", False)):
        for container in spec.get(field) or ():
            resources = container.get("resources") or {}
            runtime, bare_id = ids.get(container.get("name", ""), (default_runtime, ""))
            containers.append(ContainerMeta(
                name=container.get("name", ""), container_id=bare_id, runtime=runtime,
                requests=_amounts(resources.get("requests"), key), limits=_amounts(resources.get("limits"), key),
                is_init=is_init,
            ))
    kube_qos = parse_kube_qos(status.get("qosClass") or "") or kube_qos_of([c for c in containers if not c.is_init])
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
    )


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

    def fetch(self) -> list[dict[str, Any]]:
        """The raw pod items of ``/pods``; raises PodSourceError."""
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
            conn.request("GET", parts.path.rstrip("/") + PODS_PATH, headers=headers)
            response = conn.getresponse()
            code = str(response.status)
            body = response.read(_MAX_BODY_BYTES + 1)
        except (OSError, http.client.HTTPException) as err:
            raise PodSourceError(f"GET {base}/pods/: {err}") from err
        finally:
            conn.close()
            if self._observe is not None:
                self._observe(code, time.perf_counter() - started)
        self._check_access(base, response.status, body)
        if response.status != 200:
            raise PodSourceError(f"GET {base}/pods/: HTTP {response.status}: {body[:200]!r}")
        if len(body) > _MAX_BODY_BYTES:
            raise PodSourceError(f"GET {base}/pods/: answer larger than {_MAX_BODY_BYTES} bytes")
        try:
            items = load_json(body, f"GET {base}/pods/", max_bytes=_MAX_BODY_BYTES).get("items")
        except (ValueError, AttributeError) as err:
            raise PodSourceError(f"GET {base}/pods/: not a PodList: {err}") from err
        if not isinstance(items, list) or not items:
            raise PodSourceError(f"GET {base}/pods/: empty pod list (kubelet restarting?)")
        return items

    def _check_access(self, base: str, status: int, body: bytes) -> None:
        """A 401 or 403 is a refusal (koordlet.access: the rule that would allow the call); a 200 ends one."""
        refusal = from_kubelet_answer("GET", f"{base}/pods/", status, body[:1024].decode("utf-8", "replace"))
        if self._refusals is not None:
            if refusal is not None:
                self._refusals.refused(refusal)
            elif status == 200:
                self._refusals.allowed(KUBELET, f"GET {base}/pods/")
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
