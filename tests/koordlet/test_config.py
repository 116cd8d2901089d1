from __future__ import annotations

import pytest

from koordlet.config import (
    ALPHA_GATES,
    BETA_GATES,
    DEFAULT_FEATURE_GATES,
    ConfigError,
    format_duration,
    parse_config,
    parse_duration,
    parse_feature_gates,
)

ENV = {"NODE_NAME": "node-1"}


def test_defaults_follow_koordinator_daemonset_paths_and_periods() -> None:
    config = parse_config([], ENV)
    assert config.node_name == "node-1"
    assert config.cgroup_root_dir == "/host-cgroup/"
    assert config.sys_root_dir == "/host-sys/"
    assert config.kubelet_sync_interval_s == 10.0
    assert config.kubelet_sync_timeout_s == 3.0
    assert config.kubelet_read_only_port == 10255
    assert config.addr == ":9316" and config.metrics_port == 9316 and config.metrics_host == "0.0.0.0"
    assert parse_config(["-addr=127.0.0.1:9316"], ENV).metrics_host == "127.0.0.1"
    assert parse_config(["-metrics-bind-host=127.0.0.1"], ENV).metrics_host == "127.0.0.1"
    assert config.runtime_hooks_failure_policy == "Ignore"
    assert config.runtime_hooks_host_endpoint == "/var/run/koordlet/koordlet.sock"
    assert config.enable_node_metric_report is True
    assert config.local_mode is False
    assert config.memory_evict_cool_time_seconds == 4 and config.cpu_evict_cool_time_seconds == 20


def test_host_mode_switches_path_defaults_to_host_paths() -> None:
    config = parse_config([], {**ENV, "agent_mode": "hostMode"})
    assert config.cgroup_root_dir == "/sys/fs/cgroup/"
    assert config.runtime_hooks_config_path == "/etc/runtime/hookserver.d"
    assert config.runtime_hooks_addr == "/var/run/koordlet/koordlet.sock"


def test_kubeconfig_defaults_to_the_environment() -> None:
    assert parse_config([], {**ENV, "KUBECONFIG": "/etc/kube/config"}).kubeconfig == "/etc/kube/config"
    assert parse_config(["-kubeconfig=/x"], {**ENV, "KUBECONFIG": "/etc/kube/config"}).kubeconfig == "/x"
    assert parse_config([], ENV).kubeconfig == ""


@pytest.mark.parametrize("argv", [
    ["-cgroup-root-dir=/sys/fs/cgroup/"],
    ["-cgroup-root-dir", "/sys/fs/cgroup/"],
    ["--cgroup-root-dir=/sys/fs/cgroup/"],
    ["--cgroup-root-dir", "/sys/fs/cgroup/"],
])
def test_go_style_single_dash_and_double_dash_flags_both_work(argv: list[str]) -> None:
    assert parse_config(argv, ENV).cgroup_root_dir == "/sys/fs/cgroup/"


def test_boolean_flags_take_bare_and_explicit_values() -> None:
    assert parse_config(["-local-mode"], ENV).local_mode is True
    assert parse_config(["-local-mode=true"], ENV).local_mode is True
    assert parse_config(["-enable-node-metric-report=false"], ENV).enable_node_metric_report is False


def test_durations_use_go_syntax() -> None:
    config = parse_config(["-kubelet-sync-interval=1m30s", "-kubelet-sync-timeout", "500ms"], ENV)
    assert config.kubelet_sync_interval_s == 90.0
    assert config.kubelet_sync_timeout_s == 0.5
    assert parse_duration("1h2m3s") == 3723.0
    assert format_duration(300) == "5m0s" and format_duration(1800) == "30m0s" and format_duration(45) == "45s"
    with pytest.raises(ConfigError, match='time: unknown unit " seconds" in duration "10 seconds"'):
        parse_duration("10 seconds")
    with pytest.raises(ConfigError, match='time: missing unit in duration "300"'):  # metav1.Duration: no bare number
        parse_duration("300")


def test_missing_node_name_is_a_clear_error() -> None:
    with pytest.raises(ConfigError, match="NODE_NAME"):
        parse_config([], {})


def test_unknown_flag_is_an_error_not_ignored() -> None:
    with pytest.raises(ConfigError, match="^flag provided but not defined: -no-such-flag$"):
        parse_config(["-no-such-flag=1"], ENV)


def test_bad_values_name_the_flag() -> None:
    with pytest.raises(ConfigError, match="kubelet-sync-interval"):
        parse_config(["-kubelet-sync-interval=soon"], ENV)
    with pytest.raises(ConfigError, match="Fail or Ignore"):
        parse_config(["-runtime-hooks-failure-policy=Maybe"], ENV)
    with pytest.raises(ConfigError, match="go together"):
        parse_config(["-kubelet-client-cert=/c.pem"], ENV)


def test_feature_gate_defaults_are_beta_on_alpha_off() -> None:
    assert all(DEFAULT_FEATURE_GATES[name] for name in BETA_GATES)
    assert not any(DEFAULT_FEATURE_GATES[name] for name in ALPHA_GATES)
    assert DEFAULT_FEATURE_GATES["BECPUSuppress"] and not DEFAULT_FEATURE_GATES["BEMemoryEvict"]


