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

Every line goes through the plan runner's recorded writes (``Plan.lines``, :mod:`koordlet.executor.lines`): before
koordlet's first write of a device's line, the line as it was is recorded (persisted, so a restarted agent knows
it too). A line koordlet wrote that no block configures any more (a device dropped, the class or the root switched
off, an annotation emptied or removed, the pod gone) is put back as it was before, and a line koordlet never wrote
is never touched: an operator's own ``io.cost.qos`` line for a disk stays as it is, however the gate, the root's
``blkioQOS`` and the blocks are set (Koordinator writes ``enable=0`` over every device the file lists). A line that
already holds the value (the keys written, numbers as numbers: the kernel prints ``rpct=95.00`` for ``rpct=95``)
is not written again, so the root's ``io.cost.qos`` is not rewritten every ``-resource-force-update-seconds``.
With the gate off, the collector puts every recorded line back (:mod:`koordlet.collector`). LSR/LS blocks are not
supported (Koordinator logs and ignores them too).

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
from koordlet.plan import LineKey, LineRestore, LineWrite, Plan
from koordlet.qosmanager.framework import GATE_BLKIO_RECONCILE, QoSManagerConfig, Strategy
from koordlet.qosmanager.snapshot import (
    CgroupRead,
    Needs,
    Scope,
    Snapshot,
    container_cgroup_dir,
    pod_cgroup_dir,
)
from koordlet.system.blkiolines import IO_WEIGHT_DEFAULT_LINE, holds
from koordlet.system.blockdev import BlockResolveError, StorageInfo
from koordlet.system.resources import device_of

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
               ) + (CgroupRead(IO_COST_QOS, Scope.ROOT), CgroupRead(IO_COST_MODEL, Scope.ROOT))


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


_NEEDS = Needs(cgroup_reads=_READS, storage=True, kernel_files=(IO_WEIGHT,), device_lines=True, pod_usage=None,
               container_usage=None)


@dataclass(frozen=True, slots=True)
class BlkIODecision:
    """Per target (a cgroup dir, "" for the root): the devices configured, and what kept a target unchanged."""

    configured: tuple[tuple[str, tuple[str, ...]], ...]  # (dir, MAJ:MIN...)
    problems: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class _Target:
    cgroup_dir: str
    blocks: tuple[BlockCfg, ...]
    where: str
    root: bool = False


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
                    files: Sequence[str] = THROTTLE_FILES) -> list[LineWrite]:
    """The per-device values of one block in ``files`` (Koordinator getBlkIOUpdaterFromBlockCfg: the four
    throttles, unset → 0, and the weight, unset → 100)."""
    io = block.io_cfg
    values = {READ_IOPS: io.read_iops or 0, READ_BPS: io.read_bps or 0, WRITE_IOPS: io.write_iops or 0,
              WRITE_BPS: io.write_bps or 0,
              IO_WEIGHT: io.io_weight_percent if io.io_weight_percent is not None else DEFAULT_IO_WEIGHT_PERCENT}
    return [LineWrite(name, cgroup_dir, f"{number} {values[name]}",
                      f"{where}: block {block.name} ({number}) {name.rpartition('.')[2]} = {values[name]}")
            for name in files]


def cost_writes(block: BlockCfg, number: str, where: str) -> list[LineWrite]:
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
    return [LineWrite(IO_COST_QOS, "", qos, reason), LineWrite(IO_COST_MODEL, "", model, reason)]


def _files(snapshot: Snapshot) -> tuple[str, ...]:
    """The per-pod files this kernel has: the throttles always, the weight with blk-iocost (Anolis v1, v2)."""
    return THROTTLE_FILES if IO_WEIGHT in snapshot.kernel_files else THROTTLE_FILES[:4]


def _target_writes(snapshot: Snapshot, target: _Target,
                   problems: list[str]) -> tuple[list[LineWrite], tuple[str, ...]] | None:
    """Every line the target's blocks ask for, and their devices; None when the target is to stay as it is."""
    if target.root and snapshot.cgroup_value(IO_COST_QOS, "") is None:
        if target.blocks:
            problems.append(f"{target.where}: this kernel has no blk-iocost ({IO_COST_QOS}); left unchanged")
        return None
    numbers: list[str] = []
    for block in target.blocks:
        try:
            numbers.append(resolve(snapshot.storage, block))
        except BlockResolveError as exc:
            problems.append(f"{target.where}: block {block.name!r} ({block.block_type}): {exc}; left unchanged")
            return None
    writes: list[LineWrite] = []
    for block, number in zip(target.blocks, numbers, strict=True):
        writes += (cost_writes(block, number, target.where) if target.root
                   else throttle_writes(block, number, target.cgroup_dir, target.where, _files(snapshot)))
    return writes, tuple(numbers)


