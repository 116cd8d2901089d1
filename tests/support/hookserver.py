"""A hook server for tests: a real runtime.v1alpha1.RuntimeHookService gRPC server on a unix socket
that records what it is asked and answers as the test tells it (echo with changes, hang, garbage,
errors), plus its registration file."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass, field

import grpc

from tests.support.waiting import wait_for as poll
from wire import hookapi_pb2 as hookapi

_TYPES = {
    "PreRunPodSandbox": (hookapi.PodSandboxHookRequest, hookapi.PodSandboxHookResponse),
    "PostStopPodSandbox": (hookapi.PodSandboxHookRequest, hookapi.PodSandboxHookResponse),
    "PreUpdatePodSandboxResources": (hookapi.PodSandboxHookRequest, hookapi.PodSandboxHookResponse),
}
_CONTAINER = (hookapi.ContainerResourceHookRequest, hookapi.ContainerResourceHookResponse)


def echo(request):
    """The full desired state answer of a compatible hook server: the request, as a response."""
    if isinstance(request, hookapi.PodSandboxHookRequest):
        return hookapi.PodSandboxHookResponse(labels=request.labels, annotations=request.annotations,
                                              cgroup_parent=request.cgroup_parent)
    return hookapi.ContainerResourceHookResponse(
        container_annotations=request.container_annotations, container_resources=request.container_resources,
        pod_cgroup_parent=request.pod_cgroup_parent, container_envs=request.container_envs)


Behaviour = Callable[[str, object], object]  # (hook type, request) -> response | bytes | raises


@dataclass
class RecordingHookServer:
    socket_path: str
    behaviour: Behaviour = field(default=lambda hook, request: echo(request))
    calls: list[tuple[str, object]] = field(default_factory=list)
    server: grpc.Server | None = None
    # the hooks it serves (None: all); gRPC answers UNIMPLEMENTED for the others, as a hook server that predates
    # a hook does (Koordinator's koordlet asked PreUpdatePodSandboxResources)
    serves: frozenset[str] | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> RecordingHookServer:
        outer = self

        class Generic(grpc.GenericRpcHandler):
            def service(self, details: grpc.HandlerCallDetails):
                hook = details.method.rsplit("/", 1)[-1].removesuffix("Hook")
                if outer.serves is not None and hook not in outer.serves:
                    return None
                request_type, _ = _TYPES.get(hook, _CONTAINER)

                def handle(raw: bytes, context: grpc.ServicerContext) -> bytes:
                    request = request_type.FromString(raw)
                    with outer._lock:
                        outer.calls.append((hook, request))
                    answer = outer.behaviour(hook, request)
                    return answer if isinstance(answer, bytes) else answer.SerializeToString()

                return grpc.unary_unary_rpc_method_handler(handle)

        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4), handlers=[Generic()])
        self.server.add_insecure_port(f"unix://{self.socket_path}")
        self.server.start()
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop(0).wait(5)
            self.server = None
        if os.path.exists(self.socket_path):
            os.unlink(self.socket_path)

    def hooks_called(self) -> list[str]:
        with self._lock:
            return [h for h, _ in self.calls]

    def requests(self, hook: str) -> list:
        with self._lock:
            return [r for h, r in self.calls if h == hook]

    def wait_for(self, hook: str, count: int = 1, timeout_s: float = 10) -> list:
        found = poll(lambda: (calls if len(calls := self.requests(hook)) >= count else []), timeout_s)
        if not found:
            raise TimeoutError(f"{hook} called {len(self.requests(hook))} times, expected {count}")
        return found


ALL_HOOKS = ["PreRunPodSandbox", "PostStopPodSandbox", "PreCreateContainer", "PreStartContainer",
             "PostStartContainer", "PreUpdateContainerResources", "PostStopContainer"]


def register(directory: str, name: str, endpoint: str, hooks: list[str] | None = None,
             policy: str | None = "Ignore") -> str:
    os.makedirs(directory, exist_ok=True)
    doc: dict = {"remote-endpoint": endpoint, "runtime-hooks": hooks or ALL_HOOKS}
    if policy is not None:
        doc["failure-policy"] = policy
    path = os.path.join(directory, name)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f)
    os.replace(tmp, path)
    return path
