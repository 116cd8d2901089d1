"""Pods from the CRI itself, for nodes without a kubelet API (bare metal, the local demo).

Each sync: ``ListPodSandbox`` (ready sandboxes) and ``ListContainers``; for a sandbox or container seen for
the first time, its verbose status (``PodSandboxStatus``/``ContainerStatus`` with ``verbose``) gives the
config the runtime was created with — the sandbox's cgroup parent and IP (``status.network.ip``; a NODE-network
sandbox reports the host's or none), the container's Linux resources. These
are cached by id (a sandbox's config never changes) and forgotten when the id is gone. A container's resources
change with an in-place resize (UpdateContainerResources): where the runtime reports them in
``ContainerStatus.status.resources`` they are read from there at every sync, so a resize is seen; a runtime that
does not report them leaves the creation config (cached).

Requests and limits are derived back from the Linux resources kubelet computed (the inverse of kubelet's
conversion): cpu limit = quota × 1000 / period milli-cores, cpu request = shares × 1000 / 1024 (shares of
2 are kubelet's "no request"), memory limit = memory_limit_in_bytes. A container of a BestEffort pod has
none. Kube QoS comes from the cgroup parent (docs/koordinator.md §2.6). The pod phase is not known here ("").

Memory and extended-resource requests are not in the Linux resources, so every pod from here has
``requests_known=False``: memory QoS and BE CPU eviction leave such pods (and the QoS dirs above them) as
they are. Said once, when the source is made.
"""

from __future__ import annotations

import logging
from typing import Any

import grpc
from google.protobuf import json_format
from google.protobuf.message import DecodeError

from koordlet.api.pod import ContainerMeta, PodMeta
from koordlet.api.qos import kube_qos_from_cgroup_parent
from koordlet.api.safeload import load_json
from koordlet.statesinformer.enacted import requests_limits
from koordlet.statesinformer.informer import PodSourceError
from wire import cri_pb2 as cri
from wire import cri_pb2_grpc as cri_grpc

logger = logging.getLogger(__name__)

_MAX_INFO_BYTES = 4 << 20  # containerd's verbose status info: the OCI spec and runtime config of one container

_OPTIONS = [("grpc.max_receive_message_length", 16 << 20)]


def _verbose_config(info: Any, config_type: type) -> Any | None:
    raw = info.get("info", "")
    if not raw:
        return None
    try:
        config = load_json(raw, "container status info", max_bytes=_MAX_INFO_BYTES).get("config")
        if not config:
            return None
        config.pop("envs", None)  # env values are plain strings in containerd's JSON; not needed here
        return json_format.ParseDict(config, config_type(), ignore_unknown_fields=True)
    except (ValueError, AttributeError, json_format.ParseError) as err:
        logger.debug("unreadable verbose info: %s", err)
        return None


