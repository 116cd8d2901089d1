"""Every metric family Koordinator's koordlet exports (tests/koordlet/koordinator_metrics.py: v1.8.0 and main's
additions) is served by koordlet-py's ``/metrics`` under the same name, with the same type and label names, and its
counters as Koordinator's Go client writes them: no ``_total``. Our own families keep Prometheus' conventions.

Here an agent's registries, with one series in every metric object and a sample of everything in the cache and the
states, are scraped over HTTP as Prometheus scrapes (its Accept header), so every family shows its labels. A real
koordlet process scraped by a real Prometheus is compared with the same facts in tests/deploy/test_prometheus.py.
"""

from __future__ import annotations

import re
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import REGISTRY, CollectorRegistry

import koordlet.eviction  # noqa: F401 - defines its metrics at import
import koordlet.executor.metrics  # noqa: F401
import koordlet.qosmanager.metrics  # noqa: F401
import koordlet.runtimehooks.metrics  # noqa: F401
from koordlet.api.nodeslo import parse_node_slo_spec
from koordlet.api.pod import ContainerMeta, PodMeta
from koordlet.gotext import GoCounter
from koordlet.metriccache import CPI_RESOURCE_CYCLE, Label, MetricCache, MetricKind, SeriesKey
from koordlet.metrics import KoordletMetrics, MetricsServer
from koordlet.statesinformer.api import NodeInfo, StaticStates
from tests.koordlet import koordinator_metrics as facts
from tests.support import promtext

REPO = Path(__file__).resolve().parents[2]
# What Prometheus 2.42 sends with a scrape (scrape/scrape.go scrapeAcceptHeader): OpenMetrics first.
PROMETHEUS_ACCEPT = ("application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
                     "text/plain;version=0.0.4;q=0.5,*/*;q=0.1")
NODE = "facts-node"
NOT_EXPORTED, EXPORTED = facts.NOT_EXPORTED, facts.EXPORTED
_SUFFIXES = ("_total", "_created", "_bucket", "_sum", "_count")


def _agent() -> KoordletMetrics:
    """An agent's metrics whose cache and states hold one of every series the scrape-time families show."""
    now = time.time()
    cache = MetricCache()
    pod, ctr = {Label.POD_UID: "u1"}, {Label.POD_UID: "u1", Label.CONTAINER_ID: "c1"}
    psi = {Label.PSI_RESOURCE: "cpu", Label.PSI_PRECISION: "avg10", Label.PSI_DEGREE: "some"}
    for key in (SeriesKey.of(MetricKind.NODE_CPU_USAGE), SeriesKey.of(MetricKind.NODE_MEMORY_USAGE),
                SeriesKey.of(MetricKind.POD_PSI, **pod, **psi), SeriesKey.of(MetricKind.CONTAINER_PSI, **ctr, **psi),
                SeriesKey.of(MetricKind.CONTAINER_CPI, **ctr, **{Label.CPI_RESOURCE: CPI_RESOURCE_CYCLE}),
                SeriesKey.of(MetricKind.RESCTRL_LLC, **{Label.QOS: "LS", Label.CACHE_ID: "0"}),
                SeriesKey.of(MetricKind.RESCTRL_MB, **{Label.QOS: "LS", Label.CACHE_ID: "0",
                                                       Label.RESCTRL_MB_TYPE: "mbm_total_bytes"}),
                SeriesKey.of(MetricKind.HOST_APP_CPU_USAGE, **{Label.HOST_APP_NAME: "nginx"})):
        cache.append(key, now, 1.0)
    slo = parse_node_slo_spec({"hostApplications": [{"name": "nginx", "priority": "koord-prod", "qos": "LS"}]})
    states = StaticStates(node=NodeInfo(NODE, allocatable={"cpu": 4000}), node_slo=slo, pods=(
        PodMeta(name="p", namespace="ns", uid="u1", containers=(ContainerMeta("c", "c1", requests={"cpu": 100},
                                                                               limits={"cpu": 200}),)),))
    return KoordletMetrics(NODE, cache, states)


def _objects(registries: tuple[CollectorRegistry, ...]) -> Iterator[object]:
    """The metric objects (labelled Counter, Gauge, Histogram, GoCounter) registered on ``registries``."""
    for registry in registries:
        for collector in list(registry._collector_to_names):  # noqa: SLF001 - the declared objects
            if getattr(collector, "_labelnames", None) is not None or isinstance(collector, GoCounter):
                yield collector


