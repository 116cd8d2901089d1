"""Prometheus metrics of the proxy and its small HTTP endpoint (/metrics, /healthz, /readyz).

The relay has no per-call object on its copy path; it reports a call once, when the frame that
ends the response stream passes (relay.RelayObserver), and the label children are cached so an
observation is one dict lookup and one histogram update.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    generate_latest,
)

from .relay import RelayObserver

log = logging.getLogger(__name__)

# Buckets from 50 µs (a relayed cheap call) to 10 s (a slow RunPodSandbox).
_BUCKETS = (5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
_MAX_METHOD_LABELS = 256


_PENDING_MAX = 4096


class _Flush:
    """Registered before the histograms: collecting it moves the pending observations into them."""

    def __init__(self, metrics: ProxyMetrics) -> None:
        self._metrics = metrics

    def collect(self) -> list:
        self._metrics.flush()
        return []

    def describe(self) -> list:
        return []


class ProxyMetrics(RelayObserver):
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self._pending: list[tuple[str | bytes, float]] = []
        self.registry.register(_Flush(self))  # first: a scrape flushes before it reads the histograms
        ProcessCollector(registry=self.registry)
        self.call_duration = Histogram(
            "koord_runtimeproxy_call_duration_seconds",
            "Time of a CRI call through the proxy by method and stage: relay (whole call of a relayed "
            "method), pre_hook, backend, post_hook (stages of a hooked lifecycle call).",
            ["method", "stage"],
            buckets=_BUCKETS,
            registry=self.registry,
        )
        self.hook_errors = Counter(
            "koord_runtimeproxy_hook_errors_total",
            "Failed hook server calls by hook server, hook type and failure policy.",
            ["server", "hook", "policy"],
            registry=self.registry,
        )
        self.hook_duration = Histogram(
            "koord_runtimeproxy_hook_duration_seconds",
            "Round trip of one hook server call, by hook server and hook type.",
            ["server", "hook"],
            buckets=_BUCKETS,
            registry=self.registry,
        )
        self.bad_hook_values = Counter(
            "koord_runtimeproxy_hook_rejected_values_total",
            "Values in hook answers dropped because the kernel would refuse them, by hook type and field.",
            ["hook", "field"],
            registry=self.registry,
        )
        self.hook_config_errors = Counter(
            "koord_runtimeproxy_hook_config_errors_total",
            "Hook server registration files ignored because they are malformed.",
            ["file"],
            registry=self.registry,
        )
        self.store_entries = Gauge(
            "koord_runtimeproxy_store_entries", "Pods and containers the proxy remembers.", ["kind"],
            registry=self.registry,
        )
        self.connections = Gauge(
            "koord_runtimeproxy_connections", "Open kubelet connections.", registry=self.registry
        )
        self.bad_requests = Counter(
            "koord_runtimeproxy_bad_requests_total",
            "Hooked calls whose request the proxy could not decode (forwarded unchanged).",
            ["method"],
            registry=self.registry,
        )
        self.refusals = Counter(
            "koord_runtimeproxy_refused_total",
            "Calls refused (too_large, bad_compression) and kubelet connections closed for breaking HTTP/2 "
            "(protocol, compression) or stalling (idle).",
            ["reason"],
            registry=self.registry,
        )
        self._relay_children: dict[str | bytes, Histogram] = {}

    @staticmethod
    def short_method(path: str) -> str:
        return path.rsplit(".", 1)[-1] if path.startswith("/runtime.") else path.lstrip("/")

    def call_finished(self, method: str | bytes, seconds: float) -> None:
        """One relayed call: appended to a list (no lock, no histogram work on the relay's path) and moved into
        the histogram at the next scrape, or when the list is long."""
        pending = self._pending
        pending.append((method, seconds))
        if len(pending) >= _PENDING_MAX:
            self.flush()

    def flush(self) -> None:
        """Move the pending observations into the histograms (before every scrape)."""
        pending, self._pending = self._pending, []
        for method, seconds in pending:
            self._observe(method, seconds)

    def _observe(self, method: str | bytes, seconds: float) -> None:
        child = self._relay_children.get(method)
        if child is None:
            name = method.decode("ascii", "replace") if isinstance(method, bytes) else method
            label = self.short_method(name) if len(self._relay_children) < _MAX_METHOD_LABELS else "other"
            child = self.call_duration.labels(label, "relay")
            self._relay_children[method] = child
        child.observe(seconds)

    def refused(self, reason: str) -> None:
        self.refusals.labels(reason).inc()

    def stage(self, method: str, stage: str, seconds: float) -> None:
        self.call_duration.labels(self.short_method(method), stage).observe(seconds)


async def serve_http(
    host: str, port: int, metrics: ProxyMetrics, ready: Callable[[], tuple[bool, str]]
) -> asyncio.AbstractServer:
    """A minimal HTTP/1.1 endpoint: /metrics, /healthz (process up), /readyz (serving + runtime)."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = await asyncio.wait_for(reader.readline(), 5)
            while (await asyncio.wait_for(reader.readline(), 5)) not in (b"\r\n", b"\n", b""):
                pass
            parts = request.decode("latin-1").split()
            path = parts[1].split("?", 1)[0] if len(parts) > 1 else "/"
            status, ctype, body = "404 Not Found", "text/plain", b"not found\n"
            if path == "/metrics":
                status, ctype, body = "200 OK", CONTENT_TYPE_LATEST, generate_latest(metrics.registry)
            elif path == "/healthz":
                status, body = "200 OK", b"ok\n"
            elif path == "/readyz":
                ok, why = ready()
                status = "200 OK" if ok else "503 Service Unavailable"
                body = (why + "\n").encode()
            writer.write(
                f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
                "Connection: close\r\n\r\n".encode() + body
            )
            await writer.drain()
        except (TimeoutError, ConnectionError, UnicodeDecodeError) as err:
            log.debug("metrics endpoint request failed: %s", err)
        finally:
            writer.close()

    return await asyncio.start_server(handle, host, port)
