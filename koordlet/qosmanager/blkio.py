"""BlkIO QoS (``BlkIOReconcile``, docs/koordinator.md §4.8; Koordinator qosmanager/plugins/blkio): block I/O limits of
the BE class, of single pods, and blk-iocost on the root cgroup, every reconcile interval.

Targets and files (v1 names; the executor writes the v2 ones: ``io.max`` ``rbps/wbps/riops/wiops``,
``io.weight``, ``io.cost.qos``, ``io.cost.model``):
- NodeSLO ``resourceQOSStrategy.beClass.blkioQOS`` → the besteffort QoS dir: per block,
  ``blkio.throttle.{read,write}_{bps,iops}_device`` = ``"<MAJ:MIN> <value>"`` (0 = no limit, the default) and
  ``blkio.cost.weight`` = ``ioWeightPercent`` (default 100);
- the pod annotation ``koordinator.sh/blkioQOS`` (``{"blocks": [...]}``) → the pod's dir, the same files, for
  running pods with a ``koordinator.sh/qosClass`` label (Koordinator skips the others);
- ``resourceQOSStrategy.cgroupRoot.blkioQOS`` → the root cgroup: ``blkio.cost.qos`` = ``"<MAJ:MIN> enable=1
  ctrl=user rpct=<readLatencyPercent, 95> rlat=<readLatency, 3000> wpct=… wlat=…"`` and ``blkio.cost.model`` =
  ``ctrl=auto``, or ``ctrl=user rbps=… rseqiops=… rrandiops=… wbps=… wseqiops=… wrandiops=…`` with
  ``enableUserModel``.
On cgroup v1, blk-throttle is flat (the kernel's blkio docs: hierarchy only with the unreleased
"sane_behavior"): a limit on a dir holds only the processes in that very dir, never its children. So on v1 a
pod's blocks are also written to each of its container dirs (where its processes are; each container then gets
the rate), while the BE class limit on the besteffort dir, as Koordinator writes it, holds nothing of the BE
pods below it (a class-wide shared limit cannot be expressed on v1; it can on v2, where the limits are
hierarchical and the besteffort dir's ``io.max`` holds every BE pod).

A device that a target's files name but its blocks no longer do gets the defaults back (throttles 0, weight
100; ``enable=0`` for the root's qos): so ``enable: false`` removes what koordlet set, and so does an emptied
annotation. LSR/LS blocks are not supported (Koordinator logs and ignores them too).

Blocks resolve through the node's block devices (``koordlet.system.blockdev``): ``device`` by name (a partition
to its disk), ``volumegroup`` to the one disk under its logical volumes. A block that does not resolve leaves
its whole target as it is (never a guessed device), reported in the decision; ``podvolume`` blocks need the
PVC → PV lookup of the API server and are reported as not supported.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from koordlet.api.annotations import AnnotationError, parse_blkio_qos
from koordlet.api.keys import ANNOTATION_BLKIO_QOS
from koordlet.api.nodeslo import (
    BLOCK_TYPE_DEVICE,
    BLOCK_TYPE_VOLUME_GROUP,
    BlkIOQOS,
    BlockCfg,
    NodeSLOSpec,
)
from koordlet.api.pod import PodMeta
from koordlet.api.qos import KubeQoS, QoSClass
from koordlet.plan import CgroupWrite, Plan, WriteStep
from koordlet.qosmanager.framework import GATE_BLKIO_RECONCILE, QoSManagerConfig, Strategy
from koordlet.qosmanager.snapshot import (
    CgroupRead,
    Needs,
    Scope,
    Snapshot,
    container_cgroup_dir,
    pod_cgroup_dir,
)
from koordlet.system.blockdev import BlockResolveError, StorageInfo
from koordlet.system.resources import devices_in

logger = logging.getLogger(__name__)

READ_IOPS, READ_BPS = "blkio.throttle.read_iops_device", "blkio.throttle.read_bps_device"
WRITE_IOPS, WRITE_BPS = "blkio.throttle.write_iops_device", "blkio.throttle.write_bps_device"
IO_WEIGHT, IO_COST_QOS, IO_COST_MODEL = "blkio.cost.weight", "blkio.cost.qos", "blkio.cost.model"
THROTTLE_FILES = (READ_IOPS, READ_BPS, WRITE_IOPS, WRITE_BPS, IO_WEIGHT)  # Koordinator's write order
DEFAULT_IO_WEIGHT_PERCENT = 100
DEFAULT_IO_LATENCY_US = 3000
DEFAULT_LATENCY_PERCENT = 95


def _annotated(pod: PodMeta) -> bool:
    return ANNOTATION_BLKIO_QOS in pod.annotations


_READS = tuple(CgroupRead(name, scope, None if scope is Scope.BESTEFFORT else _annotated)
               for name in THROTTLE_FILES for scope in (Scope.BESTEFFORT, Scope.PODS, Scope.APP_CONTAINERS)
               ) + (CgroupRead(IO_COST_QOS, Scope.ROOT),)


@dataclass(frozen=True, slots=True)
class BlkIOConfig:
    be: BlkIOQOS = BlkIOQOS()
    root: BlkIOQOS = BlkIOQOS()
    ls_blocks_ignored: bool = False  # LSR/LS blocks set (not supported, as in Koordinator)
    enabled: bool = True  # the gate decides; a class with enable=false removes what koordlet set

    @classmethod
    def from_node_slo(cls, spec: NodeSLOSpec, flags: QoSManagerConfig | None = None) -> BlkIOConfig:
        strategy = spec.resource_qos_strategy
        ignored = any(c.blkio_qos.enable and c.blkio_qos.blocks for c in (strategy.lsr_class, strategy.ls_class))
        return cls(strategy.be_class.blkio_qos, strategy.cgroup_root.blkio_qos, ignored)

    @property
    def needs(self) -> Needs:
        return _NEEDS


_NEEDS = Needs(cgroup_reads=_READS, storage=True, kernel_files=(IO_WEIGHT,))


@dataclass(frozen=True, slots=True)
class BlkIODecision:
    """Per target (a cgroup dir, "" for the root): the devices configured, and what kept a target unchanged."""

    configured: tuple[tuple[str, tuple[str, ...]], ...]  # (dir, MAJ:MIN...)
    problems: tuple[str, ...]


def resolve(storage: StorageInfo | None, block: BlockCfg) -> str:
    """MAJ:MIN of a block; BlockResolveError when it does not resolve."""
    if storage is None:
        raise BlockResolveError("the node's block devices are not known")
    if block.block_type == BLOCK_TYPE_DEVICE:
        return storage.device_number(block.name)
    if block.block_type == BLOCK_TYPE_VOLUME_GROUP:
        return storage.volume_group_number(block.name)
    raise BlockResolveError(f"block type {block.block_type!r} needs the PVC → PV lookup of the API server: "
                            "not supported, use device or volumegroup")


def throttle_writes(block: BlockCfg, number: str, cgroup_dir: str, where: str,
                    files: Sequence[str] = THROTTLE_FILES) -> list[CgroupWrite]:
    """The per-device values of one block in ``files`` (Koordinator getBlkIOUpdaterFromBlockCfg: the four
    throttles, unset → 0, and the weight, unset → 100)."""
    io = block.io_cfg
    values = {READ_IOPS: io.read_iops or 0, READ_BPS: io.read_bps or 0, WRITE_IOPS: io.write_iops or 0,
              WRITE_BPS: io.write_bps or 0,
              IO_WEIGHT: io.io_weight_percent if io.io_weight_percent is not None else DEFAULT_IO_WEIGHT_PERCENT}
    return [CgroupWrite(name, cgroup_dir, f"{number} {values[name]}",
                        f"{where}: block {block.name} ({number}) {name.rpartition('.')[2]} = {values[name]}")
            for name in files]


def cost_writes(block: BlockCfg, number: str, where: str) -> list[CgroupWrite]:
    """blk-iocost QoS and model of one block on the root cgroup (Koordinator getDiskConfigUpdaterFromBlockCfg)."""
    io = block.io_cfg

    def pick(value: int | None, default: int) -> int:
        return default if value is None else value

    qos = (f"{number} enable=1 ctrl=user rpct={pick(io.read_latency_percent, DEFAULT_LATENCY_PERCENT)} "
           f"rlat={pick(io.read_latency, DEFAULT_IO_LATENCY_US)} "
           f"wpct={pick(io.write_latency_percent, DEFAULT_LATENCY_PERCENT)} "
           f"wlat={pick(io.write_latency, DEFAULT_IO_LATENCY_US)}")
    if io.enable_user_model:
        model = (f"{number} ctrl=user rbps={io.model_read_bps or 0} rseqiops={io.model_read_seq_iops or 0} "
                 f"rrandiops={io.model_read_rand_iops or 0} wbps={io.model_write_bps or 0} "
                 f"wseqiops={io.model_write_seq_iops or 0} wrandiops={io.model_write_rand_iops or 0}")
    else:
        model = f"{number} ctrl=auto"
    reason = f"{where}: block {block.name} ({number}) blk-iocost"
    return [CgroupWrite(IO_COST_QOS, "", qos, reason), CgroupWrite(IO_COST_MODEL, "", model, reason)]


def _files(snapshot: Snapshot) -> tuple[str, ...]:
    """The per-pod files this kernel has: the throttles always, the weight with blk-iocost (Anolis v1, v2)."""
    return THROTTLE_FILES if IO_WEIGHT in snapshot.kernel_files else THROTTLE_FILES[:4]


def _removals(snapshot: Snapshot, cgroup_dir: str, files: Sequence[str], keep: set[str], root: bool,
              where: str) -> list[CgroupWrite]:
    """Defaults for the devices the files name that no block of the target configures any more."""
    stale: set[str] = set()
    for name in files:
        content = snapshot.cgroup_value(name, cgroup_dir)
        if content is not None:
            stale |= devices_in(content)
    writes: list[CgroupWrite] = []
    for number in sorted(stale - keep):
        reason = f"{where}: no block configures {number} any more"
        if root:
            writes.append(CgroupWrite(IO_COST_QOS, "", f"{number} enable=0", reason))
            continue
        writes += [CgroupWrite(name, cgroup_dir, f"{number} {DEFAULT_IO_WEIGHT_PERCENT if name == IO_WEIGHT else 0}",
                               reason) for name in files]
    return writes


def _target(snapshot: Snapshot, cgroup_dir: str, blocks: Sequence[BlockCfg], root: bool, where: str,
            problems: list[str]) -> tuple[list[CgroupWrite], tuple[str, ...]] | None:
    if root and snapshot.cgroup_value(IO_COST_QOS, "") is None:
        if blocks:
            problems.append(f"{where}: this kernel has no blk-iocost ({IO_COST_QOS}); left unchanged")
        return None
    numbers: list[str] = []
    for block in blocks:
        try:
            numbers.append(resolve(snapshot.storage, block))
        except BlockResolveError as exc:
            problems.append(f"{where}: block {block.name!r} ({block.block_type}): {exc}; left unchanged")
            return None
    files = (IO_COST_QOS,) if root else _files(snapshot)
    writes: list[CgroupWrite] = []
    for block, number in zip(blocks, numbers, strict=True):
        writes += (cost_writes(block, number, where) if root
                   else throttle_writes(block, number, cgroup_dir, where, files))
    writes += _removals(snapshot, cgroup_dir, files, set(numbers), root, where)
    return writes, tuple(numbers)


def _pod_targets(snapshot: Snapshot, problems: list[str]) -> list[tuple[str, tuple[BlockCfg, ...], str]]:
    """(dir, blocks, where) of the annotated pods: the pod dir, and on v1 (flat blk-throttle) its containers'."""
    targets = []
    for pod in snapshot.pods:
        if not _annotated(pod) or pod.qos_label is QoSClass.NONE or pod.phase not in ("Running", ""):
            continue  # Koordinator: annotated, with a QoS class, running ("" = the CRI source: running)
        pod_dir = pod_cgroup_dir(snapshot.layout, pod)
        if pod_dir is None:
            continue
        raw = pod.annotations[ANNOTATION_BLKIO_QOS]
        try:
            qos = parse_blkio_qos(raw) if raw else BlkIOQOS()  # "": no blocks (Koordinator: every limit goes)
        except AnnotationError as exc:
            problems.append(f"pod {pod.key}: {exc}; left unchanged")
            continue
        where = f"pod {pod.key} {ANNOTATION_BLKIO_QOS}"
        targets.append((pod_dir, qos.blocks, where))
        if not snapshot.cgroup_v2:
            for container in pod.containers:
                container_dir = container_cgroup_dir(snapshot.layout, pod_dir, container)
                if container_dir is not None and not container.is_init:
                    targets.append((container_dir, qos.blocks, f"{where}, container {container.name} (v1: flat)"))
    return targets