def _pod_targets(snapshot: Snapshot, problems: list[str]) -> tuple[list[_Target], set[str]]:
    """The annotated pods' targets (the pod dir, and on v1 (flat blk-throttle) its containers'), and the dirs of
    annotated pods whose annotation cannot be read (left as they are)."""
    targets: list[_Target] = []
    kept: set[str] = set()
    for pod in snapshot.pods:
        if not _annotated(pod) or pod.qos_label is QoSClass.NONE or pod.phase not in ("Running", ""):
            continue  # Koordinator: annotated, with a QoS class, running ("" = the CRI source: running)
        pod_dir = pod_cgroup_dir(snapshot.layout, pod)
        if pod_dir is None:
            continue
        dirs = [(pod_dir, "")]
        if not snapshot.cgroup_v2:
            dirs += [(container_dir, f", container {container.name} (v1: flat)") for container in pod.containers
                     if not container.is_init
                     and (container_dir := container_cgroup_dir(snapshot.layout, pod_dir, container)) is not None]
        raw = pod.annotations[ANNOTATION_BLKIO_QOS]
        try:
            qos = parse_blkio_qos(raw) if raw else BlkIOQOS()  # "": no blocks (Koordinator: every limit goes)
        except AnnotationError as exc:
            problems.append(f"pod {pod.key}: {exc}; left unchanged")
            kept.update(d.strip("/") for d, _ in dirs)
            continue
        where = f"pod {pod.key} {ANNOTATION_BLKIO_QOS}"
        targets += [_Target(d, qos.blocks, where + suffix) for d, suffix in dirs]
    return targets, kept


def decide(snapshot: Snapshot, config: BlkIOConfig) -> Plan:
    """The lines the BE class, the annotated pods and the root ask for that do not hold yet; the lines koordlet
    wrote that nothing asks for any more, put back as they were."""
    problems: list[str] = []
    if config.ls_blocks_ignored:
        problems.append("lsrClass/lsClass blkioQOS blocks are not supported (as in Koordinator); ignored")
    targets = [_Target(snapshot.layout.qos_dir(KubeQoS.BESTEFFORT), config.be.blocks if config.be.enable else (),
                       "beClass blkioQOS"),
               _Target("", config.root.blocks if config.root.enable else (), "cgroupRoot blkioQOS", root=True)]
    pod_targets, kept = _pod_targets(snapshot, problems)
    wanted: set[LineKey] = set()
    writes: list[LineWrite] = []
    configured: list[tuple[str, tuple[str, ...]]] = []
    for target in targets + pod_targets:
        done = _target_writes(snapshot, target, problems)
        if done is None:
            kept.add(target.cgroup_dir.strip("/"))
            continue
        lines, numbers = done
        configured.append((target.cgroup_dir, numbers))
        for line in lines:
            wanted.add(LineKey.of(line.resource, line.cgroup_dir, device_of(line.value)))
            content = snapshot.cgroup_value(line.resource, line.cgroup_dir)
            if content is None or not holds(line.resource, line.value, content):
                writes.append(line)
    restores = tuple(LineRestore(key.resource, key.cgroup_dir, key.device,
                                 f"no block configures {key.device} for {key.cgroup_dir or 'the root'} any more")
                     for key in sorted(snapshot.lines_recorded - wanted, key=LineKey.text)
                     if key.cgroup_dir not in kept and key.resource != IO_WEIGHT_DEFAULT_LINE)  # that one is BE PSI
    # throttle's (psithrottle.py), recorded beside these
    return Plan(lines=tuple(writes) + restores, report=BlkIODecision(tuple(configured), tuple(problems)))


STRATEGY = Strategy("blkio", GATE_BLKIO_RECONCILE, BlkIOConfig, decide)
