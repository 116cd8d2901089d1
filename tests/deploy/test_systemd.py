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
