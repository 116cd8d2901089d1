"""The lifecycle calls: hook requests built, hook servers called, answers merged, runtime called.

Per docs/koordinator.md §2.2 and §2.6–2.7, with its faults fixed:
* every registered hook server that asks for a hook type is called, in file-name order, each one
  seeing the request as the previous one left it (Koordinator calls the first match only);
* each hook call has a deadline; on error `Ignore` goes on with the request as it was, `Fail`
  returns an error to kubelet naming the hook server and the reason, and post hooks never fail a
  call; a hook server that answers UNIMPLEMENTED (one that predates the hook) is skipped under either policy;
* UpdatePodSandboxResources (a pod-level resize, Kubernetes 1.33+) is offered to the PreUpdatePodSandboxResources
  hook (koordlet-py's extension of the hook API), with the same failure policy;
* values a hook server answers that the kernel would refuse (a cgroup quota of 5, a cpuset of
  "banana") are dropped with a log line and a metric, never sent to the runtime;
* a request is re-encoded only when a hook changed it: otherwise kubelet's bytes go as they came.
"""

from __future__ import annotations

import logging
import posixpath
import time
import zlib
from collections.abc import Awaitable, Callable

from google.protobuf.message import DecodeError, Message

from wire import cri_pb2 as cri
from wire import hookapi_pb2 as hookapi
from wire import kernel_ranges

from . import h2
from .backend import RuntimeClient, call_metadata
from .hookclient import HookClient, HookError, HookUnimplemented
from .hookconfig import HookType, Registry
from .metrics import ProxyMetrics
from .relay import CallResult, HookedRequest
from .store import Store, container_request, pod_request_from_config, to_cri_resources, to_hook_resources

log = logging.getLogger(__name__)

_PREFIX = "/runtime.v1.RuntimeService/"

Backend = Callable[[bytes], Awaitable[CallResult]]


class MessageTooLarge(ValueError):
    """A request message past the proxy's receive limit."""


def inflate_bounded(data: bytes, limit: int) -> bytes:
    """A gzip-compressed gRPC message inflated to at most ``limit`` bytes (MessageTooLarge past it): a
    64 MiB message compresses to ~64 KiB, and inflating it whole would cost the proxy the 64 MiB."""
    inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
    chunks: list[bytes] = []
    size = 0
    pending = data
    while pending and not inflater.eof:
        # in steps of 1 MiB: one growing buffer would be reallocated (and briefly doubled) on the way
        chunk = inflater.decompress(pending, 1 << 20)
        size += len(chunk)
        if size > limit:
            raise MessageTooLarge(f"received message larger than max (more than {limit} bytes after gzip inflation)")
        chunks.append(chunk)
        pending = inflater.unconsumed_tail
    if not inflater.eof:
        raise ValueError("truncated gzip message")
    return b"".join(chunks)


# The checked fields of a hook answer's container resources (docs/koordinator.md §2.7): (name, whether the answer
# sets it, the kernel's range for it; wire.kernel_ranges, as hooks/validate.py and koordlet's cgroup registry).
# Numbers are set when non-zero (positive for most); the cpusets always, as an empty one clears the cpuset (how
# BE containers lose theirs).
_CHECKED_FIELDS: tuple[tuple[str, Callable[[int | str], bool], Callable[..., str | None]], ...] = (
    ("cpu_period", lambda value: value > 0, kernel_ranges.period_problem),
    ("cpu_quota", lambda value: value != 0, kernel_ranges.quota_problem),
    ("cpu_shares", lambda value: value > 0, kernel_ranges.shares_problem),
    ("memory_limit_in_bytes", lambda value: value > 0, kernel_ranges.memory_limit_problem),
    ("oom_score_adj", lambda value: True, kernel_ranges.oom_score_adj_problem),
    ("cpuset_cpus", lambda value: True, kernel_ranges.cpu_list_problem),
    ("cpuset_mems", lambda value: True, kernel_ranges.cpu_list_problem),
)


