"""koordlet's connection to the runtime's NRI socket: register, stay registered, come back.

Where Koordinator's users got hurt (docs/nri-protocol.md §6), and what this does instead:

- **one connection, always.** One loop owns the connection; a new one is opened only after the old one is
  closed and gone, so the runtime never sees two koordlet plugins that conflict with each other
  (Koordinator #2334: "plugins "00-nri/nri.sock" and "00-nri/nri.sock" both tried to set ...").
- **a socket that appears later is picked up.** Koordinator checks once at start and stays off until a
  restart; here the socket path is looked at every second (one stat) until it is there.
- **capped backoff.** After a failed attempt the next one waits ``backoff_s`` × ``backoff_factor``^n (at most
  ``backoff_steps`` growths, jitter 10 %, never more than ``backoff_cap_s``; Koordinator's cap is effectively
  unbounded), and at once when the runtime re-creates its socket (a restart) or after a connection that
  worked was closed.
- **answers in time** and **frames of at most 4096 bytes**: wire/nri.py and wire/nrimux.py.

``connect_timeout_s`` bounds one attempt: connect, RegisterPlugin, Configure and the whole Synchronize.
The loop runs in its own thread with its own asyncio loop; the handlers run in a small thread pool.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import stat
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from wire.nri import PluginConnection, PluginHandlers
from wire.ttrpc import ConnectionClosed, TtrpcError

from .. import metrics

log = logging.getLogger(__name__)

MAX_INT32 = 2**31 - 1
SOCKET_POLL_S = 1.0
_WORKERS = 4


@dataclass(frozen=True, slots=True)
class NriConfig:
    """Koordinator's ``-runtime-hooks-nri-*`` flags (defaults theirs, but for the backoff cap)."""

    socket_path: str
    plugin_name: str = "koordlet_nri"
    plugin_index: str = "00"
    connect_timeout_s: float = 6.0  # above containerd's 5 s registration timeout, as Koordinator's
    backoff_s: float = 1.0
    backoff_factor: float = 2.0
    backoff_steps: int = MAX_INT32
    backoff_cap_s: float = 30.0
    fail_on_error: bool = False  # -runtime-hooks-plugin-failure-policy=Fail
    socket_poll_s: float = SOCKET_POLL_S


def backoff_delay(config: NriConfig, failures: int, jitter: float | None = None) -> float:
    """Seconds before the next attempt after ``failures`` failed ones in a row (k8s wait.Backoff's shape,
    capped after the jitter so the cap holds)."""
    if failures <= 0:
        return 0.0
    growths = min(failures - 1, config.backoff_steps)
    try:
        delay = config.backoff_s * config.backoff_factor ** growths
    except OverflowError:
        delay = config.backoff_cap_s
    delay = min(delay, config.backoff_cap_s)
    delay *= 1.0 + 0.1 * (random.random() if jitter is None else jitter)
    return min(delay, config.backoff_cap_s)


