"""Bare metal from the image's root tree (`install-baremetal.sh --rootfs`), on files: the tree `make image` writes is
unpacked as a version, checked to run with its own Python, and the units are rendered to run it in the tree.

Under ``--root`` with systemctl recorded. The services started from the tree by real systemd, with no Python on the
services' PATH: tests/deploy/test_root_tree_systemd_v2.py, in the v2 stage's systemd guest (on request). What it
found first: a RootDirectory= through the P/current link fails every start under systemd 252 (226/NAMESPACE, the
read-only remount of the tree finds no mount by that path), so the drop-ins name the version's own directory.
"""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from tests.deploy.test_image import VERSION, build_image_archive
from tests.deploy.test_systemd import parse_unit, values

ROOT = Path(__file__).resolve().parents[2]
INSTALL = ROOT / "scripts" / "install-baremetal.sh"
UNINSTALL = ROOT / "scripts" / "uninstall.sh"
PREFIX = "/opt/kp"
PROXY_DROP_IN = "etc/systemd/system/koord-runtime-proxy.service.d/50-root-tree.conf"
KOORDLET_DROP_IN = "etc/systemd/system/koordlet.service.d/50-root-tree.conf"
# serial: the image build writes out/image (test_image.py's tests build it too, in the same serial session).
pytestmark = [pytest.mark.serial, pytest.mark.timeout(900)]  # the first test builds the image


@pytest.fixture(scope="module")
def rootfs() -> Path:
    """`make image`'s root tree (built once for the image's tests too: an unchanged checkout is not built again)."""
    archive = build_image_archive()
    tree = archive.with_name(archive.name.replace(".oci.tar", ".rootfs.tar.gz"))
    assert tree.is_file(), f"scripts/build-image.sh wrote {archive} but no {tree}"
    return tree


def _recorder(tmp_path: Path) -> tuple[dict[str, str], Path]:
    record = tmp_path / "systemctl-calls"
    fake = tmp_path / "systemctl"
    fake.write_text(f'#!/bin/sh\necho "$*" >> {record}\nexit 0\n')
    fake.chmod(0o755)
    return {**os.environ, "SYSTEMCTL": str(fake)}, record


