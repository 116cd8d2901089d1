"""Listening socket, start-up checks, serving and graceful drain of the proxy.

The listening socket is systemd's where the proxy runs under ``koord-runtime-proxy.socket`` (``listen_fd``): it
outlives every proxy process, so a call that arrives while none runs waits in its backlog for the next one, and
the proxy never unlinks it. Started any other way (the demo, the tests), the proxy binds the path itself and
removes it on stop. Either way it tells systemd READY=1 only once its store is rebuilt and it serves, and
STOPPING=1 when it starts to drain (wire/systemd.py; nothing is sent without ``NOTIFY_SOCKET``).
"""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
import time
from dataclasses import dataclass

from wire.sockets import SocketPathError, chmod_socket, prepare_socket, remove_socket
from wire.systemd import Notifier

from . import h2
from .backend import RuntimeClient
from .hookclient import HookClient
from .hookconfig import Registry
from .interceptor import LifecycleInterceptor
from .metrics import ProxyMetrics, serve_http
from .relay import Relay, RelayLimits
from .store import Store

log = logging.getLogger(__name__)

# Connections kubelet may have waiting to be accepted; the socket unit's Backlog= is the same.
_BACKLOG = 1024


class StartupError(Exception):
    """The proxy cannot start; the message says why, for the operator."""


@dataclass(frozen=True, slots=True)
class ProxyOptions:
    listen_path: str
    backend_path: str
    skip_label_key: str = "runtimeproxy.koordinator.sh/skip-hookserver"
    skip_label_value: str = "true"
    metrics_host: str = "127.0.0.1"
    metrics_port: int = 9318
    drain_timeout_s: float = 10.0
    hook_config_dir: str = "/etc/runtime/hookserver.d"
    hook_timeout_s: float = 2.0
    checkpoint_path: str | None = "/var/lib/koord-runtimeproxy/store.json"
    store_gc_interval_s: float = 60.0
    max_message_bytes: int = 16 << 20
    handshake_timeout_s: float = 10.0
    stall_timeout_s: float = 30.0
    # A listening unix socket the proxy serves instead of binding listen_path: systemd's (socket activation)
    listen_fd: int | None = None


