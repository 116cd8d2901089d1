"""The bare-metal units verify with systemd-analyze, agree with each other, and install idempotently."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from runtimeproxy.main import parse_args

ROOT = Path(__file__).resolve().parents[2]
SYSTEMD = ROOT / "systemd"
INSTALL = ROOT / "scripts" / "install-baremetal.sh"
UNIT_PREFIX = "/opt/koordlet-py"
PROXY_SOCKET = "/var/run/koord-runtimeproxy/runtimeproxy.sock"


def parse_unit(text: str) -> dict[str, list[tuple[str, str]]]:
    """Sections -> (key, value) in order; backslash continuations joined, comments dropped."""
    sections: dict[str, list[tuple[str, str]]] = {}
    current = ""
    pending = ""
    for raw in text.splitlines():
        line = pending + raw.strip()
        pending = ""
        if line.endswith("\\"):
            pending = line[:-1] + " "
            continue
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            current = line[1:-1]
            sections.setdefault(current, [])
            continue
        key, _, value = line.partition("=")
        sections[current].append((key.strip(), value.strip()))
    return sections


def values(unit: dict[str, list[tuple[str, str]]], section: str, key: str) -> list[str]:
    return [v for k, v in unit.get(section, []) if k == key]


def _unit(name: str) -> dict[str, list[tuple[str, str]]]:
    return parse_unit((SYSTEMD / name).read_text())


def test_proxy_unit_starts_before_kubelet_always_restarts_and_is_sandboxed() -> None:
    unit = _unit("koord-runtime-proxy.service")
    assert "kubelet.service" in values(unit, "Unit", "Before")[0].split()
    assert values(unit, "Service", "Restart") == ["always"]
    assert values(unit, "Service", "RuntimeDirectory") == ["koord-runtimeproxy"]
    for key, expected in {
        "ProtectSystem": "strict",
        "NoNewPrivileges": "yes",
        "ProtectHome": "yes",
        "PrivateTmp": "yes",
        "ProtectControlGroups": "yes",
        "CapabilityBoundingSet": "",
    }.items():
        assert values(unit, "Service", key) == [expected], key


def test_proxy_command_line_is_accepted_by_the_proxy_and_matches_the_kubelet_drop_in() -> None:
    exec_start = values(_unit("koord-runtime-proxy.service"), "Service", "ExecStart")[0]
    argv = shlex.split(exec_start)
    assert argv[0] == f"{UNIT_PREFIX}/venv/bin/koord-runtime-proxy"
    args = parse_args(argv[1:])  # the proxy's own parser: unknown flags would exit
    assert args.koord_runtimeproxy_endpoint == PROXY_SOCKET
    # The socket dir is the unit's RuntimeDirectory (/run = /var/run).
    assert os.path.dirname(args.koord_runtimeproxy_endpoint) == "/var/run/koord-runtimeproxy"
    drop_in = parse_unit((SYSTEMD / "10-koord-runtime-proxy.conf").read_text())
    env = values(drop_in, "Service", "Environment")
    assert env == [f'"KUBELET_EXTRA_ARGS=--container-runtime-endpoint=unix://{PROXY_SOCKET}"']
    assert values(drop_in, "Unit", "After") == ["koord-runtime-proxy.service"]


def test_koordlet_unit_keeps_cgroup_and_proc_writable_but_hardens_the_rest() -> None:
    unit = _unit("koordlet.service")
    assert values(unit, "Service", "Restart") == ["always"]
    assert values(unit, "Service", "ProtectSystem") == ["full"]
    assert values(unit, "Service", "NoNewPrivileges") == ["yes"]
    for forbidden in ("ProtectControlGroups", "ProtectKernelTunables", "PrivateDevices", "CapabilityBoundingSet"):
        assert values(unit, "Service", forbidden) == [], f"{forbidden} would stop koordlet from doing its job"
    assert values(unit, "Service", "RuntimeDirectory") == ["koordlet"]
    assert "NODE_NAME=%H" in values(unit, "Service", "Environment")
    # NRI mode: containerd's socket stays reachable (a unix socket, writable)
    assert "-/run/nri" in values(unit, "Service", "ReadWritePaths")
    assert "AF_UNIX" in values(unit, "Service", "RestrictAddressFamilies")[0].split()


def _verify_dir(tmp_path: Path) -> Path:
    """The units (prefix pointed at this venv) and the drop-in on a stand-in kubelet.service, in one dir."""
    venv = Path(sys.prefix)
    for script in ("koord-runtime-proxy", "koordlet"):
        if not (venv / "bin" / script).exists():
            pytest.skip(f"{venv}/bin/{script} is missing (package not installed into the venv)")
    for name in ("koord-runtime-proxy.service", "koordlet.service"):
        text = (SYSTEMD / name).read_text().replace(f"{UNIT_PREFIX}/venv", str(venv))
        (tmp_path / name).write_text(text)
    (tmp_path / "kubelet.service").write_text("[Unit]\nDescription=kubelet\n[Service]\nExecStart=/bin/true\n")
    (tmp_path / "kubelet.service.d").mkdir()
    shutil.copy(SYSTEMD / "10-koord-runtime-proxy.conf", tmp_path / "kubelet.service.d")
    return tmp_path


def _systemd_analyze_verify(directory: Path) -> str:
    tool = shutil.which("systemd-analyze")
    if tool is None:
        pytest.skip("systemd-analyze not installed (Debian package 'systemd'; scripts/install-deps.sh installs it)")
    units = ["./koord-runtime-proxy.service", "./koordlet.service", "./kubelet.service"]
    done = subprocess.run([tool, "verify", *units], cwd=directory, capture_output=True, text=True, timeout=60)
    return f"rc={done.returncode}\n{done.stdout}{done.stderr}"


def test_units_and_drop_in_pass_systemd_analyze_verify(tmp_path: Path) -> None:
    output = _systemd_analyze_verify(_verify_dir(tmp_path))
    assert output.startswith("rc=0"), output
    ours = [line for line in output.splitlines()[1:] if str(tmp_path) in line]
    assert ours == [], "systemd-analyze complained:\n" + "\n".join(ours)


def test_verify_really_reads_the_drop_in(tmp_path: Path) -> None:
    directory = _verify_dir(tmp_path)
    drop_in = directory / "kubelet.service.d" / "10-koord-runtime-proxy.conf"
    drop_in.write_text(drop_in.read_text() + "NoSuchSetting=1\n")
    assert "NoSuchSetting" in _systemd_analyze_verify(directory)


def _install(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(INSTALL), *args], capture_output=True, text=True, timeout=60)


def test_dry_run_lists_every_step_and_changes_nothing(tmp_path: Path) -> None:
    done = _install("--dry-run", "--no-venv", "--root", str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert list(tmp_path.iterdir()) == []
    for dest in (
        "/etc/systemd/system/koord-runtime-proxy.service",
        "/etc/systemd/system/koordlet.service",
        "/etc/systemd/system/kubelet.service.d/10-koord-runtime-proxy.conf",
    ):
        assert f"would install: {tmp_path}{dest}" in done.stdout
    assert f"would create: {tmp_path}/etc/runtime/hookserver.d" in done.stdout


def test_dry_run_on_the_live_system_shows_venv_and_systemctl_steps() -> None:
    done = _install("--dry-run", "--prefix", "/srv/koordlet-py")
    assert done.returncode == 0, done.stderr
    assert "would run: python3 -m venv /srv/koordlet-py/venv" in done.stdout or os.path.exists(
        "/srv/koordlet-py/venv/bin/python"
    )
    assert f"pip install -q --disable-pip-version-check --upgrade {ROOT}" in done.stdout
    assert "would run: systemctl enable koord-runtime-proxy.service koordlet.service" in done.stdout


@pytest.mark.skipif(os.path.isdir("/run/systemd/system"), reason="systemd is running here")
def test_refuses_a_real_run_without_systemd() -> None:
    done = _install("--no-venv")
    assert done.returncode == 1
    assert "systemd is not running" in done.stderr


def test_install_into_a_root_is_idempotent_and_follows_the_prefix(tmp_path: Path) -> None:
    first = _install("--no-venv", "--root", str(tmp_path), "--prefix", "/srv/kp")
    assert first.returncode == 0, first.stderr
    proxy = tmp_path / "etc/systemd/system/koord-runtime-proxy.service"
    assert "ExecStart=/srv/kp/venv/bin/koord-runtime-proxy" in proxy.read_text()
    assert UNIT_PREFIX not in proxy.read_text()
    assert (tmp_path / "etc/systemd/system/kubelet.service.d/10-koord-runtime-proxy.conf").is_file()
    assert (tmp_path / "etc/runtime/hookserver.d").is_dir()
    second = _install("--no-venv", "--root", str(tmp_path), "--prefix", "/srv/kp")
    assert second.returncode == 0, second.stderr
    assert "installed:" not in second.stdout and "created:" not in second.stdout
    assert second.stdout.count("unchanged:") == 3


def test_warns_when_etc_default_kubelet_would_override_the_drop_in(tmp_path: Path) -> None:
    (tmp_path / "etc/default").mkdir(parents=True)
    (tmp_path / "etc/default/kubelet").write_text('KUBELET_EXTRA_ARGS="--node-ip=10.0.0.1"\n')
    done = _install("--no-venv", "--root", str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert "WARNING" in done.stdout and "--container-runtime-endpoint=unix://" in done.stdout


def test_root_without_no_venv_is_refused(tmp_path: Path) -> None:
    done = _install("--root", str(tmp_path))
    assert done.returncode == 2 and "--no-venv" in done.stderr


def _defaults(root: Path) -> dict[str, str]:
    """/etc/default/koordlet as systemd's EnvironmentFile reads it."""
    out = {}
    for line in (root / "etc/default/koordlet").read_text().splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            out[key] = value.strip('"')
    return out


