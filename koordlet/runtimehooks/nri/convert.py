"""NRI's pods and containers as the hook plugins see them, and plugin results as NRI answers.

An answer carries only what differs from the container as it arrives: every field an NRI plugin sets is
owned by it for that container, and containerd fails the creation when two plugins set one field
(docs/nri-protocol.md §4.6). So a value already there (kubelet's, or the proxy's when both front doors are on) is
not set again, and "unlimited" (-1) is not set where the container has no limit.

Fields koordlet sets, and how (docs/nri.md lists them for operators):

| plugin result            | NRI field                              | when                                        |
|--------------------------|----------------------------------------|---------------------------------------------|
| cpu_shares               | linux.resources.cpu.shares             | differs                                     |
| cfs_quota_us             | linux.resources.cpu.quota              | differs (-1 only over a limited quota)      |
|                          | linux.resources.cpu.period = 100000    | a limited quota and no period (as the proxy)|
| cpuset_cpus              | linux.resources.cpu.cpus               | non-empty and differs (NRI cannot clear it) |
| memory_limit_bytes       | linux.resources.memory.limit           | differs (-1 only over a limit)              |
| resctrl_group            | linux.resources.rdt_class              | differs (the group is made at pod level)    |
| cpu_idle (cgroup v2)     | linux.resources.unified["cpu.idle"]    | differs; v1 has no unified files            |
| envs                     | env (adjustment only)                  | absent or different                         |
| devices (RDMA)           | linux.devices (adjustment only)        | no device at that path yet                  |
| mounts (HAMi-core)       | mounts (adjustment only)               | no such mount yet                           |
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from hooks.protocol import Changes, ContainerContext, ContainerResources, LinuxDevice, Mount
from koordlet.api.pod import PodMeta
from koordlet.api.units import CFS_PERIOD_US
from wire import cri_pb2 as cri
from wire import nri_pb2 as api

UNIFIED_CPU_IDLE = "cpu.idle"


def pod_from_nri(pod: api.PodSandbox) -> PodMeta:
    """The pod as the plugins see it: kubelet's labels and annotations as containerd passes them along."""
    return PodMeta(name=pod.name, namespace=pod.namespace, uid=pod.uid, labels=dict(pod.labels),
                   annotations=dict(pod.annotations), cgroup_parent=pod.linux.cgroup_parent, sandbox_id=pod.id)


def envs_of(env: Iterable[str]) -> dict[str, str]:
    """``NAME=value`` entries as a mapping (a later entry wins, as in the process environment)."""
    out: dict[str, str] = {}
    for entry in env:
        name, sep, value = entry.partition("=")
        if sep:
            out[name] = value
    return out


def resources_of(resources: api.LinuxResources) -> ContainerResources:
    """The Linux resources of a request as the plugins' ContainerResources (0 / "" where unset)."""
    cpu, memory = resources.cpu, resources.memory
    return ContainerResources(cpu_shares=cpu.shares.value, cfs_quota_us=cpu.quota.value, cpuset_cpus=cpu.cpus,
                              memory_limit_bytes=memory.limit.value)


def cri_resources(resources: api.LinuxResources) -> cri.LinuxContainerResources:
    """An NRI request's cpu and memory amounts as the CRI call kubelet made carried them."""
    cpu = resources.cpu
    return cri.LinuxContainerResources(cpu_period=cpu.period.value, cpu_quota=cpu.quota.value,
                                       cpu_shares=cpu.shares.value, memory_limit_in_bytes=resources.memory.limit.value)


def container_context(pod: PodMeta, container: api.Container,
                      resources: api.LinuxResources | None = None) -> ContainerContext:
    """``resources``: the ones to decide from (an update's requested resources); default the container's."""
    current = container.linux.resources if resources is None else resources
    return ContainerContext(pod=pod, name=container.name, container_id=container.id,
                            resources=resources_of(current), envs=envs_of(container.env))


def _limited(value: int) -> bool:
    return value > 0


def _unlimited_change(wanted: int, current: int, is_set: bool) -> bool:
    """Whether ``wanted`` changes the current quota / memory limit: -1 (unlimited) only over a limit."""
    if wanted <= 0:
        return is_set and _limited(current)
    return not is_set or wanted != current