def socket_identity(path: str) -> tuple[int, int, int] | None:
    """(device, inode, mtime) of the socket at ``path``; None when there is no socket (a new one is a restart)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    if not stat.S_ISSOCK(st.st_mode):
        return None
    return st.st_dev, st.st_ino, st.st_mtime_ns


class RegistrationError(Exception):
    """The runtime did not configure and synchronize the plugin in time."""


_SERIES: dict[tuple[str, str], tuple[object, object]] = {}  # the labelled series, looked up once


def _observe(event: str, result: str, seconds: float) -> None:
    series = _SERIES.get((event, result))
    if series is None:
        series = _SERIES[(event, result)] = (metrics.NRI_EVENTS.labels(event, result),
                                             metrics.NRI_EVENT_DURATION_MS.labels(event))
    count, duration = series
    count.inc()  # type: ignore[attr-defined]
    duration.observe(seconds * 1000)  # type: ignore[attr-defined]


class NriPlugin:
    """``start()`` runs the connection loop in a thread; ``stop()`` closes the connection and ends it."""

    def __init__(self, config: NriConfig, handlers: PluginHandlers) -> None:
        self.config = config
        self._handlers = handlers
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._started = threading.Event()
        self.registered = threading.Event()  # set while registered and synchronized
        self.registrations = 0
        self.connection: PluginConnection | None = None
        self.down_since: float | None = None  # monotonic: not registered since (health checks); None while registered

    @property
    def loop_alive(self) -> bool:
        """The connection loop's thread runs (it ends only on stop, or on a bug in the loop itself)."""
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        self.down_since = time.monotonic()
        metrics.NRI_ENABLED.set(1)
        self._thread = threading.Thread(target=self._thread_main, name="nri-plugin", daemon=True)
        self._thread.start()
        self._started.wait(5.0)

    def stop(self, timeout_s: float = 5.0) -> bool:
        metrics.NRI_ENABLED.set(0)
        loop, stopping = self._loop, self._stopping
        if self._thread is None or loop is None or stopping is None:
            return True
        try:
            loop.call_soon_threadsafe(stopping.set)
        except RuntimeError:  # the loop already ended
            pass
        self._thread.join(timeout_s)
        return not self._thread.is_alive()

    def _thread_main(self) -> None:
        executor = ThreadPoolExecutor(max_workers=_WORKERS, thread_name_prefix="nri-handler")
        try:
            asyncio.run(self._main(executor))
        except Exception:  # noqa: BLE001 - the loop's own failure is logged; koordlet goes on without NRI
            log.exception("NRI plugin loop failed; NRI mode is off until koordlet restarts")
        finally:
            executor.shutdown(wait=False, cancel_futures=True)
            metrics.NRI_REGISTERED.set(0)

    async def _main(self, executor: ThreadPoolExecutor) -> None:
        self._loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        self._started.set()
        failures = 0
        announced_missing = False
        while not self._stopping.is_set():
            identity = socket_identity(self.config.socket_path)
            if identity is None:
                if not announced_missing:
                    log.info("NRI socket %s is not there (yet); koordlet registers as soon as it appears",
                             self.config.socket_path)
                    announced_missing = True
                await self._wait(self.config.socket_poll_s, identity)
                continue
            announced_missing = False
            try:
                connection = await self._connect(executor)
            except (OSError, TimeoutError, TtrpcError, ConnectionClosed, RegistrationError) as err:
                failures += 1
                metrics.NRI_CONNECT_FAILURES.inc()
                delay = backoff_delay(self.config, failures)
                log_at = logging.WARNING if failures == 1 else logging.DEBUG
                log.log(log_at, "NRI: cannot register at %s (%s); next attempt in %.1f s (or when the runtime "
                        "re-creates its socket)", self.config.socket_path, str(err) or type(err).__name__, delay)
                await self._wait(delay, identity)
                continue
            failures = 0
            await self._serve(connection)

    async def _wait(self, seconds: float, identity: tuple[int, int, int] | None) -> None:
        """Sleep ``seconds``, or less: until a stop, or until the socket is not the one last seen."""
        stopping = self._stopping
        assert stopping is not None
        loop = asyncio.get_running_loop()
        until = loop.time() + seconds
        while not stopping.is_set():
            left = until - loop.time()
            if left <= 0:
                return
            try:
                await asyncio.wait_for(stopping.wait(), min(left, self.config.socket_poll_s))
            except TimeoutError:
                if socket_identity(self.config.socket_path) != identity:
                    return

    async def _connect(self, executor: ThreadPoolExecutor) -> PluginConnection:
        config = self.config
        loop = asyncio.get_running_loop()
        until = loop.time() + config.connect_timeout_s
        connection = await PluginConnection.open(config.socket_path, self._handlers, executor,
                                                 timeout_s=config.connect_timeout_s,
                                                 fail_on_error=config.fail_on_error, observe=_observe)
        try:
            await connection.register(config.plugin_name, config.plugin_index, max(until - loop.time(), 0.1))
            if not await connection.synchronized(max(until - loop.time(), 0.0)):
                raise RegistrationError(f"not configured and synchronized within {config.connect_timeout_s:.1f} s")
        except BaseException:
            connection.close()
            await connection.wait_closed()
            raise
        return connection

    async def _serve(self, connection: PluginConnection) -> None:
        """Until the runtime closes the connection or koordlet stops; then the connection is closed and gone
        before anything else happens, so there is never a second one."""
        stopping = self._stopping
        assert stopping is not None
        self.connection = connection
        self.registrations += 1
        if self.registrations > 1:
            metrics.NRI_RECONNECTS.inc()
        sync = connection.sync
        for item, value in (("pods", sync.pods), ("containers", sync.containers), ("messages", sync.messages),
                            ("bytes", sync.request_bytes), ("updates", sync.updates)):
            metrics.NRI_SYNC_SIZE.labels(item).set(value)
        metrics.NRI_REGISTERED.set(1)
        self.down_since = None
        self.registered.set()
        log.info("NRI: registered as %s-%s at %s (synchronized %d pods, %d containers in %d message(s); %d "
                 "updates)", self.config.plugin_index, self.config.plugin_name, self.config.socket_path,
                 sync.pods, sync.containers, sync.messages, sync.updates)
        serving = asyncio.ensure_future(connection.run())
        stop = asyncio.ensure_future(stopping.wait())
        try:
            await asyncio.wait([serving, stop], return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop.cancel()
            self.registered.clear()
            self.down_since = time.monotonic()
            metrics.NRI_REGISTERED.set(0)
            connection.close()
            await connection.wait_closed()
            failure: BaseException | None = None
            try:
                await serving
            except (asyncio.CancelledError, Exception) as err:  # noqa: BLE001 - reported below
                failure = err
            if not stopping.is_set():
                log.warning("NRI: connection to the runtime ended (%s); registering again",
                            failure if failure is not None and not isinstance(failure, asyncio.CancelledError)
                            else "closed by the runtime")
            self.connection = None