def _install(root: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(INSTALL), "--root", str(root), "--prefix", PREFIX, *args], capture_output=True,
                          text=True, timeout=600, env=env)


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_the_tree_is_a_version_that_runs_its_own_python_and_the_units_run_it_inside(
        tmp_path: Path, rootfs: Path) -> None:
    root = tmp_path / "root"
    env, record = _recorder(tmp_path)
    done = _install(root, "--rootfs", str(rootfs), "--local", env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    base = root / PREFIX.lstrip("/")
    target = f"versions/{VERSION}-{_digest(rootfs)[:12]}"
    assert os.readlink(base / "current") == target
    assert "kind=tree" in (base / target / ".installed").read_text()
    tree = base / target / "root"  # the image's root file system
    assert "runs from there only" not in done.stdout  # a tree, unlike a virtualenv, does not care where it is
    # the image's own interpreter runs the proxy, in the tree: nothing of this host's Python is used
    chroot = shutil.which("chroot") or "/usr/sbin/chroot"
    ran = subprocess.run([chroot, str(tree), "/opt/koordlet-py/bin/koord-runtime-proxy", "--help"],
                         capture_output=True, text=True, timeout=120, env={"PATH": "/usr/bin:/bin"})
    assert ran.returncode == 0 and "--koord-runtimeproxy-endpoint" in ran.stdout, ran.stderr

    units = root / "etc/systemd/system"
    for unit, drop_in, binary in (("koord-runtime-proxy.service", PROXY_DROP_IN, "koord-runtime-proxy"),
                                  ("koordlet.service", KOORDLET_DROP_IN, "koordlet")):
        exec_start = values(parse_unit((units / unit).read_text()), "Service", "ExecStart")[0]
        assert exec_start.split()[0] == f"/opt/koordlet-py/bin/{binary}", exec_start  # the image's path, in the tree
        assert os.access(tree / exec_start.split()[0].lstrip("/"), os.X_OK)
        service = parse_unit((root / drop_in).read_text())["Service"]
        # the version's own tree, not current/root: through a link systemd cannot make the tree read-only
        assert ("RootDirectory", f"{PREFIX}/{target}/root") in service
        assert ("MountAPIVFS", "yes") in service
    proxy_binds = values(parse_unit((root / PROXY_DROP_IN).read_text()), "Service", "BindReadOnlyPaths")
    assert proxy_binds == ["/run"]  # containerd's and the hook servers' sockets
    koordlet_binds = values(parse_unit((root / KOORDLET_DROP_IN).read_text()), "Service", "BindPaths")
    assert {"/run", "/etc/runtime/hookserver.d", "-/var/lib/kubelet"} <= set(koordlet_binds)
    assert record.read_text().splitlines()[:2] == [
        "daemon-reload", "enable koord-runtime-proxy.socket koord-runtime-proxy.service koordlet.service"]

    again = _install(root, "--rootfs", str(rootfs), env=env)
    assert again.returncode == 0, again.stderr
    assert f"unchanged: version {target.removeprefix('versions/')} is installed" in again.stdout
    assert "unpacking" not in again.stdout and "installed:" not in again.stdout

    gone = subprocess.run(["bash", str(UNINSTALL), "--root", str(root), "--prefix", PREFIX, "--purge"],
                          capture_output=True, text=True, timeout=600, env=env)
    assert gone.returncode == 0, gone.stderr
    assert not base.exists() and not (units / "koord-runtime-proxy.service.d").exists()
    assert [p for p in root.rglob("*") if p.is_file()] == []


def test_rollback_points_the_drop_ins_at_the_previous_tree_and_reloads_systemd_before_the_restart(
        tmp_path: Path, rootfs: Path) -> None:
    root = tmp_path / "root"
    env, record = _recorder(tmp_path)
    second = tmp_path / "second.rootfs.tar.gz"  # the same tree in other bytes (an empty gzip member after it)
    shutil.copyfile(rootfs, second)
    with open(second, "ab") as tar:
        tar.write(subprocess.run(["gzip", "-c"], input=b"", capture_output=True, check=True).stdout)
    first_id, second_id = (f"{VERSION}-{_digest(tar)[:12]}" for tar in (rootfs, second))
    for args in (("--rootfs", str(rootfs), "--local"), ("--rootfs", str(second))):
        done = _install(root, *args, env=env)
        assert done.returncode == 0, done.stdout + done.stderr

    def root_directories() -> set[str]:
        return {dict(parse_unit((root / drop_in).read_text())["Service"])["RootDirectory"]
                for drop_in in (PROXY_DROP_IN, KOORDLET_DROP_IN)}

    assert root_directories() == {f"{PREFIX}/versions/{second_id}/root"}
    record.write_text("")
    back = _install(root, "--rollback", env=env)
    assert back.returncode == 0, back.stdout + back.stderr
    assert root_directories() == {f"{PREFIX}/versions/{first_id}/root"}
    assert record.read_text().splitlines() == [
        "daemon-reload", "restart koord-runtime-proxy.service", "restart koordlet.service"]
    shutil.rmtree(root)


def test_a_tar_that_is_not_the_image_tree_is_refused_and_current_stays(tmp_path: Path) -> None:
    root = tmp_path / "root"
    base = root / PREFIX.lstrip("/")
    base.mkdir(parents=True)
    (base / "current").symlink_to("versions/older")
    bogus = tmp_path / "bogus.rootfs.tar.gz"
    with tarfile.open(bogus, "w:gz") as tar:
        data = b"#!/bin/sh\n"
        info = tarfile.TarInfo("opt/koordlet-py/bin/koordlet")
        info.size, info.mode = len(data), 0o755
        tar.addfile(info, io.BytesIO(data))
    done = _install(root, "--rootfs", str(bogus), "--proxy-only")
    assert done.returncode == 1
    assert "is not koordlet-py's root tree" in done.stderr and "current is unchanged" in done.stderr
    assert os.readlink(base / "current") == "versions/older"
    assert list((base / "versions").iterdir()) == [], "nothing half-unpacked is left"
    assert not (root / "etc/systemd").exists(), "no unit was installed"


def test_rollback_across_a_virtualenv_and_a_root_tree_is_refused_naming_both(tmp_path: Path, rootfs: Path) -> None:
    root = tmp_path / "root"
    assert _install(root, "--rootfs", str(rootfs), "--proxy-only").returncode == 0
    base = root / PREFIX.lstrip("/")
    # the version installed before: a virtualenv, as the pip way leaves it (its python a link to an interpreter)
    venv = base / "versions/0.0.9-000000000000"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin/python").symlink_to(shutil.which("python3") or "/usr/bin/python3")
    (base / "previous").symlink_to("versions/0.0.9-000000000000")
    done = _install(root, "--rollback")
    assert done.returncode == 1
    assert "is a virtualenv and the units run a root tree (--rootfs)" in done.stderr
    assert "install that version again" in done.stderr


def test_options_that_do_not_go_with_a_root_tree_are_refused(tmp_path: Path, rootfs: Path) -> None:
    for args, why in ((["--no-venv"], "no --no-venv, no --python"), (["--python", "python3.11"], "no --python"),
                      (["--kubeconfig", "/srv/kubeconfig"], "koordlet sees the host's /etc/kubernetes")):
        (tmp_path / "srv").mkdir(exist_ok=True)
        (tmp_path / "srv/kubeconfig").write_text("apiVersion: v1\n")
        done = _install(tmp_path, "--rootfs", str(rootfs), *args)
        assert done.returncode == 2 and why in done.stderr, (args, done.stderr)
    missing = _install(tmp_path, "--rootfs", str(tmp_path / "none.tar.gz"))
    assert missing.returncode == 2 and "no such readable file" in missing.stderr


def test_dry_run_names_the_tree_it_would_unpack_and_changes_nothing(tmp_path: Path, rootfs: Path) -> None:
    done = _install(tmp_path, "--rootfs", str(rootfs), "--local", "--dry-run")
    assert done.returncode == 0, done.stderr
    assert (f"would unpack {rootfs} into {tmp_path}{PREFIX}/versions/<version>-{_digest(rootfs)[:12]} and check "
            "that its own Python runs koordlet and the proxy") in done.stdout
    assert f"would install: {tmp_path}/{PROXY_DROP_IN}" in done.stdout
    assert list(tmp_path.iterdir()) == []
