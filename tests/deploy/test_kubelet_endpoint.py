"""The installer points kubelet at the proxy in the one place kubelet reads its endpoint from, and uninstall puts
exactly that back (scripts/kubelet-endpoint.sh).

Each test lays kubelet out under a root as kubeadm's packages do (tests/support/kubeadmnode.py) and runs the
installer and the uninstaller on it as files (``--root``, systemctl recorded); the stand-in kubelet resolves each
layout's endpoint with kubelet's precedence. What a kubelet started by real systemd reads from them, with the real
installer and uninstaller (no --root): test_kubelet_endpoint_systemd_v2.py in the v2 stage's systemd guest, on request
(not in ``make test``: docs/testing.md), for kubeadm 1.27 and later; kubeadm before 1.27 and ``--restart-kubelet``
under real systemd are not tested yet.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.support.kubeadmnode import CONTAINERD_ENDPOINT, KubeadmLayout, runtime_endpoint

ROOT = Path(__file__).resolve().parents[2]
INSTALL = ROOT / "scripts" / "install-baremetal.sh"
UNINSTALL = ROOT / "scripts" / "uninstall.sh"
PROXY = "unix:///var/run/koord-runtimeproxy/runtimeproxy.sock"
DROP_IN = "/etc/systemd/system/kubelet.service.d/10-koord-runtime-proxy.conf"
DROP_IN_LINE = f'Environment="KUBELET_EXTRA_ARGS=--container-runtime-endpoint={PROXY}"'
RECORD = "/var/lib/koord-runtimeproxy/kubelet-endpoint"


def _run(script: Path, root: Path, *args: str, systemctl: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **({"SYSTEMCTL": str(systemctl)} if systemctl else {})}
    return subprocess.run(["bash", str(script), "--root", str(root), *args], capture_output=True, text=True,
                          timeout=60, env=env)


def _install(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return _run(INSTALL, root, "--proxy-only", "--no-venv", *args)


def _uninstall(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    fake = root.parent / "systemctl"
    fake.write_text("#!/bin/sh\nexit 0\n")
    fake.chmod(0o755)
    return _run(UNINSTALL, root, *args, systemctl=fake)


def _changed(layout: KubeadmLayout, before: dict[str, bytes]) -> dict[str, tuple[str, str]]:
    """The layout's files that differ from ``before``: node path -> (old text, new text)."""
    return {path: (before[path].decode(), now.decode()) for path, now in layout.contents().items()
            if now != before[path]}


def _drop_in(root: Path) -> str:
    return (root / DROP_IN.lstrip("/")).read_text()


def _drop_in_environment(root: Path) -> list[str]:
    return [line for line in _drop_in(root).splitlines() if line.startswith("Environment=")]


def test_kubeadm_127_and_later_the_config_files_containerRuntimeEndpoint_is_changed_and_nothing_else(
        tmp_path: Path) -> None:
    # kubeadm >= 1.27: the endpoint in config.yaml, no flag; the deb's empty KUBELET_EXTRA_ARGS= would override a
    # drop-in's Environment= (the defect: the endpoint never reached kubelet).
    layout = KubeadmLayout(tmp_path)
    before = layout.write()
    done = _install(tmp_path)
    assert done.returncode == 0, done.stderr
    assert _changed(layout, before) == {"/var/lib/kubelet/config.yaml": (
        before["/var/lib/kubelet/config.yaml"].decode(),
        before["/var/lib/kubelet/config.yaml"].decode().replace(CONTAINERD_ENDPOINT, PROXY))}
    assert "kubelet reads its endpoint from /var/lib/kubelet/config.yaml" in done.stdout
    # the drop-in orders kubelet after the proxy but does not also carry the flag
    assert _drop_in_environment(tmp_path) == [] and "After=koord-runtime-proxy.socket" in _drop_in(tmp_path)
    assert runtime_endpoint(["--config", str(layout.path("/var/lib/kubelet/config.yaml"))])[0] == PROXY

    again = _install(tmp_path)  # a rerun changes nothing
    assert again.returncode == 0, again.stderr
    assert "kubelet's endpoint: unchanged, /var/lib/kubelet/config.yaml names the proxy" in again.stdout
    assert _changed(layout, before) == {"/var/lib/kubelet/config.yaml": _changed(layout, before)[
        "/var/lib/kubelet/config.yaml"]}

    gone = _uninstall(tmp_path)
    assert gone.returncode == 0, gone.stderr
    assert layout.contents() == before, "uninstall puts back exactly what was there"
    assert not (tmp_path / RECORD.lstrip("/")).exists() and not (tmp_path / DROP_IN.lstrip("/")).exists()


