"""A 401 or 403 of the API server, read by koordlet.access from the project's API server's real answers: the call,
the user, the verb and resource refused, and the rule that would allow it; logged once, counted each time, over
when the call is allowed; named by /healthz without failing it, failing /readyz."""

from __future__ import annotations

import logging

import pytest
from kubernetes.client.exceptions import ApiException

from koordlet.access import Refusals, from_api_answer, from_kubelet_answer, watch_client
from koordlet.health import Health
from koordlet.kubeapi import CoreV1, CustomObjects
from koordlet.metrics import KoordletMetrics
from tests.support.apiserver import ApiServer, Credentials, create_objects, kube_api_client

NODE = "node-1"
ACCOUNT = "system:serviceaccount:koordinator-system:koordlet-py"
METRIC = ("slo.koordinator.sh", "v1alpha1", "nodemetrics")


def _account(server: ApiServer, rules: list[dict]) -> Credentials:
    create_objects(server, [
        {"apiVersion": "v1", "kind": "ServiceAccount",
         "metadata": {"name": "koordlet-py", "namespace": "koordinator-system"}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "koordlet-py"},
         "rules": rules},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": "koordlet-py"},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "koordlet-py"},
         "subjects": [{"kind": "ServiceAccount", "name": "koordlet-py", "namespace": "koordinator-system"}]}])
    return Credentials("koordlet-py", token=server.service_account_token("koordinator-system", "koordlet-py"))


def test_a_refused_status_write_is_logged_once_with_its_rule_counted_each_time_and_over_when_allowed(
        server: ApiServer, caplog: pytest.LogCaptureFixture) -> None:
    server.seed({"apiVersion": "slo.koordinator.sh/v1alpha1", "kind": "NodeMetric", "metadata": {"name": NODE}})
    credentials = _account(server, [{"apiGroups": ["slo.koordinator.sh"], "resources": ["nodemetrics"],
                                     "verbs": ["get"]}])
    metrics = KoordletMetrics(NODE)
    refusals = Refusals(metrics.observe_access_refused)
    with kube_api_client(server, credentials) as client, caplog.at_level(logging.WARNING, "koordlet.access"):
        watch_client(client, refusals)
        custom = CustomObjects(client)
        for _ in range(3):
            metric = custom.get_cluster_custom_object(*METRIC, NODE)
            with pytest.raises(ApiException):
                custom.replace_cluster_custom_object_status(*METRIC, NODE, metric)
        [warning] = [r.getMessage() for r in caplog.records]
        assert warning == (
            f"the API server refused PUT /apis/slo.koordinator.sh/v1alpha1/nodemetrics/{NODE}/status (403): user "
            f'{ACCOUNT} may not update nodemetrics/status in API group "slo.koordinator.sh"; the rule that allows '
            'it: {apiGroups: ["slo.koordinator.sh"], resources: ["nodemetrics/status"], verbs: ["update"]} '
            f'(nodemetrics.slo.koordinator.sh "{NODE}" is forbidden: User "{ACCOUNT}" cannot update resource '
            '"nodemetrics/status" in API group "slo.koordinator.sh" at the cluster scope)')
        assert metrics.access_refused.labels(NODE, "apiserver", "403", "update", "nodemetrics/status")._value.get() \
            == 3
        create_objects(server, [{"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                                 "metadata": {"name": "status"}, "rules": [{"apiGroups": ["slo.koordinator.sh"],
                                                                           "resources": ["nodemetrics/status"],
                                                                           "verbs": ["update"]}]},
                                {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                                 "metadata": {"name": "status"},
                                 "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                             "name": "status"},
                                 "subjects": [{"kind": "ServiceAccount", "name": "koordlet-py",
                                               "namespace": "koordinator-system"}]}])
        assert [r.resource for r in refusals.current()] == ["nodemetrics/status"]
        custom.replace_cluster_custom_object_status(*METRIC, NODE, custom.get_cluster_custom_object(*METRIC, NODE))
        assert refusals.current() == []


def test_a_401_says_the_credential_is_not_accepted(server: ApiServer) -> None:
    refusals = Refusals()
    expired = Credentials("koordlet-py", token="a-token-nobody-issued")
    with kube_api_client(server, expired) as client:
        watch_client(client, refusals)
        with pytest.raises(ApiException):
            CoreV1(client).read_node(NODE)
    [refusal] = refusals.current()
    assert (refusal.source, refusal.code, refusal.call) == ("apiserver", 401, f"GET /api/v1/nodes/{NODE}")
    assert refusal.describe().startswith(f"the API server did not authenticate koordlet for GET /api/v1/nodes/{NODE} "
                                         "(401): the API server did not accept its credential")


