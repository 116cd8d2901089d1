"""The bare-metal units verify with systemd-analyze, agree with each other, and install idempotently."""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from runtimeproxy.main import parse_args
from tests.support.proxy import ProxyProcess

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


def test_proxy_unit_is_ready_before_kubelet_always_restarts_and_is_sandboxed() -> None:
    unit = _unit("koord-runtime-proxy.service")
    assert "kubelet.service" in values(unit, "Unit", "Before")[0].split()
    # kubelet is ordered after readiness (the store rebuilt), not after the process merely exists
    assert values(unit, "Service", "Type") == ["notify"]
    assert values(unit, "Service", "Restart") == ["always"]
    # the socket is systemd's: no runtime dir of the service's own that a stop could remove under it
    assert values(unit, "Service", "RuntimeDirectory") == []
    for key, expected in {
        "ProtectSystem": "strict",
        "NoNewPrivileges": "yes",
        "ProtectHome": "yes",
        "PrivateTmp": "yes",
        "ProtectControlGroups": "yes",
        "CapabilityBoundingSet": "",
    }.items():
        assert values(unit, "Service", key) == [expected], key


def _proxy_args() -> argparse.Namespace:
    """The proxy's command line as systemd runs it: the unit's own Environment= defaults expanded."""
    unit = _unit("koord-runtime-proxy.service")
    env = dict(item.split("=", 1) for item in values(unit, "Service", "Environment"))
    argv = shlex.split(values(unit, "Service", "ExecStart")[0])
    assert argv[0] == f"{UNIT_PREFIX}/current/bin/koord-runtime-proxy"  # the installed version's venv
    expanded = [re.sub(r"\$\{(\w+)\}", lambda m: env[m.group(1)], arg) for arg in argv[1:]]
    return parse_args(expanded)  # the proxy's own parser: unknown flags would exit


def test_proxy_command_line_is_accepted_by_the_proxy_and_matches_the_kubelet_drop_in() -> None:
    args = _proxy_args()
    assert args.koord_runtimeproxy_endpoint == PROXY_SOCKET
    assert args.metrics_bind_address == "127.0.0.1:9318"  # the default; the installer's env file may change it
    drop_in = parse_unit((SYSTEMD / "10-koord-runtime-proxy.conf").read_text())
    env = values(drop_in, "Service", "Environment")
    assert env == [f'"KUBELET_EXTRA_ARGS=--container-runtime-endpoint=unix://{PROXY_SOCKET}"']
    # after the socket and the proxy's readiness; never Requires= (a proxy restart must not restart kubelet)
    assert values(drop_in, "Unit", "After") == ["koord-runtime-proxy.socket koord-runtime-proxy.service"]
    assert values(drop_in, "Unit", "Wants") == ["koord-runtime-proxy.socket koord-runtime-proxy.service"]
    assert values(drop_in, "Unit", "Requires") == []


def test_the_socket_unit_holds_the_path_kubelet_dials_with_tight_permissions() -> None:
    socket_unit = _unit("koord-runtime-proxy.socket")
    service = _unit("koord-runtime-proxy.service")
    # /var/run is /run: the path kubelet is given and the path systemd listens on are one file
    listen = values(socket_unit, "Socket", "ListenStream")
    assert listen == ["/run" + PROXY_SOCKET.removeprefix("/var/run")]
    assert _proxy_args().koord_runtimeproxy_endpoint == PROXY_SOCKET
    assert values(socket_unit, "Socket", "SocketMode") == ["0660"]
    assert values(socket_unit, "Socket", "SocketUser") == ["root"]
    assert values(socket_unit, "Socket", "SocketGroup") == ["root"]
    assert values(socket_unit, "Socket", "FileDescriptorName") == ["cri"]  # the name the proxy looks for
    assert values(socket_unit, "Socket", "Accept") == []  # one service for the socket, not one per connection
    assert "kubelet.service" in values(socket_unit, "Unit", "Before")[0].split()
    assert values(socket_unit, "Install", "WantedBy") == ["sockets.target"]
    assert values(service, "Unit", "Requires") == ["koord-runtime-proxy.socket"]
    assert "koord-runtime-proxy.socket" in values(service, "Unit", "After")[0].split()


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
    for name in ("koord-runtime-proxy.service", "koord-runtime-proxy.socket", "koordlet.service"):
        text = (SYSTEMD / name).read_text().replace(f"{UNIT_PREFIX}/current", str(venv))
        (tmp_path / name).write_text(text)
    (tmp_path / "kubelet.service").write_text("[Unit]\nDescription=kubelet\n[Service]\nExecStart=/bin/true\n")
    (tmp_path / "kubelet.service.d").mkdir()
    shutil.copy(SYSTEMD / "10-koord-runtime-proxy.conf", tmp_path / "kubelet.service.d")
    return tmp_path