def test_a_config_without_the_field_gets_it_added_and_uninstall_takes_it_out_again(tmp_path: Path) -> None:
    layout = KubeadmLayout(tmp_path)
    before = layout.write()
    config = layout.path("/var/lib/kubelet/config.yaml")
    config.write_text("".join(line for line in config.read_text().splitlines(keepends=True)
                              if not line.startswith("containerRuntimeEndpoint:")))
    before = layout.contents()
    assert _install(tmp_path).returncode == 0
    assert config.read_text() == before["/var/lib/kubelet/config.yaml"].decode() + \
        f"containerRuntimeEndpoint: {PROXY}\n"
    assert _uninstall(tmp_path).returncode == 0
    assert layout.contents() == before


@pytest.mark.parametrize("rpm", [False, True], ids=["deb-etc-default", "rpm-etc-sysconfig"])
def test_kubeadm_before_127_the_flag_goes_into_the_extra_args_file_after_kubeadms_own(
        tmp_path: Path, rpm: bool) -> None:
    # kubeadm < 1.27: --container-runtime-endpoint in kubeadm-flags.env (rewritten by kubeadm upgrade: not ours to
    # change); KUBELET_EXTRA_ARGS comes after it on the command line, and of a flag given twice the last wins.
    layout = KubeadmLayout(tmp_path, flag_in_kubeadm_args=True, rpm=rpm, extra_args='"--node-ip=10.0.0.5"')
    before = layout.write()
    done = _install(tmp_path)
    assert done.returncode == 0, done.stderr
    extra = layout.extra_args_file
    assert _changed(layout, before) == {extra: (
        'KUBELET_EXTRA_ARGS="--node-ip=10.0.0.5"\n',
        f'KUBELET_EXTRA_ARGS="--node-ip=10.0.0.5 --container-runtime-endpoint={PROXY}"\n')}
    assert "flags win over its config file" in done.stdout
    assert _drop_in_environment(tmp_path) == []
    # kubelet's command line as 10-kubeadm.conf builds it: kubeadm's flag first, ours last
    argv = ["--config=/nonexistent", "--pod-infra-container-image=pause", f"--container-runtime-endpoint="
            f"{CONTAINERD_ENDPOINT}", "--node-ip=10.0.0.5", f"--container-runtime-endpoint={PROXY}"]
    assert runtime_endpoint(argv) == (PROXY, "flag --container-runtime-endpoint")
    assert _install(tmp_path).stdout.count("kubelet's endpoint: unchanged") == 1
    assert _uninstall(tmp_path).returncode == 0
    assert layout.contents() == before


def test_an_empty_extra_args_file_gets_the_flag_when_kubelet_has_no_config_file(tmp_path: Path) -> None:
    layout = KubeadmLayout(tmp_path)
    before = layout.write()
    dropin = layout.path(f"{layout.unit_dir}/kubelet.service.d/10-kubeadm.conf")
    dropin.write_text(dropin.read_text().replace('Environment="KUBELET_CONFIG_ARGS=--config=/var/lib/kubelet/config'
                                                 '.yaml"\n', ""))
    before = layout.contents()
    done = _install(tmp_path)
    assert done.returncode == 0, done.stderr
    assert _changed(layout, before) == {"/etc/default/kubelet": (
        "KUBELET_EXTRA_ARGS=\n", f'KUBELET_EXTRA_ARGS="--container-runtime-endpoint={PROXY}"\n')}
    assert _uninstall(tmp_path).returncode == 0
    assert layout.contents() == before


def test_with_no_file_defining_extra_args_the_drop_in_carries_the_flag(tmp_path: Path) -> None:
    layout = KubeadmLayout(tmp_path, unit_dir="/lib/systemd/system")
    before = layout.write()
    layout.path("/etc/default/kubelet").unlink()  # EnvironmentFile=- of a file that is not there: nothing
    dropin = layout.path(f"{layout.unit_dir}/kubelet.service.d/10-kubeadm.conf")
    dropin.write_text(dropin.read_text().replace("--config=/var/lib/kubelet/config.yaml", ""))
    del before["/etc/default/kubelet"]
    before[f"{layout.unit_dir}/kubelet.service.d/10-kubeadm.conf"] = dropin.read_bytes()
    done = _install(tmp_path)
    assert done.returncode == 0, done.stderr
    assert _drop_in_environment(tmp_path) == [DROP_IN_LINE]
    assert {path: layout.path(path).read_bytes() for path in before} == before
    assert (tmp_path / RECORD.lstrip("/") / "place").read_text() == "drop-in\n"
    assert _uninstall(tmp_path).returncode == 0
    assert not (tmp_path / DROP_IN.lstrip("/")).exists()


