"""Our CRDs (deploy/chart/koordlet-py/files/crds) against Koordinator's: fact for fact Koordinator's own at commit
a7a1b76, which is v1.8.0's plus exactly the fields README.md names; the objects koordlet writes stay valid under
v1.8.0's, which prunes those fields; and the recorded facts against Koordinator's chart and source when
``KOORDINATOR_CHARTS_DIR`` / ``KOORDINATOR_SOURCE_DIR`` name them (tests/deploy/koordinator_crds.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from tests.deploy.koordinator_crds import (
    FACTS,
    SOURCE_COMMIT,
    SOURCE_FACTS,
    chart_facts,
    crd_documents,
    facts_of,
    load_facts,
    source_facts,
)
from tests.deploy.tools import CHART, ROOT, request
from tests.support.apiserver import ApiServer, kube_api_client

V1_8_0, SOURCE = load_facts(FACTS), load_facts(SOURCE_FACTS)
OURS = facts_of([yaml.safe_load(path.read_text()) for path in sorted((CHART / "files" / "crds").glob("*_*.yaml"))])
CLASSES = ("lsrClass", "lsClass", "beClass", "systemClass", "cgroupRoot")
PAGE_CACHE = ("pageCacheEnable", "pageCacheLimitPercent", "pageCacheLimitSize", "pageCacheReclaimSync")


def _nodes(schema: dict[str, Any], path: str = "") -> dict[str, dict[str, Any]]:
    """Every node of a schema by its path (``.a.b``, ``[]`` for items, ``{}`` for additionalProperties), each with
    its own facts (its children left out)."""
    out = {path: {k: v for k, v in schema.items() if k not in ("properties", "items", "additionalProperties")}}
    for name, sub in schema.get("properties", {}).items():
        out |= _nodes(sub, f"{path}.{name}")
    if "items" in schema:
        out |= _nodes(schema["items"], path + "[]")
    if isinstance(schema.get("additionalProperties"), dict):
        out |= _nodes(schema["additionalProperties"], path + "{}")
    return out


def _fields(paths: set[str]) -> set[str]:
    """The named fields among schema paths (not the ``[]``/``{}`` nodes of lists and maps)."""
    return {p for p in paths if not p.endswith(("[]", "{}"))}


def _added(name: str) -> set[str]:
    """The schema paths a7a1b76 has and v1.8.0 has not, for one CRD (every version)."""
    return {f"{new['name']}{path}" if len(SOURCE[name]["versions"]) > 1 else path
            for new, old in zip(SOURCE[name]["versions"], V1_8_0[name]["versions"], strict=True)
            for path in set(_nodes(new["schema"])) - set(_nodes(old["schema"]))}


def test_our_crds_are_koordinators_at_a7a1b76_fact_for_fact() -> None:
    assert OURS == SOURCE


def test_a7a1b76_is_v1_8_0_with_only_fields_added() -> None:
    """Same names, scope, versions (served, storage, status subresource) and, for every field v1.8.0 has, the same
    type, format, bounds, enum, default and pattern: nothing narrower, nothing taken away."""
    assert set(SOURCE) == set(V1_8_0)
    for name, crd in SOURCE.items():
        released = V1_8_0[name]
        assert {k: crd[k] for k in ("group", "scope", "names")} == {k: released[k] for k in ("group", "scope", "names")}
        for version, old in zip(crd["versions"], released["versions"], strict=True):
            assert {k: version[k] for k in ("name", "served", "storage", "status")} == \
                {k: old[k] for k in ("name", "served", "storage", "status")}
            new_nodes, old_nodes = _nodes(version["schema"]), _nodes(old["schema"])
            assert set(old_nodes) <= set(new_nodes), name
            assert {p: new_nodes[p] for p in old_nodes} == old_nodes, name


def test_the_added_fields_are_exactly_those_the_readme_names() -> None:
    metric, slo = _added("nodemetrics.slo.koordinator.sh"), _added("nodeslos.slo.koordinator.sh")
    roots = (".status.nodeMetric.numaUsages", ".status.prodPeakMetric")
    assert all(p.startswith(roots) for p in metric) and {p for p in metric if p in roots} == set(roots)
    assert slo == {f".spec.resourceQOSStrategy.{c}.memoryQOS.{f}" for c in CLASSES for f in PAGE_CACHE} | {
        ".spec.systemStrategy.pageCacheLimitEnabled"}
    assert not _added("devices.scheduling.koordinator.sh")
    assert not _added("noderesourcetopologies.topology.node.k8s.io")
    assert [v["status"] for v in V1_8_0["devices.scheduling.koordinator.sh"]["versions"]] == [False]
    counts = {"NodeMetric": len(_fields(metric)), "NodeSLO": len(_fields(slo))}
    assert counts == {"NodeMetric": 84, "NodeSLO": 21}
    [claim] = [" ".join(paragraph.split()) for paragraph in (ROOT / "README.md").read_text().split("\n\n")
               if paragraph.startswith("The CRDs are Koordinator's own")]
    for needed in (f"`{SOURCE_COMMIT}`", f"{counts['NodeMetric']} in NodeMetric", f"{counts['NodeSLO']} in NodeSLO",
                   *(f"`{r.lstrip('.')}`" for r in roots), "`systemStrategy.pageCacheLimitEnabled`",
                   *(f"`{f}`" for f in PAGE_CACHE), "Device (no `status` subresource, as Koordinator's)"):
        assert needed in claim, needed


def _status_as_koordlet_writes_it() -> dict[str, Any]:
    usage = {"resources": {"cpu": "1500m", "memory": "2Gi"}}
    return {"updateTime": "2026-01-02T03:04:05Z",
            "nodeMetric": {"nodeUsage": usage, "systemUsage": usage, "numaUsages": [
                {"numaNodeID": 0, "nodeUsage": usage, "systemUsage": usage}]},
            "podsMetric": [{"name": "web", "namespace": "default", "podUsage": usage, "priority": "koord-prod",
                            "qos": "LS"}],
            "prodReclaimableMetric": {"resource": usage}, "prodPeakMetric": {"resource": usage}}


def test_under_v1_8_0s_crds_koordlets_nodemetric_is_accepted_and_the_later_fields_pruned() -> None:
    """What README says happens under Koordinator v1.8.0's own CRDs: no refusal, the two later fields dropped,
    everything else kept; under ours they are kept."""
    for crds, kept in ((crd_documents(V1_8_0), False), (crd_documents(SOURCE), True)):
        with ApiServer(crd_dir=None) as server, kube_api_client(server) as client:
            for crd in crds:
                request(client, "POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)
            base = "/apis/slo.koordinator.sh/v1alpha1/nodemetrics"
            request(client, "POST", base, {"apiVersion": "slo.koordinator.sh/v1alpha1", "kind": "NodeMetric",
                                           "metadata": {"name": "node-1"}})
            written = request(client, "PUT", f"{base}/node-1/status", {
                "apiVersion": "slo.koordinator.sh/v1alpha1", "kind": "NodeMetric", "metadata": {"name": "node-1"},
                "status": _status_as_koordlet_writes_it()})["status"]
        expected = _status_as_koordlet_writes_it()
        if not kept:
            del expected["nodeMetric"]["numaUsages"], expected["prodPeakMetric"]
        assert written == expected


def test_the_recorded_v1_8_0_facts_are_koordinators_chart(koordinator_chart: Path) -> None:
    assert chart_facts(koordinator_chart) == V1_8_0


def test_the_recorded_a7a1b76_facts_are_koordinators_source(koordinator_source: str) -> None:
    assert source_facts(koordinator_source) == SOURCE