def _systemd_analyze_verify(directory: Path) -> str:
    tool = shutil.which("systemd-analyze")
    if tool is None:
        pytest.skip("systemd-analyze not installed (Debian package 'systemd'; scripts/install-deps.sh installs it)")
    units = ["./koord-runtime-proxy.socket", "./koord-runtime-proxy.service", "./koordlet.service", "./kubelet.service"]
    done = subprocess.run([tool, "verify", *units], cwd=directory, capture_output=True, text=True, timeout=60)
    return f"rc={done.returncode}\n{done.stdout}{done.stderr}"


def test_units_and_drop_in_pass_systemd_analyze_verify(tmp_path: Path) -> None:
    output = _systemd_analyze_verify(_verify_dir(tmp_path))
    assert output.startswith("rc=0"), output
    ours = [line for line in output.splitlines()[1:] if str(tmp_path) in line]
    assert ours == [], "systemd-analyze complained:\n" + "\n".join(ours)


def test_the_root_tree_drop_ins_pass_systemd_analyze_verify(tmp_path: Path) -> None:
    # systemd-analyze looks for ExecStart on the host, not in RootDirectory=: the units keep this venv's commands and
    # the drop-ins point at an existing directory, so what is checked is that systemd knows every setting.
    directory = _verify_dir(tmp_path)
    tree = tmp_path / "tree"
    tree.mkdir()
    for unit in ("koord-runtime-proxy", "koordlet"):
        (directory / f"{unit}.service.d").mkdir()
        text = (SYSTEMD / f"{unit}-root-tree.conf").read_text()
        text = text.replace(f"{UNIT_PREFIX}/versions/VERSION/root", str(tree))  # the installer writes the version in
        (directory / f"{unit}.service.d" / "50-root-tree.conf").write_text(text + "\n")
    output = _systemd_analyze_verify(directory)
    assert output.startswith("rc=0"), output
    assert [line for line in output.splitlines()[1:] if str(tmp_path) in line] == [], output
    broken = directory / "koordlet.service.d" / "50-root-tree.conf"
    broken.write_text(broken.read_text() + "RootDirectoryy=/\n")
    assert "RootDirectoryy" in _systemd_analyze_verify(directory)


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
        "/etc/systemd/system/koord-runtime-proxy.socket",
        "/etc/systemd/system/koord-runtime-proxy.service",
        "/etc/systemd/system/koordlet.service",
        "/etc/systemd/system/kubelet.service.d/10-koord-runtime-proxy.conf",
        "/etc/default/koord-runtime-proxy",
    ):
        assert f"would install: {tmp_path}{dest}" in done.stdout
    assert f"would create: {tmp_path}/etc/runtime/hookserver.d" in done.stdout


