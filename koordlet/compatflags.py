"""Flags of Koordinator v1.8.0's koordlet binary that koordlet-py accepts but does not act on.

Koordinator's chart (and any DaemonSet written for its koordlet) may pass any flag that binary registers, and Go's
flag package refuses an unknown one, so a drop-in must take them all: Koordinator's own (cmd/koordlet and every
``InitFlags`` of pkg/koordlet), klog's (``klog.InitFlags``), and those its dependencies register on
``flag.CommandLine`` when imported (cAdvisor's, through kubelet's ``cmd/kubelet/app/options``). The flags we act
on are declared where they act (koordlet/config.py, koordlet/logs.py); the rest are here, one row each, with the
reason they do nothing here. Each is parsed with its Go type (a bad value is still refused with Go's message),
and the ones given are named in one log line at start (:func:`koordlet.main.main`). docs/configuration.md lists
them. To give one a meaning, delete its row and declare it in config.py.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from koordlet import goflag

_TRACE_LOCATION = goflag.value_kind("traceLocation", lambda text: _trace_location(text))


def _trace_location(text: str) -> str:
    """klog's -log_backtrace_at (``file.go:234``)."""
    if not text:
        return text
    file_name, sep, line = text.partition(":")
    if not sep or ":" in line or "." not in file_name:
        raise ValueError("syntax error: expect file.go:234")
    try:
        number = goflag.parse_int(line, 10)  # strconv.Atoi
    except goflag.NumError as err:
        raise ValueError("syntax error: expect file.go:234") from err
    if number <= 0:
        raise ValueError("negative or zero value for level")
    return text


@dataclass(frozen=True, slots=True)
class UnusedFlag:
    name: str
    kind: goflag.Kind
    default: object
    why: str  # why it does nothing here (docs/configuration.md shows it)


_TSDB = "koordlet-py's metric cache is bounded rings in memory, no TSDB"
_CADVISOR = "cAdvisor's, registered in Koordinator's binary by kubelet's packages; koordlet-py has no cAdvisor"