def _one_series_each(registries: tuple[CollectorRegistry, ...]) -> list[tuple[object, tuple[str, ...]]]:
    """Give every Koordinator metric object one series (label values ``facts``), as its code path would."""
    made = []
    for metric in _objects(registries):
        name = getattr(metric, "name", None) or getattr(metric, "_name", "")
        if name not in EXPORTED:
            continue
        labelnames = getattr(metric, "labelnames", None) or metric._labelnames  # type: ignore[attr-defined]
        values = tuple(NODE if label == "node" else "facts" for label in labelnames)
        child = metric.labels(*values) if labelnames else metric  # type: ignore[attr-defined]
        for record in ("inc", "set", "observe"):
            if hasattr(child, record):
                getattr(child, record)(1)
                break
        made.append((metric, values))
    return made


@pytest.fixture(scope="module")
def scrape() -> Iterator[tuple[str, str]]:
    """(Content-Type, body) of ``GET /metrics`` of a served agent, asked as Prometheus asks."""
    metrics = _agent()
    made = _one_series_each((metrics.registry, REGISTRY))
    server = MetricsServer(metrics.registry, "127.0.0.1", 0)
    server.start()
    try:
        request = urllib.request.Request(f"http://127.0.0.1:{server.port}/metrics",
                                         headers={"Accept": PROMETHEUS_ACCEPT})
        with urllib.request.urlopen(request, timeout=10) as response:
            yield response.headers["Content-Type"], response.read().decode()
    finally:
        server.stop()
        for metric, values in made:  # the default registry outlives this module
            if values:
                metric.remove(*values)  # type: ignore[attr-defined]


def test_every_koordinator_family_is_served_with_its_name_type_and_label_names(scrape: tuple[str, str]) -> None:
    families = promtext.parse(scrape[1])
    missing = sorted(name for name in EXPORTED if not families.get(name, promtext.Family(name, "")).samples)
    different = {name: ((families[name].type, sorted(families[name].label_names)),
                        (family.type, sorted(family.labels)))
                 for name, family in EXPORTED.items() if name in families and families[name].samples
                 and (families[name].type, families[name].label_names) != (family.type, frozenset(family.labels))}
    assert missing == [] and different == {}
    print(f"{len(facts.V1_8_0)} families at v1.8.0 + {len(facts.MAIN_ADDITIONS)} of main = {len(facts.FAMILIES)}; "
          f"served with samples: {len(EXPORTED)}; not exported: {len(NOT_EXPORTED)}")


def test_no_family_koordinator_does_not_export_is_served(scrape: tuple[str, str]) -> None:
    families = promtext.parse(scrape[1])
    assert set(NOT_EXPORTED) & set(families) == set()


def test_koordinators_counters_are_served_without_total_and_ours_with_it(scrape: tuple[str, str]) -> None:
    families = promtext.parse(scrape[1])
    counters = {name for name, family in families.items() if family.type == "counter"}
    koordinators = {name for name, family in EXPORTED.items() if family.type == "counter"}
    assert koordinators == {"koordlet_pod_eviction", "koordlet_pod_eviction_detail",
                            "koordlet_collect_node_cpu_info_status", "koordlet_collect_node_numa_info_status",
                            "koordlet_collect_node_local_storage_info_status"}
    assert koordinators <= counters
    for name in koordinators:
        assert {sample.name for sample in families[name].samples} == {name}
    ours = counters - koordinators
    assert ours and all(name.endswith("_total") for name in ours), sorted(n for n in ours if not n.endswith("_total"))
    # Nothing of ours is a Koordinator name with a suffix (a family that would shadow or split one of theirs).
    shadows = {name for name in families for base in facts.FAMILIES
               if name != base and name.startswith(base) and name[len(base):] in _SUFFIXES}
    assert shadows == set()


def test_a_scrape_that_asks_for_openmetrics_first_gets_the_text_format_as_from_koordinator(
        scrape: tuple[str, str]) -> None:
    """Koordinator's promhttp handler has OpenMetrics off: Prometheus' OpenMetrics-first Accept gets text 0.0.4, where a
    counter may keep its bare name; no ``_created`` series (the Go client writes none)."""
    content_type, body = scrape
    assert content_type == facts.CONTENT_TYPE
    assert "# TYPE koordlet_pod_eviction counter\n" in body
    assert f'koordlet_pod_eviction{{node="{NODE}",reason="facts"}} 1\n' in body
    assert "# EOF" not in body and "_created" not in body


def test_docs_section_6_lists_every_koordinator_metric_and_says_which_are_not_exported() -> None:
    text = (REPO / "docs/koordinator.md").read_text()
    section = text[text.index("## 6. Prometheus metrics"):text.index("## 7.")]
    listed = set(re.findall(r"`(koordlet_[a-z_]+)`", section))
    assert set(facts.FAMILIES) - listed == set()
    for name in NOT_EXPORTED:
        assert re.search(rf"`{name}`[^\n]*not exported", section), \
            f"docs/koordinator.md §6 does not say {name} is not exported"
