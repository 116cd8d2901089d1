"""koordlet's ``/metrics`` text in the form Koordinator's koordlet answers it: client_golang v1.23.2 behind
``promhttp.HandlerOpts{}`` (Koordinator v1.8.0 cmd/koordlet/main.go), text format 0.0.4.

Two things of prometheus_client's own output differ from it, and each would break what was built on Koordinator:

- A Koordinator counter is named without ``_total`` (``koordlet_pod_eviction``), and client_golang's text format
  writes a counter under the name it was given. prometheus_client appends ``_total`` to every counter. Koordinator's
  counters are therefore :class:`GoCounter` here, whose family and samples keep the bare name. Our own counters stay
  prometheus_client's, ``_total`` and all (Prometheus' naming convention); docs/configuration.md says which is which.
- client_golang writes no ``_created`` series in the text format; prometheus_client writes one gauge family per
  counter and histogram. :func:`exposition` leaves them out.

Content negotiation: with ``EnableOpenMetrics`` false (``HandlerOpts{}``) promhttp answers text 0.0.4 to every
Accept header, Prometheus' OpenMetrics-first one included, so OpenMetrics' rule that a counter's samples end in
``_total`` never applies and the bare names reach Prometheus as they are. koordlet answers :data:`CONTENT_TYPE`
(what promhttp sends, prometheus/common v0.67.5 expfmt.Negotiate) to every request likewise. The one difference
left: an Accept asking for protobuf first (Prometheus with native histograms on) gets protobuf from Go and text
here, which Prometheus reads by its Content-Type all the same. The other families keep prometheus_client's number
form (``1.0`` where Go writes ``1``): the same value to any parser.
"""

from __future__ import annotations

import copy
import math
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from decimal import Decimal

from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.core import Metric
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import Collector

# promhttp's answer to any Accept but protobuf's: expfmt.FmtText with the default name escaping.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8; escaping=underscores"


class GoCounterFamily(Metric):
    """A counter family exposed under its own name: no ``_total`` is added, to the family or to its samples."""

    def __init__(self, name: str, documentation: str) -> None:
        super().__init__(name, documentation, "counter")


class _Series:
    """One labelled value of a :class:`GoCounter` (``labels(...)`` returns it)."""

    __slots__ = ("_family", "_value", "updated")

    def __init__(self, family: GoCounter, updated: float) -> None:
        self._family = family
        self._value = 0.0
        self.updated = updated

    def inc(self, amount: float = 1.0) -> None:
        if amount < 0:
            raise ValueError("a counter only goes up")
        with self._family.lock:
            self._value += amount
            self.updated = self._family.clock()

    def get(self) -> float:
        with self._family.lock:
            return self._value


class GoCounter:
    """A labelled counter as client_golang exposes a ``CounterVec`` named without ``_total``.

    ``expire_after_s``: a series not counted for that long is dropped (Koordinator's ``NewGCCounterVec``,
    pkg/util/metrics/expire_metric.go: 5 minutes, for the per-pod ``koordlet_pod_eviction_detail``); checked when a
    series is made and at each scrape, so no thread is needed."""

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str],
                 registry: CollectorRegistry | None = REGISTRY, expire_after_s: float | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self.expire_after_s = expire_after_s
        self.clock = clock
        self.lock = threading.Lock()
        self._series: dict[tuple[str, ...], _Series] = {}
        if registry is not None:
            registry.register(self)

    def labels(self, *values: object, **by_name: object) -> _Series:
        if values and by_name:
            raise ValueError("label values either by position or by name")
        if by_name:
            if set(by_name) != set(self.labelnames):
                raise ValueError(f"{self.name}: labels {sorted(by_name)}, expected {sorted(self.labelnames)}")
            values = tuple(by_name[label] for label in self.labelnames)
        if len(values) != len(self.labelnames):
            raise ValueError(f"{self.name}: {len(values)} label values for {len(self.labelnames)} labels")
        key = tuple(str(value) for value in values)
        with self.lock:
            self._expire()
            series = self._series.get(key)
            if series is None:
                series = self._series[key] = _Series(self, self.clock())
            return series

    def remove(self, *values: object) -> None:
        with self.lock:
            self._series.pop(tuple(str(value) for value in values), None)

    def clear(self) -> None:
        with self.lock:
            self._series.clear()

    def _expire(self) -> None:
        if self.expire_after_s is None:
            return
        oldest = self.clock() - self.expire_after_s
        for key in [key for key, series in self._series.items() if series.updated < oldest]:
            del self._series[key]

    def describe(self) -> list[Metric]:
        return [GoCounterFamily(self.name, self.documentation)]

    def collect(self) -> list[Metric]:
        family = GoCounterFamily(self.name, self.documentation)
        with self.lock:
            self._expire()
            for key, series in self._series.items():
                family.add_sample(self.name, dict(zip(self.labelnames, key, strict=True)), series._value)
        return [family]


