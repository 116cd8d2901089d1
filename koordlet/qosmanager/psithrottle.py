"""BE PSI throttle (gate ``BEPSIThrottle``, cgroup v2): the LS pods' pressure steers the BE pods' CPU and IO.

Koordinator acts on PSI nowhere (its ``PSIReconcile``, PR #3106, is unmerged); koordlet-py already steers BE memory
reclaim by it (memoryreclaim.py). This strategy is koordlet-py's: NodeSLO ``extensions.bePSIThrottleStrategy``
(koordlet.api.nodeslo.BEPSIThrottleStrategy, docs/colocation.md "BE CPU and IO steered by the LS pods' pressure").

Every tick (``-reconcile-interval-seconds``) it reads the ``cpu.pressure`` and ``io.pressure`` of every LS pod
(every pod not BE) and takes, per resource, the highest ``some avg10``: the share of the last ten seconds in which
some task of that pod was ready to run (or waiting for IO) and could not. Each resource has a level, 0 when BE is
not held back:

- CPU, the besteffort QoS dir's ``cpu.max``: at level k the BE pods together may use
  ``max(100 − k × cpuStepPercent, cpuMinPercent)`` percent of the node's CPUs (level 0: ``max``, no limit). A CPU
  limit, not ``cpu.weight``: the besteffort dir's weight is already kubelet's minimum (2 shares), so weights cannot
  take more from BE; what delays an LS task beside a BE burner is a CPU busy with BE work when it wakes, and only
  a limit leaves CPUs idle;
- IO, the besteffort dir's ``io.weight`` default line: at level k ``max(100 / 2^k, ioMinWeight)``; at level 0 the
  line koordlet found there before its first write (100, the kernel's default, unless someone set another). It
  takes effect where blk-iocost is on for the device (``io.cost.qos``, the NodeSLO's ``cgroupRoot.blkioQOS``); the
  per-device lines of ``beClass.blkioQOS`` win over it (the kernel's rule). The line is written as blkio lines are
  (``Plan.lines``, :mod:`koordlet.executor.lines`): recorded before koordlet's first write, put back from that record.

A level goes one step up when its pressure is at or above its threshold and the last step of that resource was at
least ``stepIntervalSeconds`` ago (``avg10`` trails a change by seconds: stepping every tick would overshoot); it
comes one step back after its pressure has stayed below ``releasePercent`` of the threshold for
``releaseIntervalSeconds`` (and one more step each such interval after); between the two it holds. That gap is the
hysteresis: a limit that relieves the LS pods lowers their pressure, and it must not be lifted at once for it.

Every tick writes the values of the current levels (the executor skips what is already there); each write is
audited with the step and its figures (reason ``BEPSIThrottle``), and shows in ``koordlet explain`` of a BE pod
(the last actions on its QoS dir). Who owns the besteffort dir's quota is :func:`koordlet.api.cfsquota.
be_quota_owner`: CPU suppress under its ``cfsQuota`` policy (then this strategy leaves CPU alone and steers IO
only), else this strategy while it is on. Switched off by the NodeSLO it gives both back at once (``max``, the
recorded IO line); with its gate off, CPU suppress (on by default) owns the quota again and sets it to ``max`` at
its first tick, and the collector puts the recorded IO line back (koordlet/collector.py). On cgroup v1 (PSI per
cgroup needs the unified hierarchy) the strategy says so once and does nothing.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace

from koordlet.api.cfsquota import be_quota_suppressed
from koordlet.api.nodeslo import NodeSLOSpec
from koordlet.api.qos import KubeQoS
from koordlet.api.units import CFS_PERIOD_US, UNLIMITED
from koordlet.plan import CgroupWrite, LineKey, LineRestore, LineWrite, Plan, WriteStep
from koordlet.qosmanager.framework import GATE_BE_CPU_SUPPRESS, GATE_BE_PSI_THROTTLE, QoSManagerConfig, Strategy
from koordlet.qosmanager.snapshot import CgroupRead, LSPressure, Needs, Scope, Snapshot, is_be, ls_pressure
from koordlet.system.blkiolines import DEFAULT_WEIGHT, IO_WEIGHT_DEFAULT_LINE
from wire.kernel_ranges import CFS_QUOTA_MIN_US

logger = logging.getLogger(__name__)

AUDIT_REASON = "BEPSIThrottle"
IO_WEIGHT = IO_WEIGHT_DEFAULT_LINE
IO_WEIGHT_DEFAULT = DEFAULT_WEIGHT  # the kernel's io.weight default
# every tick, whatever the collectors read less often: the pressure of every LS pod, read by the snapshot; no usage
_NEEDS = Needs(cgroup_reads=(CgroupRead("cpu.pressure", Scope.PODS, lambda pod: not is_be(pod)),
                             CgroupRead("io.pressure", Scope.PODS, lambda pod: not is_be(pod))),
               kernel_files=(IO_WEIGHT,), device_lines=True, pod_usage=None, container_usage=None)
CPU, IO = "cpu", "io"


@dataclass(frozen=True, slots=True)
class PSIThrottleConfig:
    enabled: bool = False  # extensions.bePSIThrottleStrategy.enable
    cpu_threshold_percent: int = 10
    io_threshold_percent: int = 10
    release_percent: int = 50
    step_interval_s: float = 4.0
    release_interval_s: float = 10.0
    cpu_step_percent: int = 25
    cpu_min_percent: int = 25
    io_min_weight: int = 1
    steers_cpu: bool = True  # False: CPU suppress owns the besteffort quota (its cfsQuota policy)

    @classmethod
    def from_node_slo(cls, spec: NodeSLOSpec, flags: QoSManagerConfig | None = None) -> PSIThrottleConfig:
        s = spec.be_psi_throttle_strategy
        suppress = flags.gate(GATE_BE_CPU_SUPPRESS) if flags is not None else True
        # the quota is this strategy's unless CPU suppress's cfsQuota policy has it (api/cfsquota.be_quota_owner)
        return cls(s.enable, s.cpu_pressure_threshold_percent, s.io_pressure_threshold_percent, s.release_percent,
                   float(s.step_interval_seconds), float(s.release_interval_seconds), s.cpu_step_percent,
                   s.cpu_min_percent, s.io_min_weight, not (suppress and be_quota_suppressed(spec)))

    @property
    def needs(self) -> Needs:
        return _NEEDS

    def threshold(self, resource: str) -> int:
        return self.cpu_threshold_percent if resource == CPU else self.io_threshold_percent

    def max_level(self, resource: str) -> int:
        """The level past which a step takes nothing more."""
        if resource == CPU:
            return -(-(100 - self.cpu_min_percent) // self.cpu_step_percent)
        level = 0
        while IO_WEIGHT_DEFAULT >> level > self.io_min_weight:
            level += 1
        return level


@dataclass(frozen=True, slots=True)
class Level:
    """One resource's level, when it last changed, and since when its pressure has been below the release mark."""

    level: int = 0
    changed_at: float | None = None
    calm_since: float | None = None


