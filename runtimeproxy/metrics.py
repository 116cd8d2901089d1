"""Prometheus metrics of the proxy and its small HTTP endpoint (/metrics, /healthz, /readyz).

The relay has no per-call object on its copy path; it reports a call once, when the frame that
ends the response stream passes (relay.RelayObserver). The call-duration histogram is the proxy's own
(CallHistogram): the proxy serves calls and scrapes on one event loop, so an observation is one dict
lookup, one bisect and two additions, with no lock; prometheus_client's Histogram costs ~5x that.
"""

from __future__ import annotations

import asyncio
import logging
from bisect import bisect_left
from collections.abc import Callable, Iterator

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily
from prometheus_client.utils import floatToGoString

from .relay import RelayObserver

log = logging.getLogger(__name__)

# Buckets from 50 µs (a relayed cheap call) to 10 s (a slow RunPodSandbox).
_BUCKETS = (5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
_MAX_METHOD_LABELS = 256


class _Child:
    """One label set's buckets: ``counts[i]`` holds observations in (bounds[i-1], bounds[i]], the last +Inf."""

    __slots__ = ("counts", "sum")

    def __init__(self, buckets: int) -> None:
        self.counts = [0] * (buckets + 1)
        self.sum = 0.0

    def observe(self, seconds: float) -> None:
        self.counts[bisect_left(_BUCKETS, seconds)] += 1
        self.sum += seconds


class CallHistogram:
    """A Prometheus histogram family without locks, for a single-threaded event loop.

    Exposed like prometheus_client's Histogram (``_bucket`` with ``le``, ``_count``, ``_sum``); observed
    only from the proxy's event loop, and collected there too (the /metrics handler runs on it)."""

    def __init__(self, name: str, documentation: str, labelnames: tuple[str, ...],
                 registry: CollectorRegistry) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = labelnames
        self._children: dict[tuple[str, ...], _Child] = {}
        self._les = [floatToGoString(b) for b in _BUCKETS] + ["+Inf"]
        registry.register(self)

    def labels(self, *values: str) -> _Child:
        if len(values) != len(self.labelnames):
            raise ValueError(f"{self.name}: {len(self.labelnames)} label values expected, got {len(values)}")
        child = self._children.get(values)
        if child is None:
            child = self._children[values] = _Child(len(_BUCKETS))
        return child

    def total(self, **match: str) -> int:
        """Observations of every child whose labels have the given values."""
        index = [(self.labelnames.index(name), value) for name, value in match.items()]
        return sum(sum(child.counts) for values, child in list(self._children.items())
                   if all(values[i] == value for i, value in index))

    def describe(self) -> list:
        return [HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)]

    def collect(self) -> Iterator[HistogramMetricFamily]:
        family = HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for values, child in list(self._children.items()):
            total = 0
            buckets = []
            for le, count in zip(self._les, child.counts, strict=True):
                total += count
                buckets.append((le, total))
            family.add_metric(list(values), buckets, child.sum)
        yield family


class _ServedCalls:
    """koord_runtimeproxy_calls_served_total, summed from the call histogram when scraped: a call costs it
    nothing. The installer reads it to see that kubelet really talks to the proxy."""

    def __init__(self, calls: CallHistogram, registry: CollectorRegistry) -> None:
        self._calls = calls
        registry.register(self)

    @staticmethod
    def _family(value: float | None = None) -> CounterMetricFamily:
        return CounterMetricFamily("koord_runtimeproxy_calls_served", "CRI calls the proxy answered (relayed or "
                                   "hooked, any status), since it started.", value=value)

    def describe(self) -> list:
        return [self._family()]

    def collect(self) -> Iterator[CounterMetricFamily]:
        yield self._family(self._calls.total(stage="relay"))


class ProxyMetrics(RelayObserver):
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        ProcessCollector(registry=self.registry)
        self.call_duration = CallHistogram(
            "koord_runtimeproxy_call_duration_seconds",
            "Time of a CRI call through the proxy by method and stage: relay (whole call of a relayed "
            "method), pre_hook, backend, post_hook (stages of a hooked lifecycle call).",
            ("method", "stage"),
            self.registry,
        )
        _ServedCalls(self.call_duration, self.registry)
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
            "Calls refused (too_large, bad_compression; goaway: opened after the proxy began to drain, refused "
            "unprocessed for the client to retry) and kubelet connections closed for breaking HTTP/2 "
            "(protocol, compression) or stalling (idle).",
            ["reason"],
            registry=self.registry,
        )
        self._relay_children: dict[str | bytes, _Child] = {}

    @staticmethod
    def short_method(path: str) -> str:
        return path.rsplit(".", 1)[-1] if path.startswith("/runtime.") else path.lstrip("/")

    def call_finished(self, method: str | bytes, seconds: float) -> None:
        """One relayed call, observed in its method's histogram (the child is cached per raw path)."""
        child = self._relay_children.get(method)
        if child is None:
            child = self._relay_child(method)
        child.observe(seconds)

    def _relay_child(self, method: str | bytes) -> _Child:
        if len(self._relay_children) >= _MAX_METHOD_LABELS:  # paths past the bound share one series, uncached
            return self.call_duration.labels("other", "relay")
        name = method.decode("ascii", "replace") if isinstance(method, bytes) else method
        child = self._relay_children[method] = self.call_duration.labels(self.short_method(name), "relay")
        return child

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
