"""The node-wide kernel files koordlet writes beside cgroups: the sysctls of NodeSLO ``systemStrategy``
(docs/koordinator.md §4.9, §10; Koordinator pkg/koordlet/util/system system_resource.go), kidled's two settings
(Anolis; the cold page collector's, Koordinator util/system/kidled_util.go) and the per-process
``oom_score_adj`` (docs/koordinator.md §3.3 OOMScoreAdj).

Each :class:`SystemResource` names the filesystem it lives in (``proc`` → ``proc_dir``, ``sys`` → ``sys_dir``),
its path there, and its valid range; :meth:`SystemResource.path` resolves it under the mount dir the caller
gives. The executor is the one writer (it validates, checks the resolved path stays in that mount dir, and
keeps what was there before its first write so that it can be put back).

Some files exist only on Anolis/Alinux kernels (``memcg_reaper``, ``pagecache_limit``, kidled, the group-identity
sysctls): they are written where present and skipped (``optional``) where not, as Koordinator does.
``sched_features`` is a list of flags, each switched by writing ``NAME`` or ``NO_NAME``
(:func:`parse_sched_features`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from koordlet.system.procfs import read_file_bytes
from wire.kernel_ranges import OOM_SCORE_ADJ_MAX, OOM_SCORE_ADJ_MIN

INT64_MAX = 2**63 - 1
MIN_FREE_KBYTES_MIN, MIN_FREE_KBYTES_MAX = 10 * 1024, 10 * 1024 * 1024  # 10 MiB .. 10 GiB, in KiB
WATERMARK_SCALE_FACTOR_MIN, WATERMARK_SCALE_FACTOR_MAX = 10, 400


class InvalidSystemValueError(ValueError):
    """A value outside a system file's range; it is never written."""


class UnknownSystemResourceError(KeyError):
    """No system resource of that name."""


@dataclass(frozen=True, slots=True)
class SystemResource:
    """One node-wide kernel file: ``fs`` ("proc" or "sys"), its ``relative_path`` under that mount dir, the
    valid range (None: no bound), and whether kernels may lack it (``optional``: Anolis-only files)."""

    name: str
    fs: str
    relative_path: str
    low: int | None = None
    high: int | None = None
    optional: bool = False
    flags: bool = False  # a flag list written one "NAME"/"NO_NAME" at a time (sched_features)

    def path(self, mount_dir: str, pid: int | None = None) -> str:
        relative = self.relative_path.format(pid=pid) if pid is not None else self.relative_path
        return os.path.join(mount_dir, relative)

    def validate(self, value: str | int) -> str:
        """The value as written (an integer in range, or one ``NAME``/``NO_NAME`` flag)."""
        text = str(value).strip()
        if self.flags:
            name = text.removeprefix("NO_")
            if not name or not name.replace("_", "").isalnum() or not name.isascii():
                raise InvalidSystemValueError(f"{self.name}: not a feature flag: {text[:40]!r}")
            return text
        body = text[1:] if text[:1] in "+-" else text
        if not body.isascii() or not body.isdigit():
            raise InvalidSystemValueError(f"{self.name}: not an integer: {text[:40]!r}")
        number = int(text)
        if (self.low is not None and number < self.low) or (self.high is not None and number > self.high):
            raise InvalidSystemValueError(f"{self.name}: {number} outside [{self.low}, {self.high}]")
        return str(number)


MIN_FREE_KBYTES = "min_free_kbytes"
WATERMARK_SCALE_FACTOR = "watermark_scale_factor"
MEMCG_REAP_BACKGROUND = "memcg_reap_background"
SCHED_GROUP_IDENTITY_ENABLED = "sched_group_identity_enabled"
SCHED_IDLE_SAVER_WMARK = "sched_idle_saver_wmark"
PAGECACHE_LIMIT_ENABLED = "pagecache_limit_enabled"
SCHED_FEATURES = "sched_features"
OOM_SCORE_ADJ = "oom_score_adj"
KIDLED_SCAN_PERIOD = "kidled_scan_period_in_seconds"
KIDLED_USE_HIERARCHY = "kidled_use_hierarchy"
UINT32_MAX = 2**32 - 1

_RESOURCES = (
    SystemResource(MIN_FREE_KBYTES, "proc", "sys/vm/min_free_kbytes", MIN_FREE_KBYTES_MIN, MIN_FREE_KBYTES_MAX),
    SystemResource(WATERMARK_SCALE_FACTOR, "proc", "sys/vm/watermark_scale_factor", WATERMARK_SCALE_FACTOR_MIN,
                   WATERMARK_SCALE_FACTOR_MAX),
    SystemResource(MEMCG_REAP_BACKGROUND, "sys", "kernel/mm/memcg_reaper/reap_background", 0, 1, optional=True),
    SystemResource(SCHED_GROUP_IDENTITY_ENABLED, "proc", "sys/kernel/sched_group_identity_enabled", 0, 1,
                   optional=True),
    SystemResource(SCHED_IDLE_SAVER_WMARK, "proc", "sys/kernel/sched_idle_saver_wmark", 0, INT64_MAX,
                   optional=True),
    SystemResource(PAGECACHE_LIMIT_ENABLED, "sys", "kernel/mm/pagecache_limit/enabled", 0, 1, optional=True),
    SystemResource(SCHED_FEATURES, "sys", "kernel/debug/sched_features", optional=True, flags=True),
    SystemResource(KIDLED_SCAN_PERIOD, "sys", "kernel/mm/kidled/scan_period_in_seconds", 0, UINT32_MAX,
                   optional=True),
    SystemResource(KIDLED_USE_HIERARCHY, "sys", "kernel/mm/kidled/use_hierarchy", 0, 1, optional=True),
    SystemResource(OOM_SCORE_ADJ, "proc", "{pid}/oom_score_adj", OOM_SCORE_ADJ_MIN, OOM_SCORE_ADJ_MAX),
)
SYSTEM_RESOURCES: Mapping[str, SystemResource] = MappingProxyType({r.name: r for r in _RESOURCES})


def get_system_resource(name: str) -> SystemResource:
    try:
        return SYSTEM_RESOURCES[name]
    except KeyError:
        raise UnknownSystemResourceError(f"unknown system resource {name!r}") from None


def parse_sched_features(text: str) -> dict[str, bool]:
    """``sched_features`` content (``GENTLE_FAIR_SLEEPERS NO_HRTICK …``) as {name: on}; a name listed both ways
    keeps its first state (Koordinator reports such a conflict and keeps the first)."""
    features: dict[str, bool] = {}
    for word in text.split():
        on = not word.startswith("NO_")
        features.setdefault(word.removeprefix("NO_"), on)
    return features


def read_text(path: str) -> str:
    return read_file_bytes(path).decode("ascii", "replace").strip()
