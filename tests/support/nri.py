"""containerd with NRI on for the NRI tests and bench/nri.py: one private instance per generation and test
process (its own run and root dirs, its own NRI socket), a restart that keeps the pods running, what the
OCI spec of a container says, and a tiny second NRI plugin.

Paths: ``/run/koordlet-py/nri-<gen>-<pid>/`` and ``/var/lib/koordlet-py/nri-<gen>-<pid>/``; instances of
test processes that are gone are stopped and removed by :func:`clean_up_dead_instances`, as the session
containerd's are by ``clean_up_dead_sessions``.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from wire import cri_pb2 as cri
from wire import nri_pb2 as api
from wire.nri import Event, PluginConnection, event_mask
from wire.ttrpc import RECEIVE_MAX

from .containerd import Containerd
from .cri import CriClient
from .waiting import wait_for

RUN_BASE = Path("/run/koordlet-py")
ROOT_BASE = Path("/var/lib/koordlet-py")
_INSTANCE = re.compile(r"^nri-(\d\.\d)-(\d+)(?:-([a-z0-9]+))?$")


@dataclass(frozen=True, slots=True)
class NriContainerd:
    """A containerd of generation ``version`` with NRI on at ``nri_socket``."""

    containerd: Containerd

    @classmethod
    def for_process(cls, version: str, pid: int | None = None, instance: str = "") -> NriContainerd:
        """``instance``: a second (third ...) one of the same generation in the same process."""
        pid = os.getpid() if pid is None else pid
        name = f"nri-{version}-{pid}" + (f"-{instance}" if instance else "")
        return cls(Containerd(str(RUN_BASE / name / "containerd"), str(ROOT_BASE / name / "containerd"),
                              version=version, nri_socket=str(RUN_BASE / name / "nri" / "nri.sock")))

    @property
    def socket(self) -> str:
        return self.containerd.socket

    @property
    def nri_socket(self) -> str:
        assert self.containerd.nri_socket is not None
        return self.containerd.nri_socket

    @property
    def var_run_dir(self) -> str:
        """The dir koordlet's ``-var-run-root-dir`` points at, so ``nri/nri.sock`` below it is our socket."""
        return str(Path(self.nri_socket).parent.parent)

    @property
    def log_path(self) -> Path:
        return Path(self.containerd.run_dir) / "containerd.log"

    def up(self) -> NriContainerd:
        self.containerd.up()
        return self

    def down(self) -> None:
        self.containerd.down()
        self.containerd.remove_dirs()

    def restart(self, timeout_s: float = 30.0) -> None:
        """SIGTERM containerd and start it again on the same config: the shims and the pods keep running,
        and containerd re-creates its NRI socket (plugins must connect again)."""
        pid_file = Path(self.containerd.run_dir) / "containerd.pid"
        pid = int(pid_file.read_text())
        os.kill(pid, signal.SIGTERM)
        if not wait_for(lambda: not Path(f"/proc/{pid}").exists() or _zombie(pid), timeout_s):
            raise RuntimeError(f"containerd {pid} did not stop")
        pid_file.unlink()  # so containerd-up.sh starts it again instead of cleaning up a "crashed" instance
        self.containerd.up()

    def log_lines(self, pattern: str) -> list[str]:
        try:
            text = self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return []
        return [line for line in text.splitlines() if re.search(pattern, line)]


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    except (OSError, IndexError):
        return True


def clean_up_dead_instances() -> list[str]:
    """Stop and remove the NRI containerds of test processes that are gone."""
    cleaned = []
    for run_dir in sorted(RUN_BASE.glob("nri-*")) if RUN_BASE.is_dir() else []:
        match = _INSTANCE.match(run_dir.name)
        if match is None or Path(f"/proc/{match.group(2)}").exists():
            continue
        NriContainerd.for_process(match.group(1), int(match.group(2)), match.group(3) or "").down()
        cleaned.append(run_dir.name)
    return cleaned


def oci_spec(client: CriClient, container_id: str) -> dict:
    """The OCI runtime spec containerd created the container with (ContainerStatus verbose info): what a
    plugin's adjustment changed is there, what was written to cgroup files afterwards is not."""
    status = client.runtime.ContainerStatus(cri.ContainerStatusRequest(container_id=container_id, verbose=True),
                                            timeout=10)
    return json.loads(status.info["info"])["runtimeSpec"]


def oci_cpu_shares(client: CriClient, container_id: str) -> int:
    return int(oci_spec(client, container_id)["linux"]["resources"]["cpu"].get("shares", 0))


class TinyPlugin:
    """A second NRI plugin (index 90, after koordlet's 00) that answers CreateContainer with ``adjust(request)``:
    used to show which fields two plugins may share."""

    def __init__(self, socket_path: str, adjust: Callable[[api.CreateContainerRequest], api.ContainerAdjustment],
                 name: str = "tiny", index: str = "90", receive_limit: int = RECEIVE_MAX) -> None:
        """``receive_limit``: MESSAGE_MAX makes it take what a Go plugin takes (ttrpc's 4 MiB)."""
        self.socket_path, self.name, self.index = socket_path, name, index
        self._adjust = adjust
        self._receive_limit = receive_limit
        self.created = 0  # CreateContainer events seen
        self.registered = threading.Event()  # configured and synchronized
        self.connected = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=asyncio.run, args=(self._main(),), name="tiny-nri", daemon=True)

    events = event_mask([Event.CREATE_CONTAINER])

    def configure(self, request: api.ConfigureRequest) -> int:
        return self.events

    def update_pod_sandbox(self, request: api.UpdatePodSandboxRequest) -> api.UpdatePodSandboxResponse:
        return api.UpdatePodSandboxResponse()

    def synchronize(self, pods, containers, deadline: float) -> list[api.ContainerUpdate]:
        return []

    def create_container(self, request: api.CreateContainerRequest) -> api.CreateContainerResponse:
        self.created += 1
        return api.CreateContainerResponse(adjust=self._adjust(request))

    def update_container(self, request: api.UpdateContainerRequest) -> api.UpdateContainerResponse:
        return api.UpdateContainerResponse()

    def state_change(self, event: api.StateChangeEvent) -> None:
        pass

    async def _main(self) -> None:
        with ThreadPoolExecutor(1) as executor:
            conn = await PluginConnection.open(self.socket_path, self, executor, timeout_s=5,
                                               receive_limit=self._receive_limit)
            self.connected.set()
            await conn.register(self.name, self.index)
            if await conn.synchronized(5):
                self.registered.set()
            while not self._stop.is_set() and not conn.closed:
                await asyncio.sleep(0.05)
            conn.close()
            await conn.wait_closed()

    def __enter__(self) -> TinyPlugin:
        self._thread.start()
        if not self.connected.wait(10):
            raise RuntimeError("the tiny NRI plugin did not connect")
        self.registered.wait(6)  # a refused sync leaves it connected but not synchronized: the caller checks
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)


def koordlet_nri_args(runtime: NriContainerd, *extra: str) -> list[str]:
    """The flags that put a koordlet process on ``runtime``'s NRI socket (Koordinator's flag names)."""
    return ["-enable-nri-runtime-hook=true", f"-var-run-root-dir={runtime.var_run_dir}",
            "-runtime-hooks-nri-socket-path=nri/nri.sock", *extra]


def wait_registered(log_or_metrics: Callable[[], str], timeout_s: float) -> bool:
    """Until a koordlet's /metrics text says it is registered with NRI."""
    return wait_for(lambda: "koordlet_nri_registered 1.0" in log_or_metrics(), timeout_s, 0.1)