def merge_resources(cached: hookapi.LinuxContainerResources, answer: hookapi.LinuxContainerResources,
                    reject: Callable[[str, object], None]) -> None:
    """docs/koordinator.md §2.7 container resource merge, refusing values the kernel would refuse."""
    for name, given, problem in _CHECKED_FIELDS:
        value = getattr(answer, name)
        if not given(value):
            continue
        if problem(value) is None:
            setattr(cached, name, value)
        else:
            reject(name, value)
    cached.unified.update(answer.unified)
    if answer.memory_swap_limit_in_bytes > 0:
        cached.memory_swap_limit_in_bytes = answer.memory_swap_limit_in_bytes
    if answer.hugepage_limits:
        del cached.hugepage_limits[:]
        cached.hugepage_limits.extend(answer.hugepage_limits)


def update_from_request(cached: hookapi.LinuxContainerResources, request: cri.LinuxContainerResources) -> None:
    """docs/koordinator.md §2.6: the cached resources as an UpdateContainerResources request changes them."""
    if request.cpu_period > 0:
        cached.cpu_period = request.cpu_period
    if request.cpu_quota != 0:
        cached.cpu_quota = request.cpu_quota
    if request.cpu_shares > 0:
        cached.cpu_shares = request.cpu_shares
    if request.memory_limit_in_bytes > 0:
        cached.memory_limit_in_bytes = request.memory_limit_in_bytes
    if request.memory_swap_limit_in_bytes > 0:
        cached.memory_swap_limit_in_bytes = request.memory_swap_limit_in_bytes
    if request.cpuset_cpus:
        cached.cpuset_cpus = request.cpuset_cpus
    if request.cpuset_mems:
        cached.cpuset_mems = request.cpuset_mems
    cached.unified.update(request.unified)


def _set_envs(config: cri.ContainerConfig, envs: dict[str, str]) -> None:
    """Rebuild config.envs from the desired map, keeping kubelet's order for the keys it sent."""
    order = [kv.key for kv in config.envs]
    keys = [k for k in dict.fromkeys(order) if k in envs] + [k for k in envs if k not in order]
    del config.envs[:]
    config.envs.extend(cri.KeyValue(key=k, value=envs[k].encode("utf-8", "surrogateescape")) for k in keys)


_DEVICE_PERMISSIONS = frozenset("rwm")


def _clean_path(path: str) -> bool:
    """A normalised absolute path (no ``..``, ``.``, doubled or trailing slashes, NUL)."""
    return path.startswith("/") and "\x00" not in path and posixpath.normpath(path) == path and path != "/"


def add_devices_and_mounts(config: cri.ContainerConfig, added: hookapi.ContainerResourceHookResponse,
                           reject: Callable[[str, object], None]) -> bool:
    """The hook answers' devices and mounts onto a CreateContainer config (koordlet-py's extension of the hook
    API): a device or mount whose container path kubelet already set keeps kubelet's; a device outside ``/dev``
    or a path that is not normalised is refused (``reject``). True when the config changed."""
    changed = False
    have = {device.container_path for device in config.devices}
    for device in added.container_devices:
        permissions = device.permissions or "rwm"
        if not (_clean_path(device.host_path) and device.host_path.startswith("/dev/")
                and _clean_path(device.container_path) and set(permissions) <= _DEVICE_PERMISSIONS):
            reject("container_devices", device.host_path)
            continue
        if device.container_path in have:
            continue
        have.add(device.container_path)
        config.devices.add(container_path=device.container_path, host_path=device.host_path, permissions=permissions)
        changed = True
    mounted = {mount.container_path for mount in config.mounts}
    for mount in added.container_mounts:
        if not (_clean_path(mount.host_path) and _clean_path(mount.container_path)):
            reject("container_mounts", mount.host_path)
            continue
        if mount.container_path in mounted:
            continue
        mounted.add(mount.container_path)
        config.mounts.add(container_path=mount.container_path, host_path=mount.host_path, readonly=mount.readonly)
        changed = True
    return changed


def _replace_map(target, values) -> None:
    target.clear()
    target.update(values)


