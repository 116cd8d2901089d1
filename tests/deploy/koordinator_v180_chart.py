"""Facts about Koordinator v1.8.0's Helm chart (koordinator-sh/charts, versions/v1.8.0), recorded for the tests that
install our chart beside it. Recorded with Helm 4.1.4:
``helm template koordinator versions/v1.8.0 --namespace koordinator-system`` (default values).
tests/deploy/test_beside_koordinator.py checks them against the chart itself where a copy of it is at hand."""

from __future__ import annotations

VERSION = "1.8.0"
NAMESPACE = "koordinator-system"

# (kind, namespace, name) of every object the default render makes; the Namespace is its own.
OBJECTS: frozenset[tuple[str, str, str]] = frozenset({
    ("ClusterRole", "", "koord-descheduler-role"),
    ("ClusterRole", "", "koord-manager-role"),
    ("ClusterRole", "", "koord-scheduler-role"),
    ("ClusterRole", "", "koordlet-role"),
    ("ClusterRoleBinding", "", "koord-descheduler-rolebinding"),
    ("ClusterRoleBinding", "", "koord-manager-rolebinding"),
    ("ClusterRoleBinding", "", "koord-scheduler-rolebinding"),
    ("ClusterRoleBinding", "", "koord-scheduler-rolebinding-custom"),
    ("ClusterRoleBinding", "", "koord-scheduler-rolebinding-volume"),
    ("ClusterRoleBinding", "", "koordlet-rolebinding"),
    ("ConfigMap", NAMESPACE, "gpu-shared-resource-templates"),
    ("ConfigMap", NAMESPACE, "koord-descheduler-config"),
    ("ConfigMap", NAMESPACE, "koord-scheduler-config"),
    ("ConfigMap", NAMESPACE, "slo-controller-config"),
    ("CustomResourceDefinition", "", "clustercolocationprofiles.config.koordinator.sh"),
    ("CustomResourceDefinition", "", "clusternetworktopologies.scheduling.koordinator.sh"),
    ("CustomResourceDefinition", "", "devices.scheduling.koordinator.sh"),
    ("CustomResourceDefinition", "", "elasticquotaprofiles.quota.koordinator.sh"),
    ("CustomResourceDefinition", "", "elasticquotas.scheduling.sigs.k8s.io"),
    ("CustomResourceDefinition", "", "nodemetrics.slo.koordinator.sh"),
    ("CustomResourceDefinition", "", "noderesourcetopologies.topology.node.k8s.io"),
    ("CustomResourceDefinition", "", "nodeslos.slo.koordinator.sh"),
    ("CustomResourceDefinition", "", "podgroups.scheduling.sigs.k8s.io"),
    ("CustomResourceDefinition", "", "podmigrationjobs.scheduling.koordinator.sh"),
    ("CustomResourceDefinition", "", "recommendations.analysis.koordinator.sh"),
    ("CustomResourceDefinition", "", "reservations.scheduling.koordinator.sh"),
    ("CustomResourceDefinition", "", "scheduleexplanations.scheduling.koordinator.sh"),
    ("DaemonSet", NAMESPACE, "koord-device-daemon"),
    ("DaemonSet", NAMESPACE, "koordlet"),
    ("Deployment", NAMESPACE, "koord-descheduler"),
    ("Deployment", NAMESPACE, "koord-manager"),
    ("Deployment", NAMESPACE, "koord-scheduler"),
    ("MutatingWebhookConfiguration", "", "koordinator-mutating-webhook-configuration"),
    ("Namespace", "", NAMESPACE),
    ("PriorityClass", "", "koord-batch"),
    ("PriorityClass", "", "koord-free"),
    ("PriorityClass", "", "koord-mid"),
    ("PriorityClass", "", "koord-prod"),
    ("Role", NAMESPACE, "koord-leader-election-role"),
    ("RoleBinding", NAMESPACE, "koord-leader-election-rolebinding"),
    ("Secret", NAMESPACE, "koordinator-webhook-certs"),
    ("Service", NAMESPACE, "koordinator-webhook-service"),
    ("ServiceAccount", NAMESPACE, "koord-descheduler"),
    ("ServiceAccount", NAMESPACE, "koord-manager"),
    ("ServiceAccount", NAMESPACE, "koord-scheduler"),
    ("ServiceAccount", NAMESPACE, "koordlet"),
    ("ValidatingWebhookConfiguration", "", "koordinator-validating-webhook-configuration"),
})

# With koordlet.enableServiceMonitor=true it also renders these two.
SERVICE_MONITOR_OBJECTS: frozenset[tuple[str, str, str]] = frozenset({
    ("Service", NAMESPACE, "koordlet-service"),
    ("ServiceMonitor", NAMESPACE, "koordlet-service-monitor"),
})

# The served versions and the storage version of the CRDs koordlet reads and writes, as that chart ships them
# (templates/crd/; all with conversion None).
CRD_VERSIONS: dict[str, tuple[tuple[str, ...], str]] = {
    "nodeslos.slo.koordinator.sh": (("v1alpha1",), "v1alpha1"),
    "nodemetrics.slo.koordinator.sh": (("v1alpha1",), "v1alpha1"),
    "devices.scheduling.koordinator.sh": (("v1alpha1",), "v1alpha1"),
    "noderesourcetopologies.topology.node.k8s.io": (("v1alpha1", "v1alpha2"), "v1alpha2"),
}

# templates/koordlet.yaml renders the value koordlet.nodeAffinity, as given, as the koordlet pod's whole
# spec.affinity (so the value holds a nodeAffinity key). It has no node selector value for koordlet.
KOORDLET_AFFINITY_VALUE = "koordlet.nodeAffinity"
