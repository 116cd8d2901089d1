"""A CRI client shaped like kubelet's calls, and a pod factory that removes what it made."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

import grpc

from wire import cri_pb2 as cri
from wire import cri_pb2_grpc as cri_grpc

from .containerd import CGROUP_ROOT, IMAGE

_OPTIONS = [("grpc.max_receive_message_length", 16 << 20)]


class CriClient:
    def __init__(self, socket_path: str) -> None:
        self.channel = grpc.insecure_channel(f"unix://{socket_path}", options=_OPTIONS)
        self.runtime = cri_grpc.RuntimeServiceStub(self.channel)
        self.image = cri_grpc.ImageServiceStub(self.channel)

    def close(self) -> None:
        self.channel.close()


def pod_cgroup_parent(uid: str, kube_qos: str = "besteffort", cgroup_root: str = CGROUP_ROOT) -> str:
    qos_dir = "" if kube_qos == "guaranteed" else f"/{kube_qos}"
    return f"{cgroup_root}/kubepods{qos_dir}/pod{uid}"


def sandbox_config(name: str, uid: str | None = None, kube_qos: str = "besteffort",
                   labels: dict[str, str] | None = None,
                   annotations: dict[str, str] | None = None, cgroup_root: str = CGROUP_ROOT) -> cri.PodSandboxConfig:
    uid = uid or str(uuid.uuid4())
    # Host-network sandboxes with an empty hostname: what kubelet sends for hostNetwork pods, and
    # what works here without CNI (docs/design.md §7).
    return cri.PodSandboxConfig(
        metadata=cri.PodSandboxMetadata(name=name, uid=uid, namespace="default", attempt=0),
        labels=labels or {}, annotations=annotations or {},
        linux=cri.LinuxPodSandboxConfig(
            cgroup_parent=pod_cgroup_parent(uid, kube_qos, cgroup_root),
            security_context=cri.LinuxSandboxSecurityContext(
                namespace_options=cri.NamespaceOption(network=cri.NODE, pid=cri.CONTAINER, ipc=cri.POD)),
        ),
    )


def container_config(name: str, command: list[str] | None = None,
                     resources: cri.LinuxContainerResources | None = None,
                     envs: dict[str, str] | None = None,
                     annotations: dict[str, str] | None = None) -> cri.ContainerConfig:
    return cri.ContainerConfig(
        metadata=cri.ContainerMetadata(name=name, attempt=0),
        image=cri.ImageSpec(image=IMAGE),
        # A shell that exits on SIGTERM, so StopContainer does not wait for its timeout.
        command=command or ["sh", "-c", "trap 'exit 0' TERM; sleep 3600 & wait"],
        envs=[cri.KeyValue(key=k, value=v.encode()) for k, v in (envs or {}).items()],
        annotations=annotations or {},
        linux=cri.LinuxContainerConfig(resources=resources or cri.LinuxContainerResources()),
    )


@dataclass
class PodFactory:
    """Creates pods and containers through a CRI client; cleanup() removes all of them."""

    client: CriClient
    cgroup_root: str = CGROUP_ROOT
    sandboxes: list[str] = field(default_factory=list)
    containers: list[str] = field(default_factory=list)

    def run_pod(self, config: cri.PodSandboxConfig, timeout: float = 60) -> str:
        sid = self.client.runtime.RunPodSandbox(cri.RunPodSandboxRequest(config=config), timeout=timeout).pod_sandbox_id
        self.sandboxes.append(sid)
        return sid

    def create_container(self, sandbox_id: str, sandbox: cri.PodSandboxConfig,
                         config: cri.ContainerConfig, timeout: float = 60) -> str:
        cid = self.client.runtime.CreateContainer(
            cri.CreateContainerRequest(pod_sandbox_id=sandbox_id, config=config, sandbox_config=sandbox),
            timeout=timeout).container_id
        self.containers.append(cid)
        return cid

    def start_pod(self, name: str, resources: cri.LinuxContainerResources | None = None,
                  kube_qos: str = "besteffort", **kw: object) -> tuple[str, str, cri.PodSandboxConfig]:
        sandbox = sandbox_config(name, kube_qos=kube_qos, labels=kw.pop("labels", None),  # type: ignore[arg-type]
                                 annotations=kw.pop("annotations", None),  # type: ignore[arg-type]
                                 cgroup_root=self.cgroup_root)
        sid = self.run_pod(sandbox)
        cid = self.create_container(sid, sandbox, container_config(name, resources=resources, **kw))  # type: ignore[arg-type]
        self.client.runtime.StartContainer(cri.StartContainerRequest(container_id=cid), timeout=60)
        return sid, cid, sandbox

    def cleanup(self) -> None:
        rt = self.client.runtime
        for cid in reversed(self.containers):
            try:
                rt.StopContainer(cri.StopContainerRequest(container_id=cid, timeout=0), timeout=30)
                rt.RemoveContainer(cri.RemoveContainerRequest(container_id=cid), timeout=30)
            except grpc.RpcError:
                pass
        for sid in reversed(self.sandboxes):
            try:
                rt.StopPodSandbox(cri.StopPodSandboxRequest(pod_sandbox_id=sid), timeout=30)
                rt.RemovePodSandbox(cri.RemovePodSandboxRequest(pod_sandbox_id=sid), timeout=30)
            except grpc.RpcError:
                pass
        self.containers.clear()
        self.sandboxes.clear()