@dataclass(frozen=True, slots=True)
class ThrottleMemo:
    cpu: Level = Level()
    io: Level = Level()
    off_because: str = ""  # said once


@dataclass(frozen=True, slots=True)
class Step:
    """What one resource did this tick: its level before and after, and the pressure that decided it."""

    resource: str
    before: int
    after: int
    pressure: LSPressure | None
    threshold: int


def cpu_limit_cores(level: int, config: PSIThrottleConfig, cpus: float) -> float | None:
    """The BE pods' CPU limit at ``level`` (cores), None at level 0 (no limit)."""
    if level <= 0:
        return None
    return cpus * max(100 - level * config.cpu_step_percent, config.cpu_min_percent) / 100


def io_weight(level: int, config: PSIThrottleConfig) -> int:
    return max(IO_WEIGHT_DEFAULT >> level, config.io_min_weight) if level > 0 else IO_WEIGHT_DEFAULT


def next_level(state: Level, pressure: LSPressure | None, config: PSIThrottleConfig, resource: str,
               now: float) -> Level:
    """One resource's level after this tick (module docstring: step up, hold, step back)."""
    if pressure is None:
        return replace(state, calm_since=None)  # no LS pod read: nothing to go by, hold
    threshold = config.threshold(resource)
    settled = state.changed_at is None or now - state.changed_at >= config.step_interval_s
    if pressure.percent >= threshold:
        if settled and state.level < config.max_level(resource):
            return Level(state.level + 1, now, None)
        return replace(state, calm_since=None)
    if pressure.percent >= threshold * config.release_percent / 100:
        return replace(state, calm_since=None)
    calm_since = state.calm_since if state.calm_since is not None else now
    released = state.changed_at is None or now - state.changed_at >= config.release_interval_s
    if state.level > 0 and now - calm_since >= config.release_interval_s and released:
        return Level(state.level - 1, now, now)
    return replace(state, calm_since=calm_since)


def _describe(step: Step, config: PSIThrottleConfig, cpus: float) -> str:
    if step.resource == CPU:
        limit = cpu_limit_cores(step.after, config, cpus)
        value = f"BE CPU limit {limit:.2f} of {cpus:g} cores" if limit is not None else "BE CPU unlimited"
    else:
        value = f"BE io.weight {io_weight(step.after, config)}" if step.after else "BE io.weight as it was"
    move = ("step " + f"{step.before} -> {step.after}" if step.after != step.before else f"held at step {step.after}")
    pressure = (f"LS {step.resource} pressure some avg10 {step.pressure.percent:.2f}% ({step.pressure.pod})"
                if step.pressure is not None else f"no LS {step.resource} pressure read")
    return f"{step.resource.upper()} {move}: {value}; {pressure}, threshold {step.threshold}%"