class CriPodSource:
    """:class:`koordlet.statesinformer.informer.PodSource` over a CRI runtime socket."""

    name = "cri"

    def __init__(self, endpoint: str, timeout_s: float = 3.0, runtime: str = "containerd") -> None:
        target = endpoint if "://" in endpoint else f"unix://{endpoint}"
        self._channel = grpc.insecure_channel(target, options=_OPTIONS)
        self._runtime = cri_grpc.RuntimeServiceStub(self._channel)
        self._timeout_s = timeout_s
        self._runtime_name = runtime
        self._sandboxes: dict[str, tuple[str, tuple[str, ...]]] = {}  # id -> (cgroup parent, IPs)
        self._container_resources: dict[str, tuple[dict[str, int], dict[str, int]]] = {}
        logger.info("pods from the CRI carry no memory or batch-resource requests (requests_known=False): "
                    "memory QoS and BE CPU eviction leave those pods, and memory QoS their QoS dirs' min/low, "
                    "as they are")

    def close(self) -> None:
        self._channel.close()

    def _sandbox(self, sandbox_id: str) -> tuple[str, tuple[str, ...]]:
        """(cgroup parent, IPs) of a sandbox; both fixed for its life, so cached by id."""
        cached = self._sandboxes.get(sandbox_id)
        if cached is None:
            response = self._runtime.PodSandboxStatus(
                cri.PodSandboxStatusRequest(pod_sandbox_id=sandbox_id, verbose=True), timeout=self._timeout_s)
            config = _verbose_config(response.info, cri.PodSandboxConfig)
            parent = config.linux.cgroup_parent if config is not None else ""
            ip = response.status.network.ip
            cached = (parent, (ip,) if ip else ())
            self._sandboxes[sandbox_id] = cached
        return cached

    def _resources(self, container_id: str) -> tuple[dict[str, int], dict[str, int]]:
        """What the container has now: the runtime's ``status.resources`` (CRI v1, what the last
        UpdateContainerResources set: an in-place resize shows here) read every sync, where the runtime reports
        them; else the config it was created with (verbose status, cached: it never changes)."""
        cached = self._container_resources.get(container_id)
        if cached is not None:
            return cached
        response = self._runtime.ContainerStatus(cri.ContainerStatusRequest(container_id=container_id),
                                                 timeout=self._timeout_s)
        if response.status.HasField("resources") and response.status.resources.HasField("linux"):
            return requests_limits(response.status.resources.linux)
        response = self._runtime.ContainerStatus(
            cri.ContainerStatusRequest(container_id=container_id, verbose=True), timeout=self._timeout_s)
        config = _verbose_config(response.info, cri.ContainerConfig)
        cached = requests_limits(config.linux.resources) if config is not None else ({}, {})
        self._container_resources[container_id] = cached
        return cached

    def list_pods(self) -> tuple[PodMeta, ...]:
        try:
            sandboxes = self._runtime.ListPodSandbox(
                cri.ListPodSandboxRequest(filter=cri.PodSandboxFilter(
                    state=cri.PodSandboxStateValue(state=cri.SANDBOX_READY))),
                timeout=self._timeout_s).items
            containers = self._runtime.ListContainers(cri.ListContainersRequest(), timeout=self._timeout_s).containers
            by_sandbox: dict[str, list[cri.Container]] = {}
            for container in containers:
                if container.state in (cri.CONTAINER_CREATED, cri.CONTAINER_RUNNING):
                    by_sandbox.setdefault(container.pod_sandbox_id, []).append(container)
            pods = []
            for sandbox in sandboxes:
                parent, ips = self._sandbox(sandbox.id)
                members = sorted(by_sandbox.get(sandbox.id, ()), key=lambda c: c.metadata.name)
                metas = []
                for container in members:
                    requests, limits = self._resources(container.id)
                    metas.append(ContainerMeta(name=container.metadata.name, container_id=container.id,
                                               runtime=self._runtime_name, requests=requests, limits=limits))
                pods.append(PodMeta(
                    name=sandbox.metadata.name, namespace=sandbox.metadata.namespace, uid=sandbox.metadata.uid,
                    labels=dict(sandbox.labels), annotations=dict(sandbox.annotations),
                    kube_qos=kube_qos_from_cgroup_parent(parent) if parent else None,
                    cgroup_parent=parent, containers=tuple(metas), sandbox_id=sandbox.id, ips=ips,
                    requests_known=False, created_at=sandbox.created_at / 1e9 if sandbox.created_at else None,
                ))
        except (grpc.RpcError, DecodeError) as err:
            detail = err.details() if isinstance(err, grpc.RpcError) and hasattr(err, "details") else err
            raise PodSourceError(f"CRI pod listing failed: {detail}") from err
        live_sandboxes = {s.id for s in sandboxes}
        live_containers = {c.id for c in containers}
        for stale in [sid for sid in self._sandboxes if sid not in live_sandboxes]:
            del self._sandboxes[stale]
        for stale in [cid for cid in self._container_resources if cid not in live_containers]:
            del self._container_resources[stale]
        return tuple(sorted(pods, key=lambda p: (p.namespace, p.name, p.uid)))
