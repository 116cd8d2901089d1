"""The project's private containerd for tests and the demo (scripts/containerd-up.sh / -down.sh)."""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
IMAGE = "localhost/busybox:local"
# Pods of tests live under this kubelet --cgroup-root, never under the host's kubepods nor under another test
# session's (a test that lowers the besteffort dir's quota must not meet another session's pods there): one root per
# session, kept in the environment so that the processes a session starts use the same one.
SESSION_CGROUP_ROOT = "/koordlet-py-test-{pid}"


def _session_cgroup_root() -> str:
    """KPY_CGROUP_ROOT when the process that started this one set it, else this session's own root. A pytest-xdist
    worker (PYTEST_XDIST_WORKER) is a session of its own, with its own containerd (named by its pid): the root its
    controller, its parent, put in the environment is not its own, and sharing it would put two workers' pods in
    one besteffort dir."""
    inherited = os.environ.get("KPY_CGROUP_ROOT")
    from_controller = (os.environ.get("PYTEST_XDIST_WORKER")
                       and inherited == SESSION_CGROUP_ROOT.format(pid=os.getppid()))
    if inherited and not from_controller:
        return inherited
    os.environ["KPY_CGROUP_ROOT"] = SESSION_CGROUP_ROOT.format(pid=os.getpid())
    return os.environ["KPY_CGROUP_ROOT"]


CGROUP_ROOT = _session_cgroup_root()
# The containerd generations the scripts install (scripts/containerd-up.sh CTRD_VERSION) and the one a test session
# runs on: KPY_CONTAINERD, else the default (README "Testing": the full suite runs there, the other two run the
# runtime-facing subset, scripts/test-all.sh).
GENERATIONS = ("1.6", "1.7", "2.1")
DEFAULT_GENERATION = "2.1"
# More runc generations as CRI runtime handlers ``runc-<gen>`` (scripts/containerd-up.sh CTRD_RUNC_HANDLERS): runc 1.3
# (Debian unstable's 1.3.6, the quadratic cpu.weight formula) in the v2 guests, whose stage fetches it beforehand
# (the guest has no network); the default handler ``runc`` is Debian 12's 1.1.5.
RUNC_13_HANDLER = "runc-1.3"


def generation() -> str:
    """The containerd generation of this test session (KPY_CONTAINERD, else DEFAULT_GENERATION)."""
    chosen = os.environ.get("KPY_CONTAINERD", "") or DEFAULT_GENERATION
    if chosen not in GENERATIONS:
        raise ValueError(f"KPY_CONTAINERD={chosen!r}: known generations are {', '.join(GENERATIONS)}")
    return chosen


@dataclass(frozen=True, slots=True)
class Containerd:
    run_dir: str
    root_dir: str
    cgroup_root: str = CGROUP_ROOT  # the kubelet --cgroup-root of the pods made against it (pruned on down)
    version: str = DEFAULT_GENERATION  # the generation (scripts/containerd-up.sh CTRD_VERSION: 2.1, 1.7, 1.6)
    nri_socket: str | None = None  # containerd >= 1.7: NRI on at this socket (CTRD_NRI_SOCKET)
    runc_handlers: tuple[str, ...] = ()  # more runc generations as handlers runc-<gen> (CTRD_RUNC_HANDLERS)

    @property
    def socket(self) -> str:
        return f"{self.run_dir}/containerd.sock"

    @property
    def binary(self) -> str:
        """This generation's containerd: Debian 12's on PATH for 1.6, else the one containerd-up.sh unpacked."""
        if self.version == "1.6":
            return "containerd"
        tools = Path(os.environ.get("KOORDLET_TOOLS", REPO / ".tools"))
        return str(tools / f"containerd-{self.version}" / "usr" / "bin" / "containerd")

    def _env(self) -> dict[str, str]:
        return {**os.environ, "CTRD_RUN": self.run_dir, "CTRD_ROOT": self.root_dir, "CTRD_CNI": "none",
                "CTRD_CGROUP_TOPS": self.cgroup_root.strip("/"), "CTRD_VERSION": self.version,
                **({"CTRD_NRI_SOCKET": self.nri_socket} if self.nri_socket else {}),
                **({"CTRD_RUNC_HANDLERS": " ".join(self.runc_handlers)} if self.runc_handlers else {})}

    def up(self) -> str:
        out = subprocess.run(["bash", str(REPO / "scripts/containerd-up.sh")], env=self._env(),
                             capture_output=True, text=True, timeout=300)
        if out.returncode != 0:
            raise RuntimeError(f"containerd-up failed ({out.returncode}):\n{out.stderr[-3000:]}")
        return out.stdout.strip()

    def remove_dirs(self) -> None:
        """Remove the (parent) dirs of run and root; never crosses into a mount left behind. With KPY_KEEP_LOGS
        set (the v2 guests set it to their results dir), containerd's log is copied there first, named after its
        run dir (``/run/koordlet-py/test-42/containerd``: ``run-koordlet-py-test-42-containerd.log``)."""
        keep = os.environ.get("KPY_KEEP_LOGS")
        log = Path(self.run_dir) / "containerd.log"
        if keep and log.is_file():
            name = self.run_dir.strip("/").replace("/", "-")
            shutil.copyfile(log, Path(keep) / f"{name}.log")
        for path in {os.path.dirname(self.run_dir), os.path.dirname(self.root_dir)}:
            subprocess.run(["rm", "-rf", "--one-file-system", path], check=False, timeout=60)

    def down(self) -> None:
        subprocess.run(["bash", str(REPO / "scripts/containerd-down.sh")], env=self._env(),
                       capture_output=True, text=True, timeout=180)


def session_containerd(pid: int | None = None) -> Containerd:
    """The containerd of one test session: its own paths, so sessions running at once never share
    (and never stop) each other's runtime. In a cgroup v2 guest (KPY_V2_GUEST=1) it also serves NRI, on its own
    socket, so that the guest's NRI tests need no second containerd (tests/support/v2stack.py)."""
    pid = os.getpid() if pid is None else pid
    cgroup_root = CGROUP_ROOT if pid == os.getpid() else SESSION_CGROUP_ROOT.format(pid=pid)
    in_v2_guest = os.environ.get("KPY_V2_GUEST") == "1"
    nri = f"/run/koordlet-py/test-{pid}/nri/nri.sock" if in_v2_guest else None
    return Containerd(f"/run/koordlet-py/test-{pid}/containerd", f"/var/lib/koordlet-py/test-{pid}/containerd",
                      cgroup_root=cgroup_root, version=generation(), nri_socket=nri,
                      runc_handlers=("1.3",) if in_v2_guest else ())


def clean_up_dead_sessions() -> list[int]:
    """Stop and remove the containerd of test sessions whose process is gone (killed, crashed)."""
    cleaned = []
    base = Path("/run/koordlet-py")
    for run_dir in sorted(base.glob("test-*")) if base.is_dir() else []:
        suffix = run_dir.name.removeprefix("test-")
        if not suffix.isdigit() or Path(f"/proc/{suffix}").exists():
            continue
        containerd = session_containerd(int(suffix))
        containerd.down()
        containerd.remove_dirs()
        cleaned.append(int(suffix))
    return cleaned
