"""Every way of deploying, with the RBAC it ships, against an API server and a kubelet that authorize as real ones do
(tests/deploy/deploy_paths.py): koordlet, running as the path's service account with the path's DaemonSet args,
syncs its pods from kubelet, writes its NodeMetric and makes its NodeResourceTopology, and nothing refuses it. The
same path with one rule taken out of its role gets the 401/403 that rule prevents, koordlet names the rule in its
log and on /readyz (unready), /healthz names it without failing (a restart does not change RBAC), and it keeps
running.

The ways: our chart alone (README 3a), our chart beside Koordinator's control plane (3b b), deploy/ with kustomize
(3c), and Koordinator's chart with our image and Koordinator's own koordlet role (3b a). Bare metal has its own test.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.deploy.deploy_paths import (
    NODE,
    PATHS,
    REPORT_WAIT_S,
    ClusterNode,
    DeployPath,
    HostKoordlet,
    cluster_node,
)
from tests.support.waiting import wait_for

_REFUSED = re.compile(r"\((401|403)\)|HTTP 40[13]|Forbidden|Unauthorized|koordlet\.access")


def _synced_reported_and_topology_made(node: ClusterNode, koordlet: HostKoordlet) -> None:
    api = node.api
    assert koordlet.wait_log("states informer synced: 1 pods", 60), koordlet.logs()[-4000:]
    metric = wait_for(lambda: ((api.get_object("nodemetrics", NODE) or {}).get("status") or {}).get("nodeMetric"),
                      REPORT_WAIT_S)
    assert metric and metric["nodeUsage"]["resources"]["cpu"], koordlet.logs()[-4000:]
    assert wait_for(lambda: api.get_object("noderesourcetopologies", NODE), 30), koordlet.logs()[-4000:]
    assert wait_for(lambda: koordlet.get("/readyz")[0] == 200, 30), koordlet.get("/readyz")


@pytest.mark.parametrize("name", list(PATHS))
def test_each_way_of_deploying_lets_koordlet_do_its_work_and_nothing_refuses_it(name: str, tmp_path: Path) -> None:
    path = PATHS[name]()
    with cluster_node(tmp_path, path) as node, HostKoordlet(node, tmp_path / "state") as koordlet:
        _synced_reported_and_topology_made(node, koordlet)
        mine = [r for r in node.api.requests() if r.user == node.account_user]
        assert {r.status for r in mine} <= {200, 201, 404}, sorted({(r.verb, r.path, r.status) for r in mine})
        assert any(r.verb == "PUT" and r.path.endswith(f"/nodemetrics/{NODE}/status") for r in mine)
        assert [(r.path, r.status, r.user) for r in node.kubelet.requests][:1] == [
            ("/pods/", 200, node.account_user)]
        assert node.kubelet.refusals() == []
        assert _REFUSED.search(koordlet.logs()) is None, _REFUSED.search(koordlet.logs())
        status, body = koordlet.get("/healthz")
        assert (status, body) == (200, "ok\n")
        if not path.manager:  # nobody else makes it: koordlet did, with the role's create
            assert any(r.verb == "POST" and r.path.endswith("/nodemetrics") and r.status == 201 for r in mine)


# (path, ClusterRole, the resource taken out of it, where the refusal comes from, what koordlet's log says of the rule)
_ALLOWS = "the rule that allows it: "
_REMOVED = [
    ("chart", "koordlet-py", "nodes/pods", "kubelet",
     _ALLOWS + '{apiGroups: [""], resources: ["nodes/pods"], verbs: ["get"]} on kubelet 1.33+'),
    ("chart", "koordlet-py", "nodes", "apiserver",  # no Node: not even kubelet's address
     _ALLOWS + '{apiGroups: [""], resources: ["nodes"], verbs: ["list"]}'),
    ("beside", "koordlet-py", "nodemetrics/status", "apiserver",
     _ALLOWS + '{apiGroups: ["slo.koordinator.sh"], resources: ["nodemetrics/status"], verbs: ["update"]}'),
    ("kustomize", "koordlet-py", "noderesourcetopologies", "apiserver",
     _ALLOWS + '{apiGroups: ["topology.node.k8s.io"], resources: ["noderesourcetopologies"], verbs: ["get"]}'),
    ("koordinator", "koordlet-role", "nodes/proxy", "kubelet",
     '{apiGroups: [""], resources: ["nodes/proxy"], verbs: ["get"]} on older kubelets'),
]


@pytest.mark.parametrize(("name", "role", "resource", "source", "rule"), _REMOVED,
                         ids=[f"{r[0]}-{r[2]}" for r in _REMOVED])
def test_a_role_without_one_rule_gets_the_refusal_that_rule_prevents_and_koordlet_names_it(
        name: str, role: str, resource: str, source: str, rule: str, tmp_path: Path) -> None:
    path = PATHS[name]().without(role, resource)
    with cluster_node(tmp_path, path) as node, HostKoordlet(node, tmp_path / "state") as koordlet:
        assert koordlet.wait_log(rule, REPORT_WAIT_S), koordlet.logs()[-4000:]
        if source == "kubelet":
            refused = wait_for(node.kubelet.refusals, 5)
            assert refused and refused[0].status == 403 and refused[0].user == node.account_user
        else:
            refused = [r for r in node.api.requests() if r.status == 403]
            assert refused and {r.user for r in refused} == {node.account_user}
        _refused_but_up(koordlet, rule)


def _refused_but_up(koordlet: HostKoordlet, rule: str) -> None:
    """Unready and saying why; live (a restart changes nothing); still running."""
    assert wait_for(lambda: koordlet.get("/readyz")[0] == 503, 30), koordlet.get("/readyz")
    assert rule in koordlet.get("/readyz")[1]
    assert wait_for(lambda: koordlet.get("/healthz")[0] == 200, 90), koordlet.get("/healthz")
    status, body = koordlet.get("/healthz")
    assert "[!]access:" in body and rule in body, body
    assert koordlet.running_for(1.0), koordlet.logs()[-4000:]


def test_our_chart_on_a_kubelet_before_1_33_needs_nodes_proxy_and_kubelet_node_proxy_grants_it(
        tmp_path: Path) -> None:
    """A kubelet without KubeletFineGrainedAuthz asks for nodes/proxy alone: the default role (nodes/pods) is refused
    and koordlet says which rule; with koordlet.kubeletNodesProxy=true (deploy/kubelet-proxy/) the pods sync."""
    from tests.deploy.deploy_paths import _daemonset, _ordered
    from tests.deploy.tools import chart_documents

    path = PATHS["chart"]()
    with cluster_node(tmp_path / "default", path, fine_grained_authz=False) as node, \
            HostKoordlet(node, tmp_path / "default" / "state") as koordlet:
        rule = '{apiGroups: [""], resources: ["nodes/proxy"], verbs: ["get"]}: this kubelet asks for nodes/proxy alone'
        assert koordlet.wait_log(_ALLOWS + rule, 60), koordlet.logs()[-4000:]
        assert node.kubelet.refusals()[0].status == 403
        _refused_but_up(koordlet, rule)
    docs = chart_documents("--set", "koordlet.kubeletNodesProxy=true")
    proxied = DeployPath("our chart with kubeletNodesProxy", _ordered(docs), _daemonset(docs), manager=False)
    with cluster_node(tmp_path / "proxy", proxied, fine_grained_authz=False) as node, \
            HostKoordlet(node, tmp_path / "proxy" / "state") as koordlet:
        _synced_reported_and_topology_made(node, koordlet)
        assert node.kubelet.refusals() == []
