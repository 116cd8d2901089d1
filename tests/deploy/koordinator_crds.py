"""Koordinator v1.8.0's CRD schemas as compact facts (koordinator_v1_8_0_crds.json), and CRDs made from them.

The facts are the CRDs' group, names, scope, versions (served, storage, status subresource) and, per version, the
structure of the schema: field names, types, formats, enums, ``required``, ``items``, ``additionalProperties`` and
the ``x-kubernetes-*`` markers; no descriptions. :func:`crd_documents` turns them back into
CustomResourceDefinition objects the project's API server serves and validates against, in place of deploy/'s.

Regenerate (needs Koordinator's chart, e.g. the mirrored koordinator-sh/charts, and Helm):
``python -m tests.deploy.koordinator_crds <charts checkout>/versions/v1.8.0``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

FACTS = Path(__file__).with_name("koordinator_v1_8_0_crds.json")
# The CRDs of the objects koordlet writes or reads.
CRD_NAMES = ("nodemetrics.slo.koordinator.sh", "nodeslos.slo.koordinator.sh", "devices.scheduling.koordinator.sh",
             "noderesourcetopologies.topology.node.k8s.io")
_KEPT = ("type", "format", "enum", "required", "nullable", "x-kubernetes-preserve-unknown-fields",
         "x-kubernetes-int-or-string", "x-kubernetes-embedded-resource", "x-kubernetes-list-type",
         "x-kubernetes-map-type", "anyOf", "pattern", "maxLength", "minimum", "maximum")


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


def load_facts() -> dict[str, Any]:
    return json.loads(FACTS.read_text())


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


def _regenerate(chart_dir: Path) -> None:
    import yaml

    from tests.deploy.tools import tool

    rendered = subprocess.run([tool("helm"), "template", "koordinator", str(chart_dir)], capture_output=True,
                              text=True, check=True, timeout=300).stdout
    crds = [d for d in yaml.safe_load_all(rendered) if d and d.get("kind") == "CustomResourceDefinition"
            and d["metadata"]["name"] in CRD_NAMES]
    FACTS.write_text(json.dumps(facts_of(crds), indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    _regenerate(Path(sys.argv[1]))
