"""The test command's stage scripts, checked on the host: the cgroup v2 VM stage's rules (the stage itself runs beside
the host stage of `make test`) and how scripts/test-all.sh splits the host suite into its sessions."""

from __future__ import annotations

import itertools
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from tests.support.waiting import wait_for

REPO = Path(__file__).resolve().parents[1]
# The guest collects only these modules (scripts/v2-guest.sh); importing the whole tree under emulation costs
# ~100 s. The same pattern as the script's grep: a cgroupv2 mark, or the v1-and-v2 parameters of
# tests/koordlet/qosmanager/realnode.py (BOTH_VERSIONS), which carry it.
MARK = re.compile(r"mark\.cgroupv2|BOTH_VERSIONS")


def _pytest(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args], cwd=cwd,
                          env={**os.environ, **(env or {})}, capture_output=True, text=True, timeout=120)


def test_the_guests_module_selection_finds_every_cgroupv2_test() -> None:
    grep = subprocess.run(["grep", "-rlE", "--include=test_*.py", MARK.pattern, "tests"], cwd=REPO,
                          capture_output=True, text=True, check=True).stdout.split()
    collected = _pytest("--collect-only", "-q", "-m", "cgroupv2", cwd=REPO)
    assert collected.returncode == 0, collected.stdout[-2000:]
    modules = {line.split("::")[0] for line in collected.stdout.splitlines() if "::" in line}
    assert len(modules) >= 3, collected.stdout[-2000:]
    assert modules <= set(grep), f"marked some other way, the guest would miss them: {modules - set(grep)}"
    for module in grep:
        assert MARK.search((REPO / module).read_text())


def test_a_skipped_cgroupv2_test_fails_in_the_guest_unless_the_kernel_lacks_the_feature(tmp_path: Path) -> None:
    (tmp_path / "test_x.py").write_text(
        "import pytest\n"
        "pytestmark = pytest.mark.cgroupv2\n"
        "def test_missing_setup():\n    pytest.skip('needs something the stage forgot to install')\n"
        "def test_old_kernel():\n    pytest.skip('kernel lacks cpu.max.burst (before 5.14)')\n"
        "def test_runs():\n    pass\n"
        "@pytest.mark.skipif(True, reason='not a cgroup v2 root')\n"
        "def test_skipif():\n    pass\n")
    args = ("-p", "tests.support.v2guest", "-o", "markers=cgroupv2", "-rA", "test_x.py")
    env = {"PYTHONPATH": str(REPO)}
    guest = _pytest(*args, cwd=tmp_path, env={**env, "KPY_V2_GUEST": "1"})
    assert guest.returncode == 1, guest.stdout
    # a skip in the call is reported as failed, one in setup (skipif, a fixture) as an error: both fail the run
    assert "1 failed, 1 passed, 1 skipped, 1 error" in guest.stdout, guest.stdout
    assert "where every cgroupv2 test must run: Skipped: needs something the stage forgot" in guest.stdout
    host = _pytest(*args, cwd=tmp_path, env={**env, "KPY_V2_GUEST": "0"})
    assert host.returncode == 0 and "1 passed, 3 skipped" in host.stdout, host.stdout


