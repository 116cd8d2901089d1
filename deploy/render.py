#!/usr/bin/env python3
"""Render the koordlet manifests with values: a small stand-in for a Helm chart.

Why not Helm: Helm is not packaged in Debian 12 and cannot be installed offline here, and a text
template engine over YAML is easy to break. The manifests under ``base/`` (plus ``crds/``) are plain
YAML that ``kubectl apply -k deploy/`` installs as they are; this script loads those same documents,
sets the values of ``values.yaml`` (overridden by ``--values FILE``) on the parsed objects, and prints
them. Unknown value keys and unknown feature gates are errors, not silently ignored.

    python deploy/render.py --values my-values.yaml | kubectl apply -f -

Needs only PyYAML.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

DEPLOY_DIR = Path(__file__).resolve().parent
# Same order as deploy/kustomization.yaml: namespace and CRDs before what uses them.
MANIFESTS = (
    "base/namespace.yaml",
    "crds/slo.koordinator.sh_nodeslos.yaml",
    "crds/slo.koordinator.sh_nodemetrics.yaml",
    "crds/scheduling.koordinator.sh_devices.yaml",
    "crds/topology.node.k8s.io_noderesourcetopologies.yaml",
    "base/rbac.yaml",
    "base/slo-controller-config.yaml",
    "base/koordlet.yaml",
)
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition"}
KOORDLET_CONTAINER = "koordlet"
VALUE_KEYS = {
    "namespace",
    "image",
    "imagePullPolicy",
    "resources",
    "featureGates",
    "extraArgs",
    "sloControllerConfig",
}
# koordlet feature gates, reference/koordinator.md §9.2.
FEATURE_GATES = frozenset(
    {
        "BECPUSuppress", "CPUBurst", "RdtResctrl", "NodeTopologyReport", "GroupIdentity", "CPUSetAllocator",
        "BatchResource", "AuditEvents", "AuditEventsHTTPHandler", "BECPUManager", "BECPUEvict", "CPUEvict",
        "CPUAllocatableEvict", "BEMemoryEvict", "MemoryEvict", "MemoryAllocatableEvict", "SystemConfig",
        "ResctrlCollector", "CgroupReconcile", "Accelerators", "RDMADevices", "CPICollector", "Libpfm4",
        "PSICollector", "BlkIOReconcile", "ColdPageCollector", "HugePageReport", "PodResourcesProxy",
        "HamiCoreVGPUMonitor", "PerCPUMetric", "NodeMetricPromMetrics", "GPUEnvInject", "RDMADeviceInject",
        "CPUNormalization", "CoreSched", "TerwayQoS", "TCNetworkQoS", "Resctrl", "OOMScoreAdj",
        "AllAlpha", "AllBeta",
    }
)  # fmt: skip


class ValuesError(ValueError):
    """A values file asks for something the chart does not have."""


def _deep_merge(base: Any, override: Any) -> Any:
    if isinstance(base, Mapping) and isinstance(override, Mapping):
        merged = dict(base)
        for key, value in override.items():
            merged[key] = _deep_merge(base.get(key), value) if key in base else copy.deepcopy(value)
        return merged
    return copy.deepcopy(override)


def load_values(path: Path | None = None) -> dict[str, Any]:
    """The default values, with ``path`` deep-merged over them; validated."""
    values = yaml.safe_load((DEPLOY_DIR / "values.yaml").read_text()) or {}
    if path is not None:
        override = yaml.safe_load(path.read_text()) or {}
        if not isinstance(override, Mapping):
            raise ValuesError(f"{path}: expected a mapping at the top")
        values = _deep_merge(values, override)
    unknown = set(values) - VALUE_KEYS
    if unknown:
        raise ValuesError(f"unknown values: {', '.join(sorted(unknown))} (known: {', '.join(sorted(VALUE_KEYS))})")
    gates = values.get("featureGates") or {}
    bad_gates = sorted(set(gates) - FEATURE_GATES)
    if bad_gates:
        raise ValuesError(f"unknown feature gates: {', '.join(bad_gates)}")
    for name, enabled in gates.items():
        if not isinstance(enabled, bool):
            raise ValuesError(f"feature gate {name}: expected true/false, got {enabled!r}")
    if not isinstance(values.get("extraArgs") or [], list):
        raise ValuesError("extraArgs: expected a list of strings")
    return values


def base_documents() -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = []
    for name in MANIFESTS:
        docs.extend(doc for doc in yaml.safe_load_all((DEPLOY_DIR / name).read_text()) if doc)
    return docs


def _koordlet_container(daemonset: dict[str, Any]) -> dict[str, Any]:
    for container in daemonset["spec"]["template"]["spec"]["containers"]:
        if container["name"] == KOORDLET_CONTAINER:
            return container
    raise ValuesError("the koordlet DaemonSet has no koordlet container")


def render(values: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The manifests with ``values`` applied (``values`` as :func:`load_values` returns them)."""
    docs = copy.deepcopy(base_documents())
    namespace = values["namespace"]
    for doc in docs:
        kind = doc["kind"]
        if kind == "Namespace":
            doc["metadata"]["name"] = namespace
        elif kind not in CLUSTER_SCOPED:
            doc["metadata"]["namespace"] = namespace
        if kind == "ClusterRoleBinding":
            for subject in doc.get("subjects", []):
                if subject.get("kind") == "ServiceAccount":
                    subject["namespace"] = namespace
        if kind == "DaemonSet" and doc["metadata"]["name"] == "koordlet":
            container = _koordlet_container(doc)
            container["image"] = values["image"]
            container["imagePullPolicy"] = values["imagePullPolicy"]
            container["resources"] = copy.deepcopy(values["resources"])
            args: list[str] = list(container.get("args") or [])  # the base manifest's own args stay
            gates = values.get("featureGates") or {}
            if gates:
                args.append("--feature-gates=" + ",".join(f"{k}={str(v).lower()}" for k, v in sorted(gates.items())))
            args.extend(str(a) for a in values.get("extraArgs") or [])
            container["args"] = args
        if kind == "ConfigMap" and doc["metadata"]["name"] == "slo-controller-config":
            for key, override in (values.get("sloControllerConfig") or {}).items():
                if key not in doc["data"]:
                    raise ValuesError(f"sloControllerConfig: unknown key {key!r} (known: {', '.join(doc['data'])})")
                merged = _deep_merge(json.loads(doc["data"][key]), override)
                doc["data"][key] = json.dumps(merged, indent=2) + "\n"
    return docs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--values", type=Path, help="YAML file deep-merged over deploy/values.yaml")
    args = parser.parse_args(argv)
    try:
        docs = render(load_values(args.values))
    except (ValuesError, OSError, yaml.YAMLError) as exc:
        print(f"render: {exc}", file=sys.stderr)
        return 2
    yaml.safe_dump_all(docs, sys.stdout, sort_keys=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