def test_feature_gates_parse_name_bool_pairs() -> None:
    config = parse_config(["-feature-gates=CPUBurst=false,BEMemoryEvict=true"], ENV)
    assert config.gate("CPUBurst") is False
    assert config.gate("BEMemoryEvict") is True
    assert config.gate("BECPUSuppress") is True


def test_all_alpha_all_beta_set_stages_and_named_gates_win() -> None:
    gates = parse_feature_gates("CPUEvict=false,AllAlpha=true,AllBeta=false")
    assert gates["PSICollector"] is True
    assert gates["CPUEvict"] is False
    assert gates["BECPUSuppress"] is False


def test_unknown_feature_gate_is_a_clear_error() -> None:
    with pytest.raises(ConfigError, match="unknown feature gate 'NoSuchGate'"):
        parse_config(["-feature-gates=NoSuchGate=true"], ENV)
    with pytest.raises(ConfigError, match="Name=true"):
        parse_feature_gates("CPUBurst")
    with pytest.raises(ConfigError, match="not a boolean"):
        parse_feature_gates("CPUBurst=maybe")


@pytest.mark.parametrize("flag", ["-h", "-help", "--help"])
def test_help_answers_even_without_node_name_on_stderr_and_exits_0_as_go(flag: str,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        parse_config([flag], {})
    assert exit_info.value.code == 0  # flag.ExitOnError: os.Exit(0) on ErrHelp (flag_test.go TestExitCode)
    printed = capsys.readouterr()
    assert printed.out == "" and printed.err.startswith("Usage of koordlet:\n")
    assert "-cgroup-root-dir" in printed.err


def test_help_writes_each_flag_in_gos_print_defaults_form(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse_config(["-help"], {})
    usage = capsys.readouterr().err
    for entry in (
        "  -kubelet-sync-interval duration\n    \tkubelet /pods poll period (default 10s)\n",
        "  -prediction-cold-start-duration duration\n",  # (default 24h0m0s), Go's Duration.String
        "(default 24h0m0s)\n",
        "  -kube-api-qps float\n",  # float64: "float", its default 20 as FormatFloat writes it
        " (default 20)\n",
        "  -kubelet-read-only-port uint\n    \tkubelet read-only port (default 10255)\n",
        "  -cgroup-root-dir string\n    \troot of the cgroup hierarchies (default \"/host-cgroup/\")\n",
        "  -local-mode\n    \tno API server: NodeSLO from a file, pods from the CRI, reports as files\n",  # no default
        "  -enable-nri-runtime-hook\n    \tregister as an NRI plugin",
        "  -v value\n    \tnumber for the log level verbosity\n",  # klog's Level: a "value", zero default omitted
        "  -stderrthreshold value\n    \tlogs at or above this threshold go to stderr (default 2)\n",
        "  -feature-gates value\n",
    ):
        assert entry in usage, entry
    for python_form in ("(default '", "(default 10.0)", "(default True)", "(default ())"):  # no Python reprs
        assert python_form not in usage


def test_every_duration_flag_is_its_name_in_seconds_in_the_config() -> None:
    from koordlet.config import _build_parser

    durations = [f for f in _build_parser(False).flags() if f.kind.name == "duration"
                 and not f.dest.startswith("unused__")]
    assert durations
    config = parse_config([], ENV)
    for item in durations:
        assert item.dest == item.name.replace("-", "_") + "_s"
        assert getattr(config, item.dest) == item.default


@pytest.mark.parametrize(("argv", "attribute", "value"), [
    (["-kube-api-burst=1_000", "-kubelet-port=0x_1F90"], "kubelet_port", 0x1F90),  # underscores with base 0
    (["-kube-api-qps=1_000.5", "-runtime-hooks-nri-backoff-factor=0x1.8p1"], "runtime_hooks_nri_backoff_factor", 3.0),
    (["-tsdb-min-block-duration=-2562047h47m16.854775808s"], "unused_flags", ("tsdb-min-block-duration",)),
    (["-kubelet-sync-timeout=0.000000001s"], "kubelet_sync_timeout_s", 1e-9),
    (["-audit-max-events-limit=0o4000"], "audit_max_events_limit", 2048),
])
def test_numbers_go_accepts_are_accepted(argv: list[str], attribute: str, value: object) -> None:
    assert getattr(parse_config(argv, ENV), attribute) == value


@pytest.mark.parametrize(("argv", "message"), [
    (["-kube-api-qps=0x1.8"], 'invalid value "0x1.8" for flag -kube-api-qps: parse error'),
    (["-kube-api-burst=\u0661\u0662"], 'invalid value "\u0661\u0662" for flag -kube-api-burst: parse error'),
    (["-kube-api-qps=\uff11"], 'invalid value "\uff11" for flag -kube-api-qps: parse error'),
    (["-report-interval=\u0661s"], 'invalid value "\u0661s" for flag -report-interval: parse error'),
    (["-tsdb-min-block-duration=-2562047h47m16.854775809s"],
     'invalid value "-2562047h47m16.854775809s" for flag -tsdb-min-block-duration: parse error'),
    (["-kube-api-burst=9223372036854775808"],
     'invalid value "9223372036854775808" for flag -kube-api-burst: value out of range'),
    (["-kube-api-qps=1e309"], 'invalid value "1e309" for flag -kube-api-qps: value out of range'),
    (["-kube-api-burst=1__000"], 'invalid value "1__000" for flag -kube-api-burst: parse error'),
    (["-v=1_0"], 'invalid value "1_0" for flag -v: strconv.ParseInt: parsing "1_0": invalid syntax'),
    (["-log_backtrace_at=main.go:\uff11"],
     'invalid value "main.go:\uff11" for flag -log_backtrace_at: syntax error: expect file.go:234'),
])
def test_numbers_go_refuses_are_refused_with_gos_message(argv: list[str], message: str) -> None:
    with pytest.raises(ConfigError) as refused:
        parse_config(argv, ENV)
    assert str(refused.value) == message
    assert refused.value.usage.startswith("Usage of koordlet:\n")  # printed after it, as Go's failf does


def test_nri_flags_have_koordinators_names_and_defaults_and_a_finite_backoff_cap() -> None:
    config = parse_config([], ENV)
    assert config.enable_nri_runtime_hook is True
    assert config.nri_socket_path == "/host-var-run/nri/nri.sock"  # -var-run-root-dir joined with nri/nri.sock
    assert (config.runtime_hooks_nri_plugin_name, config.runtime_hooks_nri_plugin_index) == ("koordlet_nri", "00")
    assert config.runtime_hooks_nri_connect_timeout_s == 6.0
    assert (config.runtime_hooks_nri_backoff_duration_s, config.runtime_hooks_nri_backoff_factor,
            config.runtime_hooks_nri_backoff_steps) == (1.0, 2.0, 2**31 - 1)
    assert config.runtime_hooks_nri_backoff_cap_s == 30.0  # Koordinator's is 2^62-1 ns: no cap at all
    assert parse_config([], {**ENV, "agent_mode": "hostMode"}).nri_socket_path == "/var/run/nri/nri.sock"


def test_nri_flags_are_parsed_and_the_socket_path_joined_as_go_does() -> None:
    config = parse_config(["-enable-nri-runtime-hook=false", "-var-run-root-dir=/run/x",
                           "-runtime-hooks-nri-socket-path=/containerd/nri.sock", "-runtime-hooks-nri-plugin-index=05",
                           "-runtime-hooks-nri-connect-timeout=2s", "-runtime-hooks-nri-backoff-cap=500ms"], ENV)
    assert config.enable_nri_runtime_hook is False
    assert config.nri_socket_path == "/run/x/containerd/nri.sock"  # filepath.Join: absolute goes below the root
    assert config.runtime_hooks_nri_plugin_index == "05"
    assert (config.runtime_hooks_nri_connect_timeout_s, config.runtime_hooks_nri_backoff_cap_s) == (2.0, 0.5)


@pytest.mark.parametrize("argv", [
    ["-runtime-hooks-nri-plugin-index=7"], ["-runtime-hooks-nri-plugin-index=a0"],
    ["-runtime-hooks-nri-plugin-name=nri/nri.sock"], ["-runtime-hooks-nri-plugin-name="],
    ["-runtime-hooks-nri-backoff-factor=0.5"], ["-runtime-hooks-nri-backoff-steps=-1"],
    ["-runtime-hooks-nri-connect-timeout=0s"], ["-runtime-hooks-nri-backoff-cap=0"],
])
def test_nri_flags_that_containerd_would_refuse_are_refused_at_start(argv: list[str]) -> None:
    with pytest.raises(ConfigError):
        parse_config(argv, ENV)


def test_the_node_info_collectors_interval_is_koordinators_flag_and_acts() -> None:
    config = parse_config(["-collect-node-cpu-info-interval=30s"], ENV)
    assert config.collect_node_cpu_info_interval_s == 30.0 and config.unused_flags == ()
    assert parse_config([], ENV).collect_node_cpu_info_interval_s == 60.0  # Koordinator's default


def test_a_missing_kernel_filesystem_root_is_one_line_naming_the_dir_and_the_settings(tmp_path) -> None:
    """koordlet on a host, without Koordinator's agent_mode=hostMode, looks for the DaemonSet's /host-* mounts:
    one line per root that is not there, naming it, its flag and agent_mode; nothing for the roots that are."""
    from koordlet.config import missing_root_dirs

    config = parse_config([f"-sys-root-dir={tmp_path / 'host-sys'}/", f"-cgroup-root-dir={tmp_path}",
                           "-proc-root-dir=/proc/"], {"NODE_NAME": "n1"})
    (line,) = missing_root_dirs(config)
    assert line.startswith(f"sysfs root {tmp_path / 'host-sys'}/ (-sys-root-dir) does not exist")
    assert "agent_mode=hostMode" in line
    assert missing_root_dirs(parse_config([], {"NODE_NAME": "n1", "agent_mode": "hostMode"})) == ()
