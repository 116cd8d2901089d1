"""RDMA device injection (docs/koordinator.md §3.3 RDMADeviceInject; Koordinator runtimehooks/hooks/rdma).

A container of a pod the scheduler gave RDMA devices (``scheduling.koordinator.sh/device-allocated`` ``rdma``
entries) gets ``/dev/infiniband/rdma_cm`` and the ``uverbs`` device of each allocated function: the PF's
(entry ``id``), or, where the entry lists VFs (``extension.vfs``), each VF's instead, mode 0666.

Koordinator adds them through NRI only; here the answer's ``devices`` travel through the proxy too (the
CreateContainer request's devices) and through NRI (the adjustment's devices). A function this node has no
uverbs device for makes the plugin fail for that container (the pod starts without RDMA, the error is
reported), as Koordinator's does.
"""

from __future__ import annotations

from koordlet.api.annotations import parse_rdma_allocated
from koordlet.api.device import ANNOTATION_DEVICE_ALLOCATED

from .protocol import NO_CHANGES, Changes, ContainerContext, LinuxDevice, NodeContext, RDMANode
from .registry import Plugin, Stage, register


def rule(node: NodeContext) -> RDMANode | None:
    return node.rdma


def container(ctx: ContainerContext, rdma: RDMANode | None) -> Changes:
    raw = ctx.pod.annotations.get(ANNOTATION_DEVICE_ALLOCATED)
    if not raw:
        return NO_CHANGES
    allocations = parse_rdma_allocated(raw)
    if not allocations:
        return NO_CHANGES
    if rdma is None or rdma.rdma_cm is None:
        raise ValueError("the scheduler gave this pod RDMA devices but this node has no /dev/infiniband/rdma_cm")
    devices: list[LinuxDevice] = [rdma.rdma_cm]
    for allocation in allocations:
        functions = [vf.bus_id for vf in allocation.vfs] or [allocation.bus_id]
        for bus_id in functions:
            node = rdma.uverbs.get(bus_id)
            if node is None:
                raise ValueError(f"RDMA device {bus_id or '(no id)'} (minor {allocation.minor}) allocated by the "
                                 "scheduler has no uverbs device on this node")
            devices.append(node)
    return Changes(devices=tuple(devices))


PLUGIN = register(Plugin("rdma", "RDMADeviceInject", rule, container=container,
                         stages=frozenset({Stage.PRE_CREATE_CONTAINER})))