UNUSED_FLAGS: tuple[UnusedFlag, ...] = (
    # cmd/koordlet/options
    UnusedFlag("enable-pprof", goflag.BOOL, False, "Go's pprof; Python has none"),
    UnusedFlag("pprof-addr", goflag.STRING, ":9317", "Go's pprof; Python has none"),
    # pkg/koordlet/config
    UnusedFlag("configmap-name", goflag.STRING, "koordlet-config", "koordlet-config ConfigMap is not read"),
    UnusedFlag("configmap-namespace", goflag.STRING, "koordinator-system", "koordlet-config ConfigMap is not read"),
    # pkg/koordlet/util/system
    UnusedFlag("docker-endpoint", goflag.STRING, "", "only containerd is supported"),
    UnusedFlag("pouch-endpoint", goflag.STRING, "", "only containerd is supported"),
    # pkg/koordlet/metricsadvisor/framework
    UnusedFlag("collect-sys-metric-outdated-interval", goflag.DURATION, 10.0,
               "staleness follows each collector's own interval"),
    UnusedFlag("collect-node-storage-info-interval", goflag.DURATION, 1.0, "no node storage collector"),
    # pkg/koordlet/metriccache
    UnusedFlag("metric-gc-interval-seconds", goflag.INT, 300, _TSDB),
    UnusedFlag("metric-expire-seconds", goflag.INT, 1800, _TSDB),
    UnusedFlag("tsdb-path", goflag.STRING, "/metric-data/", _TSDB),
    UnusedFlag("tsdb-retention-duration", goflag.DURATION, 12 * 3600.0, _TSDB),
    UnusedFlag("tsdb-enable-prometheus-metric", goflag.BOOL, True, _TSDB),
    UnusedFlag("tsdb-stripe-size", goflag.INT, 16384, _TSDB),
    UnusedFlag("tsdb-max-bytes", goflag.INT64, 100 << 20, _TSDB),
    UnusedFlag("tsdb-wal-segment-size", goflag.INT, 1 << 20, _TSDB),
    UnusedFlag("tsdb-max-block-chunk-segment-size", goflag.INT64, 5 << 20, _TSDB),
    UnusedFlag("tsdb-min-block-duration", goflag.DURATION, 600.0, _TSDB),
    UnusedFlag("tsdb-max-block-duration", goflag.DURATION, 600.0, _TSDB),
    UnusedFlag("tsdb-head-chunks-write-buffer-size", goflag.INT, 1 << 20, _TSDB),
    # klog
    UnusedFlag("add_dir_header", goflag.BOOL, False, "log lines carry no source file"),
    UnusedFlag("one_output", goflag.BOOL, False, "one log file is written, not one per severity"),
    UnusedFlag("skip_log_headers", goflag.BOOL, False, "log files get no header block"),
    UnusedFlag("log_backtrace_at", _TRACE_LOCATION, "", "Go source lines; no such thing here"),
    # cAdvisor v0.53.0 (container/common, containerd, docker, raw, machine, manager, storage)
    # (their defaults are not repeated here: nothing reads these values)
    *(UnusedFlag(name, kind, None, _CADVISOR) for name, kind in (
        ("allow_dynamic_housekeeping", goflag.BOOL),
        ("application_metrics_count_limit", goflag.INT),
        ("boot_id_file", goflag.STRING),
        ("container_hints", goflag.STRING),
        ("containerd", goflag.STRING),
        ("containerd-namespace", goflag.STRING),
        ("containerd_env_metadata_whitelist", goflag.STRING),
        ("disable_root_cgroup_stats", goflag.BOOL),
        ("docker", goflag.STRING),
        ("docker-tls", goflag.BOOL),
        ("docker-tls-ca", goflag.STRING),
        ("docker-tls-cert", goflag.STRING),
        ("docker-tls-key", goflag.STRING),
        ("docker_env_metadata_whitelist", goflag.STRING),
        ("docker_only", goflag.BOOL),
        ("docker_root", goflag.STRING),
        ("enable_load_reader", goflag.BOOL),
        ("event_storage_age_limit", goflag.STRING),
        ("event_storage_event_limit", goflag.STRING),
        ("global_housekeeping_interval", goflag.DURATION),
        ("housekeeping_interval", goflag.DURATION),
        ("log_cadvisor_usage", goflag.BOOL),
        ("machine_id_file", goflag.STRING),
        ("max_housekeeping_interval", goflag.DURATION),
        ("referenced_reset_interval", goflag.UINT64),
        ("storage_driver_buffer_duration", goflag.DURATION),
        ("storage_driver_db", goflag.STRING),
        ("storage_driver_host", goflag.STRING),
        ("storage_driver_password", goflag.STRING),
        ("storage_driver_secure", goflag.BOOL),
        ("storage_driver_table", goflag.STRING),
        ("storage_driver_user", goflag.STRING),
        ("update_machine_info_interval", goflag.DURATION),
    )),
)
_DEST_PREFIX = "unused__"


def add_flags(flags: goflag.FlagSet) -> None:
    """Declare every row of :data:`UNUSED_FLAGS`."""
    for item in UNUSED_FLAGS:
        flags.add(item.name, item.kind, item.default, f"accepted for Koordinator's koordlet, not used: {item.why}",
                  dest=_DEST_PREFIX + item.name)


def unused_given(values: dict[str, object], given: Sequence[str]) -> tuple[str, ...]:
    """Remove the unused flags' values from ``values``; the names of those on the command line, in order."""
    for key in [k for k in values if k.startswith(_DEST_PREFIX)]:
        del values[key]
    names = {item.name for item in UNUSED_FLAGS}
    return tuple(name for name in given if name in names)


def unused_reasons() -> Mapping[str, str]:
    return {item.name: item.why for item in UNUSED_FLAGS}