def test_a_refusal_of_a_list_names_the_list_and_a_read_of_another_object_ends_it(server: ApiServer) -> None:
    credentials = _account(server, [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}])
    server.seed({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web", "namespace": "shop"},
                 "spec": {"containers": [{"name": "c", "image": "i"}]}})
    refusals = Refusals()
    with kube_api_client(server, credentials) as client:
        watch_client(client, refusals)
        core = CoreV1(client)
        with pytest.raises(ApiException):
            core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={NODE}")
        [refusal] = refusals.current()
        assert refusal.rule == '{apiGroups: [""], resources: ["pods"], verbs: ["list"]}'
        with pytest.raises(ApiException):
            core.read_namespaced_pod("gone", "shop")  # 404 after authorization: allowed, not a refusal
        assert [r.verb for r in refusals.current()] == ["list"]


def test_an_admission_refusal_is_kept_without_a_rule_and_a_non_resource_one_names_its_path() -> None:
    body = ('{"kind": "Status", "message": "nodes \\"n2\\" is forbidden: node \\"n1\\" is not allowed to modify node '
            '\\"n2\\"", "reason": "Forbidden", "code": 403}')
    refusal = from_api_answer("PATCH", "/api/v1/nodes/n2", 403, body)
    assert refusal is not None and refusal.rule == "" and "not allowed to modify" in refusal.describe()
    refusal = from_api_answer("GET", "/metrics", 403, '{"message": "forbidden: User \\"u\\" cannot get path '
                                                      '\\"/metrics\\""}')
    assert refusal is not None and refusal.rule == '{nonResourceURLs: ["/metrics"], verbs: ["get"]}'
    assert from_api_answer("GET", "/api/v1/nodes/x", 404, "{}") is None


def test_kubelets_refusal_before_the_fine_grained_gate_asks_for_nodes_proxy() -> None:
    refusal = from_kubelet_answer("GET", "https://10.0.0.1:10250/pods/", 403,
                                  "Forbidden (user=system:serviceaccount:ns:sa, verb=get, resource=nodes, "
                                  "subresource(s)=[proxy])\n")
    assert refusal is not None and refusal.resource == "nodes/proxy"
    assert refusal.rule.startswith('{apiGroups: [""], resources: ["nodes/proxy"], verbs: ["get"]}: this kubelet asks '
                                   "for nodes/proxy alone")


def test_health_names_a_refusal_without_failing_liveness_and_readiness_fails() -> None:
    refusals = Refusals()
    health = Health(lambda: True)  # no states informer: /readyz fails on "states" throughout; "access" is looked at
    health.watch_access(refusals)
    assert health.healthz({}).body == b"ok\n" and b"[+]access ok: nothing refused" in health.readyz({}).body
    refused = from_kubelet_answer("GET", "https://127.0.0.1:10250/pods/", 403,
                                  "Forbidden (user=u, verb=get, resource=nodes, subresource(s)=[pods proxy])")
    assert refused is not None
    refusals.refused(refused)
    live, ready = health.healthz({}), health.readyz({})
    assert live.status == 200 and live.body.decode().startswith("[!]access: kubelet refused GET ")
    assert b"a restart does not help" in live.body
    assert ready.status == 503 and b"[-]access failed: kubelet refused GET https://127.0.0.1:10250/pods/" in ready.body
    # The /debug guard's reviews are refused under a role without them: /debug says so; koordlet's work goes on.
    review = from_api_answer("POST", "/apis/authentication.k8s.io/v1/tokenreviews", 403,
                             '{"message": "tokenreviews.authentication.k8s.io is forbidden: User \\"u\\" cannot '
                             'create resource \\"tokenreviews\\" in API group \\"authentication.k8s.io\\" at the '
                             'cluster scope"}')
    assert review is not None and not review.blocks_work
    refusals.allowed("kubelet", "GET https://127.0.0.1:10250/pods/")
    refusals.refused(review)
    assert b"[+]access ok" in health.readyz({}).body and b"[!]access" in health.healthz({}).body
