"""The rules of the cgroup v2 VM stage (scripts/v2-guest.sh sets KPY_V2_GUEST=1), loaded by tests/conftest.py:

- there every test marked ``cgroupv2`` must run, so a skip is reported as a failure, unless the kernel truly lacks
  what the test needs and the skip reason says so with :data:`KERNEL_LACKS`;
- a test marked ``alone`` (its outcome depends on how much CPU the guest's processes get, or how fast the emulated
  guest runs) runs after the guest's other tests, and, when the VM runs beside the host stage (scripts/test-all.sh),
  not before the host says its stages are done: a busy host stalls the guest's vCPUs, and the guest counts the
  stalled time as CPU time of whatever ran on them.

Also the benchmarks' way into the guest (:func:`run_bench_in_v2_guest`)."""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

import pytest

KERNEL_LACKS = "kernel lacks"
# A file scripts/v2-stage.sh creates when this guest's tests marked alone may run: the host's stages beside the VM are
# done (V2_WAIT_FOR_HOST=1) and no other guest runs a test; unset: the guest runs alone and nothing is waited for.
HOST_DONE_ENV = "KPY_V2_HOST_DONE"
ALONE_READY = "alone-ready"  # written beside that file when this guest's next test is marked alone
HOST_WAIT_LIMIT_S = 2400.0  # past this the tests marked alone run anyway (and say so): a lost signal costs a run
_WAITED: list[float] = []  # the wait, once per session
REPO = Path(__file__).resolve().parents[2]
V2_ROOT = "/sys/fs/cgroup"
V2_CONTROLLERS = ("cpu", "cpuset", "memory")


def run_bench_in_v2_guest(bench: str, out_name: str, args: Sequence[str], timeout_s: int,
                          env: Mapping[str, str] | None = None) -> object | None:
    """Boot the cgroupfs guest (scripts/v2-stage.sh, ``V2_MODE=bench``) to run ``bench``'s ``--v2-guest`` part with
    ``args``; the guest's output goes to stderr and ``out/<out_name>/``. Returns the JSON the guest wrote to
    ``bench.json`` there, None (said on stderr) when it wrote none. ``env``: more of the stage's variables."""
    out = REPO / "out" / out_name
    stage_env = {**os.environ, "V2_MODE": "bench", "V2_BENCH": bench, "V2_OUT": str(out),
                 "V2_TIMEOUT": str(timeout_s), **(env or {})}
    done = subprocess.run(["bash", str(REPO / "scripts" / "v2-stage.sh"), *args], env=stage_env, stdout=sys.stderr,
                          check=False)
    try:
        return json.loads((out / "bench.json").read_text())
    except (OSError, ValueError):
        print(f"the v2 guest gave no results (exit {done.returncode}); see {out}/guest.log", file=sys.stderr)
        return None


def guest_part(run: Callable[[], dict[str, object]], show: Callable[[dict[str, object]], None],
               controllers: Sequence[str] | None = None) -> int:
    """A benchmark's ``--v2-guest`` part: ``run`` where the cgroups it needs (``controllers``: delegated to the
    pods) can be written, ``show`` its result, and write it to ``$KPY_V2_OUT/bench.json`` for
    :func:`run_bench_in_v2_guest`; 2 (said on stderr) when it cannot run here."""
    from tests.koordlet.qosmanager.realnode import skip_unless_v2_writable

    try:
        if controllers is None:
            skip_unless_v2_writable()
        else:
            skip_unless_v2_writable(controllers)
    except pytest.skip.Exception as exc:
        print(f"cannot run: {exc}", file=sys.stderr)
        return 2
    # a benchmark stuck in the guest prints every thread's stack every 240 s, as the guest's pytest does
    faulthandler.dump_traceback_later(240, repeat=True, file=sys.stderr)
    try:
        result = run()
    finally:
        faulthandler.cancel_dump_traceback_later()
    show(result)
    with open(os.path.join(os.environ["KPY_V2_OUT"], "bench.json"), "w") as f:
        json.dump(result, f)
    return 0


def host_part(bench: str, out_name: str, args: argparse.Namespace, show: Callable[[dict[str, object]], None],
              timeout_s: int, env: Mapping[str, str] | None = None, kept_here: Sequence[str] = ()) -> int:
    """A benchmark's host part: its options (but ``--json`` and ``kept_here``) forwarded to its ``--v2-guest`` part
    in the guest (:func:`run_bench_in_v2_guest`), the result shown (``--json``: as JSON); 1 without one."""
    forwarded = [f"--{k.replace('_', '-')}={v}" for k, v in vars(args).items()
                 if k not in ("json", "v2_guest", *kept_here)]
    result = run_bench_in_v2_guest(bench, out_name, forwarded, timeout_s, env)
    if not isinstance(result, dict):
        return 1
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        show(result)
    return 0


