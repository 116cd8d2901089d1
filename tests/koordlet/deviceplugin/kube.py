"""Kubernetes objects for the GPU tests, on the in-repo API server (tests/support/apiserver.py)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import kubernetes.client

from koordlet.api import device as api
from koordlet.kubeapi import CoreV1, CustomObjects, KubeClient
from tests.support.apiserver import ApiServer, kube_api_client


@dataclass
class Kube:
    """The test API server with two kinds of clients on one ApiClient: ``core``/``custom`` (the generated
    kubernetes client, for setting up and inspecting) and ``agent_core``/``agent_custom`` (koordlet.kubeapi, what
    koordlet's code is handed)."""

    server: ApiServer
    core: kubernetes.client.CoreV1Api
    custom: kubernetes.client.CustomObjectsApi
    agent_core: CoreV1
    agent_custom: CustomObjects

    def node(self, name: str) -> dict:
        return self.server.seed({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}})

    def pod(self, manifest: dict) -> dict:
        return self.server.seed(manifest)

    def reset(self) -> None:
        """Forget what a test created, so one server can serve a whole module (starting one is slow); the agent's
        calls get a new client (its own API budget and Event recorder, as a koordlet that starts)."""
        client = KubeClient(self.agent_core.api_client)
        self.agent_core, self.agent_custom = CoreV1(client), CustomObjects(client)
        self.server.clear_failures()
        self.server.clear_requests()
        for pod in self.server.list_objects("pods"):
            meta = pod["metadata"]
            self.core.delete_namespaced_pod(meta["name"], meta["namespace"])
        for node in self.server.list_objects("nodes"):
            self.core.delete_node(node["metadata"]["name"])
        for event in self.server.list_objects("events"):
            meta = event["metadata"]
            self.core.delete_namespaced_event(meta["name"], meta["namespace"])
        for device in self.server.list_objects("devices"):
            self.custom.delete_cluster_custom_object(
                api.DEVICE_GROUP, api.DEVICE_VERSION, api.DEVICE_PLURAL, device["metadata"]["name"]
            )


@contextmanager
def kube_env() -> Iterator[Kube]:
    with ApiServer() as server, kube_api_client(server) as client:
        agent = KubeClient(client)
        yield Kube(server, kubernetes.client.CoreV1Api(client), kubernetes.client.CustomObjectsApi(client),
                   CoreV1(agent), CustomObjects(agent))


def gpu_pod(
    name: str,
    node: str,
    phase: str = "Pending",
    annotations: dict[str, str] | None = None,
    gpus: dict[str, int] | None = None,
    namespace: str = "ns",
) -> dict:
    """A pod whose containers request `nvidia.com/gpu` as given (container name -> count, 0 = none)."""
    containers: list[dict[str, Any]] = []
    for container, count in (gpus or {"main": 1}).items():
        spec: dict[str, Any] = {"name": container, "image": "localhost/busybox"}
        if count:
            spec["resources"] = {"limits": {api.RESOURCE_NVIDIA_GPU: str(count)}}
        containers.append(spec)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "annotations": dict(annotations or {})},
        "spec": {"nodeName": node, "containers": containers},
        "status": {"phase": phase},
    }


def set_node_lock(kube: Kube, node: str, value: str) -> None:
    """Write the node lock annotation as another scheduler would, raw."""
    kube.core.patch_node(node, {"metadata": {"annotations": {api.ANNOTATION_NODE_LOCK: value}}})


def warning_events(kube: Kube) -> list[dict]:
    return [e for e in kube.server.list_objects("events") if e.get("type") == "Warning"]


def node_annotations(kube: Kube, name: str) -> dict[str, str]:
    return kube.core.read_node(name).metadata.annotations or {}


def pod_annotations(kube: Kube, name: str, namespace: str = "ns") -> dict[str, str]:
    return kube.core.read_namespaced_pod(name, namespace).metadata.annotations or {}