class LifecycleInterceptor:
    """Serves withheld lifecycle calls for the relay (relay.Handler)."""

    def __init__(self, runtime: RuntimeClient, metrics: ProxyMetrics, store: Store,
                 registry: Registry | None = None, hooks: HookClient | None = None,
                 skip_label: tuple[str, str] = ("runtimeproxy.koordinator.sh/skip-hookserver", "true"),
                 hook_timeout_s: float = 2.0, max_message_bytes: int = 16 << 20) -> None:
        self.runtime = runtime
        self.max_message_bytes = max_message_bytes
        self.metrics = metrics
        self.store = store
        self.registry = registry
        self.hooks = hooks or HookClient()
        self.skip_label = skip_label
        self.hook_timeout_s = hook_timeout_s
        # The one table of the lifecycle calls: their request type and handler. The relay withholds
        # exactly these methods (see ``methods``).
        self._lifecycle: dict[str, tuple[type[Message], Callable]] = {
            _PREFIX + "RunPodSandbox": (cri.RunPodSandboxRequest, self._run_pod_sandbox),
            _PREFIX + "StopPodSandbox": (cri.StopPodSandboxRequest, self._stop_pod_sandbox),
            _PREFIX + "CreateContainer": (cri.CreateContainerRequest, self._create_container),
            _PREFIX + "StartContainer": (cri.StartContainerRequest, self._start_container),
            _PREFIX + "UpdateContainerResources": (cri.UpdateContainerResourcesRequest,
                                                   self._update_container_resources),
            _PREFIX + "StopContainer": (cri.StopContainerRequest, self._stop_container),
            _PREFIX + "RemoveContainer": (cri.RemoveContainerRequest, self._remove_container),
            _PREFIX + "UpdatePodSandboxResources": (cri.UpdatePodSandboxResourcesRequest,
                                                    self._update_pod_sandbox_resources),
        }

    @property
    def methods(self) -> frozenset[str]:
        """The gRPC paths this interceptor serves: the ones the relay must withhold."""
        return frozenset(self._lifecycle)

    # -- entry ----------------------------------------------------------------------------------
    def decode(self, method: str, message: bytes) -> Message | None:
        try:
            return self._lifecycle[method][0].FromString(message)
        except DecodeError as err:
            log.warning("cannot decode %s request (%d bytes): %s; forwarding it unchanged", method, len(message), err)
            self.metrics.bad_requests.labels(self.metrics.short_method(method)).inc()
            return None

    async def __call__(self, req: HookedRequest) -> CallResult:
        metadata, timeout = call_metadata(req.headers)
        try:
            compressed, message = h2.decode_grpc_message(bytes(req.body))
            if compressed:
                encoding = next((v for k, v in req.headers if k == b"grpc-encoding"), b"identity")
                if encoding != b"gzip":
                    return CallResult(h2.GRPC_INTERNAL, f"koord-runtime-proxy: unsupported grpc-encoding {encoding!r}")
                message = inflate_bounded(message, self.max_message_bytes)
        except MessageTooLarge as err:
            self.metrics.refused("too_large")
            return CallResult(h2.GRPC_RESOURCE_EXHAUSTED, f"koord-runtime-proxy: {err}")
        except (ValueError, OSError, EOFError, zlib.error) as err:
            return CallResult(h2.GRPC_INTERNAL, f"koord-runtime-proxy: malformed {req.method} request: {err}")

        async def backend(payload: bytes) -> CallResult:
            started = time.perf_counter()
            result = await self.runtime.call(req.method, payload, metadata, timeout)
            self.metrics.stage(req.method, "backend", time.perf_counter() - started)
            return result

        request = self.decode(req.method, message)
        if request is None:
            return await backend(message)
        return await self._lifecycle[req.method][1](request, message, backend)

    # -- hook chains -----------------------------------------------------------------------------
    def _skipped(self, labels) -> bool:
        key, value = self.skip_label
        return labels.get(key) == value

    async def _chain(self, hook: HookType, method: str, build: Callable[[], Message],
                     response_type: type[Message], merge: Callable[[Message], None]) -> CallResult | None:
        """Call every matching hook server in order; an error result only for a Fail pre hook."""
        servers = self.registry.matching(hook) if self.registry is not None else ()
        if not servers:
            return None
        stage = "post_hook" if hook.is_post else "pre_hook"
        started = time.perf_counter()
        try:
            for server in servers:
                t0 = time.perf_counter()
                try:
                    answer = await self.hooks.call(server, hook, build(), response_type, self.hook_timeout_s)
                except HookUnimplemented as err:
                    # no opinion rather than an error: not counted in hook_errors (whose alert would then fire on
                    # every pod resize of a node whose koordlet predates the hook)
                    log.debug("hook server %s (%s) does not serve %s (%s); going on without it",
                              server.name, server.endpoint, hook.value, err)
                    continue
                except HookError as err:
                    self.metrics.hook_errors.labels(server.name, hook.value, server.failure_policy.value).inc()
                    if hook.is_post or server.failure_policy.value == "Ignore":
                        log.warning("hook server %s (%s) %s: %s; going on without it",
                                    server.name, server.endpoint, hook.value, err)
                        continue
                    log.error("hook server %s (%s) %s failed with policy Fail: %s",
                              server.name, server.endpoint, hook.value, err)
                    return CallResult(h2.GRPC_UNKNOWN, f"koord-runtime-proxy: hook server {server.name} "
                                                       f"({server.endpoint}) failed {hook.value} with failure "
                                                       f"policy Fail: {err}")
                finally:
                    self.metrics.hook_duration.labels(server.name, hook.value).observe(time.perf_counter() - t0)
                merge(answer)
            return None
        finally:
            self.metrics.stage(method, stage, time.perf_counter() - started)

    def _rejecter(self, hook: HookType, who: str) -> Callable[[str, object], None]:
        def reject(field: str, value: object) -> None:
            log.warning("%s: hook answer for %s sets %s=%r, which the kernel would refuse; ignored",
                        hook.value, who, field, value)
            self.metrics.bad_hook_values.labels(hook.value, field).inc()
        return reject

    def _merge_container(self, creq: hookapi.ContainerResourceHookRequest, hook: HookType,
                         added: hookapi.ContainerResourceHookResponse | None = None):
        """``added``: collects the answers' devices and mounts (CreateContainer only)."""
        def merge(answer: hookapi.ContainerResourceHookResponse) -> None:
            if added is not None:
                added.container_devices.extend(answer.container_devices)
                added.container_mounts.extend(answer.container_mounts)
            creq.container_annotations.update(answer.container_annotations)
            if answer.HasField("container_resources"):
                merge_resources(creq.container_resources, answer.container_resources,
                                self._rejecter(hook, f"{creq.pod_meta.namespace}/{creq.pod_meta.name}/"
                                                     f"{creq.container_meta.name}"))
            if answer.pod_cgroup_parent:
                creq.pod_cgroup_parent = answer.pod_cgroup_parent
            if answer.container_envs:
                _replace_map(creq.container_envs, answer.container_envs)
        return merge

    async def _container_chain(self, hook: HookType, method: str,
                               creq: hookapi.ContainerResourceHookRequest) -> CallResult | None:
        return await self._chain(hook, method, lambda: creq, hookapi.ContainerResourceHookResponse,
                                 self._merge_container(creq, hook))

    # -- pods --------------------------------------------------------------------------------------
    async def _run_pod_sandbox(self, msg: cri.RunPodSandboxRequest, raw: bytes, backend: Backend) -> CallResult:
        pod = pod_request_from_config(msg.config, msg.runtime_handler)
        payload = raw
        if not self._skipped(pod.labels):
            before = pod.SerializeToString()

            def merge(answer: hookapi.PodSandboxHookResponse) -> None:
                pod.labels.update(answer.labels)
                pod.annotations.update(answer.annotations)
                if answer.cgroup_parent:
                    pod.cgroup_parent = answer.cgroup_parent

            failed = await self._chain(HookType.PRE_RUN_POD_SANDBOX, _PREFIX + "RunPodSandbox", lambda: pod,
                                       hookapi.PodSandboxHookResponse, merge)
            if failed is not None:
                return failed
            if pod.SerializeToString() != before:
                _replace_map(msg.config.labels, pod.labels)
                _replace_map(msg.config.annotations, pod.annotations)
                msg.config.linux.cgroup_parent = pod.cgroup_parent
                payload = msg.SerializeToString()
        result = await backend(payload)
        if result.code == h2.GRPC_OK and result.payload is not None:
            sandbox_id = cri.RunPodSandboxResponse.FromString(result.payload).pod_sandbox_id
            self.store.put_pod(sandbox_id, pod)
        return result

    async def _stop_pod_sandbox(self, msg: cri.StopPodSandboxRequest, raw: bytes, backend: Backend) -> CallResult:
        result = await backend(raw)
        pod = self.store.pods.get(msg.pod_sandbox_id)
        if result.code == h2.GRPC_OK and pod is not None:
            if not self._skipped(pod.labels):
                await self._chain(HookType.POST_STOP_POD_SANDBOX, _PREFIX + "StopPodSandbox", lambda: pod,
                                  hookapi.PodSandboxHookResponse, lambda _answer: None)
            self.store.drop_pod(msg.pod_sandbox_id)
        return result

    async def _update_pod_sandbox_resources(self, msg: cri.UpdatePodSandboxResourcesRequest, raw: bytes,
                                            backend: Backend) -> CallResult:
        """kubelet has resized the pod's own cgroup and tells the runtime (best effort: kubelet goes on whatever the
        answer). The hook servers see the sandbox's request with the call's resources and may change them; the call
        then goes on, and a runtime that does not implement it answers kubelet as it would without the proxy."""
        stored = self.store.pods.get(msg.pod_sandbox_id)
        if stored is None or self._skipped(stored.labels):
            return await backend(raw)
        pod = hookapi.PodSandboxHookRequest()
        pod.CopyFrom(stored)
        pod.overhead.CopyFrom(to_hook_resources(msg.overhead))
        pod.resources.CopyFrom(to_hook_resources(msg.resources))
        before = pod.SerializeToString()
        who = f"{pod.pod_meta.namespace}/{pod.pod_meta.name}"

        def merge(answer: hookapi.PodSandboxHookResponse) -> None:
            if answer.HasField("resources"):
                merge_resources(pod.resources, answer.resources,
                                self._rejecter(HookType.PRE_UPDATE_POD_SANDBOX_RESOURCES, who))

        failed = await self._chain(HookType.PRE_UPDATE_POD_SANDBOX_RESOURCES, _PREFIX + "UpdatePodSandboxResources",
                                   lambda: pod, hookapi.PodSandboxHookResponse, merge)
        if failed is not None:
            return failed
        payload = raw
        if pod.SerializeToString() != before:
            msg.resources.CopyFrom(to_cri_resources(pod.resources))
            payload = msg.SerializeToString()
        result = await backend(payload)
        if result.code == h2.GRPC_OK:
            self.store.put_pod(msg.pod_sandbox_id, pod)
        return result

    # -- containers ---------------------------------------------------------------------------------
    async def _create_container(self, msg: cri.CreateContainerRequest, raw: bytes, backend: Backend) -> CallResult:
        # kubelet sends the sandbox config along: it stands in for a pod the store does not know.
        # A stored pod's cgroup parent is the one its sandbox really got (a PreRunPodSandbox hook may
        # have moved it); Koordinator takes kubelet's here and splits sandbox and containers apart.
        stored = self.store.pods.get(msg.pod_sandbox_id)
        pod = stored or pod_request_from_config(msg.sandbox_config, "")
        parent = stored.cgroup_parent if stored is not None and stored.cgroup_parent else \
            msg.sandbox_config.linux.cgroup_parent
        creq = container_request(pod, msg.config, parent)
        payload = raw
        if not self._skipped(creq.pod_labels):
            before = creq.SerializeToString()
            added = hookapi.ContainerResourceHookResponse()
            failed = await self._chain(HookType.PRE_CREATE_CONTAINER, _PREFIX + "CreateContainer", lambda: creq,
                                       hookapi.ContainerResourceHookResponse,
                                       self._merge_container(creq, HookType.PRE_CREATE_CONTAINER, added))
            if failed is not None:
                return failed
            changed = creq.SerializeToString() != before
            if changed:
                _replace_map(msg.config.annotations, creq.container_annotations)
                msg.config.linux.resources.CopyFrom(to_cri_resources(creq.container_resources))
                msg.sandbox_config.linux.cgroup_parent = creq.pod_cgroup_parent
                _set_envs(msg.config, dict(creq.container_envs))
            who = f"{creq.pod_meta.namespace}/{creq.pod_meta.name}/{creq.container_meta.name}"
            extended = add_devices_and_mounts(msg.config, added, self._rejecter(HookType.PRE_CREATE_CONTAINER, who))
            if changed or extended:
                payload = msg.SerializeToString()
        result = await backend(payload)
        if result.code == h2.GRPC_OK and result.payload is not None:
            container_id = cri.CreateContainerResponse.FromString(result.payload).container_id
            self.store.put_container(container_id, msg.pod_sandbox_id, creq)
        return result

    async def _start_container(self, msg: cri.StartContainerRequest, raw: bytes, backend: Backend) -> CallResult:
        creq = self.store.containers.get(msg.container_id)
        hooked = creq is not None and not self._skipped(creq.pod_labels)
        if hooked:
            before = creq.SerializeToString()
            failed = await self._container_chain(HookType.PRE_START_CONTAINER, _PREFIX + "StartContainer", creq)
            if failed is not None:
                return failed
            if creq.SerializeToString() != before:  # StartContainer has nothing to change: cache only
                self.store.touch_container(msg.container_id)
        result = await backend(raw)
        if hooked and result.code == h2.GRPC_OK:
            await self._container_chain(HookType.POST_START_CONTAINER, _PREFIX + "StartContainer", creq)
        return result

    async def _update_container_resources(self, msg: cri.UpdateContainerResourcesRequest, raw: bytes,
                                          backend: Backend) -> CallResult:
        creq = self.store.containers.get(msg.container_id)
        if creq is None or self._skipped(creq.pod_labels):
            return await backend(raw)
        updated = hookapi.ContainerResourceHookRequest()
        updated.CopyFrom(creq)
        update_from_request(updated.container_resources, msg.linux)  # oom_score_adj deliberately not taken
        updated.container_annotations.update(msg.annotations)
        before = updated.SerializeToString()
        failed = await self._container_chain(HookType.PRE_UPDATE_CONTAINER_RESOURCES,
                                             _PREFIX + "UpdateContainerResources", updated)
        if failed is not None:
            return failed
        payload = raw
        if updated.SerializeToString() != before:
            oom_score_adj = msg.linux.oom_score_adj
            msg.linux.CopyFrom(to_cri_resources(updated.container_resources))
            msg.linux.oom_score_adj = oom_score_adj
            _replace_map(msg.annotations, updated.container_annotations)
            payload = msg.SerializeToString()
        result = await backend(payload)
        if result.code == h2.GRPC_OK:
            self.store.put_container(msg.container_id, self.store.container_sandbox.get(msg.container_id, ""),
                                     updated)
        return result

    async def _stop_container(self, msg: cri.StopContainerRequest, raw: bytes, backend: Backend) -> CallResult:
        result = await backend(raw)
        creq = self.store.containers.get(msg.container_id)
        if result.code == h2.GRPC_OK and creq is not None:
            if not self._skipped(creq.pod_labels):
                await self._container_chain(HookType.POST_STOP_CONTAINER, _PREFIX + "StopContainer", creq)
            self.store.drop_container(msg.container_id)
        return result

    async def _remove_container(self, msg: cri.RemoveContainerRequest, raw: bytes, backend: Backend) -> CallResult:
        result = await backend(raw)
        if result.code == h2.GRPC_OK:
            self.store.drop_container(msg.container_id)
        return result

