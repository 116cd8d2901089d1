"""kubelet's steady CRI traffic, for the proxy's restart tests: threads that call ``Version``, ``ListContainers``
and ``PodSandboxStatus`` in a loop over one channel (kubelet keeps one connection to its runtime endpoint), and
record every call's outcome and how long it took."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import grpc

from wire import cri_pb2 as cri

from .cri import CriClient

# kubelet's CRI calls carry its --runtime-request-timeout (2 min by default); a call that waits in the socket's
# backlog through a restart must come back well inside that, and this bound keeps a hung call from hanging a test.
CALL_TIMEOUT_S = 60.0
# After a failed call a thread waits this long before its next one, as a client that retries would; the count of
# failed calls depends on it (it is in the figures' line).
RETRY_PAUSE_S = 0.1


@dataclass(frozen=True, slots=True)
class LoopFigures:
    calls: int
    failed: int
    longest_wait_s: float  # the longest single call, from its start to its answer (or its failure)
    longest_gap_s: float  # the longest time without any call answered: what the client saw of an outage
    failures: tuple[str, ...]  # "<method>: <status code> <details>", the first few

    def line(self) -> str:
        return (f"{self.calls} calls, {self.failed} failed (a thread retries {RETRY_PAUSE_S:g} s after a failure), "
                f"longest wait {self.longest_wait_s * 1000:.0f} ms, longest gap without an answer "
                f"{self.longest_gap_s * 1000:.0f} ms"
                + (f"; first failures: {list(self.failures)}" if self.failures else ""))


class CallLoop:
    """``threads`` loops of Version, ListContainers and PodSandboxStatus(``sandbox_id``) through ``socket_path``."""

    def __init__(self, socket_path: str, sandbox_id: str, threads: int = 2) -> None:
        self.client = CriClient(socket_path)
        self.sandbox_id = sandbox_id
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.calls = 0
        self.ok = 0
        self.failed = 0
        self.longest_wait_s = 0.0
        self.longest_gap_s = 0.0
        self._last_answer = 0.0
        self.failures: list[str] = []
        self._threads = [threading.Thread(target=self._run, daemon=True, name=f"cri-loop-{i}") for i in range(threads)]

    def start(self) -> CallLoop:
        for thread in self._threads:
            thread.start()
        return self

    def _run(self) -> None:
        runtime = self.client.runtime
        calls = (
            ("Version", lambda: runtime.Version(cri.VersionRequest(), timeout=CALL_TIMEOUT_S)),
            ("ListContainers", lambda: runtime.ListContainers(cri.ListContainersRequest(), timeout=CALL_TIMEOUT_S)),
            ("PodSandboxStatus", lambda: runtime.PodSandboxStatus(
                cri.PodSandboxStatusRequest(pod_sandbox_id=self.sandbox_id), timeout=CALL_TIMEOUT_S)),
        )
        while not self._stop.is_set():
            for method, call in calls:
                started = time.monotonic()
                error = None
                try:
                    call()
                except grpc.RpcError as err:
                    error = f"{method}: {err.code().name} {err.details()}"
                self._record(time.monotonic() - started, error)
                if error is not None:
                    self._stop.wait(RETRY_PAUSE_S)

    def _record(self, seconds: float, error: str | None) -> None:
        with self._lock:
            self.calls += 1
            self.longest_wait_s = max(self.longest_wait_s, seconds)
            if error is None:
                self.ok += 1
                now = time.monotonic()
                if self._last_answer:
                    self.longest_gap_s = max(self.longest_gap_s, now - self._last_answer)
                self._last_answer = now
            else:
                self.failed += 1
                if len(self.failures) < 5:
                    self.failures.append(error)

    def served(self) -> int:
        """Calls answered without an error so far."""
        with self._lock:
            return self.ok

    def wait_served(self, more: int, timeout_s: float) -> bool:
        """Until ``more`` calls beyond those answered now have been answered."""
        target = self.served() + more
        deadline = time.monotonic() + timeout_s
        while self.served() < target:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)
        return True

    def stop(self) -> LoopFigures:
        self._stop.set()
        for thread in self._threads:
            thread.join(CALL_TIMEOUT_S + 5)
        self.client.close()
        with self._lock:
            return LoopFigures(self.calls, self.failed, self.longest_wait_s, self.longest_gap_s, tuple(self.failures))
