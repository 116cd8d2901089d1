"""The proxy's own call-duration histogram reads the same as prometheus_client's Histogram, and relayed
paths cannot grow its series without bound."""

from __future__ import annotations

import random

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from runtimeproxy.metrics import _BUCKETS, _MAX_METHOD_LABELS, CallHistogram, ProxyMetrics

NAME = "koord_runtimeproxy_call_duration_seconds"


def _samples(registry: CollectorRegistry) -> dict[tuple, float]:
    out = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        if family.name != NAME:
            continue
        for sample in family.samples:
            if sample.name.endswith("_created"):
                continue
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def test_call_histogram_exposes_what_prometheus_clients_histogram_exposes() -> None:
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    mine = CallHistogram(NAME, "doc", ("method", "stage"), ours)
    reference = Histogram(NAME, "doc", ["method", "stage"], buckets=_BUCKETS, registry=theirs)
    rng = random.Random(3)
    values = [*_BUCKETS, 0.0, 11.0, 1e-9]  # on every bound (le is inclusive), below the first, past the last
    values += [rng.choice((rng.uniform(0, 0.01), rng.uniform(0, 20))) for _ in range(2000)]
    for value in values:
        labels = ("RuntimeService/Version", rng.choice(("relay", "backend")))
        mine.labels(*labels).observe(value)
        reference.labels(*labels).observe(value)
    got, want = _samples(ours), _samples(theirs)
    assert got.keys() == want.keys() and len(got) == 2 * (len(_BUCKETS) + 3)
    for key, value in want.items():
        assert abs(got[key] - value) <= 1e-9 * max(1.0, abs(value)), key


def test_relayed_paths_past_the_bound_share_one_series() -> None:
    metrics = ProxyMetrics(CollectorRegistry())
    for i in range(3 * _MAX_METHOD_LABELS):
        metrics.call_finished(f"/some.Service/Method{i}".encode(), 0.001)
    counts = {labels: value for (name, labels), value in _samples(metrics.registry).items()
              if name.endswith("_count")}
    assert len(counts) == _MAX_METHOD_LABELS + 1
    assert counts[(("method", "other"), ("stage", "relay"))] == 2 * _MAX_METHOD_LABELS
    assert sum(counts.values()) == 3 * _MAX_METHOD_LABELS
    assert len(metrics._relay_children) == _MAX_METHOD_LABELS
