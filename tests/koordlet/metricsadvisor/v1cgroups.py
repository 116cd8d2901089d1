"""Private cgroup v1 dirs on the real kernel for tests, and child processes placed in them.

Everything lives under ``/sys/fs/cgroup/<controller>/koordlet-py-test-<pid>-<name>/`` and is removed by
:meth:`V1TestCgroups.cleanup` (children killed by PID first, then dirs removed deepest first).
"""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

CGROUP_ROOT = "/sys/fs/cgroup"


def skip_unless_v1_writable(controllers: tuple[str, ...]) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to create cgroup v1 dirs")
    for ctrl in controllers:
        if not os.path.isfile(os.path.join(CGROUP_ROOT, ctrl, "cgroup.procs")):
            pytest.skip(f"cgroup v1 hierarchy {ctrl} is not mounted at {CGROUP_ROOT}/{ctrl}")


class V1TestCgroups:
    version = 1  # the cgroup version, as koordlet.system.cgroup_stats takes it

    def __init__(self, name: str, controllers: tuple[str, ...] = ("cpu", "cpuacct", "memory")) -> None:
        self.controllers = controllers
        self.prefix = f"koordlet-py-test-{os.getpid()}-{name}"
        self._dirs: list[str] = []
        self._children: list[subprocess.Popen[bytes]] = []

    def path(self, controller: str, rel: str = "") -> str:
        return os.path.join(CGROUP_ROOT, controller, self.prefix, rel).rstrip("/")

    def make(self, rel: str = "") -> None:
        """Create ``<prefix>/<rel>`` (and parents) in every controller hierarchy."""
        parts = [p for p in rel.split("/") if p]
        for depth in range(len(parts) + 1):
            sub = "/".join(parts[:depth])
            for ctrl in self.controllers:
                path = self.path(ctrl, sub)
                if os.path.isdir(path):
                    continue
                os.mkdir(path)
                self._dirs.append(path)
                if ctrl == "cpuset":
                    # A new v1 cpuset is empty; tasks cannot join until cpus and mems are set.
                    parent = os.path.dirname(path)
                    for name in ("cpuset.cpus", "cpuset.mems"):
                        with open(os.path.join(parent, name)) as src, open(os.path.join(path, name), "w") as dst:
                            dst.write(src.read())

    def write(self, controller: str, rel: str, filename: str, value: str) -> None:
        with open(os.path.join(self.path(controller, rel), filename), "w") as f:
            f.write(value)

    def spawn(self, rel: str, code: str) -> subprocess.Popen[bytes]:
        """Start ``python -c code`` and move it into ``rel`` before it runs ``code``.

        The child reports that its interpreter is up and then blocks on one stdin line, so its start-up
        memory stays charged to the parent cgroup and only what ``code`` does is charged to the test
        cgroup. ``code`` may use ``sys``.
        """
        wrapper = f"import sys\nprint('up', flush=True)\nsys.stdin.readline()\n{code}"
        child = subprocess.Popen([sys.executable, "-c", wrapper], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self._children.append(child)
        assert child.stdout is not None and child.stdin is not None
        if child.stdout.readline() != b"up\n":
            raise RuntimeError(f"test child {child.pid} did not start")
        for ctrl in self.controllers:
            self.write(ctrl, rel, "cgroup.procs", str(child.pid))
        child.stdin.write(b"go\n")
        child.stdin.flush()
        return child

    def cleanup(self) -> None:
        for child in self._children:
            if child.poll() is None:
                child.kill()
            child.wait()
        self._children.clear()
        errors: list[str] = []
        for path in sorted(self._dirs, key=lambda p: p.count("/"), reverse=True):
            for attempt in range(50):
                try:
                    os.rmdir(path)
                except FileNotFoundError:
                    break
                except OSError as err:
                    # A just-reaped task can keep a v1 cgroup busy for a moment.
                    if err.errno == errno.EBUSY and attempt < 49:
                        time.sleep(0.02)
                        continue
                    errors.append(f"{path}: {err}")
                    break
                else:
                    break
        self._dirs.clear()
        if errors:
            raise RuntimeError("could not remove test cgroups: " + "; ".join(errors))


def v1_cgroups(name: str, controllers: tuple[str, ...] = ("cpu", "cpuacct", "memory")) -> Iterator[V1TestCgroups]:
    """Generator body for a fixture: skips when v1 is not writable, always cleans up."""
    skip_unless_v1_writable(controllers)
    groups = V1TestCgroups(name, controllers)
    try:
        yield groups
    finally:
        groups.cleanup()