def test_without_any_kubelet_unit_the_drop_in_carries_the_flag_as_before(tmp_path: Path) -> None:
    done = _install(tmp_path)
    assert done.returncode == 0, done.stderr
    assert "no kubelet.service here yet" in done.stdout
    assert _drop_in_environment(tmp_path) == [DROP_IN_LINE]


def test_dry_run_names_the_change_and_makes_none(tmp_path: Path) -> None:
    layout = KubeadmLayout(tmp_path)
    before = layout.write()
    done = _install(tmp_path, "--dry-run")
    assert done.returncode == 0, done.stderr
    assert (f"would point kubelet at the proxy in /var/lib/kubelet/config.yaml (kubelet reads its endpoint from "
            f"/var/lib/kubelet/config.yaml (no --container-runtime-endpoint flag)): 'containerRuntimeEndpoint: "
            f"{CONTAINERD_ENDPOINT}' -> 'containerRuntimeEndpoint: {PROXY}'") in done.stdout
    assert layout.contents() == before
    assert not (tmp_path / "var/lib/koord-runtimeproxy").exists()


@pytest.mark.parametrize(("change", "why"), [
    (lambda layout: layout.path(f"{layout.unit_dir}/kubelet.service.d/10-kubeadm.conf").write_text(
        layout.files()[f"{layout.unit_dir}/kubelet.service.d/10-kubeadm.conf"].replace(
            "$KUBELET_EXTRA_ARGS", f"$KUBELET_EXTRA_ARGS --container-runtime-endpoint={CONTAINERD_ENDPOINT}")),
     "and no $KUBELET_EXTRA_ARGS follows it"),
    (lambda layout: layout.path("/var/lib/kubelet/config.yaml").write_text(
        '{"kind": "KubeletConfiguration", "containerRuntimeEndpoint": "unix:///run/containerd/containerd.sock"}\n'),
     "/var/lib/kubelet/config.yaml is JSON"),
    (lambda layout: (layout.path("/etc/default/kubelet").unlink(),
                     layout.path("/etc/systemd/system/kubelet.service.d/20-extra.conf").parent.mkdir(parents=True),
                     layout.path("/etc/systemd/system/kubelet.service.d/20-extra.conf").write_text(
                         '[Service]\nEnvironment="KUBELET_EXTRA_ARGS=--node-ip=10.0.0.5"\n'),
                     layout.path("/var/lib/kubelet/config.yaml").unlink()),
     "KUBELET_EXTRA_ARGS is set by Environment= in /etc/systemd/system/kubelet.service.d/20-extra.conf"),
], ids=["flag-after-extra-args", "json-config", "someone-elses-environment"])
def test_a_layout_where_no_single_change_would_do_is_refused_and_left_alone(
        tmp_path: Path, change: object, why: str) -> None:
    layout = KubeadmLayout(tmp_path)
    layout.write()
    change(layout)  # type: ignore[operator]
    files = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    done = _install(tmp_path)
    assert done.returncode == 1
    assert "cannot point kubelet at the proxy" in done.stderr and why in done.stderr and "by hand" in done.stderr
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == files, "nothing was changed"


def test_uninstall_refuses_when_the_line_it_wrote_was_changed_since(tmp_path: Path) -> None:
    layout = KubeadmLayout(tmp_path)
    layout.write()
    assert _install(tmp_path).returncode == 0
    config = layout.path("/var/lib/kubelet/config.yaml")
    config.write_text(config.read_text().replace(PROXY, f'"{PROXY}"'))
    done = _uninstall(tmp_path)
    assert done.returncode == 1
    assert "was changed since" in done.stderr and f"it said 'containerRuntimeEndpoint: {CONTAINERD_ENDPOINT}'" \
        in done.stderr
    assert (tmp_path / DROP_IN.lstrip("/")).exists(), "kubelet keeps the proxy until the file is fixed"


def test_an_install_that_finds_kubelet_reading_another_place_than_it_changed_refuses(tmp_path: Path) -> None:
    layout = KubeadmLayout(tmp_path)
    layout.write()
    assert _install(tmp_path).returncode == 0  # config.yaml changed and recorded
    # the operator since passes the flag in KUBELET_EXTRA_ARGS: kubelet now reads that
    layout.path("/etc/default/kubelet").write_text(f'KUBELET_EXTRA_ARGS="--container-runtime-endpoint='
                                                   f'{CONTAINERD_ENDPOINT}"\n')
    done = _install(tmp_path)
    assert done.returncode == 1
    assert "an earlier install pointed kubelet at the proxy in /var/lib/kubelet/config.yaml" in done.stderr
    assert "kubelet now reads its endpoint from /etc/default/kubelet" in done.stderr
