"""koordlet/gotext.py: Koordinator's counters in client_golang's text form, and the exposition around them."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram

from koordlet.gotext import GoCounter, exposition, go_float


@pytest.mark.parametrize("value,text", [
    # strconv.FormatFloat(v, 'g', -1, 64) and expfmt's writeFloat special cases (0, 1, -1, NaN, ±Inf).
    (0.0, "0"), (-0.0, "0"), (1.0, "1"), (-1.0, "-1"), (3.0, "3"), (0.5, "0.5"), (12.25, "12.25"),
    (123456.0, "123456"), (1234567.0, "1.234567e+06"), (1e6, "1e+06"), (2.68435456e8, "2.68435456e+08"),
    (0.0001, "0.0001"), (1e-05, "1e-05"), (1.5e-7, "1.5e-07"), (0.1 + 0.2, "0.30000000000000004"),
    (1e300, "1e+300"), (float("inf"), "+Inf"), (float("-inf"), "-Inf"), (float("nan"), "NaN"),
])
def test_values_are_written_as_gos_shortest_g_format(value: float, text: str) -> None:
    assert go_float(value) == text


def test_a_go_counter_is_written_under_its_own_name_with_sorted_escaped_labels() -> None:
    registry = CollectorRegistry()
    counter = GoCounter("koordlet_pod_eviction", 'Pods evicted\nby "reason" \\ feature', ["reason", "node"],
                        registry=registry)
    counter.labels(reason='say "no"\\now\n', node="n1").inc()
    counter.labels("r2", "n1").inc(2)
    assert exposition([registry]).decode() == (
        '# HELP koordlet_pod_eviction Pods evicted\\nby "reason" \\\\ feature\n'
        "# TYPE koordlet_pod_eviction counter\n"
        'koordlet_pod_eviction{node="n1",reason="say \\"no\\"\\\\now\\n"} 1\n'
        'koordlet_pod_eviction{node="n1",reason="r2"} 2\n')


def test_a_go_counter_with_no_series_yet_is_still_described() -> None:
    registry = CollectorRegistry()
    GoCounter("koordlet_collect_node_cpu_info_status", "Readings", ["node", "status"], registry=registry)
    assert exposition([registry]).decode() == ("# HELP koordlet_collect_node_cpu_info_status Readings\n"
                                               "# TYPE koordlet_collect_node_cpu_info_status counter\n")


def test_our_counters_keep_total_and_no_family_has_created_series() -> None:
    registry = CollectorRegistry()
    Counter("koordlet_node_metric_reports", "Reports", ["status"], registry=registry).labels("ok").inc()
    Histogram("koordlet_collector_duration_seconds", "Time", buckets=(1.0,), registry=registry).observe(0.5)
    text = exposition([registry]).decode()
    assert "# TYPE koordlet_node_metric_reports_total counter\n" in text
    assert 'koordlet_node_metric_reports_total{status="ok"} 1.0\n' in text
    assert 'koordlet_collector_duration_seconds_bucket{le="1.0"} 1.0\n' in text
    assert "_created" not in text


def test_series_of_an_expiring_counter_go_after_their_time_without_a_count() -> None:
    now = [1000.0]
    registry = CollectorRegistry()
    detail = GoCounter("koordlet_pod_eviction_detail", "Detail", ["pod_name"], registry=registry,
                       expire_after_s=300.0, clock=lambda: now[0])
    detail.labels("old").inc()
    detail.labels("kept").inc()
    now[0] += 200.0
    detail.labels("kept").inc()  # counted again: its 300 s start over
    now[0] += 150.0
    text = exposition([registry]).decode()
    assert 'pod_name="old"' not in text and 'koordlet_pod_eviction_detail{pod_name="kept"} 2\n' in text
    now[0] += 301.0
    assert "pod_name=" not in exposition([registry]).decode()


def test_a_go_counter_refuses_wrong_labels_and_a_decrease() -> None:
    registry = CollectorRegistry()
    counter = GoCounter("koordlet_pod_eviction", "x", ["node", "reason"], registry=registry)
    with pytest.raises(ValueError, match="labels"):
        counter.labels(node="n1")
    with pytest.raises(ValueError, match="label values"):
        counter.labels("n1")
    with pytest.raises(ValueError, match="only goes up"):
        counter.labels("n1", "r").inc(-1)
    with pytest.raises(ValueError):  # the registry holds the name (and its _total) already
        Counter("koordlet_pod_eviction", "x", registry=registry)