def decide(snapshot: Snapshot, config: BlkIOConfig) -> Plan:
    """Limits of the BE class, of annotated pods and of the root, one write step per target."""
    problems: list[str] = []
    if config.ls_blocks_ignored:
        problems.append("lsrClass/lsClass blkioQOS blocks are not supported (as in Koordinator); ignored")
    be_dir = snapshot.layout.qos_dir(KubeQoS.BESTEFFORT)
    targets = [(be_dir, config.be.blocks if config.be.enable else (), "beClass blkioQOS", False),
               ("", config.root.blocks if config.root.enable else (), "cgroupRoot blkioQOS", True)]
    targets += [(d, blocks, where, False) for d, blocks, where in _pod_targets(snapshot, problems)]
    steps: list[WriteStep] = []
    configured: list[tuple[str, tuple[str, ...]]] = []
    for cgroup_dir, blocks, where, root in targets:
        done = _target(snapshot, cgroup_dir, blocks, root, where, problems)
        if done is None:
            continue
        writes, numbers = done
        configured.append((cgroup_dir, numbers))
        if writes:
            steps.append(WriteStep(tuple(writes)))
    return Plan(tuple(steps), report=BlkIODecision(tuple(configured), tuple(problems)))


STRATEGY = Strategy("blkio", GATE_BLKIO_RECONCILE, BlkIOConfig, decide)
