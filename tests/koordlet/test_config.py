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
    with pytest.raises(ConfigError, match="not a duration"):
        parse_duration("10 seconds")


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
def test_help_answers_even_without_node_name(flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        parse_config([flag], {})
    assert exit_info.value.code == 0
    assert "-cgroup-root-dir" in capsys.readouterr().out


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