class ProxyServer:
    def __init__(self, options: ProxyOptions, metrics: ProxyMetrics | None = None,
                 notifier: Notifier | None = None) -> None:
        self.options = options
        self.metrics = metrics or ProxyMetrics()
        self.notifier = notifier or Notifier({})
        self.runtime = RuntimeClient(options.backend_path)
        self.store = Store(options.checkpoint_path)
        self.registry = Registry(options.hook_config_dir,
                                 on_error=lambda name, _reason: self.metrics.hook_config_errors.labels(name).inc())
        self.hooks = HookClient()
        self.interceptor = LifecycleInterceptor(
            self.runtime, self.metrics, self.store, self.registry, self.hooks,
            skip_label=(options.skip_label_key, options.skip_label_value), hook_timeout_s=options.hook_timeout_s,
            max_message_bytes=options.max_message_bytes)
        limits = RelayLimits(max_message_bytes=options.max_message_bytes,
                             handshake_timeout_s=options.handshake_timeout_s, stall_timeout_s=options.stall_timeout_s)
        self.relay = Relay(options.backend_path, self.interceptor, self.interceptor.methods, self.metrics, limits)
        self.metrics.connections.set_function(lambda: len(self.relay.connections))
        self.metrics.store_entries.labels("pod").set_function(lambda: len(self.store.pods))
        self.metrics.store_entries.labels("container").set_function(lambda: len(self.store.containers))
        self._stop = asyncio.Event()
        self._serving = False

    async def _runtime_call(self, method: str, request: bytes) -> bytes:
        result = await self.runtime.call(method, request, [], 30.0)
        if result.code != h2.GRPC_OK or result.payload is None:
            raise ConnectionError(f"{method}: gRPC status {result.code}: {result.message}")
        return result.payload

    async def _housekeeping(self) -> None:
        """Re-scan registrations (a safety net under the watch) and sweep store entries the
        runtime no longer has."""
        last_gc = time.monotonic()
        while True:
            await asyncio.sleep(min(5.0, self.options.store_gc_interval_s))
            self.registry.scan()
            if time.monotonic() - last_gc < self.options.store_gc_interval_s:
                continue
            last_gc = time.monotonic()
            try:
                gone = await self.store.sweep(self._runtime_call)
            except ConnectionError as err:
                log.warning("store sweep skipped: %s", err)
                continue
            if gone:
                log.info("store sweep dropped %d entries the runtime no longer has", gone)

    def ready(self) -> tuple[bool, str]:
        if not self._serving:
            return False, "not serving"
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        probe.settimeout(0.5)
        try:
            probe.connect(self.options.backend_path)
        except OSError as err:
            return False, f"runtime {self.options.backend_path} unreachable: {err}"
        finally:
            probe.close()
        return True, "ok"

    def stop(self) -> None:
        self._stop.set()

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        opts = self.options
        if opts.listen_fd is None:
            try:
                prepare_socket(opts.listen_path)
            except SocketPathError as err:
                raise StartupError(str(err)) from err
        try:
            self.registry.start()
        except OSError as err:  # e.g. a read-only /etc without the dir (the unit's ConfigurationDirectory= makes it)
            raise StartupError(f"hook server registrations dir {opts.hook_config_dir}: {err}") from err
        try:
            await self.store.rebuild(self._runtime_call)
        except ConnectionError as err:
            log.error("store not rebuilt from the runtime (%s): hooks for existing pods will lack details", err)
        if opts.listen_fd is None:
            server = await loop.create_unix_server(self.relay, opts.listen_path, backlog=_BACKLOG)
            chmod_socket(opts.listen_path)
            where = opts.listen_path
        else:
            server = await loop.create_unix_server(self.relay, sock=socket.socket(fileno=opts.listen_fd),
                                                   backlog=_BACKLOG)
            where = f"{opts.listen_path} (systemd's socket, fd {opts.listen_fd})"
        http = None
        if opts.metrics_port >= 0:
            try:
                http = await serve_http(opts.metrics_host, opts.metrics_port, self.metrics, self.ready)
            except OSError as err:
                # kubelet's calls matter more than the metrics: an address not (yet) on the node costs the
                # endpoint, not the CRI socket.
                log.error("metrics endpoint %s:%d cannot listen (%s): serving CRI without /metrics, /healthz "
                          "and /readyz", opts.metrics_host, opts.metrics_port, err)
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stop)
        self._serving = True
        log.info("serving CRI on %s, runtime %s, hook servers from %s", where, opts.backend_path,
                 opts.hook_config_dir)
        self.notifier.send("READY=1", f"STATUS=serving CRI on {opts.listen_path}; store rebuilt: "
                                      f"{len(self.store.pods)} pods, {len(self.store.containers)} containers")
        housekeeping = loop.create_task(self._housekeeping())
        try:
            await self._stop.wait()
        finally:
            self._serving = False
            self.notifier.send("STOPPING=1", f"STATUS=draining {self.relay.in_flight()} calls in flight")
            housekeeping.cancel()
            await self._drain(server)
            if http is not None:
                http.close()
            self.registry.stop()
            self.store.flush()
            await self.hooks.close()
            await self.runtime.close()

    async def _drain(self, server: asyncio.AbstractServer) -> None:
        """Stop accepting (systemd's socket stays open in systemd, its backlog for the next process; our own
        socket goes), send every connection GOAWAY and end the server streams that never end by themselves
        (kubelet's GetContainerEvents: relay.py), finish the calls in flight within the drain timeout."""
        server.close()
        if self.options.listen_fd is None:
            remove_socket(self.options.listen_path)
        self.relay.start_drain()
        draining = self.relay.in_flight()
        deadline = time.monotonic() + self.options.drain_timeout_s
        while self.relay.in_flight() and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        left = self.relay.in_flight()
        if left:
            log.warning("drain timeout: closing with %d call(s) still in flight", left)
        self.relay.close_all()
        log.info("stopped: %d call(s) in flight at the stop finished, %d stream(s) opened after GOAWAY refused "
                 "for the client to retry, %d endless stream(s) ended for the client to call again",
                 draining - left, self.relay.refused_streams, self.relay.ended_streams)
