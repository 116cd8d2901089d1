"""CRDs with several versions, served as the real API server serves them with conversion strategy None: the
chart's NodeResourceTopology CRD (v1alpha1 and v1alpha2, v1alpha2 stored), as Koordinator ships it."""

from __future__ import annotations

import copy

import kubernetes.client
import pytest
from kubernetes import watch
from kubernetes.client.exceptions import ApiException

from tests.support.apiserver import ApiServer, kube_api_client, kube_version_priority

GROUP, PLURAL = "topology.node.k8s.io", "noderesourcetopologies"
ZONES = [{"name": "node-0", "type": "Node", "resources": [
    {"name": "cpu", "capacity": "8", "allocatable": "8", "available": "6"}]}]


def _nrt(version: str, name: str = "node-1", **fields: object) -> dict:
    return {"apiVersion": f"{GROUP}/{version}", "kind": "NodeResourceTopology", "metadata": {"name": name},
            "zones": copy.deepcopy(ZONES), **fields}


def test_an_object_written_at_either_version_is_stored_at_v1alpha2_and_read_at_both(
        server: ApiServer, custom: kubernetes.client.CustomObjectsApi) -> None:
    custom.create_cluster_custom_object(GROUP, "v1alpha1", PLURAL, _nrt("v1alpha1", topologyPolicies=["None"]))
    custom.create_cluster_custom_object(GROUP, "v1alpha2", PLURAL, _nrt("v1alpha2", "node-2", attributes=[
        {"name": "topologyManagerPolicy", "value": "single-numa-node"}]))
    assert {o["apiVersion"] for o in server.list_objects(PLURAL)} == {f"{GROUP}/v1alpha2"}
    for version in ("v1alpha1", "v1alpha2"):
        listed = custom.list_cluster_custom_object(GROUP, version, PLURAL)
        assert listed["apiVersion"] == f"{GROUP}/{version}"
        assert {o["apiVersion"] for o in listed["items"]} == {f"{GROUP}/{version}"}
        assert custom.get_cluster_custom_object(GROUP, version, PLURAL, "node-1")["topologyPolicies"] == ["None"]
    # v1alpha1 has no top-level attributes: read at v1alpha1 they are pruned, at v1alpha2 they are there.
    assert "attributes" not in custom.get_cluster_custom_object(GROUP, "v1alpha1", PLURAL, "node-2")
    assert custom.get_cluster_custom_object(GROUP, "v1alpha2", PLURAL, "node-2")["attributes"][0]["value"] == \
        "single-numa-node"


def test_each_version_validates_by_its_own_schema(custom: kubernetes.client.CustomObjectsApi) -> None:
    with pytest.raises(ApiException) as refused:  # v1alpha1 requires topologyPolicies, v1alpha2 does not
        custom.create_cluster_custom_object(GROUP, "v1alpha1", PLURAL, _nrt("v1alpha1"))
    assert refused.value.status == 422 and "topologyPolicies" in refused.value.body
    custom.create_cluster_custom_object(GROUP, "v1alpha2", PLURAL, _nrt("v1alpha2"))


def test_an_update_at_one_version_keeps_what_the_other_wrote(custom: kubernetes.client.CustomObjectsApi) -> None:
    custom.create_cluster_custom_object(GROUP, "v1alpha2", PLURAL, _nrt("v1alpha2", topologyPolicies=["None"],
                                                                       attributes=[{"name": "a", "value": "1"}]))
    old = custom.get_cluster_custom_object(GROUP, "v1alpha1", PLURAL, "node-1")
    old["zones"][0]["resources"][0]["available"] = "4"
    custom.replace_cluster_custom_object(GROUP, "v1alpha1", PLURAL, "node-1", old)
    now = custom.get_cluster_custom_object(GROUP, "v1alpha2", PLURAL, "node-1")
    assert now["zones"][0]["resources"][0]["available"] == "4"
    # A v1alpha1 client never saw attributes, and its update drops them: conversion None keeps no hidden fields,
    # as on the real server (why koordlet writes only the version Koordinator's scheduler reads).
    assert "attributes" not in now