def test_dry_run_on_the_live_system_shows_the_versions_venv_the_lock_and_systemctl_steps() -> None:
    done = _install("--dry-run", "--prefix", "/srv/koordlet-py")
    assert done.returncode == 0, done.stderr
    version = re.search(r"installing version (0\.1\.0-[0-9a-f]{12}) into /srv/koordlet-py/versions/\1", done.stdout)
    assert version, done.stdout
    venv = f"/srv/koordlet-py/versions/{version.group(1)}"
    assert f"would run: python3 -m venv {venv}\n" in done.stdout
    assert f"{venv}/bin/python -m pip install -q --disable-pip-version-check --require-hashes --no-deps " \
           f"-r {ROOT}/requirements.lock\n" in done.stdout
    assert f"--no-deps --no-build-isolation {ROOT}\n" in done.stdout
    assert f"would point /srv/koordlet-py/current at versions/{version.group(1)}" in done.stdout
    assert "would run: systemctl enable koord-runtime-proxy.socket koord-runtime-proxy.service koordlet.service" \
        in done.stdout


@pytest.mark.skipif(os.path.isdir("/run/systemd/system"), reason="systemd is running here")
def test_refuses_a_real_run_without_systemd() -> None:
    done = _install("--no-venv")
    assert done.returncode == 1
    assert "systemd is not running" in done.stderr


def test_install_into_a_root_is_idempotent_and_follows_the_prefix(tmp_path: Path) -> None:
    first = _install("--no-venv", "--root", str(tmp_path), "--prefix", "/srv/kp")
    assert first.returncode == 0, first.stderr
    proxy = tmp_path / "etc/systemd/system/koord-runtime-proxy.service"
    assert "ExecStart=/srv/kp/current/bin/koord-runtime-proxy" in proxy.read_text()
    assert UNIT_PREFIX not in proxy.read_text()
    assert "ExecStart=/srv/kp/current/bin/koordlet" in (tmp_path / "etc/systemd/system/koordlet.service").read_text()
    assert (tmp_path / "etc/systemd/system/kubelet.service.d/10-koord-runtime-proxy.conf").is_file()
    assert (tmp_path / "etc/runtime/hookserver.d").is_dir()
    second = _install("--no-venv", "--root", str(tmp_path), "--prefix", "/srv/kp")
    assert second.returncode == 0, second.stderr
    assert "installed:" not in second.stdout and "created:" not in second.stdout
    assert second.stdout.count("unchanged:") == 5  # socket, service, drop-in, the proxy's env file, koordlet


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
    assert "would run: systemctl enable koord-runtime-proxy.socket koord-runtime-proxy.service\n" in live.stdout
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


def test_kubelets_kubeconfig_is_not_koordlets_identity_and_an_explicit_one_must_exist(tmp_path: Path) -> None:
    # kubelet.conf is the node (system:node:<name>): RBAC and the Node authorizer refuse it koordlet's objects
    (tmp_path / "etc/kubernetes").mkdir(parents=True)
    (tmp_path / "etc/kubernetes/kubelet.conf").write_text("apiVersion: v1\nkind: Config\n")
    done = _install("--no-venv", "--root", str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert "KUBECONFIG" not in _defaults(tmp_path) and "-local-mode" in _defaults(tmp_path)["KOORDLET_ARGS"]
    assert "kubelet's kubeconfig is there but not used" in done.stdout and "--admin-kubeconfig" in done.stdout
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
        "disable --now koord-runtime-proxy.socket (no-drop-in)",  # last: nothing is left to serve it
        "daemon-reload (no-drop-in)",
    ]
    units = root / "etc/systemd/system"
    assert [p.name for p in units.glob("koord*")] == []
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


# ---- versioned installs, the proxy's metrics address, kubelet's check ---------------------------------------

def _recorder(tmp_path: Path, on_kubelet_restart: str = "") -> tuple[Path, Path]:
    """A systemctl stand-in that records its calls; ``on_kubelet_restart`` runs on `restart kubelet.service`."""
    record = tmp_path / "systemctl-calls"
    fake = tmp_path / "systemctl-recorder"
    fake.write_text(f'#!/bin/sh\necho "$*" >> {record}\n'
                    f'[ "$*" = "restart kubelet.service" ] && {{ {on_kubelet_restart or ":"}; }}\nexit 0\n')
    fake.chmod(0o755)
    return fake, record


