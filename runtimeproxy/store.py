"""What the proxy remembers about pods and containers, so that hook requests are complete.

A hook request for StartContainer or StopContainer carries the container's cgroup parent,
resources and envs, which the CRI request does not: the proxy keeps them from CreateContainer.
Koordinator keeps this in memory only and loses it on restart (docs/koordinator.md §2.8);
this store also writes an atomic checkpoint file after every change and, at start, rebuilds itself
from the runtime (ListPodSandbox/ListContainers and their verbose status, whose "config" holds the
CRI configs as the runtime received them, hook changes included) merged with that checkpoint.

Checkpoint writes stay off kubelet's path: each entry is serialised once when it changes, and the
file is rewritten (temp file + rename, so a reader sees the old or the new file, never a torn one)
in a worker thread, changes made meanwhile coalesced into the next write. No fsync: the checkpoint
only has to survive a crashed or killed proxy, and after a power loss every pod restarts anyway.

Entries go when their pod or container stops, and a periodic sweep drops what the runtime no
longer knows, so the store cannot grow without end.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import threading
from collections.abc import Awaitable, Callable

from google.protobuf import json_format
from google.protobuf.message import DecodeError

from wire import cri_pb2 as cri
from wire import hookapi_pb2 as hookapi
from wire.files import write_atomic

log = logging.getLogger(__name__)

CHECKPOINT_VERSION = 1


def to_hook_resources(resources: cri.LinuxContainerResources) -> hookapi.LinuxContainerResources:
    # Same field numbers in both protos (docs/koordinator.md §2.3): the bytes convert directly.
    return hookapi.LinuxContainerResources.FromString(resources.SerializeToString())


def to_cri_resources(resources: hookapi.LinuxContainerResources) -> cri.LinuxContainerResources:
    return cri.LinuxContainerResources.FromString(resources.SerializeToString())


def envs_map(envs) -> dict[str, str]:
    """CRI KeyValue envs as a map (later duplicates win, as in Koordinator)."""
    return {kv.key: kv.value.decode("utf-8", "surrogateescape") for kv in envs}


def pod_request_from_config(config: cri.PodSandboxConfig, runtime_handler: str) -> hookapi.PodSandboxHookRequest:
    meta = config.metadata
    return hookapi.PodSandboxHookRequest(
        pod_meta=hookapi.PodSandboxMetadata(name=meta.name, uid=meta.uid, namespace=meta.namespace,
                                            attempt=meta.attempt),
        runtime_handler=runtime_handler,
        labels=dict(config.labels),
        annotations=dict(config.annotations),
        cgroup_parent=config.linux.cgroup_parent,
    )


def container_request(pod: hookapi.PodSandboxHookRequest, config: cri.ContainerConfig,
                      pod_cgroup_parent: str, container_id: str = "") -> hookapi.ContainerResourceHookRequest:
    return hookapi.ContainerResourceHookRequest(
        pod_meta=pod.pod_meta,
        container_meta=hookapi.ContainerMetadata(name=config.metadata.name, attempt=config.metadata.attempt,
                                                 id=container_id),
        container_annotations=dict(config.annotations),
        container_resources=to_hook_resources(config.linux.resources),
        pod_annotations=dict(pod.annotations),
        pod_labels=dict(pod.labels),
        pod_cgroup_parent=pod_cgroup_parent or pod.cgroup_parent,
        container_envs=envs_map(config.envs),
    )


RuntimeCall = Callable[[str, bytes], Awaitable[bytes]]  # (gRPC path, request) -> response, raises ConnectionError
_RUNTIME_SERVICE = "/runtime.v1.RuntimeService/"


async def _list_runtime(call: RuntimeCall) -> tuple[list[cri.PodSandbox], list[cri.Container]]:
    sandboxes = cri.ListPodSandboxResponse.FromString(
        await call(_RUNTIME_SERVICE + "ListPodSandbox", cri.ListPodSandboxRequest().SerializeToString())).items
    containers = cri.ListContainersResponse.FromString(
        await call(_RUNTIME_SERVICE + "ListContainers", cri.ListContainersRequest().SerializeToString())).containers
    return list(sandboxes), list(containers)


def _entry_json(message, sandbox_id: str | None = None) -> str:
    as_dict = json_format.MessageToDict(message, preserving_proto_field_name=True)
    if sandbox_id is None:
        return json.dumps(as_dict, separators=(",", ":"))
    return json.dumps({"sandbox_id": sandbox_id, "request": as_dict}, separators=(",", ":"))


class Store:
    """sandbox id -> pod hook request; container id -> container hook request (+ its sandbox)."""

    def __init__(self, checkpoint_path: str | None) -> None:
        self.checkpoint_path = checkpoint_path
        self.pods: dict[str, hookapi.PodSandboxHookRequest] = {}
        self.containers: dict[str, hookapi.ContainerResourceHookRequest] = {}
        self.container_sandbox: dict[str, str] = {}
        self._pod_json: dict[str, str] = {}
        self._container_json: dict[str, str] = {}
        self._write_lock = threading.Lock()
        self._write_pending = False

    # -- changes (each one checkpointed) ------------------------------------------------------
    def put_pod(self, sandbox_id: str, pod: hookapi.PodSandboxHookRequest) -> None:
        self.pods[sandbox_id] = pod
        self._pod_json[sandbox_id] = _entry_json(pod)
        self.save()

    def put_container(self, container_id: str, sandbox_id: str, req: hookapi.ContainerResourceHookRequest) -> None:
        req.container_meta.id = container_id
        self.containers[container_id] = req
        self.container_sandbox[container_id] = sandbox_id
        self._container_json[container_id] = _entry_json(req, sandbox_id)
        self.save()

    def touch_container(self, container_id: str) -> None:
        """The cached request of a container changed in place: checkpoint it."""
        req = self.containers.get(container_id)
        if req is not None:
            self.put_container(container_id, self.container_sandbox.get(container_id, ""), req)

    def drop_pod(self, sandbox_id: str) -> None:
        if self.pods.pop(sandbox_id, None) is not None:
            self._pod_json.pop(sandbox_id, None)
            for cid in [c for c, s in self.container_sandbox.items() if s == sandbox_id]:
                self._forget_container(cid)
            self.save()

    def drop_container(self, container_id: str) -> None:
        if container_id in self.containers:
            self._forget_container(container_id)
            self.save()

    def _forget_container(self, container_id: str) -> None:
        self.containers.pop(container_id, None)
        self.container_sandbox.pop(container_id, None)
        self._container_json.pop(container_id, None)

    def keep_only(self, sandbox_ids: set[str], container_ids: set[str]) -> int:
        """Drop entries the runtime no longer has; returns how many went."""
        gone_pods = [s for s in self.pods if s not in sandbox_ids]
        gone_ctrs = [c for c in self.containers if c not in container_ids]
        for s in gone_pods:
            del self.pods[s]
            self._pod_json.pop(s, None)
        for c in gone_ctrs:
            self._forget_container(c)
        if gone_pods or gone_ctrs:
            self.save()
        return len(gone_pods) + len(gone_ctrs)

    # -- checkpoint ---------------------------------------------------------------------------
    def _document(self) -> str:
        pods = ",".join(f"{json.dumps(k)}:{v}" for k, v in self._pod_json.items())
        ctrs = ",".join(f"{json.dumps(k)}:{v}" for k, v in self._container_json.items())
        return f'{{"version":{CHECKPOINT_VERSION},"pods":{{{pods}}},"containers":{{{ctrs}}}}}'

    def save(self) -> None:
        """Checkpoint now (no event loop running) or soon, in a worker thread (from the event loop)."""
        if not self.checkpoint_path:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self._write(self._document())
            return
        if self._write_pending:
            return  # a write is already scheduled; it will take this change along
        self._write_pending = True

        def write_latest() -> None:
            self._write_pending = False
            loop.run_in_executor(None, self._write, self._document())

        loop.call_soon(write_latest)

    def flush(self) -> None:
        """Write the checkpoint synchronously (at shutdown)."""
        if self.checkpoint_path:
            self._write(self._document())

    def _write(self, text: str) -> None:
        directory = os.path.dirname(self.checkpoint_path) or "."
        with self._write_lock:  # writes land in the order they were scheduled
            try:
                os.makedirs(directory, mode=0o700, exist_ok=True)
                write_atomic(self.checkpoint_path, text, prefix=".checkpoint-")  # readers see old or new
            except OSError as err:
                log.error("cannot write store checkpoint %s: %s", self.checkpoint_path, err)

    def load_checkpoint(self) -> tuple[dict[str, hookapi.PodSandboxHookRequest],
                                       dict[str, tuple[str, hookapi.ContainerResourceHookRequest]]]:
        if not self.checkpoint_path or not os.path.exists(self.checkpoint_path):
            return {}, {}
        try:
            with open(self.checkpoint_path, encoding="utf-8") as f:
                doc = json.load(f)
            if doc.get("version") != CHECKPOINT_VERSION:
                raise ValueError(f"checkpoint version {doc.get('version')!r}, expected {CHECKPOINT_VERSION}")
            pods = {sid: json_format.ParseDict(p, hookapi.PodSandboxHookRequest(), ignore_unknown_fields=True)
                    for sid, p in doc.get("pods", {}).items()}
            containers = {
                cid: (c.get("sandbox_id", ""),
                      json_format.ParseDict(c["request"], hookapi.ContainerResourceHookRequest(),
                                            ignore_unknown_fields=True))
                for cid, c in doc.get("containers", {}).items()}
        except (OSError, ValueError, KeyError, TypeError, AttributeError, json_format.ParseError) as err:
            log.error("ignoring unreadable store checkpoint %s: %s", self.checkpoint_path, err)
            return {}, {}
        return pods, containers

    # -- rebuild --------------------------------------------------------------------------------
    async def sweep(self, call: RuntimeCall) -> int:
        """Drop the entries of pods and containers the runtime no longer has; returns how many went."""
        sandboxes, containers = await _list_runtime(call)
        return self.keep_only({s.id for s in sandboxes}, {c.id for c in containers})

    async def rebuild(self, call: RuntimeCall) -> None:
        """Fill the store from the runtime and the checkpoint; `call(method, request) -> response`."""
        saved_pods, saved_containers = self.load_checkpoint()
        sandboxes, containers = await _list_runtime(call)
        limit = asyncio.Semaphore(8)

        async def verbose_config(method: str, request: bytes, response_type, config_type):
            async with limit:
                try:
                    info = response_type.FromString(await call(_RUNTIME_SERVICE + method, request)).info.get("info", "")
                    config = json.loads(info).get("config") if info else None
                    if not config:
                        return None
                    # containerd writes env values as plain strings; our KeyValue.value is bytes
                    # (CRI >= 1.32), which protobuf JSON would read as base64.
                    envs = config.pop("envs", None) if config_type is cri.ContainerConfig else None
                    parsed = json_format.ParseDict(config, config_type(), ignore_unknown_fields=True)
                    for kv in envs or ():
                        parsed.envs.add(key=str(kv.get("key", "")), value=str(kv.get("value", "")).encode())
                    return parsed
                except (ConnectionError, DecodeError, ValueError, json_format.ParseError) as err:
                    log.warning("no verbose %s for rebuild: %s", method, err)
                    return None

        async def pod_entry(sb: cri.PodSandbox) -> None:
            if sb.id in saved_pods:
                self.pods[sb.id] = saved_pods[sb.id]
                self._pod_json[sb.id] = _entry_json(saved_pods[sb.id])
                return
            config = await verbose_config(
                "PodSandboxStatus", cri.PodSandboxStatusRequest(pod_sandbox_id=sb.id, verbose=True).SerializeToString(),
                cri.PodSandboxStatusResponse, cri.PodSandboxConfig)
            if config is None:  # what Koordinator would have: no cgroup parent
                config = cri.PodSandboxConfig(metadata=sb.metadata, labels=sb.labels, annotations=sb.annotations)
            self.pods[sb.id] = pod_request_from_config(config, sb.runtime_handler)
            self._pod_json[sb.id] = _entry_json(self.pods[sb.id])

        await asyncio.gather(*(pod_entry(sb) for sb in sandboxes))

        async def container_entry(c: cri.Container) -> None:
            pod = self.pods.get(c.pod_sandbox_id)
            if pod is None:
                log.warning("container %s has no sandbox %s in the runtime; not stored", c.id, c.pod_sandbox_id)
                return
            if c.id in saved_containers:
                sandbox_id, request = saved_containers[c.id]
                self.containers[c.id], self.container_sandbox[c.id] = request, sandbox_id
                self._container_json[c.id] = _entry_json(request, sandbox_id)
                return
            config = await verbose_config(
                "ContainerStatus", cri.ContainerStatusRequest(container_id=c.id, verbose=True).SerializeToString(),
                cri.ContainerStatusResponse, cri.ContainerConfig)
            if config is None:
                config = cri.ContainerConfig(metadata=c.metadata, annotations=c.annotations)
            self.containers[c.id] = container_request(pod, config, pod.cgroup_parent, c.id)
            self.container_sandbox[c.id] = c.pod_sandbox_id
            self._container_json[c.id] = _entry_json(self.containers[c.id], c.pod_sandbox_id)

        await asyncio.gather(*(container_entry(c) for c in containers))
        from_checkpoint = sum(1 for s in self.pods if s in saved_pods) + sum(
            1 for c in self.containers if c in saved_containers)
        log.info("store rebuilt: %d pods, %d containers (%d entries from the checkpoint)",
                 len(self.pods), len(self.containers), from_checkpoint)
        self.save()