def test_a_watch_at_v1alpha1_sees_writes_made_at_v1alpha2(
        server: ApiServer, custom: kubernetes.client.CustomObjectsApi) -> None:
    start = custom.list_cluster_custom_object(GROUP, "v1alpha1", PLURAL)["metadata"]["resourceVersion"]
    custom.create_cluster_custom_object(GROUP, "v1alpha2", PLURAL, _nrt("v1alpha2", topologyPolicies=["None"]))
    custom.patch_cluster_custom_object(GROUP, "v1alpha2", PLURAL, "node-1", {"metadata": {"labels": {"x": "1"}}})
    seen = []
    watcher = watch.Watch()
    for event in watcher.stream(custom.list_cluster_custom_object, GROUP, "v1alpha1", PLURAL,
                                resource_version=start, timeout_seconds=2):
        seen.append((event["type"], event["object"]["apiVersion"]))
        if len(seen) == 2:
            watcher.stop()
    assert seen == [("ADDED", f"{GROUP}/v1alpha1"), ("MODIFIED", f"{GROUP}/v1alpha1")]


def test_discovery_prefers_the_highest_priority_version(api_client: kubernetes.client.ApiClient) -> None:
    group = kubernetes.client.ApisApi(api_client).get_api_versions()
    [topology] = [g for g in group.groups if g.name == GROUP]
    assert [v.version for v in topology.versions] == ["v1alpha2", "v1alpha1"]
    assert topology.preferred_version.version == "v1alpha2"
    assert sorted(["v1alpha1", "v1", "v2beta1", "v1beta2", "v10", "foo"], key=kube_version_priority) == [
        "v10", "v1", "v2beta1", "v1beta2", "v1alpha1", "foo"]


def _thing_crd(strategy: str | None) -> dict:
    versions = [{"name": name, "served": True, "storage": name == "v1", "schema": {"openAPIV3Schema": {
        "type": "object", "properties": {"spec": {"type": "object", "properties": {"size": {"type": "integer"}}}}}}}
        for name in ("v1beta1", "v1")]
    spec = {"group": "example.com", "scope": "Cluster", "versions": versions,
            "names": {"plural": "things", "singular": "thing", "kind": "Thing", "listKind": "ThingList"}}
    if strategy:
        spec["conversion"] = {"strategy": strategy}
    return {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": "things.example.com"}, "spec": spec}


def test_a_created_crd_is_defaulted_to_conversion_none_and_gets_its_status() -> None:
    with ApiServer(crd_dir=None) as server, kube_api_client(server) as client:
        ext = kubernetes.client.ApiextensionsV1Api(client)
        created = ext.create_custom_resource_definition(_thing_crd(None))
        assert created.spec.conversion.strategy == "None"
        assert created.status.stored_versions == ["v1"]
        assert {c.type: c.status for c in created.status.conditions} == {"NamesAccepted": "True",
                                                                         "Established": "True"}
        custom = kubernetes.client.CustomObjectsApi(client)
        custom.create_cluster_custom_object("example.com", "v1beta1", "things", {
            "apiVersion": "example.com/v1beta1", "kind": "Thing", "metadata": {"name": "a"}, "spec": {"size": 1}})
        assert server.get_object("things", "a")["apiVersion"] == "example.com/v1"


def test_a_crd_asking_for_webhook_conversion_is_refused() -> None:
    with ApiServer(crd_dir=None) as server, kube_api_client(server) as client:
        ext = kubernetes.client.ApiextensionsV1Api(client)
        with pytest.raises(ApiException) as refused:
            ext.create_custom_resource_definition(_thing_crd("Webhook"))
        assert refused.value.status == 422 and "Webhook" in refused.value.body
        assert server.list_objects("customresourcedefinitions") == []