def test_the_stage_scripts_parse_and_the_guest_script_refuses_to_run_on_a_host(tmp_path: Path) -> None:
    for script in ("v2-stage.sh", "v2-guest.sh", "test-all.sh"):
        assert subprocess.run(["bash", "-n", str(REPO / "scripts" / script)]).returncode == 0, script
    if "virtme" in Path("/proc/cmdline").read_text():
        return  # inside the VM itself
    done = subprocess.run(["bash", str(REPO / "scripts/v2-guest.sh")], env={**os.environ, "KPY_V2_OUT": str(tmp_path)},
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 1
    assert "refusing" in done.stderr or "not cgroup2" in done.stderr, done.stderr
    assert (tmp_path / "rc").read_text().strip() == "1"
    assert not os.path.ismount("/var/lib/koordlet-py") or "koordlet-py-v2" not in Path("/proc/mounts").read_text()


def test_the_host_sessions_of_the_test_command_run_every_host_test_exactly_once() -> None:
    """scripts/test-all.sh's pytest sessions on a generation: the serial one, the parallel one, the alone one (last).
    For every combination of the markers exactly one of them selects a host test, and none a cgroupv2 one."""
    # (the alone selection twice: the default generation's, then the 1.7 and 1.6 subsets')
    selections = list(dict.fromkeys(re.findall(r'-m "([^"]+)"', (REPO / "scripts" / "test-all.sh").read_text())))
    assert selections == ["serial and not alone and not cgroupv2", "not serial and not alone and not cgroupv2",
                          "alone and not cgroupv2"]
    for serial, alone, cgroupv2 in itertools.product((False, True), repeat=3):
        marks = {"serial": serial, "alone": alone, "cgroupv2": cgroupv2}
        chosen = [s for s in selections if eval(s, {}, marks)]  # noqa: S307 (our own script's marker expressions)
        assert len(chosen) == (0 if cgroupv2 else 1), (marks, chosen)


def test_in_the_guest_the_alone_tests_run_last_once_the_host_gives_them_their_turn(tmp_path: Path) -> None:
    """v2guest's order and wait: the alone tests after the others, the guest saying so (``alone-ready``, which
    v2-stage.sh reads), and not before the host's file exists; the wait is no test's time (a 1 s pytest-timeout is not
    hit by a 3 s wait)."""
    done, log = tmp_path / "host-done", tmp_path / "order.log"
    (tmp_path / "test_x.py").write_text(
        "import os, pytest\n"
        f"LOG, DONE = {str(log)!r}, {str(done)!r}\n"
        "def note(name):\n    open(LOG, 'a').write(f'{name} {os.path.exists(DONE)}\\n')\n"
        "@pytest.mark.alone\ndef test_burn():\n    note('burn')\n"
        "def test_files():\n    note('files')\n"
        "def test_more_files():\n    note('more_files')\n")
    env = {"PYTHONPATH": str(REPO), "KPY_V2_GUEST": "1", "KPY_V2_HOST_DONE": str(done)}
    guest = subprocess.Popen([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "tests.support.v2guest",
                              "-o", "markers=alone", "-o", "timeout=1", "-q", "test_x.py"], cwd=tmp_path,
                             env={**os.environ, **env}, stdout=subprocess.PIPE, text=True)
    try:
        assert wait_for(lambda: log.exists() and len(log.read_text().split("\n")) > 2, 60), "the other tests ran first"
        time.sleep(3)
        assert log.read_text() == "files False\nmore_files False\n", "an alone test ran before the host was done"
        assert (tmp_path / "alone-ready").exists(), "the guest did not say its alone tests are next"
        done.touch()
        out = guest.communicate(timeout=60)[0]
    finally:
        guest.kill()
    assert guest.returncode == 0, out
    assert log.read_text() == "files False\nmore_files False\nburn True\n"
    assert "waiting for the turn of the tests marked alone" in out, out
    assert "the turn of the tests marked alone came; waited" in out, out


# A guest as the gate sees it: busy for BUSY seconds, then says its next test is marked alone, waits for its turn,
# runs ALONE seconds, writes rc. Each step's time goes to the log.
_FAKE_GUEST = r"""
dir=$1 busy=$2 alone=$3 log=$4
now() { date +%s.%N; }
sleep "$busy"
echo "$(now) ${dir##*/} ready" >> "$log"
: > "$dir/alone-ready"
while [ ! -e "$dir/host-done" ]; do sleep 0.05; done
echo "$(now) ${dir##*/} start" >> "$log"
sleep "$alone"
echo "$(now) ${dir##*/} end" >> "$log"
echo 0 > "$dir/rc"
"""


def test_the_gate_gives_the_guests_alone_tests_their_turns_one_at_a_time_after_the_host(tmp_path: Path) -> None:
    """scripts/v2-gate.sh with two stand-in guests: A is ready at once, B is busy with its other tests for 3 s. No
    turn before the host's file; A's turn only once B waits too (B's other tests would disturb A's); B's only once
    A is done; and the gate ends with the guests."""
    log, host_done = tmp_path / "gate.log", tmp_path / "host-done"
    script = tmp_path / "guest.sh"
    script.write_text(_FAKE_GUEST)
    driver = (f". {REPO}/scripts/v2-gate.sh\n"
              "log() { echo \"$(date +%s.%N) gate $*\" >> \"$LOG\"; }\n"
              "mkdir -p \"$out/a\" \"$out/b\"\n"
              "bash \"$GUEST\" \"$out/a\" 0 2 \"$LOG\" & a=$!\n"
              "bash \"$GUEST\" \"$out/b\" 3 1 \"$LOG\" & b=$!\n"
              "gate \"$out/a\" $a \"$out/b\" $b\n"
              "wait $a $b\n")
    env = {**os.environ, "out": str(tmp_path), "LOG": str(log), "GUEST": str(script), "V2_WAIT_FOR_HOST": "1"}
    started = time.time()
    gate = subprocess.Popen(["bash", "-c", driver], env=env)
    try:
        time.sleep(1.5)
        host_done.touch()
        done_at = time.time()
        assert gate.wait(timeout=60) == 0
    finally:
        gate.kill()
        gate.wait()
    events = {}
    for line in log.read_text().splitlines():
        at, who, what = line.split(" ", 2)
        events.setdefault((who, what.split(":")[0]), float(at))
    assert events[("a", "ready")] - started < 1.0
    assert events[("a", "start")] >= done_at, "a turn before the host was done"
    assert events[("a", "start")] >= events[("b", "ready")], "A's turn while B still ran its other tests"
    assert events[("b", "start")] >= events[("a", "end")], "B's turn while A's alone tests ran"
    assert ("gate", "the turn of the tests marked alone") in events
