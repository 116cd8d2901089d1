"""System config (``SystemConfig``, docs/koordinator.md §4.9; Koordinator qosmanager/plugins/sysreconcile): the node's
sysctls from NodeSLO ``systemStrategy``, every reconcile interval.

- ``minFreeKbytesFactor`` → ``vm.min_free_kbytes`` = node memory capacity in KiB × factor / 10000 (integer
  division), written only within [10 MiB, 10 GiB] (Koordinator's MinFreeKbytesValidator);
- ``watermarkScaleFactor`` → ``vm.watermark_scale_factor``, within [10, 400];
- where the kernel has them (Anolis/Alinux): ``memcgReapBackGround`` → ``/sys/kernel/mm/memcg_reaper/
  reap_background``, ``schedGroupIdentityEnabled`` → ``kernel.sched_group_identity_enabled``,
  ``schedIdleSaverWmark`` → ``kernel.sched_idle_saver_wmark``, ``pageCacheLimitEnabled`` →
  ``/sys/kernel/mm/pagecache_limit/enabled``, and ``schedFeatures`` → one ``NAME``/``NO_NAME`` write to
  ``/sys/kernel/debug/sched_features`` per flag that differs (flags this kernel does not list are skipped).

Beyond Koordinator: the executor records each value before koordlet's first write of it, and a field that is
no longer set (the strategy emptied, the NodeSLO gone) gets that value back at the next tick; with the gate
off the manager puts every recorded value back at start (``koordlet.qosmanager.new_qos_manager``). Values
outside the ranges are never written: the decision reports them.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from koordlet.api.nodeslo import NodeSLOSpec
from koordlet.plan import Plan, SystemAction, SystemRestore, SystemWrite
from koordlet.qosmanager.framework import GATE_SYSTEM_CONFIG, QoSManagerConfig, Strategy
from koordlet.qosmanager.snapshot import Needs, Snapshot
from koordlet.system.sysctl import (
    MEMCG_REAP_BACKGROUND,
    MIN_FREE_KBYTES,
    PAGECACHE_LIMIT_ENABLED,
    SCHED_FEATURES,
    SCHED_GROUP_IDENTITY_ENABLED,
    SCHED_IDLE_SAVER_WMARK,
    SYSTEM_RESOURCES,
    WATERMARK_SCALE_FACTOR,
    parse_sched_features,
)

logger = logging.getLogger(__name__)

_FILES = (MIN_FREE_KBYTES, WATERMARK_SCALE_FACTOR, MEMCG_REAP_BACKGROUND, SCHED_GROUP_IDENTITY_ENABLED,
          SCHED_IDLE_SAVER_WMARK, PAGECACHE_LIMIT_ENABLED, SCHED_FEATURES)
_NEEDS = Needs(system_files=_FILES, pod_usage=None, container_usage=None)


def owns(key: str) -> bool:
    """A recorded key (``name`` or ``sched_features:<NAME>``) of this strategy's files, not another owner's
    (the cold page collector records kidled's settings in the same record)."""
    return key.partition(":")[0] in _FILES


@dataclass(frozen=True, slots=True)
class SystemConfig:
    """``systemStrategy``'s sysctl fields; None = not set (leave the kernel's value, or put it back)."""

    min_free_kbytes_factor: int | None = None
    watermark_scale_factor: int | None = None
    memcg_reap_background: int | None = None
    sched_group_identity_enabled: int | None = None
    sched_idle_saver_wmark: int | None = None
    page_cache_limit_enabled: int | None = None
    sched_features: tuple[tuple[str, bool], ...] = ()
    enabled: bool = True  # something is set; when nothing is, the manager runs decide once more (the undo)

    @classmethod
    def from_node_slo(cls, spec: NodeSLOSpec, flags: QoSManagerConfig | None = None) -> SystemConfig:
        s = spec.system_strategy
        values = (s.min_free_kbytes_factor, s.watermark_scale_factor, s.memcg_reap_background,
                  s.sched_group_identity_enabled, s.sched_idle_saver_wmark, s.page_cache_limit_enabled)
        features = tuple(sorted(s.sched_features.items()))
        return cls(*values, features, any(v is not None for v in values) or bool(features))

    @property
    def needs(self) -> Needs:
        return _NEEDS


@dataclass(frozen=True, slots=True)
class SystemDecision:
    """What each set field asks for: key → value (the key of a sched_features flag is
    ``sched_features:<NAME>``), and the fields that cannot be written, with why."""

    wanted: tuple[tuple[str, str, str], ...]  # (key, value, reason)
    skipped: tuple[str, ...]


def _in_range(name: str, value: int) -> bool:
    resource = SYSTEM_RESOURCES[name]
    return (resource.low is None or value >= resource.low) and (resource.high is None or value <= resource.high)


def min_free_kbytes(memory_capacity_bytes: int, factor: int) -> int:
    """vm.min_free_kbytes for ``factor`` (1/10000 of the node's memory, in KiB; Koordinator calculateMemoryConfig)."""
    return memory_capacity_bytes // 1024 * factor // 10000


def _plain_fields(snapshot: Snapshot, config: SystemConfig) -> list[tuple[str, int, str]]:
    fields: list[tuple[str, int, str]] = []
    if config.min_free_kbytes_factor is not None:
        capacity = snapshot.capacity_memory_bytes
        value = min_free_kbytes(capacity, config.min_free_kbytes_factor)
        fields.append((MIN_FREE_KBYTES, value,
                       f"minFreeKbytesFactor {config.min_free_kbytes_factor}/10000 of {capacity // 1024} KiB"))
    for name, value, key in (
        (WATERMARK_SCALE_FACTOR, config.watermark_scale_factor, "watermarkScaleFactor"),
        (MEMCG_REAP_BACKGROUND, config.memcg_reap_background, "memcgReapBackGround"),
        (SCHED_GROUP_IDENTITY_ENABLED, config.sched_group_identity_enabled, "schedGroupIdentityEnabled"),
        (SCHED_IDLE_SAVER_WMARK, config.sched_idle_saver_wmark, "schedIdleSaverWmark"),
        (PAGECACHE_LIMIT_ENABLED, config.page_cache_limit_enabled, "pageCacheLimitEnabled"),
    ):
        if value is not None:
            fields.append((name, value, f"systemStrategy.{key} {value}"))
    return fields


def decide_values(snapshot: Snapshot, config: SystemConfig) -> SystemDecision:
    """The values the set fields ask for, where this kernel has the file and the value is in range."""
    wanted: list[tuple[str, str, str]] = []
    skipped: list[str] = []
    for name, value, reason in _plain_fields(snapshot, config):
        if name not in snapshot.system_values:
            skipped.append(f"{name}: not on this kernel")
        elif not _in_range(name, value):
            low, high = SYSTEM_RESOURCES[name].low, SYSTEM_RESOURCES[name].high
            skipped.append(f"{name}: {value} outside [{low}, {high}] ({reason})")
        else:
            wanted.append((name, str(value), reason))
    if config.sched_features:
        current = snapshot.system_values.get(SCHED_FEATURES)
        known = parse_sched_features(current) if current is not None else {}
        for flag, on in config.sched_features:
            if flag not in known:
                skipped.append(f"{SCHED_FEATURES}: {flag} not on this kernel")
                continue
            wanted.append((f"{SCHED_FEATURES}:{flag}", flag if on else f"NO_{flag}", f"systemStrategy.schedFeatures "
                           f"{flag}={'true' if on else 'false'}"))
    return SystemDecision(tuple(wanted), tuple(skipped))


def _current(snapshot: Snapshot, key: str) -> str | None:
    name, _, flag = key.partition(":")
    text = snapshot.system_values.get(name)
    if text is None or not flag:
        return text
    on = parse_sched_features(text).get(flag)
    return None if on is None else (flag if on else f"NO_{flag}")


def decide(snapshot: Snapshot, config: SystemConfig) -> Plan:
    """Write what differs from the set fields; put back the recorded values of the fields no longer set."""
    decision = decide_values(snapshot, config) if config.enabled else SystemDecision((), ())
    actions: list[SystemAction] = []
    wanted_keys = set()
    for key, value, reason in decision.wanted:
        wanted_keys.add(key)
        if _current(snapshot, key) != value:
            name = key.partition(":")[0]
            actions.append(SystemWrite(name, value, f"{reason}: {key} {_current(snapshot, key)} -> {value}"))
    for key in sorted(key for key in snapshot.system_recorded - wanted_keys if owns(key)):
        actions.append(SystemRestore(key, f"{key} is no longer set by NodeSLO systemStrategy"))
    for problem in decision.skipped:
        logger.debug("system config: %s", problem)
    return Plan(system=tuple(actions), report=decision)


STRATEGY = Strategy("systemconfig", GATE_SYSTEM_CONFIG, SystemConfig, decide)
