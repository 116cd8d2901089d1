"""koordlet's command line: Koordinator's flag names and defaults, feature gates.

Flags: docs/koordinator.md §9.1; feature gates: docs/koordinator.md §9.2.

Go's ``flag`` package spells long flags with one dash (``-cgroup-root-dir=/x`` or ``-cgroup-root-dir /x``);
both that and ``--cgroup-root-dir`` are accepted, so a DaemonSet written for Koordinator's koordlet works
unchanged. Boolean flags take ``-flag``, ``-flag=true`` or ``-flag=false``. Durations use Go's syntax
(``10s``, ``1m30s``, ``500ms``). Only the flags this agent acts on are declared: an unknown flag is an
error, never silently ignored.

With the environment variable ``agent_mode=hostMode`` the path defaults are the plain host paths
(``/sys/fs/cgroup/`` …) instead of the DaemonSet's ``/host-*`` mounts, as in Koordinator.

Flags of our own (not in Koordinator): ``-kubeconfig`` (default ``$KUBECONFIG``, else in-cluster),
``-local-mode`` (no API server: NodeSLO from ``-node-slo-file``, pods from the CRI at ``-cri-endpoint``,
NodeMetric/Device written under ``-report-dir``), ``-metrics-bind-host`` (the host bound when ``-addr``
names none; every address by default, IPv4 and IPv6, as Go binds ``:9316``),
``-tls-cert-file``/``-tls-private-key-file`` (``-addr`` over HTTPS), ``-kubelet-cgroup-root`` (kubelet's
``--cgroup-root``), ``-create-node-metric`` (create a missing NodeMetric instead of skipping), ``-kubelet-token-file``,
``-kubelet-client-cert``/``-kubelet-client-key``, ``-kubelet-port``, ``-stop-timeout``, ``-terway-qos-dir``
(Koordinator writes Terway's files to a fixed ``/host-var-lib/terway/qos``).
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

from koordlet import compatflags, features, goflag, gonet, logs

ENV_NODE_NAME = "NODE_NAME"
ENV_AGENT_MODE = "agent_mode"
ENV_KUBECONFIG = "KUBECONFIG"
HOST_MODE = "hostMode"


# Go's flag types (koordlet/goflag.py): each flag parses as the Go type Koordinator declares it with.
_STR, _STRINGS, _INT, _UINT, _FLOAT, _DURATION = (goflag.STRING, goflag.STRING_LIST, goflag.INT, goflag.UINT,
                                                   goflag.FLOAT64, goflag.DURATION)


class ConfigError(ValueError):
    """The command line or environment cannot configure koordlet; ``usage``: Go's usage text, printed after the
    message when the flag package refused the command line (as Go's ExitOnError does)."""

    def __init__(self, message: str, usage: str = "") -> None:
        super().__init__(message)
        self.usage = usage


# docs/koordinator.md §9.2: Beta gates default on, Alpha gates default off; the one table is koordlet/features.py.
BETA_GATES = features.BETA_GATES
ALPHA_GATES = features.ALPHA_GATES
DEFAULT_FEATURE_GATES: Mapping[str, bool] = features.DEFAULTS
_ALL_ALPHA, _ALL_BETA = "AllAlpha", "AllBeta"

_TRUE = {"1", "t", "true", "y", "yes", "on"}
_FALSE = {"0", "f", "false", "n", "no", "off"}


def parse_bool(text: str) -> bool:
    """Go's strconv.ParseBool plus yes/no/on/off."""
    lowered = text.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise ConfigError(f"not a boolean: {text!r}")


def parse_duration(text: str) -> float:
    """A Go duration (``1m30s``, ``500ms``, ``0``) in seconds, as time.ParseDuration reads it (metav1.Duration in
    an object's spec)."""
    try:
        return goflag.parse_duration_ns(text) / 1e9
    except goflag.DurationError as err:
        raise ConfigError(str(err)) from err


def format_duration(seconds: float) -> str:
    """Go's time.Duration.String: 300 → ``5m0s``, 3600 → ``1h0m0s``, 30 → ``30s``."""
    return goflag.duration_string(round(seconds * 1e9))


def parse_feature_gates(text: str, base: Mapping[str, bool] = DEFAULT_FEATURE_GATES) -> dict[str, bool]:
    """``Name=bool,Name=bool`` over ``base``; ``AllAlpha``/``AllBeta`` set every gate of that stage first
    (named gates win regardless of order, as in k8s.io/component-base)."""
    gates = dict(base)
    named: dict[str, bool] = {}
    stage: dict[str, bool] = {}
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        name, sep, value = item.partition("=")
        name = name.strip()
        if not sep:
            raise ConfigError(f"feature gate {item!r}: expected Name=true|false")
        enabled = parse_bool(value)
        if name in (_ALL_ALPHA, _ALL_BETA):
            stage[name] = enabled
        elif name in gates:
            named[name] = enabled
        else:
            raise ConfigError(f"unknown feature gate {name!r}; known gates: {', '.join(sorted(gates))}")
    if _ALL_ALPHA in stage:
        gates.update(dict.fromkeys(ALPHA_GATES, stage[_ALL_ALPHA]))
    if _ALL_BETA in stage:
        gates.update(dict.fromkeys(BETA_GATES, stage[_ALL_BETA]))
    gates.update(named)
    return gates


@dataclass(frozen=True, slots=True)
class KoordletConfig:
    node_name: str
    # paths (docs/koordinator.md §9.1)
    cgroup_root_dir: str
    proc_root_dir: str
    sys_root_dir: str
    sys_fs_root_dir: str
    var_run_root_dir: str
    run_root_dir: str
    var_lib_kubelet_dir: str
    kubelet_cgroup_root: str
    # runtime
    containerd_endpoint: str
    default_runtime_type: str
    # kubelet (docs/koordinator.md §8.1)
    kubelet_preferred_address_type: str
    kubelet_sync_interval_s: float
    kubelet_sync_timeout_s: float
    kubelet_insecure_tls: bool
    kubelet_read_only_port: int
    kubelet_port: int
    kubelet_token_file: str
    kubelet_client_cert: str
    kubelet_client_key: str
    disable_query_kubelet_config: bool
    kubelet_config_file: str
    node_topology_sync_interval_s: float
    node_topology_min_update_interval_s: float
    # metrics advisor (docs/koordinator.md §7.1) and cache
    collect_res_used_interval_s: float
    collect_pod_res_used_interval_s: float  # our own: pods no strategy reads every tick (metricsadvisor/pods.py)
    psi_collector_interval_s: float
    enable_pagecache_collector: bool
    # qos manager (docs/koordinator.md §4.1)
    reconcile_interval_seconds: int
    cpu_suppress_interval_seconds: int
    cpu_evict_interval_seconds: int
    memory_evict_interval_seconds: int
    memory_evict_cool_time_seconds: int
    cpu_evict_cool_time_seconds: int
    only_evict_by_api: bool
    resource_force_update_seconds: int
    # runtime hooks (docs/koordinator.md §9.1)
    runtime_hooks_network: str
    runtime_hooks_addr: str
    runtime_hooks_host_endpoint: str
    runtime_hooks_failure_policy: str
    runtime_hooks_plugin_failure_policy: str
    runtime_hooks_config_path: str
    runtime_hooks_disable_stages: tuple[str, ...]
    runtime_hooks_reconcile_interval_s: float
    # NRI mode (docs/koordinator.md §2.10; docs/nri-protocol.md §6): koordlet as an NRI plugin of containerd >= 1.7
    enable_nri_runtime_hook: bool
    runtime_hooks_nri_socket_path: str
    runtime_hooks_nri_plugin_name: str
    runtime_hooks_nri_plugin_index: str
    runtime_hooks_nri_connect_timeout_s: float
    runtime_hooks_nri_backoff_duration_s: float
    runtime_hooks_nri_backoff_factor: float
    runtime_hooks_nri_backoff_steps: int
    runtime_hooks_nri_backoff_cap_s: float
    # reporting
    enable_node_metric_report: bool
    report_interval_s: float
    create_node_metric: bool
    kube_api_qps: float
    kube_api_burst: int
    addr: str
    metrics_bind_host: str
    tls_cert_file: str
    tls_private_key_file: str
    # our own
    kubeconfig: str
    local_mode: bool
    node_slo_file: str
    cri_endpoint: str
    report_dir: str
    stop_timeout_s: float
    feature_gates: Mapping[str, bool] = field(default_factory=lambda: DEFAULT_FEATURE_GATES)
    logging: logs.LogOptions = field(default_factory=logs.LogOptions)  # klog's flags and -logging-format
    unused_flags: tuple[str, ...] = ()  # flags given that Koordinator's koordlet has and we do not act on
    ignored_args: tuple[str, ...] = ()  # what followed the first non-flag argument (Go's flag.Args(): unread)
    netqos_uplink: str = ""  # TCNetworkQoS: the shaped interface; "" = the default route's
    system_config_record_file: str = ""  # SystemConfig: the sysctl values found before koordlet's writes
    api_checkpoint_file: str = ""  # the objects last written to the API server, for a restart (kubeclient/checkpoint)
    # the peak predictor (Koordinator's -prediction-* flags)
    prediction_checkpoint_filepath: str = "/var/run/koordlet/prediction-checkpoints"
    prediction_cold_start_duration_s: float = 24 * 3600.0
    prediction_safety_margin_percent: int = 10
    prediction_memory_histogram_decay_halflife_s: float = 24 * 3600.0
    prediction_cpu_histogram_decay_halflife_s: float = 12 * 3600.0
    prediction_training_interval_s: float = 60.0
    prediction_model_expiration_duration_s: float = 1800.0
    prediction_model_checkpoint_interval_s: float = 600.0
    prediction_model_checkpoint_max_per_step: int = 12
    # audit (gate AuditEvents; Koordinator pkg/koordlet/audit flags)
    audit_log_dir: str = "/var/log/koordlet"
    audit_verbose: int = 3
    audit_max_disk_space_mb: int = 16
    audit_max_concurrent_readers: int = 4
    audit_max_events_limit: int = 2048
    # collectors of the Alpha gates (docs/koordinator.md §7.1)
    cpi_collector_interval_s: float = 60.0
    collect_node_cpu_info_interval_s: float = 60.0
    collect_cpi_timewindow_s: float = 10.0
    coldpage_collector_interval_s: float = 5.0
    resctrl_collector_interval_s: float = 10.0
    enable_resctrl_collector: bool = False
    # devices and vendor files
    pod_resources_proxy_path: str = "/var/run/koordlet/pod-resources"
    hami_core_library_directory_path: str = "/usr/local/vgpu/libvgpu.so"
    terway_qos_dir: str = "/var/lib/terway/qos"
    # Koordinator v1.8 parity flags (_parity_flags)
    xpu_device_infos_dir: str = "/var/run/koordlet/xpu-device-infos/"
    xpu_enforce_collect_from_device_infos: bool = False
    disable_unset_cpu_quota: bool = False
    enable_pod_taskids: bool = False
    qos_extension_plugins: Mapping[str, bool] = field(default_factory=lambda: MappingProxyType({}))
    # cgroup v2 nodes of Kubernetes 1.35-1.37 (docs/koordinator.md "Where koordlet-py differs")
    cgroup_v2_weight_formula: str = "auto"

    def gate(self, name: str) -> bool:
        return bool(self.feature_gates.get(name, False))

    @property
    def device_plugin_dir(self) -> str:
        """kubelet's device plugin directory, ``<-var-lib-kubelet-dir>/device-plugins/`` (its ``kubelet.sock``
        and our plugin's socket), as Koordinator derives kubelet's other paths from that flag."""
        return os.path.normpath(os.path.join(self.var_lib_kubelet_dir, "device-plugins"))

    @property
    def nri_socket_path(self) -> str:
        """``-runtime-hooks-nri-socket-path`` under ``-var-run-root-dir``, joined as Go's filepath.Join does
        (Koordinator's GetNRISocketPath): an absolute path is taken below the root too."""
        return os.path.normpath(os.path.join(self.var_run_root_dir, self.runtime_hooks_nri_socket_path.lstrip("/")))

    @property
    def listen_address(self) -> gonet.ListenAddress:
        """``-addr`` as Go's ``http.ListenAndServe`` reads it (empty: ``:http``); a host-less one takes
        ``-metrics-bind-host`` when that is set, else it is every address (koordlet/gonet.py: IPv4 and IPv6)."""
        address = gonet.parse_listen_address(self.addr or ":http")
        if address.host or not self.metrics_bind_host:
            return address
        return gonet.ListenAddress(self.metrics_bind_host.strip("[]"), address.port)

    @property
    def metrics_port(self) -> int:
        """The port of ``-addr`` (``:9316``, ``0.0.0.0:9316``, ``[::]:9316``)."""
        return self.listen_address.port

    @property
    def metrics_host(self) -> str:
        """The host ``-addr`` binds (no brackets); ``0.0.0.0`` for every address, which Go (and koordlet/gonet.py)
        opens as one socket for IPv4 and IPv6 where the host has both."""
        return self.listen_address.host or "0.0.0.0"  # noqa: S104 (docs/koordinator.md)

    @property
    def serving_tls(self) -> tuple[str, str] | None:
        """(certificate, key) files to serve ``-addr`` over TLS with (``-tls-cert-file``,
        ``-tls-private-key-file``); None: plain HTTP, as Koordinator's koordlet."""
        return (self.tls_cert_file, self.tls_private_key_file) if self.tls_cert_file else None


def _weight_formula(text: str) -> str:
    if text not in ("auto", "linear", "quadratic"):
        raise ConfigError(f"cgroup v2 weight formula must be auto, linear or quadratic, got {text!r}")
    return text


def _policy(text: str) -> str:
    if text not in ("Fail", "Ignore"):
        raise ConfigError(f"failure policy must be Fail or Ignore, got {text!r}")
    return text


_NRI_PLUGIN_NAME = re.compile(r"^[A-Za-z0-9_.+-]+$")


def _nri_plugin_name(text: str) -> str:
    # NRI v0.12 refuses other characters (api.CheckPluginName); older runtimes take them, so do we never send one
    if not _NRI_PLUGIN_NAME.match(text):
        raise ConfigError(f"NRI plugin name {text!r}: letters, digits and _.+- only")
    return text


def _nri_plugin_index(text: str) -> str:
    if len(text) != 2 or not text.isascii() or not text.isdigit():
        raise ConfigError(f"NRI plugin index {text!r}: exactly two digits (00-99)")
    return text


def _build_parser(host_mode: bool, kubeconfig: str = "") -> goflag.FlagSet:
    flags = goflag.FlagSet("koordlet")

    def flag(name: str, kind: goflag.Kind | Callable[[str], object], default: object, help_text: str) -> None:
        # a duration's value is in seconds, and so named: -report-interval is KoordletConfig.report_interval_s
        dest = name.replace("-", "_") + ("_s" if kind is goflag.DURATION else "")
        flags.add(name, kind if isinstance(kind, goflag.Kind) else goflag.value_kind("string", kind), default,
                  help_text, dest=dest)

    def switch(name: str, default: bool, help_text: str) -> None:
        flags.add(name, goflag.BOOL, default, help_text)

    def path(host: str, daemonset: str) -> str:
        return host if host_mode else daemonset

    _host_and_kubelet_flags(flag, switch, path)
    _collection_qos_and_hook_flags(flag, switch, path)
    _nri_flags(flag, switch)
    _prediction_and_system_config_flags(flag, path)
    _observability_flags(flag, switch, path)
    _report_api_and_mode_flags(flag, switch, kubeconfig)
    _parity_flags(flag, switch)
    logs.add_flags(flags)
    compatflags.add_flags(flags)
    return flags


# What _build_parser hands its flag groups: flag(name, convert, default, help), switch(name, default, help), and
# path(host default, DaemonSet default).
_AddFlag = Callable[[str, "goflag.Kind | Callable[[str], object]", object, str], None]
_AddSwitch = Callable[[str, bool, str], None]
_ModePath = Callable[[str, str], str]


def _host_and_kubelet_flags(flag: _AddFlag, switch: _AddSwitch, path: _ModePath) -> None:
    flag("cgroup-root-dir", _STR, path("/sys/fs/cgroup/", "/host-cgroup/"), "root of the cgroup hierarchies")
    flag("proc-root-dir", _STR, "/proc/", "procfs root")
    flag("sys-root-dir", _STR, path("/sys/", "/host-sys/"), "sysfs root")
    flag("sys-fs-root-dir", _STR, path("/sys/fs/", "/host-sys-fs/"), "resctrl lives at <this>/resctrl")
    flag("var-run-root-dir", _STR, path("/var/run/", "/host-var-run/"), "host /var/run")
    flag("run-root-dir", _STR, path("/run/", "/host-run/"), "host /run")
    flag("var-lib-kubelet-dir", _STR, "/var/lib/kubelet/",
         "kubelet state dir (the GPU device plugin serves in <this>/device-plugins/)")
    flag("kubelet-cgroup-root", _STR, "/", "kubelet --cgroup-root (pods live under <this>/kubepods)")
    flag("containerd-endpoint", _STR, "", "containerd socket (eviction kill path)")
    flag("default-runtime-type", _STR, "containerd", "runtime of bare container ids")
    flag("cgroup-v2-weight-formula", _weight_formula, "auto",
         "cpu.shares -> cpu.weight on cgroup v2: linear (runc <= 1.3.1), quadratic (runc >= 1.3.2, crun >= 1.23), "
         "or auto: the runtime's own, read from the weights it wrote")
    flag("kubelet-preferred-address-type", _STR, "InternalIP", "node address type used to reach kubelet")
    flag("kubelet-sync-interval", _DURATION, 10.0, "kubelet /pods poll period")
    flag("kubelet-sync-timeout", _DURATION, 3.0, "kubelet /pods request timeout")
    switch("kubelet-insecure-tls", False, "HTTP on the read-only port instead of HTTPS")
    flag("kubelet-read-only-port", _UINT, 10255, "kubelet read-only port")
    flag("kubelet-port", _INT, 0, "kubelet HTTPS port (0: the node's daemonEndpoints, else 10250)")
    flag("kubelet-token-file", _STR, "/var/run/secrets/kubernetes.io/serviceaccount/token", "bearer token file")
    flag("kubelet-client-cert", _STR, "", "client certificate for kubelet (instead of a token)")
    flag("kubelet-client-key", _STR, "", "client key for kubelet")
    switch("disable-query-kubelet-config", False, "do not read kubelet /configz")
    flag("kubelet-config-file", _STR, "",
         "kubelet's KubeletConfiguration file: CPU manager policy options and reservedSystemCPUs (optional)")


def _collection_qos_and_hook_flags(flag: _AddFlag, switch: _AddSwitch, path: _ModePath) -> None:
    flag("node-topology-sync-interval", _DURATION, 3.0, "Device (and topology) report period")
    flag("node-topology-min-update-interval", _DURATION, 10.0,
         "NodeResourceTopology: least time between two updates of the object")
    flag("collect-res-used-interval", _DURATION, 1.0, "node/pod usage collection period")
    flag("collect-pod-res-used-interval", _DURATION, 10.0,
         "period of the pods and containers no QoS strategy reads every collection (at least "
         "-collect-res-used-interval)")
    flag("psi-collector-interval", _DURATION, 10.0, "PSI collection period")
    flag("collect-node-cpu-info-interval", _DURATION, 60.0,
         "period of the node info collector (CPU topology and NUMA nodes into the metric cache)")
    switch("enable-pagecache-collector", False, "also collect usage with page cache")
    flag("reconcile-interval-seconds", _INT, 1, "cpu burst / cgroup reconcile period")
    flag("cpu-suppress-interval-seconds", _INT, 1, "cpu suppress period")
    flag("cpu-evict-interval-seconds", _INT, 1, "cpu evict period")
    flag("memory-evict-interval-seconds", _INT, 1, "memory evict period")
    flag("memory-evict-cool-time-seconds", _INT, 4, "memory evict cool-down")
    flag("cpu-evict-cool-time-seconds", _INT, 20, "cpu evict cool-down")
    switch("only-evict-by-api", False, "never fall back to killing through the CRI")
    flag("resource-force-update-seconds", _INT, 60, "rewrite an unchanged cgroup value after this long")
    flag("runtime-hooks-network", _STR, "unix", "hook server network")
    flag("runtime-hooks-addr", _STR, path("/var/run/koordlet/koordlet.sock", "/host-var-run-koordlet/koordlet.sock"),
         "hook server socket (as koordlet sees it)")
    flag("runtime-hooks-host-endpoint", _STR, "/var/run/koordlet/koordlet.sock", "hook server socket (on the host)")
    flag("runtime-hooks-failure-policy", _policy, "Ignore", "failure policy written in the registration")
    flag("runtime-hooks-plugin-failure-policy", _policy, "Ignore", "what a failing plugin does to a hook call")
    flag("runtime-hooks-config-path", _STR, path("/etc/runtime/hookserver.d", "/host-etc-hookserver/"),
         "hookserver.d dir for the registration file")
    flag("runtime-hooks-disable-stages", _STRINGS, (),
         "hook stages to disable (repeat the flag, or separate them with commas)")
    flag("runtime-hooks-reconcile-interval", _DURATION, 10.0, "reconciler period")


def _nri_flags(flag: _AddFlag, switch: _AddSwitch) -> None:
    switch("enable-nri-runtime-hook", True, "register as an NRI plugin of the container runtime (containerd >= 1.7)")
    flag("runtime-hooks-nri-socket-path", _STR, "nri/nri.sock", "the runtime's NRI socket, under -var-run-root-dir")
    flag("runtime-hooks-nri-plugin-name", _nri_plugin_name, "koordlet_nri", "NRI plugin name")
    flag("runtime-hooks-nri-plugin-index", _nri_plugin_index, "00",
         "NRI plugin index: two digits, plugins are called in index order")
    flag("runtime-hooks-nri-connect-timeout", _DURATION, 6.0,
         "bound on one registration (connect, register, configure, synchronize); above containerd's 5 s")
    flag("runtime-hooks-nri-backoff-duration", _DURATION, 1.0, "wait after the first failed NRI registration")
    flag("runtime-hooks-nri-backoff-factor", _FLOAT, 2.0, "growth of the wait after each further failure")
    flag("runtime-hooks-nri-backoff-steps", _INT, 2**31 - 1, "how many times the wait grows")
    flag("runtime-hooks-nri-backoff-cap", _DURATION, 30.0,
         "longest wait between NRI registration attempts (Koordinator: unbounded)")


def _prediction_and_system_config_flags(flag: _AddFlag, path: _ModePath) -> None:
    # DaemonSet mode: Koordinator's chart mounts the host's checkpoint dir at /prediction-checkpoints (its default)
    # and the host's /var/run/koordlet at /host-var-run-koordlet/: our own state that must outlive the pod goes there.
    flag("prediction-checkpoint-filepath", _STR,
         path("/var/run/koordlet/prediction-checkpoints", "/prediction-checkpoints"),
         "directory of the peak predictor's checkpoints (restored at start)")
    flag("prediction-cold-start-duration", _DURATION, 24 * 3600.0,
         "a pod this young is not predicted: its request counts into the prod peak")
    flag("prediction-safety-margin-percent", _INT, 10, "margin added to the predicted peaks")
    flag("prediction-memory-histogram-decay-halflife", _DURATION, 24 * 3600.0, "memory histograms' half-life")
    flag("prediction-cpu-histogram-decay-halflife", _DURATION, 12 * 3600.0, "CPU histograms' half-life")
    flag("prediction-training-interval", _DURATION, 60.0, "one sample per model this often (the p90 over it)")
    flag("prediction-model-expiration-duration", _DURATION, 1800.0, "a model not updated this long goes")
    flag("prediction-model-checkpoint-interval", _DURATION, 600.0, "a model is saved at most this often")
    flag("prediction-model-checkpoint-max-per-step", _INT, 12, "models saved per minute at most")
    flag("system-config-record-file", _STR,
         path("/var/run/koordlet/system-config-originals.json", "/host-var-run-koordlet/system-config-originals.json"),
         "SystemConfig: where the sysctl values found before koordlet's first writes are kept (put back when "
         "the strategy or its gate goes off); the records of the resctrl groups, blkio lines and host dirs koordlet "
         "made are kept beside it; empty: memory only")
    flag("api-checkpoint-file", _STR, path("", "/host-var-run-koordlet/api-checkpoint.json"),
         "the NodeMetric and NodeResourceTopology as koordlet last wrote them, so that a restart does not read them "
         "first (koordlet/kubeclient/checkpoint.py); its dir must exist; empty: nothing kept")


def _report_api_and_mode_flags(flag: _AddFlag, switch: _AddSwitch, kubeconfig: str) -> None:
    switch("enable-node-metric-report", True, "report NodeMetric status")
    flag("report-interval", _DURATION, 60.0, "NodeMetric report period when its spec does not set one")
    switch("create-node-metric", False, "create the NodeMetric object when it is missing")
    flag("addr", _STR, ":9316", "metrics address")
    flag("metrics-bind-host", _STR, "", "host to bind when -addr names none (empty: every address, as Go)")
    flag("tls-cert-file", _STR, "", "serve -addr over HTTPS with this certificate (PEM; e.g. kubelet's serving "
         "certificate), read again when it changes; empty: plain HTTP")
    flag("tls-private-key-file", _STR, "", "the key of -tls-cert-file (may be the same file)")
    flag("kubeconfig", _STR, kubeconfig, "kubeconfig (default: $KUBECONFIG, else in-cluster)")
    switch("local-mode", False, "no API server: NodeSLO from a file, pods from the CRI, reports as files")
    flag("node-slo-file", _STR, "/etc/koordlet/nodeslo.yaml", "NodeSLO spec file (local mode)")
    flag("cri-endpoint", _STR, "/var/run/containerd/containerd.sock", "CRI socket for the CRI pod source")
    flag("report-dir", _STR, "/var/lib/koordlet/reports", "where local mode writes NodeMetric/Device")
    flag("stop-timeout", _DURATION, 10.0, "bound on a graceful stop")
    flag("kube-api-qps", _FLOAT, 20.0, "QPS to use while talking with kube-apiserver (a token bucket)")
    flag("kube-api-burst", _INT, 30, "Burst to use while talking with kube-apiserver")
    flag("feature-gates", _MAP_STRING_BOOL_TEXT, (), "Name=bool,... (docs/koordinator.md §9.2)")
    flag("netqos-uplink", _STR, "", "interface that TCNetworkQoS shapes (default: that of the default route)")


def _observability_flags(flag: _AddFlag, switch: _AddSwitch, path: _ModePath) -> None:
    flag("audit-log-dir", _STR, "/var/log/koordlet", "audit log dir (gate AuditEvents)")
    flag("audit-verbose", _INT, 3, "audit events above this level are not written (0: all)")
    flag("audit-max-disk-space-mb", _INT, 16, "disk space of all audit files together")
    flag("audit-max-concurrent-readers", _INT, 4, "readings of /events kept at once")
    flag("audit-max-events-limit", _INT, 2048, "most events one /events page may ask for")
    flag("cpi-collector-interval", _DURATION, 60.0, "CPI collection period (gate CPICollector)")
    flag("collect-cpi-timewindow", _DURATION, 10.0, "how long one CPI collection counts")
    flag("coldpage-collector-interval", _DURATION, 5.0, "cold page collection period (gate ColdPageCollector)")
    flag("resctrl-collector-interval", _DURATION, 10.0, "resctrl monitoring period (gate ResctrlCollector)")
    switch("enable-resctrl-collector", False, "collect LLC occupancy and memory bandwidth of the QoS resctrl groups")
    flag("pod-resources-proxy-path", _STR, "/var/run/koordlet/pod-resources",
         "dir of the pod-resources proxy socket kubelet.sock (gate PodResourcesProxy)")
    flag("hami-core-library-directory-path", _STR, "/usr/local/vgpu/libvgpu.so", "HAMi-core's libvgpu.so on the node")
    flag("terway-qos-dir", _STR, path("/var/lib/terway/qos", "/host-var-lib/terway/qos"),
         "where Terway's QoS reads pod.json and global_bps_config (gate TerwayQoS)")


def parse_map_string_bool(text: str) -> dict[str, bool]:
    """k8s.io/component-base's MapStringBool.Set: ``key=bool`` pairs separated by commas, each value read by
    strconv.ParseBool (``-qos-extension-plugins``; the flag may be given again, its pairs merge)."""
    pairs: dict[str, bool] = {}
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        key, sep, value = item.partition("=")
        if not sep:
            raise ConfigError("malformed pair, expect string=bool")
        try:
            pairs[key.strip()] = goflag.parse_bool(value.strip())
        except goflag.NumError as err:  # Go's text
            raise ConfigError(f"invalid value of {key.strip()}: {value.strip()}, err: {err}") from err
    return pairs


_MAP_STRING_BOOL = goflag.value_kind("mapStringBool", parse_map_string_bool, accumulate=True)
# The same check, keeping the text as given (-feature-gates: parse_feature_gates reads the joined texts).
_MAP_STRING_BOOL_TEXT = goflag.value_kind("mapStringBool", lambda text: (parse_map_string_bool(text), text)[1],
                                          accumulate=True)


def _parity_flags(flag: _AddFlag, switch: _AddSwitch) -> None:
    """Koordinator v1.8's flags for XPU devices, the cpuset hook's quota, pod task ids and out-of-tree QoS plugins
    (issue 35, part 4; facts: Koordinator v1.8.0 util/system/config.go, statesinformer/impl/config.go,
    runtimehooks/config.go, qosmanager/framework/extension.go)."""
    flag("xpu-device-infos-dir", _STR, "/var/run/koordlet/xpu-device-infos/",
         "dir of the device-info JSON files a device daemon writes for NPUs, MLUs and other accelerators "
         "(gate Accelerators; koordlet/metricsadvisor/xpu.py)")
    switch("xpu-enforce-collect-from-device-infos", False,
           "report accelerators from -xpu-device-infos-dir only, never GPUs from NVML")
    switch("disable-unset-cpu-quota", False,
           "the cpuset hook keeps the CFS quota of a pod bound to CPUs (LSE/LSR) instead of unsetting it")
    switch("enable-pod-taskids", False,
           "the states informer reads the thread ids of each container and sandbox at every pod sync; the resctrl "
           "reconciler moves those threads into the pod's group")
    flag("qos-extension-plugins", _MAP_STRING_BOOL, {},
         "Name=bool,...: turn out-of-tree QoS strategies and hook plugins (Python entry points "
         "koordlet.qos_strategies, koordlet.hook_plugins) on or off; off by default")


# The kernel filesystem roots koordlet reads, by flag: (the config field, the flag, what is mounted there).
_ROOTS = (("proc_root_dir", "proc-root-dir", "procfs"), ("sys_root_dir", "sys-root-dir", "sysfs"),
          ("cgroup_root_dir", "cgroup-root-dir", "cgroupfs"))


def missing_root_dirs(config: KoordletConfig) -> tuple[str, ...]:
    """One line for each kernel filesystem root the flags name that is not there: what reads it would fail on
    every tick, so the cause is said once, at start, with the settings that choose it (Koordinator's DaemonSet
    mounts the host's filesystems at ``/host-*``; ``agent_mode=hostMode`` makes the host's own paths the
    defaults)."""
    lines = []
    for field_name, flag, what in _ROOTS:
        path = getattr(config, field_name)
        if not os.path.isdir(path):
            lines.append(f"{what} root {path} (-{flag}) does not exist, so nothing is read from it: Koordinator's "
                         f"DaemonSet mounts the host's {what} there; on the host itself set {ENV_AGENT_MODE}="
                         f"{HOST_MODE} (the host's own paths are then the defaults) or -{flag}")
    return tuple(lines)


def parse_config(argv: Sequence[str], environ: Mapping[str, str]) -> KoordletConfig:
    """The configuration from command line and environment; raises ConfigError with a clear message."""
    flags = _build_parser(environ.get(ENV_AGENT_MODE) == HOST_MODE, environ.get(ENV_KUBECONFIG, ""))
    try:  # before the NODE_NAME check, so that -help always answers
        parsed = flags.parse(argv)
    except goflag.HelpRequested:
        sys.stderr.write(flags.usage())  # Go's ExitOnError: the usage on stderr, exit 0
        raise SystemExit(0) from None
    except goflag.GoFlagError as err:
        raise ConfigError(str(err), usage=flags.usage()) from err
    args = parsed.values
    node_name = environ.get(ENV_NODE_NAME, "").strip()
    if not node_name:
        raise ConfigError(f"environment variable {ENV_NODE_NAME} must name this node")
    gates = parse_feature_gates(",".join(args.pop("feature_gates")))  # type: ignore[arg-type]
    stages = tuple(s.strip() for value in args.pop("runtime_hooks_disable_stages")  # type: ignore[attr-defined]
                   for s in value.split(",") if s.strip())
    log_options = logs.options_from_flags(args)
    unused = compatflags.unused_given(args, parsed.given)
    values = dict(args)
    plugins: dict[str, bool] = {}
    for pairs in values["qos_extension_plugins"]:  # type: ignore[attr-defined]
        plugins.update(pairs)
    values["qos_extension_plugins"] = MappingProxyType(plugins)
    config = KoordletConfig(node_name=node_name, feature_gates=MappingProxyType(gates),
                            runtime_hooks_disable_stages=stages, logging=log_options, unused_flags=unused,
                            ignored_args=tuple(parsed.rest), **values)
    _check(config)
    return config


# Durations that must be positive (their flags: the name without "_s", dashes for underscores).
_POSITIVE_DURATIONS = (
    "kubelet_sync_interval_s", "kubelet_sync_timeout_s", "collect_res_used_interval_s", "node_topology_sync_interval_s",
    "collect_pod_res_used_interval_s",
    "report_interval_s", "stop_timeout_s", "runtime_hooks_reconcile_interval_s",
    "runtime_hooks_nri_connect_timeout_s", "runtime_hooks_nri_backoff_duration_s", "runtime_hooks_nri_backoff_cap_s",
    "cpi_collector_interval_s", "collect_cpi_timewindow_s", "coldpage_collector_interval_s",
    "collect_node_cpu_info_interval_s",
    "resctrl_collector_interval_s", "prediction_training_interval_s", "prediction_cpu_histogram_decay_halflife_s",
    "prediction_memory_histogram_decay_halflife_s",
)


def _check(config: KoordletConfig) -> None:
    for name in _POSITIVE_DURATIONS:
        if getattr(config, name) <= 0:
            raise ConfigError(f"-{name.removesuffix('_s').replace('_', '-')} must be positive")
    try:
        config.listen_address  # noqa: B018 (parsed for its errors: Go's, at start)
    except gonet.AddrError as err:
        raise ConfigError(f"-addr {config.addr!r}: listen tcp: {err}") from err
    if bool(config.tls_cert_file) != bool(config.tls_private_key_file):
        raise ConfigError("-tls-cert-file and -tls-private-key-file go together")
    if config.kube_api_qps <= 0 or config.kube_api_burst < 1:
        raise ConfigError("-kube-api-qps must be positive and -kube-api-burst at least 1")
    if config.node_topology_min_update_interval_s < 0:
        raise ConfigError("-node-topology-min-update-interval must not be negative")
    if bool(config.kubelet_client_cert) != bool(config.kubelet_client_key):
        raise ConfigError("-kubelet-client-cert and -kubelet-client-key go together")
    _check_nri_prediction_and_collectors(config)


def _check_nri_prediction_and_collectors(config: KoordletConfig) -> None:
    if config.runtime_hooks_nri_backoff_factor < 1.0 or config.runtime_hooks_nri_backoff_steps < 0:
        raise ConfigError("-runtime-hooks-nri-backoff-factor must be >= 1 and -runtime-hooks-nri-backoff-steps >= 0")
    if config.prediction_safety_margin_percent < 0 or config.prediction_model_checkpoint_max_per_step < 0:
        raise ConfigError("-prediction-safety-margin-percent and -prediction-model-checkpoint-max-per-step must "
                          "not be negative")
    if config.collect_cpi_timewindow_s >= config.cpi_collector_interval_s:
        raise ConfigError("-collect-cpi-timewindow must be shorter than -cpi-collector-interval")
    if config.audit_max_disk_space_mb < 2:
        raise ConfigError("-audit-max-disk-space-mb must hold at least one 2 MiB audit file")
    for name in ("audit_max_concurrent_readers", "audit_max_events_limit"):
        if getattr(config, name) < 1:
            raise ConfigError(f"-{name.replace('_', '-')} must be at least 1")