def test_proxy_only_installs_the_proxy_and_drop_in_and_no_second_koordlet(tmp_path: Path) -> None:
    done = _install("--proxy-only", "--no-venv", "--root", str(tmp_path))
    assert done.returncode == 0, done.stderr
    units = tmp_path / "etc/systemd/system"
    assert (units / "koord-runtime-proxy.service").is_file()
    assert (units / "kubelet.service.d/10-koord-runtime-proxy.conf").is_file()
    assert (tmp_path / "etc/runtime/hookserver.d").is_dir()
    assert not (units / "koordlet.service").exists() and not (tmp_path / "etc/default/koordlet").exists()
    live = _install("--proxy-only", "--dry-run")
    assert live.returncode == 0, live.stderr
    assert "would run: systemctl enable koord-runtime-proxy.service\n" in live.stdout
    assert "koordlet.service" not in live.stdout.replace("koordlet.service from", "")


def test_proxy_only_over_a_full_install_removes_its_koordlet_unit(tmp_path: Path) -> None:
    assert _install("--no-venv", "--local", "--root", str(tmp_path)).returncode == 0
    assert (tmp_path / "etc/systemd/system/koordlet.service").is_file()
    done = _install("--proxy-only", "--no-venv", "--root", str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert "koordlet.service from an earlier full install" in done.stdout
    assert not (tmp_path / "etc/systemd/system/koordlet.service").exists()


def test_without_a_kubeconfig_koordlet_service_runs_in_local_mode(tmp_path: Path) -> None:
    from koordlet.config import parse_config

    done = _install("--no-venv", "--root", str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert "local mode" in done.stdout
    env = _defaults(tmp_path)
    assert "KUBECONFIG" not in env
    config = parse_config(shlex.split(env["KOORDLET_ARGS"]), {"NODE_NAME": "node-1", "agent_mode": "hostMode"})
    assert config.local_mode and config.cri_endpoint == "/var/run/containerd/containerd.sock"


def test_kubelets_kubeconfig_is_found_and_an_explicit_one_must_exist(tmp_path: Path) -> None:
    (tmp_path / "etc/kubernetes").mkdir(parents=True)
    (tmp_path / "etc/kubernetes/kubelet.conf").write_text("apiVersion: v1\nkind: Config\n")
    done = _install("--no-venv", "--root", str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert _defaults(tmp_path)["KUBECONFIG"] == "/etc/kubernetes/kubelet.conf"
    other = tmp_path / "other"
    missing = _install("--no-venv", "--root", str(other), "--kubeconfig", "/etc/koordlet/kubeconfig")
    assert missing.returncode == 2 and "no such readable file" in missing.stderr
    assert not other.exists()


def test_an_environment_file_that_would_crash_loop_koordlet_is_refused(tmp_path: Path) -> None:
    (tmp_path / "etc/default").mkdir(parents=True)
    (tmp_path / "etc/default/koordlet").write_text('#KUBECONFIG=/etc/kubernetes/kubelet.conf\nKOORDLET_ARGS=""\n')
    done = _install("--no-venv", "--root", str(tmp_path))
    assert done.returncode == 1
    assert "sets neither KUBECONFIG nor -local-mode" in done.stderr and "restart for ever" in done.stderr


def test_koordlet_unit_gives_up_on_a_configuration_error_instead_of_restarting_for_ever() -> None:
    unit = _unit("koordlet.service")
    assert values(unit, "Unit", "StartLimitIntervalSec") == ["600"]
    assert values(unit, "Unit", "StartLimitBurst") == ["5"]
    assert values(unit, "Service", "RestartPreventExitStatus") == ["2"]
    from koordlet.main import main

    assert main(["-no-such-flag"]) == 2  # the exit status the unit does not restart on


UNINSTALL = ROOT / "scripts" / "uninstall.sh"


def _recording_systemctl(tmp_path: Path, root: Path) -> tuple[Path, Path]:
    """A systemctl stand-in that records each call, and whether the kubelet drop-in was still there."""
    record = tmp_path / "calls"
    fake = tmp_path / "systemctl"
    drop_in = root / "etc/systemd/system/kubelet.service.d/10-koord-runtime-proxy.conf"
    fake.write_text(f"#!/bin/sh\n[ -e {drop_in} ] && d=drop-in || d=no-drop-in\n"
                    f'echo "$* ($d)" >> {record}\n[ "$1" = show ] && exit 0\nexit 0\n')
    fake.chmod(0o755)
    return fake, record


def test_uninstall_takes_the_proxy_off_kubelets_path_before_stopping_it(tmp_path: Path) -> None:
    root = tmp_path / "root"
    assert _install("--no-venv", "--local", "--root", str(root)).returncode == 0
    fake, record = _recording_systemctl(tmp_path, root)
    done = subprocess.run(["bash", str(UNINSTALL), "--root", str(root)], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "SYSTEMCTL": str(fake)})
    assert done.returncode == 0, done.stderr
    calls = [c for c in record.read_text().splitlines() if not c.startswith(("show", "list-unit-files", "is-active"))]
    assert calls == [
        "daemon-reload (no-drop-in)",                   # 1. kubelet's unit no longer names the proxy
        "restart kubelet.service (no-drop-in)",          # 2. kubelet back on containerd's socket
        "disable --now koordlet.service (no-drop-in)",   # 3. then the agent and the proxy stop
        "disable --now koord-runtime-proxy.service (no-drop-in)",
        "daemon-reload (no-drop-in)",
    ]
    units = root / "etc/systemd/system"
    assert not (units / "koordlet.service").exists() and not (units / "koord-runtime-proxy.service").exists()
    assert (root / "etc/default/koordlet").exists()  # kept without --purge


def test_uninstall_refuses_while_kubelets_config_still_points_at_the_proxy(tmp_path: Path) -> None:
    root = tmp_path / "root"
    assert _install("--proxy-only", "--no-venv", "--root", str(root)).returncode == 0
    (root / "var/lib/kubelet").mkdir(parents=True)
    (root / "var/lib/kubelet/config.yaml").write_text(
        f"containerRuntimeEndpoint: unix://{PROXY_SOCKET}\n")
    fake, record = _recording_systemctl(tmp_path, root)
    done = subprocess.run(["bash", str(UNINSTALL), "--root", str(root)], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "SYSTEMCTL": str(fake)})
    assert done.returncode == 1 and "still point(s) kubelet at" in done.stderr
    assert not record.exists(), "nothing may be stopped while kubelet would lose its runtime"
    assert (root / "etc/systemd/system/kubelet.service.d/10-koord-runtime-proxy.conf").exists()


def test_uninstall_purge_leaves_nothing_of_the_install(tmp_path: Path) -> None:
    root = tmp_path / "root"
    assert _install("--no-venv", "--local", "--root", str(root)).returncode == 0
    done = subprocess.run(["bash", str(UNINSTALL), "--root", str(root), "--purge"], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert [p for p in root.rglob("*") if p.is_file()] == []