def go_float(value: float) -> str:
    """``value`` as expfmt's writeFloat writes it: ``strconv.AppendFloat(f, 'g', -1, 64)``, the shortest digits that
    read back the same, in %e form when the decimal exponent is below -4 or at least 6 (``1``, ``0.5``,
    ``123456``, ``1.234567e+06``, ``1e-05``). prometheus_client writes ``1.0`` for one."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if value == 0:
        return "0"
    sign, digit_tuple, exponent = Decimal(repr(value)).normalize().as_tuple()
    digits = "".join(map(str, digit_tuple))
    point = len(digits) + int(exponent)  # where the decimal point falls in the digits
    minus = "-" if sign else ""
    if not -4 <= point - 1 < 6:
        mantissa = digits[0] + ("." + digits[1:] if len(digits) > 1 else "")
        return f"{minus}{mantissa}e{'-' if point - 1 < 0 else '+'}{abs(point - 1):02d}"
    if point <= 0:
        return f"{minus}0.{'0' * -point}{digits}"
    if point >= len(digits):
        return f"{minus}{digits}{'0' * (point - len(digits))}"
    return f"{minus}{digits[:point]}.{digits[point:]}"


def _escape_label_value(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def _go_counter_text(family: GoCounterFamily) -> bytes:
    """client_golang's text for a counter family (expfmt MetricFamilyToText): HELP, TYPE, then each sample under the
    family's own name with its labels sorted by name. A family with no sample yet keeps its HELP and TYPE, as every
    other family of ours does (Go leaves such a family out; here Prometheus knows its name and type before the first
    count)."""
    help_text = family.documentation.replace("\\", r"\\").replace("\n", r"\n")
    lines = [f"# HELP {family.name} {help_text}\n", f"# TYPE {family.name} counter\n"]
    for sample in family.samples:
        labels = ",".join(f'{name}="{_escape_label_value(value)}"' for name, value in sorted(sample.labels.items()))
        lines.append(f"{sample.name}{{{labels}}} {go_float(sample.value)}\n" if labels
                     else f"{sample.name} {go_float(sample.value)}\n")
    return "".join(lines).encode()


class _One:
    """One family as a collector (what generate_latest takes)."""

    def __init__(self, family: Metric) -> None:
        self._family = family

    def collect(self) -> Iterator[Metric]:
        yield self._family


def _without_created(family: Metric) -> Metric:
    created = family.name + "_created"
    if not any(sample.name == created for sample in family.samples):
        return family
    trimmed = copy.copy(family)
    trimmed.samples = [sample for sample in family.samples if sample.name != created]
    return trimmed


def exposition(collectors: Iterable[Collector]) -> bytes:
    """The text of every family of ``collectors`` (registries, or anything with ``collect()``), in their order."""
    parts = []
    for collector in collectors:
        for family in collector.collect():
            if isinstance(family, GoCounterFamily):
                parts.append(_go_counter_text(family))
            else:
                parts.append(generate_latest(_One(_without_created(family))))  # type: ignore[arg-type]
    return b"".join(parts)