def systemctl(*args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    """The guest's systemctl, its output captured."""
    return subprocess.run(["systemctl", *args], capture_output=True, text=True, timeout=timeout)


def journal(units: Sequence[str], lines: int) -> str:
    """The last ``lines`` of the guest's journal for ``units``, messages only."""
    return subprocess.run(["journalctl", *(arg for unit in units for arg in ("-u", unit)), "--no-pager", "-n",
                           str(lines), "-o", "cat"], capture_output=True, text=True, timeout=60).stdout


def main_pid(unit: str) -> int:
    """The unit's main process (0: none)."""
    return int(systemctl("show", "-p", "MainPID", "--value", unit).stdout.strip() or 0)


def paths_under(top: str) -> set[str]:
    """Every file and symlink under ``top`` (symlinks not followed; each dir with a trailing /): what an install and
    its uninstall must leave as it was."""
    found = set()
    for parent, dirs, files in os.walk(top):
        found.update(os.path.join(parent, name) for name in files)
        found.update(os.path.join(parent, name) + "/" for name in dirs)
    return found


def remove_path(path: str) -> None:
    """Remove a file, a symlink or a whole directory."""
    target = Path(path)
    if target.is_dir() and not target.is_symlink():
        shutil.rmtree(target)
    else:
        target.unlink(missing_ok=True)


def skip_unless_systemd_guest() -> None:
    """Skip unless this is the v2 stage's systemd guest (systemd as PID 1)."""
    if not in_v2_guest():
        pytest.skip("runs in the v2 stage's systemd guest only (make v2-check V2_DRIVERS=systemd)")
    if Path("/proc/1/comm").read_text().strip() != "systemd":
        pytest.skip("needs systemd as PID 1: the systemd guest of the v2 stage runs this module")


def in_v2_guest() -> bool:
    return os.environ.get("KPY_V2_GUEST") == "1"


def skip_unless_v2_writable(needed: Sequence[str] = V2_CONTROLLERS) -> None:
    """Skip unless /sys/fs/cgroup is a writable cgroup v2 root with the ``needed`` controllers."""
    if os.geteuid() != 0:
        pytest.skip("needs root to create cgroup v2 dirs")
    try:
        with open(os.path.join(V2_ROOT, "cgroup.controllers")) as f:
            controllers = f.read().split()
    except OSError:
        pytest.skip(f"{V2_ROOT} is not a cgroup v2 root (this machine has cgroup v1)")
    missing = [c for c in needed if c not in controllers]
    if missing:
        pytest.skip(f"kernel lacks cgroup v2 controllers {missing}")


def attached_disk() -> str:
    """The disk v2-stage.sh attaches to the cgroupfs guest, found by its virtio serial (the image path's first 20
    characters, all a virtio-blk serial holds); skips outside the guest, fails in a guest without it."""
    if not in_v2_guest():
        pytest.skip("needs the disk the cgroup v2 VM stage attaches (make v2-check)")
    image = os.environ.get("KPY_V2_DISK", "")
    assert image, "v2-stage.sh names the attached disk in KPY_V2_DISK"
    for serial in sorted(Path("/sys/block").glob("*/serial")):
        if serial.read_text().strip() and image.startswith(serial.read_text().strip()):
            return f"/dev/{serial.parent.name}"
    pytest.fail(f"no disk with the serial of {image} under /sys/block")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    if not (in_v2_guest() and report.skipped and item.get_closest_marker("cgroupv2")):
        return
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    if KERNEL_LACKS in reason:
        return
    report.outcome = "failed"
    report.longrepr = f"skipped in the cgroup v2 guest, where every cgroupv2 test must run: {reason}"


def wait_for_the_host(path: str, say: Callable[[str], None], limit_s: float = HOST_WAIT_LIMIT_S,
                      step_s: float = 2.0) -> float:
    """Until ``path`` exists, at most ``limit_s``; the seconds waited. ``path`` is this guest's turn for the tests
    marked alone: scripts/v2-stage.sh creates it once the host's stages beside the VM are done and no other guest runs
    anything (each other guest is done, or waits for its own turn). This guest says it waits by ``alone-ready`` beside
    ``path`` (its results dir, which the host reads)."""
    started = time.monotonic()
    try:
        Path(path).with_name(ALONE_READY).touch()
    except OSError as err:  # the host then grants the turn only once it sees this guest done: slower, not wrong
        say(f"v2-guest: could not say the tests marked alone are next ({err})")
    if not os.path.exists(path):
        say(f"v2-guest: waiting for the turn of the tests marked alone ({path}): the host stage and any other "
            "guest's tests first")
    while not os.path.exists(path) and time.monotonic() - started < limit_s:
        time.sleep(step_s)
    waited = time.monotonic() - started
    say(f"v2-guest: the turn of the tests marked alone came; waited {waited:.0f} s" if os.path.exists(path) else
        f"v2-guest: no turn after {waited:.0f} s; the tests marked alone run anyway")
    return waited


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    if in_v2_guest():  # the tests marked alone last, in their order (a module marked alone stays together)
        items.sort(key=lambda item: item.get_closest_marker("alone") is not None)


@pytest.hookimpl(hookwrapper=True, tryfirst=True)  # outside pytest-timeout's clock: the wait is no test's time
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    path = os.environ.get(HOST_DONE_ENV, "")
    if in_v2_guest() and path and item.get_closest_marker("alone") and not _WAITED:
        terminal = item.config.pluginmanager.get_plugin("terminalreporter")
        _WAITED.append(wait_for_the_host(path, lambda line: terminal.write_line(line) if terminal else None))
    yield
