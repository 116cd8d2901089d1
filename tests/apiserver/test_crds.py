"""deploy/chart/koordlet-py/files/crds: every file is a valid structural CRD with Koordinator's names."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.support.kube import crd_problems, load_crds, validate_schema

CRD_DIR = Path(__file__).resolve().parents[2] / "deploy" / "chart" / "koordlet-py" / "files" / "crds"
CRD_FILES = sorted(CRD_DIR.glob("*_*.yaml"))  # <group>_<plural>.yaml (kustomization.yaml is kustomize's)


def test_crd_directory_holds_the_four_node_side_crds() -> None:
    names = {crd["metadata"]["name"] for crd in load_crds(CRD_DIR)}
    assert names == {"nodeslos.slo.koordinator.sh", "nodemetrics.slo.koordinator.sh",
                     "devices.scheduling.koordinator.sh", "noderesourcetopologies.topology.node.k8s.io"}


@pytest.mark.parametrize("path", CRD_FILES, ids=[path.name for path in CRD_FILES])
def test_every_crd_file_parses_and_is_structural(path: Path) -> None:
    documents = [doc for doc in yaml.safe_load_all(path.read_text()) if doc]
    assert len(documents) == 1
    crd = documents[0]
    assert crd["kind"] == "CustomResourceDefinition"
    assert crd_problems(crd) == []
    version = crd["spec"]["versions"][0]
    assert version["name"] == "v1alpha1" and version["served"]
    assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert crd["spec"]["scope"] == "Cluster"
    properties = version["schema"]["openAPIV3Schema"]["properties"]
    # NodeResourceTopology (the NRT API's v1alpha1) keeps its fields at the top level, not under spec
    assert "spec" in properties or {"topologyPolicies", "zones"} <= set(properties)
    assert path.name == f"{crd['spec']['group']}_{crd['spec']['names']['plural']}.yaml"


@pytest.mark.parametrize(("name", "kind", "subresources"), [
    ("nodeslos.slo.koordinator.sh", "NodeSLO", {"status": {}}),
    ("nodemetrics.slo.koordinator.sh", "NodeMetric", {"status": {}}),
    ("devices.scheduling.koordinator.sh", "Device", None),  # Koordinator's Device has none
])
def test_crds_have_koordinators_kind_and_status_subresource(name: str, kind: str, subresources: dict | None) -> None:
    crd = next(crd for crd in load_crds(CRD_DIR) if crd["metadata"]["name"] == name)
    assert crd["spec"]["names"]["kind"] == kind
    assert crd["spec"]["versions"][0].get("subresources") == subresources


def test_crd_problems_reports_untyped_fields_and_bad_names() -> None:
    crd = {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
           "metadata": {"name": "wrong.example.com"},
           "spec": {"group": "example.com", "scope": "Cluster",
                    "names": {"plural": "things", "singular": "thing", "kind": "Thing", "listKind": "ThingList"},
                    "versions": [{"name": "v1", "served": True, "storage": True, "schema": {"openAPIV3Schema": {
                        "type": "object", "properties": {"spec": {"properties": {"x": {"type": "array"}}}}}}}]}}
    problems = crd_problems(crd)
    assert "metadata.name must be things.example.com" in problems
    assert any(problem.endswith(".spec: type is missing") for problem in problems)
    assert any(problem.endswith(".spec.x: array without items") for problem in problems)


def test_quantity_fields_accept_numbers_and_quantity_strings_only() -> None:
    crd = next(crd for crd in load_crds(CRD_DIR) if crd["spec"]["names"]["kind"] == "Device")
    resources = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"][
        "devices"]["items"]["properties"]["resources"]
    assert validate_schema({"koordinator.sh/gpu-core": 100, "koordinator.sh/gpu-memory": "80Gi",
                            "cpu": "1500m"}, resources, "r") == []
    errors = validate_schema({"koordinator.sh/gpu-memory": "lots", "x": True}, resources, "r")
    assert {error.field for error in errors} == {"r.koordinator.sh/gpu-memory", "r.x"}