def _cpu(changes: Changes, current: api.LinuxCPU, target: api.LinuxCPU) -> None:
    shares = changes.cpu_shares
    if shares is not None and (not current.HasField("shares") or current.shares.value != shares):
        target.shares.value = shares
    quota = changes.cfs_quota_us
    if quota is not None and _unlimited_change(quota, current.quota.value, current.HasField("quota")):
        target.quota.value = quota
        if quota > 0 and current.period.value <= 0:
            target.period.value = CFS_PERIOD_US
    if changes.cpuset_cpus and changes.cpuset_cpus != current.cpus:
        target.cpus = changes.cpuset_cpus


def resources_change(changes: Changes, current: api.LinuxResources, cgroup_v2: bool) -> api.LinuxResources:
    """What ``changes`` changes in ``current``, as LinuxResources (empty when nothing)."""
    out = api.LinuxResources()
    _cpu(changes, current.cpu, out.cpu)
    limit = changes.memory_limit_bytes
    if limit is not None and _unlimited_change(limit, current.memory.limit.value, current.memory.HasField("limit")):
        out.memory.limit.value = limit
    if changes.resctrl_group and current.rdt_class.value != changes.resctrl_group:
        out.rdt_class.value = changes.resctrl_group
    if cgroup_v2 and changes.cpu_idle is not None and current.unified.get(UNIFIED_CPU_IDLE) != str(changes.cpu_idle):
        out.unified[UNIFIED_CPU_IDLE] = str(changes.cpu_idle)
    if not out.cpu.ByteSize():
        out.ClearField("cpu")
    if not out.memory.ByteSize():
        out.ClearField("memory")
    return out


def env_change(changes: Changes, current: Mapping[str, str]) -> list[api.KeyValue]:
    return [api.KeyValue(key=name, value=value) for name, value in sorted(changes.envs.items())
            if current.get(name) != value]


def device_of(device: LinuxDevice) -> api.LinuxDevice:
    return api.LinuxDevice(path=device.path, type=device.type, major=device.major, minor=device.minor,
                           file_mode=api.OptionalFileMode(value=device.file_mode))


def mount_of(mount: Mount) -> api.Mount:
    options = list(mount.options) + (["ro"] if mount.readonly and "ro" not in mount.options else [])
    return api.Mount(destination=mount.destination, type=mount.type, source=mount.source, options=options)


def adjustment(changes: Changes, container: api.Container, cgroup_v2: bool) -> api.ContainerAdjustment:
    """The CreateContainer answer for ``changes`` (empty when the container already is that way)."""
    out = api.ContainerAdjustment()
    resources = resources_change(changes, container.linux.resources, cgroup_v2)
    if resources.ByteSize():
        out.linux.resources.CopyFrom(resources)
    out.env.extend(env_change(changes, envs_of(container.env)))
    # Devices and mounts the plugins add (RDMA device nodes, HAMi-core's files); one the container has already
    # (the proxy's answer when both front doors are on) is not added twice.
    # Only touched when there is something to add: reaching out.linux marks it present, and an empty `linux {}`
    # would make an unchanged container's answer non-empty.
    have_devices = {device.path for device in container.linux.devices}
    devices = [device_of(d) for d in changes.devices if d.path not in have_devices]
    if devices:
        out.linux.devices.extend(devices)
    have_mounts = {(m.destination, m.source) for m in container.mounts}
    mounts = [mount_of(m) for m in changes.mounts if (m.destination, m.source) not in have_mounts]
    if mounts:
        out.mounts.extend(mounts)
    return out


def container_update(container_id: str, changes: Changes, current: api.LinuxResources,
                     cgroup_v2: bool, ignore_failure: bool = False) -> api.ContainerUpdate | None:
    """A ContainerUpdate for ``container_id`` (the id containerd needs to apply it; Koordinator leaves it out,
    its issue 3129), or None when nothing changes."""
    resources = resources_change(changes, current, cgroup_v2)
    if not resources.ByteSize():
        return None
    update = api.ContainerUpdate(container_id=container_id, ignore_failure=ignore_failure)
    update.linux.resources.CopyFrom(resources)
    return update