def _calls(record: Path) -> list[str]:
    calls = record.read_text().splitlines() if record.exists() else []
    record.unlink(missing_ok=True)
    return calls


def _tree_copy(dest: Path) -> Path:
    """What the installer reads of a checkout (sources, lock, units, scripts), as another version would be."""
    dest.mkdir()
    for name in ("pyproject.toml", "requirements.lock", "README.md"):
        shutil.copy(ROOT / name, dest / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in ("wire", "runtimeproxy", "koordlet", "hooks", "systemd", "scripts"):
        shutil.copytree(ROOT / name, dest / name, ignore=ignore)
    return dest


def _lock_pins() -> dict[str, str]:
    text = (ROOT / "requirements.lock").read_text()
    return {m.group(1).lower(): m.group(2) for m in re.finditer(r"^([A-Za-z0-9._-]+)==(\S+)", text, re.M)}


def _installed_versions(python: Path) -> dict[str, str]:
    script = "import importlib.metadata as m\nfor d in m.distributions(): print(d.metadata['Name'], d.version)"
    out = subprocess.run([str(python), "-c", script], capture_output=True, text=True, timeout=60, check=True).stdout
    return {name.lower().replace("_", "-"): version for name, version in (line.split() for line in out.splitlines())}


@pytest.mark.timeout(900)  # two real venvs from the lock (pip checks every hash), beside the parallel stage
def test_each_version_gets_its_own_locked_venv_a_new_one_restarts_the_proxy_and_rollback_goes_back(
        tmp_path: Path) -> None:
    """Real venvs from the lock (pip checks every file's sha256; PyPI or pip's cache), in a fake root."""
    root, prefix = tmp_path / "root", "/opt/kp"
    fake, record = _recorder(tmp_path)
    env = {**os.environ, "SYSTEMCTL": str(fake)}
    base = root / prefix.lstrip("/")

    def install(tree: Path, *args: str) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(["bash", str(tree / "scripts/install-baremetal.sh"), "--proxy-only", "--root", str(root),
                               "--prefix", prefix, *args], capture_output=True, text=True, timeout=600, env=env)
        assert done.returncode == 0, done.stdout + done.stderr
        return done

    first = install(ROOT)
    v1 = os.readlink(base / "current")
    assert re.fullmatch(r"versions/0\.1\.0-[0-9a-f]{12}", v1)
    assert "runs from there only" in first.stdout  # a venv under --root is said to be bound to it
    # a first install makes the socket (the proxy of an older install is stopped first: it bound the path itself)
    assert _calls(record) == ["daemon-reload", "enable koord-runtime-proxy.socket koord-runtime-proxy.service",
                              "stop koord-runtime-proxy.service", "restart koord-runtime-proxy.socket",
                              "start koord-runtime-proxy.service"]
    # every dependency at the lock's version, nothing resolved beside it, the project itself from this tree
    installed = _installed_versions(base / "current/bin/python")
    pins = _lock_pins()
    assert {name: installed.get(name) for name in pins if name != "setuptools"} == \
        {name: version for name, version in pins.items() if name != "setuptools"}
    assert installed.pop("koordlet-py") == "0.1.0"
    assert set(installed) - set(pins) <= {"pip"}, "a package outside the lock was installed"
    assert subprocess.run([str(base / "current/bin/koord-runtime-proxy"), "--help"], capture_output=True,
                          timeout=60).returncode == 0

    again = install(ROOT)  # the same version: nothing built, nothing restarted
    assert f"unchanged: version {v1.removeprefix('versions/')} is installed" in again.stdout
    assert _calls(record) == ["enable koord-runtime-proxy.socket koord-runtime-proxy.service",
                              "start koord-runtime-proxy.socket koord-runtime-proxy.service"]

    # a code-only change is a new version: its own venv, current switched, the proxy restarted (its socket kept)
    other = _tree_copy(tmp_path / "v2")
    with (other / "runtimeproxy/__init__.py").open("a") as init:
        init.write("# the next version\n")
    second = install(other)
    v2 = os.readlink(base / "current")
    assert v2 != v1 and os.readlink(base / "previous") == v1
    assert f"version: {v1} -> {v2}" in second.stdout
    assert _calls(record) == ["enable koord-runtime-proxy.socket koord-runtime-proxy.service",
                              "start koord-runtime-proxy.socket", "restart koord-runtime-proxy.service"]
    assert (base / v1 / "bin/python").exists(), "the previous version stays for the running process and rollback"

    back = subprocess.run(["bash", str(INSTALL), "--rollback", "--root", str(root), "--prefix", prefix],
                          capture_output=True, text=True, timeout=60, env=env)
    assert back.returncode == 0, back.stderr
    assert os.readlink(base / "current") == v1 and os.readlink(base / "previous") == v2
    assert _calls(record) == ["restart koord-runtime-proxy.service"]


def test_a_version_that_fails_to_install_leaves_current_as_it_was(tmp_path: Path) -> None:
    root = tmp_path / "root"
    tree = _tree_copy(tmp_path / "tree")
    lock = tree / "requirements.lock"
    # the hashes of the first package changed: pip must refuse whichever of its files it downloads
    text = lock.read_text()
    first = re.search(r"^\S+==\S+ \\\n(?:\s+--hash=sha256:[0-9a-f]{64}.*\n)+", text, re.M)
    lock.write_text(text.replace(first.group(0), re.sub(r"[0-9a-f]{64}", "0" * 64, first.group(0))))
    base = root / "opt/kp"
    base.mkdir(parents=True)
    (base / "current").symlink_to("versions/older")
    done = subprocess.run(["bash", str(tree / "scripts/install-baremetal.sh"), "--proxy-only", "--root", str(root),
                           "--prefix", "/opt/kp"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 1
    assert "failed (above); " in done.stderr and "current is unchanged" in done.stderr
    assert os.readlink(base / "current") == "versions/older"
    assert list((base / "versions").iterdir()) == [], "a half-built venv is not left behind"


def test_rollback_without_a_previous_version_says_so(tmp_path: Path) -> None:
    done = _install("--rollback", "--root", str(tmp_path), "--prefix", "/opt/kp")
    assert done.returncode == 1 and "nothing to roll back to" in done.stderr
    assert _install("--rollback", "--proxy-only", "--root", str(tmp_path)).returncode == 2


def _proxy_env(root: Path) -> str:
    return (root / "etc/default/koord-runtime-proxy").read_text()


def test_the_metrics_bind_address_is_an_install_option_kept_across_installs(tmp_path: Path) -> None:
    fake, record = _recorder(tmp_path)
    env = {**os.environ, "SYSTEMCTL": str(fake)}

    def install(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["bash", str(INSTALL), "--proxy-only", "--no-venv", "--root", str(tmp_path), *args],
                              capture_output=True, text=True, timeout=60, env=env)

    assert install("--metrics-bind-address", "0.0.0.0:9318").returncode == 0
    assert "METRICS_BIND_ADDRESS=0.0.0.0:9318\n" in _proxy_env(tmp_path)
    _calls(record)
    kept = install()  # no flag: the file's address stays, nothing restarts
    assert kept.returncode == 0 and "proxy metrics: 0.0.0.0:9318" in kept.stdout
    assert "restart koord-runtime-proxy.service" not in _calls(record)
    changed = install("--metrics-bind-address=[::]:9400")
    assert changed.returncode == 0 and "METRICS_BIND_ADDRESS=[::]:9400\n" in _proxy_env(tmp_path)
    assert "restart koord-runtime-proxy.service" in _calls(record)  # the proxy must bind the new address
    # as systemd would run it: the env file's value on the proxy's command line, accepted by the proxy
    from runtimeproxy.main import _split_host_port

    assert _split_host_port("[::]:9400") == ("::", 9400)
    bad = install("--metrics-bind-address", "9318")
    assert bad.returncode == 2 and "expected host:port" in bad.stderr


@pytest.fixture()
def running_proxy(tmp_path: Path) -> Iterator[ProxyProcess]:
    from tests.support.fakeruntime import FakeRuntime

    runtime = FakeRuntime(str(tmp_path / "runtime.sock")).start()
    proxy = ProxyProcess(str(tmp_path / "proxy.sock"), runtime.socket_path).start()
    try:
        yield proxy
    finally:
        proxy.terminate()
        runtime.stop()


def test_restart_kubelet_confirms_kubelet_talks_to_the_proxy_by_its_served_calls(
        tmp_path: Path, running_proxy: ProxyProcess) -> None:
    # kubelet's first calls after its restart, as kubelet makes them: Version through the proxy's socket
    dial = (f"{sys.executable} -c 'import grpc; grpc.insecure_channel(\"unix://{running_proxy.listen}\")"
            f".unary_unary(\"/runtime.v1.RuntimeService/Version\")(b\"\", timeout=10)'")
    fake, record = _recorder(tmp_path, on_kubelet_restart=dial)
    done = subprocess.run(["bash", str(INSTALL), "--proxy-only", "--no-venv", "--root", str(tmp_path / "root"),
                           "--restart-kubelet", "--metrics-bind-address", f"127.0.0.1:{running_proxy.metrics_port}"],
                          capture_output=True, text=True, timeout=120, env={**os.environ, "SYSTEMCTL": str(fake)})
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(r"kubelet talks to the proxy: [1-9]\d* CRI call\(s\) served within \d+s", done.stdout)
    assert _calls(record)[-1] == "restart kubelet.service"


def test_restart_kubelet_fails_loudly_when_kubelet_never_reaches_the_proxy(
        tmp_path: Path, running_proxy: ProxyProcess) -> None:
    fake, _ = _recorder(tmp_path)  # kubelet restarts and keeps talking to containerd: no call reaches the proxy
    done = subprocess.run(["bash", str(INSTALL), "--proxy-only", "--no-venv", "--root", str(tmp_path / "root"),
                           "--restart-kubelet", "--metrics-bind-address", f"127.0.0.1:{running_proxy.metrics_port}"],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "SYSTEMCTL": str(fake), "KUBELET_CHECK_TIMEOUT": "3"})
    assert done.returncode == 1
    assert "kubelet made no CRI call through the proxy within 3s" in done.stderr
    for hint in ("systemctl cat kubelet.service", "KUBELET_EXTRA_ARGS", "containerRuntimeEndpoint",
                 "journalctl -u kubelet"):
        assert hint in done.stderr


def test_a_proxy_that_keeps_failing_to_start_ends_the_install_with_why_instead_of_a_wait_for_ever(
        tmp_path: Path) -> None:
    # systemctl's start job of a unit with Restart=always that fails while starting never ends: the stand-in waits so
    record = tmp_path / "systemctl-calls"
    fake = tmp_path / "systemctl-hangs"
    fake.write_text(f'#!/bin/sh\necho "$*" >> {record}\n'
                    '[ "$*" = "start koord-runtime-proxy.service" ] && exec sleep 120\nexit 0\n')
    fake.chmod(0o755)
    started = time.monotonic()
    done = subprocess.run(["bash", str(INSTALL), "--proxy-only", "--no-venv", "--root", str(tmp_path / "root")],
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, "SYSTEMCTL": str(fake), "START_TIMEOUT": "2"})
    assert done.returncode == 1, done.stdout + done.stderr
    assert time.monotonic() - started < 30
    assert (f"'{fake} start koord-runtime-proxy.service' did not finish within 2s (START_TIMEOUT): "
            "koord-runtime-proxy.service keeps failing while it starts") in done.stderr
    assert "journalctl -u koord-runtime-proxy.service" in done.stderr
    assert _calls(record)[-1] == "start koord-runtime-proxy.service"  # nothing after it: kubelet left alone
