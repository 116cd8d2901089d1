"""Koordinator's CRD schemas as compact facts, and CRDs made from them.

- koordinator_v1_8_0_crds.json: the four CRDs koordlet reads and writes as Koordinator v1.8.0's chart ships them
  (koordinator-sh/charts, versions/v1.8.0/templates/crd);
- koordinator_a7a1b76_crds.json: Koordinator's own three (NodeSLO, NodeMetric, Device) at koordinator-sh/koordinator
  commit a7a1b76 (config/crd/bases), the API koordlet-py follows: v1.8.0's and the fields added after it (NodeMetric's
  NUMA usages and peak, NodeSLO's page cache limits). Our CRDs (deploy/chart/koordlet-py/files/crds) are these,
  fact for fact (tests/deploy/test_crds_match_koordinator.py).

The facts are the CRDs' group, names, scope, versions (served, storage, status subresource) and, per version, the
structure of the schema: field names, types, formats, enums, defaults, bounds, patterns, ``required``, ``items``,
``additionalProperties`` and the ``x-kubernetes-*`` markers; no descriptions. :func:`crd_documents` turns them back
into CustomResourceDefinition objects the project's API server serves and validates against, in place of deploy/'s.

Regenerate (needs Koordinator's chart, e.g. the mirrored koordinator-sh/charts, and Helm; or a clone of
koordinator-sh/koordinator that has commit a7a1b76, bare or not):
``python -m tests.deploy.koordinator_crds chart <charts checkout>/versions/v1.8.0`` and
``python -m tests.deploy.koordinator_crds source <koordinator clone>``. tests/deploy/test_crds_match_koordinator.py
compares the recorded facts with these sources when ``KOORDINATOR_CHARTS_DIR`` / ``KOORDINATOR_SOURCE_DIR`` name them.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

FACTS = Path(__file__).with_name("koordinator_v1_8_0_crds.json")
SOURCE_COMMIT = "a7a1b76"
SOURCE_FACTS = Path(__file__).with_name(f"koordinator_{SOURCE_COMMIT}_crds.json")
# The CRDs of the objects koordlet writes or reads.
CRD_NAMES = ("nodemetrics.slo.koordinator.sh", "nodeslos.slo.koordinator.sh", "devices.scheduling.koordinator.sh",
             "noderesourcetopologies.topology.node.k8s.io")
_KEPT = ("type", "format", "enum", "required", "nullable", "x-kubernetes-preserve-unknown-fields",
         "x-kubernetes-int-or-string", "x-kubernetes-embedded-resource", "x-kubernetes-list-type",
         "x-kubernetes-map-type", "anyOf", "pattern", "maxLength", "minLength", "minimum", "maximum", "default")


def _compact(schema: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {key: schema[key] for key in _KEPT if key in schema}
    if "anyOf" in out:
        out["anyOf"] = [_compact(item) for item in out["anyOf"]]
    if "properties" in schema:
        out["properties"] = {name: _compact(sub) for name, sub in schema["properties"].items()}
    if "items" in schema:
        out["items"] = _compact(schema["items"])
    if isinstance(schema.get("additionalProperties"), dict):
        out["additionalProperties"] = _compact(schema["additionalProperties"])
    elif "additionalProperties" in schema:
        out["additionalProperties"] = schema["additionalProperties"]
    return out


def facts_of(crds: list[dict[str, Any]]) -> dict[str, Any]:
    facts = {}
    for crd in sorted(crds, key=lambda c: c["metadata"]["name"]):
        spec = crd["spec"]
        facts[crd["metadata"]["name"]] = {
            "group": spec["group"], "scope": spec["scope"],
            "names": {key: spec["names"][key] for key in ("kind", "listKind", "plural", "singular", "shortNames")
                      if key in spec["names"]},
            "versions": [{"name": v["name"], "served": v["served"], "storage": v["storage"],
                          "status": "status" in (v.get("subresources") or {}),
                          "schema": _compact(v["schema"]["openAPIV3Schema"])} for v in spec["versions"]],
        }
    return facts


def load_facts(path: Path = FACTS) -> dict[str, Any]:
    return json.loads(path.read_text())


def crd_documents(facts: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """CustomResourceDefinitions (apiextensions.k8s.io/v1) with exactly the recorded schemas."""
    docs = []
    for name, crd in (facts or load_facts()).items():
        versions = []
        for version in crd["versions"]:
            item: dict[str, Any] = {"name": version["name"], "served": version["served"],
                                    "storage": version["storage"],
                                    "schema": {"openAPIV3Schema": version["schema"]}}
            if version["status"]:
                item["subresources"] = {"status": {}}
            versions.append(item)
        docs.append({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
                     "metadata": {"name": name},
                     "spec": {"group": crd["group"], "scope": crd["scope"], "names": crd["names"],
                              "versions": versions}})
    return docs


def _wanted(crds: list[dict[str, Any]]) -> dict[str, Any]:
    return facts_of([d for d in crds if d and d.get("kind") == "CustomResourceDefinition"
                     and d["metadata"]["name"] in CRD_NAMES])


def chart_facts(chart_dir: Path) -> dict[str, Any]:
    """The facts of the CRDs a chart renders with its default values (`helm template`)."""
    import yaml

    from tests.deploy.tools import tool

    rendered = subprocess.run([tool("helm"), "template", "koordinator", str(chart_dir)], capture_output=True,
                              text=True, check=True, timeout=300).stdout
    return _wanted(list(yaml.safe_load_all(rendered)))


def source_facts(git_dir: str, commit: str = SOURCE_COMMIT) -> dict[str, Any]:
    """The facts of Koordinator's generated CRDs (config/crd/bases) at ``commit`` of the clone at ``git_dir``."""
    import yaml

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", git_dir, *args], capture_output=True, text=True, check=True,
                              timeout=60).stdout

    names = git("ls-tree", "--name-only", f"{commit}:config/crd/bases").split()
    return _wanted([yaml.safe_load(git("show", f"{commit}:config/crd/bases/{name}")) for name in names])


if __name__ == "__main__":
    kind, where = sys.argv[1:3]
    facts, target = (chart_facts(Path(where)), FACTS) if kind == "chart" else (source_facts(where), SOURCE_FACTS)
    target.write_text(json.dumps(facts, indent=1, sort_keys=True) + "\n")