def _io_restores(snapshot: Snapshot, why: str) -> tuple[LineRestore, ...]:
    """Put back the IO line(s) this strategy recorded (the besteffort dir's, or one a layout before it used)."""
    return tuple(LineRestore(key.resource, key.cgroup_dir, key.device, why)
                 for key in sorted(snapshot.lines_recorded, key=LineKey.text) if key.resource == IO_WEIGHT)


def _plan(memo: ThrottleMemo, config: PSIThrottleConfig, snapshot: Snapshot, steer_io: bool, why: str,
          report: object = None) -> Plan:
    """The current levels' values: the quota (when the strategy owns it), and the IO line (written at a level,
    put back at level 0)."""
    be_dir = snapshot.layout.qos_dir(KubeQoS.BESTEFFORT)
    steps: tuple[WriteStep, ...] = ()
    if config.steers_cpu:
        limit = cpu_limit_cores(memo.cpu.level, config, snapshot.capacity_cpu_milli / 1000)
        quota = UNLIMITED if limit is None else max(int(limit * CFS_PERIOD_US), CFS_QUOTA_MIN_US)
        steps = (WriteStep((CgroupWrite("cpu.cfs_quota_us", be_dir, quota),)),)
    lines: tuple[LineWrite | LineRestore, ...] = ()
    if steer_io and memo.io.level > 0:
        lines = (LineWrite(IO_WEIGHT, be_dir, f"default {io_weight(memo.io.level, config)}"),)
    elif steer_io:
        lines = _io_restores(snapshot, "BE IO not throttled")
    return Plan(steps, lines=lines, memo=memo, report=report, reason=AUDIT_REASON, why=why)


def _off(snapshot: Snapshot) -> str:
    """Why the strategy cannot act on this node, or ""."""
    if not snapshot.cgroup_v2:
        return "BE PSI throttle off: it needs cgroup v2 (per-cgroup PSI and cpu.max); this node has cgroup v1"
    return ""


def _give_back(snapshot: Snapshot, config: PSIThrottleConfig, why: str) -> Plan:
    return _plan(ThrottleMemo(), config, snapshot, IO_WEIGHT in snapshot.kernel_files, why)


def decide(snapshot: Snapshot, config: PSIThrottleConfig) -> Plan:
    """Step the BE pods' CPU limit and IO weight by the LS pods' pressure (module docstring)."""
    memo = snapshot.memo if isinstance(snapshot.memo, ThrottleMemo) else ThrottleMemo()
    off = _off(snapshot)
    if off:
        if off != memo.off_because:
            logger.warning("%s", off)
        return Plan(memo=ThrottleMemo(off_because=off))
    if not config.enabled:
        return _give_back(snapshot, config, "BE PSI throttle off (extensions.bePSIThrottleStrategy.enable false): "
                                            "BE CPU unlimited, BE io.weight as it was before")
    steer_io = IO_WEIGHT in snapshot.kernel_files
    if not steer_io and memo.off_because != "io":
        logger.info("BE PSI throttle: this kernel has no io.weight (blk-iocost); BE IO is not steered")
    now = snapshot.timestamp
    cpus = snapshot.capacity_cpu_milli / 1000
    steps = []
    levels = {}
    for resource, state in ((CPU, memo.cpu), (IO, memo.io)):
        pressure = ls_pressure(snapshot, f"{resource}.pressure")
        steered = config.steers_cpu if resource == CPU else steer_io
        after = next_level(state, pressure, config, resource, now) if steered else Level()
        levels[resource] = after
        steps.append(Step(resource, state.level, after.level, pressure, config.threshold(resource)))
    new_memo = ThrottleMemo(levels[CPU], levels[IO], off_because="" if steer_io else "io")
    for step in steps:
        if step.after != step.before:
            logger.info("BE PSI throttle: %s", _describe(step, config, cpus))
    why = "; ".join(_describe(step, config, cpus) for step in steps
                    if (config.steers_cpu if step.resource == CPU else steer_io))
    if not config.steers_cpu:
        why += "; CPU left to CPU suppress (its cfsQuota policy owns the besteffort quota)"
    return _plan(new_memo, config, snapshot, steer_io, why, tuple(steps))


STRATEGY = Strategy("psithrottle", GATE_BE_PSI_THROTTLE, PSIThrottleConfig, decide)
