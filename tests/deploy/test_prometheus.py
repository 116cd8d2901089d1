"""The alert rules, the dashboard and the proxy's scrape job (deploy/prometheus/), checked by Debian 12's Prometheus
2.42 and its promtool (scripts/fetch-tools.sh): the rules pass ``promtool check rules``, their unit tests pass
``promtool test rules`` (every alert fires on trouble and stays quiet beside it), the chart's PrometheusRule is the
same rules, and a real Prometheus scraping a running koordlet and a running proxy evaluates every alert expression
and every dashboard query with data, and sees every Koordinator metric family koordlet serves under Koordinator's
name and type. A metric renamed in the code fails here. The proxy's job (runtime-proxy-scrape.yaml) finds the proxy
through Kubernetes service discovery, which Debian 12's build lacks: Debian 13's Prometheus 2.53 runs that one."""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from tests.deploy.tools import CHART, ROOT, chart_documents, tool

PROMETHEUS_DIR = ROOT / "deploy" / "prometheus"
RULES = PROMETHEUS_DIR / "koordlet-rules.yaml"
RULE_TESTS = PROMETHEUS_DIR / "koordlet-rules.test.yaml"
DASHBOARD = PROMETHEUS_DIR / "koordlet-dashboard.json"
PROXY_SCRAPE = PROMETHEUS_DIR / "runtime-proxy-scrape.yaml"
RUNBOOK_BASE = "https://koordlet-py.invalid/docs/operations.md"  # the rules file's stand-in (it says how to replace it)
# Families the running stack below cannot show samples of, and why; their names are still checked against what the
# targets describe (# HELP / # TYPE lines).
NO_SAMPLES_HERE = {
    "koordlet_kubelet_request_duration_seconds": "local mode reads pods from the CRI, not from kubelet",
    "koordlet_access_refused_total": "local mode calls neither the API server nor kubelet (tests/deploy/"
                                     "test_access_paths.py shows the refusals)",
}
_MATCHERS = re.compile(r"(?<=[a-z0-9_])\{[^}]*\}")  # a selector's {label matchers}
_COMPARISON = re.compile(r"\s*(==|!=|>=|<=|>|<)\s*[0-9.]+\s*$")
_METRIC = re.compile(r"\b(koordlet_[a-z0-9_]+|koord_runtimeproxy_[a-z0-9_]+|process_[a-z0-9_]+)\b")


def alerts() -> list[dict]:
    return [rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]]


def dashboard_queries() -> list[tuple[str, str]]:
    """(panel title, expr) of every query of every panel."""
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return [(panel["title"], target["expr"]) for panel in panels for target in panel.get("targets", [])]


def family(name: str) -> str:
    """The family a sample name belongs to (a histogram's ``_bucket``, ``_count``, ``_sum``)."""
    return re.sub(r"_(bucket|count|sum)$", "", name)


# ------------------------------------------------------------------------------------------- promtool


def test_promtool_checks_the_rules() -> None:
    done = subprocess.run([tool("promtool"), "check", "rules", str(RULES)], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(alerts())} rules found" in done.stdout


def test_promtool_unit_tests_pass_and_cover_every_alert_firing_and_quiet() -> None:
    done = subprocess.run([tool("promtool"), "test", "rules", str(RULE_TESTS)], capture_output=True, text=True,
                          timeout=120, cwd=PROMETHEUS_DIR)
    print(done.stdout + done.stderr)
    assert done.returncode == 0 and "SUCCESS" in done.stdout, done.stdout + done.stderr
    fires: set[str] = set()
    for case in yaml.safe_load(RULE_TESTS.read_text())["tests"]:
        instances = {re.search(r'instance="([^"]+)"', s["series"]).group(1) for s in case["input_series"]}
        for check in case["alert_rule_test"]:
            fired = {alert["exp_labels"].get("instance") for alert in check["exp_alerts"]}
            if fired:
                fires.add(check["alertname"])
            if fired - {None}:  # an absent() alert has no instance, and no neighbour to stay quiet
                assert instances - fired, f"{case['name']}: no healthy instance left quiet beside the one firing"
    assert fires == {alert["alert"] for alert in alerts()}, "every alert has a unit test in which it fires"


def test_every_alert_links_its_runbook_section_in_the_operations_doc() -> None:
    operations = (ROOT / "docs" / "operations.md").read_text()
    for alert in alerts():
        assert alert["annotations"]["runbook_url"] == f"{RUNBOOK_BASE}#{alert['alert'].lower()}"
        assert f"\n#### {alert['alert']}\n" in operations, alert["alert"]  # whose anchor is the name in lower case


# --------------------------------------------------------------------------------------------- chart


def test_the_chart_template_is_generated_from_the_rules_file() -> None:
    done = subprocess.run(["python3", str(ROOT / "scripts" / "gen-prometheusrule.py"), "--check"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def test_the_chart_renders_the_same_rules_as_a_prometheusrule_when_asked() -> None:
    assert not [d for d in chart_documents() if d["kind"] == "PrometheusRule"]  # off by default
    (rule,) = [d for d in chart_documents("--set", "prometheusRule.enabled=true",
                                          "--set", "prometheusRule.labels.release=kube-prometheus-stack")
               if d["kind"] == "PrometheusRule"]
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["metadata"]["name"] == "koordlet-py" and rule["metadata"]["labels"]["app.kubernetes.io/name"] == \
        "koordlet-py"
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert rule["spec"] == yaml.safe_load(RULES.read_text())


def test_the_chart_takes_the_runbook_urls_base_from_its_value() -> None:
    base = "https://git.example.com/ops/koordlet-py/blob/v0.1.0/docs/operations.md"
    (rule,) = [d for d in chart_documents("--set", "prometheusRule.enabled=true",
                                          "--set", f"prometheusRule.runbookURL={base}")
               if d["kind"] == "PrometheusRule"]
    urls = {r["alert"]: r["annotations"]["runbook_url"] for group in rule["spec"]["groups"] for r in group["rules"]}
    assert urls == {alert["alert"]: f"{base}#{alert['alert'].lower()}" for alert in alerts()}


def test_the_chart_refuses_an_unknown_prometheusrule_value() -> None:
    done = subprocess.run([tool("helm"), "template", "x", str(CHART), "--set", "prometheusRule.enable=true"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "enable" in done.stderr


# ------------------------------------------------------------------------------------ real Prometheus


@dataclass
class Scraped:
    prometheus: object  # PrometheusServer
    families: set[str]
    koordlet_url: str


def _refused_shares(hook: str, request: object) -> object:
    """A hook server's answer with a CPU weight below the kernel's minimum of 2."""
    from tests.support.hookserver import echo

    answer = echo(request)
    answer.container_resources.cpu_shares = 1  # type: ignore[attr-defined]
    return answer


@pytest.fixture(scope="module")
def scraped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scraped]:
    """A running koordlet (local mode, NRI on a containerd 2.1 of its own, BE suppress and eviction on) and a running
    proxy in front of that containerd, a BE pod through the proxy and an LS pod straight on containerd (NRI), and a
    real Prometheus scraping both every second and evaluating the rules. Two more hook servers are registered with
    the proxy for its trouble counters: one that is not there (hook errors) and one that answers a CPU weight the
    kernel refuses (a dropped value)."""
    import os
    import shutil

    from tests.support.cri import CriClient, PodFactory, container_config, sandbox_config
    from tests.support.hookserver import RecordingHookServer, register
    from tests.support.nri import NriContainerd, clean_up_dead_instances, koordlet_nri_args, wait_registered
    from tests.support.prometheus import PrometheusServer
    from tests.support.proxy import ProxyProcess
    from tests.support.stack import BE_ANNOTATIONS, BE_LABELS, KoordletProcess, http_get

    if os.geteuid() != 0 or not shutil.which("runc") or not Path("/sys/fs/cgroup/cpu").is_dir():
        pytest.skip("needs root, runc and cgroup v1 to run containerd")
    tmp = tmp_path_factory.mktemp("prometheus")
    clean_up_dead_instances()
    with contextlib.ExitStack() as stack:
        runtime = NriContainerd.for_process("2.1", instance="prom").up()
        stack.callback(runtime.down)
        proxy = ProxyProcess(str(tmp / "proxy.sock"), runtime.socket, state_dir=str(tmp))
        bad_hooks = RecordingHookServer(str(tmp / "bad-hooks.sock"), _refused_shares).start()
        stack.callback(bad_hooks.stop)
        register(proxy.hook_dir, "zz-absent.json", str(tmp / "absent.sock"), ["PreCreateContainer"])
        register(proxy.hook_dir, "zz-refused.json", bad_hooks.socket_path, ["PreCreateContainer"])
        (tmp / "slo.yaml").write_text("resourceUsedThresholdWithBE: {enable: true, memoryEvictThresholdPercent: 99}\n")
        koordlet = KoordletProcess(tmp, runtime.socket, proxy.hook_dir)
        # The NodeMetric and PSI every 1 s, for the families they set to have samples within the scrapes below.
        koordlet.args += koordlet_nri_args(runtime, "-feature-gates=BEMemoryEvict=true,BECPUEvict=true,"
                                           "NodeMetricPromMetrics=true,PSICollector=true,PerCPUMetric=true",
                                           "-report-interval=1s", "-psi-collector-interval=1s")
        stack.callback(koordlet.stop)
        koordlet.start()
        assert wait_registered(lambda: http_get(f"http://127.0.0.1:{koordlet.port}/metrics"), 30)
        stack.callback(lambda: proxy.proc is not None and proxy.terminate())
        proxy.start()
        for name, socket_path, qos, labels, annotations in (
                ("prom-be", proxy.listen, "besteffort", BE_LABELS, BE_ANNOTATIONS),  # the hook server decides
                ("prom-ls", runtime.socket, "burstable", {"koordinator.sh/qosClass": "LS"}, {})):  # NRI decides
            client = CriClient(socket_path)
            stack.callback(client.close)
            pods = PodFactory(client)
            stack.callback(pods.cleanup)
            sandbox = sandbox_config(name, kube_qos=qos, labels=labels, annotations=annotations)
            pods.create_container(pods.run_pod(sandbox), sandbox, container_config("main"))
        prometheus = PrometheusServer(tmp, {"koordlet": f"127.0.0.1:{koordlet.port}",
                                            "koord-runtime-proxy": f"127.0.0.1:{proxy.metrics_port}"},
                                      rule_files=[RULES]).start()
        stack.callback(prometheus.stop)
        prometheus.wait_up(30.0)
        time.sleep(8)  # several scrapes: rate() over 1 minute needs two samples of each series
        yield Scraped(prometheus, prometheus.metadata(), f"http://127.0.0.1:{koordlet.port}")


def _has_data(scraped: Scraped, expr: str) -> bool:
    return bool(scraped.prometheus.query(expr))  # type: ignore[attr-defined]


def _unknown_families(scraped: Scraped, expr: str) -> list[str]:
    return sorted({family(name) for name in _METRIC.findall(expr)} - {family(f) for f in scraped.families})


@pytest.mark.containerd
@pytest.mark.cgroupv1
def test_prometheus_loads_every_rule_and_evaluates_it_without_error(scraped: Scraped) -> None:
    groups = scraped.prometheus.api("/api/v1/rules")["groups"]  # type: ignore[attr-defined]
    rules = [rule for group in groups for rule in group["rules"]]
    assert sorted(rule["name"] for rule in rules) == sorted(alert["alert"] for alert in alerts())
    assert all(rule["health"] == "ok" for rule in rules), [(r["name"], r.get("lastError")) for r in rules]


@pytest.mark.containerd
@pytest.mark.cgroupv1
def test_the_proxy_alerts_fire_on_the_real_trouble_made_for_them(scraped: Scraped) -> None:
    """The absent and the refusing hook servers: their counters rise and the two alerts are pending or firing."""
    pending = {alert["labels"]["alertname"]: alert for alert in scraped.prometheus.api("/api/v1/alerts")["alerts"]}
    assert pending["KoordRuntimeProxyHookErrors"]["labels"]["server"] == "zz-absent.json"
    assert "KoordRuntimeProxyHookValuesRejected" in pending
    assert {"KoordletDown", "KoordRuntimeProxyDown"}.isdisjoint(pending)


@pytest.mark.containerd
@pytest.mark.cgroupv1
def test_every_alert_expression_returns_data_from_the_real_scrape(scraped: Scraped) -> None:
    """An alert's expression is empty on a healthy node by design. Then its signal (the expression without its final
    comparison) must have data; or its selectors without their label matchers (a failure status that never happened
    here); or, for a counter the stack cannot make count here, its family must be described by the scrape."""
    found: dict[str, list[str]] = {"as they are": [], "through their signal": [], "through their bare selectors": [],
                                   "by family only": []}
    for alert in alerts():
        expr = " ".join(alert["expr"].split())
        assert not _unknown_families(scraped, expr), f"{alert['alert']}: {_unknown_families(scraped, expr)}"
        signal = _COMPARISON.sub("", expr)
        if _has_data(scraped, expr):
            found["as they are"].append(alert["alert"])
        elif _has_data(scraped, signal):
            found["through their signal"].append(alert["alert"])
        elif _has_data(scraped, _MATCHERS.sub("", signal)):
            found["through their bare selectors"].append(alert["alert"])
        else:
            names = {family(n) for n in _METRIC.findall(expr)}
            assert names and names <= set(NO_SAMPLES_HERE), f"{alert['alert']}: no data for {signal}"
            found["by family only"].append(alert["alert"])
    print("alert expressions with data: " + "; ".join(f"{len(names)} {how} ({', '.join(names) or '-'})"
                                                      for how, names in found.items()))
    assert sum(len(names) for names in found.values()) == len(alerts())


@pytest.mark.containerd
@pytest.mark.cgroupv1
def test_every_dashboard_query_returns_data_from_the_real_scrape(scraped: Scraped) -> None:
    with_data, by_family = [], []
    for title, expr in dashboard_queries():
        query = expr.replace("$__rate_interval", "1m").replace("$instance", ".*")
        assert not _unknown_families(scraped, query), f"{title}: {_unknown_families(scraped, query)}"
        if _has_data(scraped, query):
            with_data.append(title)
            continue
        names = {family(n) for n in _METRIC.findall(query)}
        assert names and names <= set(NO_SAMPLES_HERE), f"{title}: no data for {query}"
        by_family.append(title)
    print(f"dashboard queries: {len(with_data)} of {len(dashboard_queries())} with data; by family only: "
          f"{', '.join(by_family) or 'none'}")
    assert len(by_family) <= len(NO_SAMPLES_HERE)


def test_the_dashboard_has_one_row_per_concern_and_its_variables() -> None:
    board = json.loads(DASHBOARD.read_text())
    rows = [panel["title"].split(":")[0] for panel in board["panels"] if panel["type"] == "row"]
    assert rows == ["Up and cost", "Runtime hooks", "NRI", "koord-runtime-proxy", "QoS and kernel writes",
                    "Evictions", "States", "Collectors"]
    assert [v["name"] for v in board["templating"]["list"]] == ["datasource", "instance"]
    assert all(target["datasource"]["uid"] == "${datasource}" for panel in board["panels"]
               for target in panel.get("targets", []))


@pytest.mark.containerd
@pytest.mark.cgroupv1
def test_a_running_koordlet_serves_koordinators_families_under_their_names_types_and_labels(scraped: Scraped) -> None:
    """Every family the running koordlet serves that bears one of Koordinator's names (tests/koordlet/
    koordinator_metrics.py) has Koordinator's type and, where it has samples here, its label names; Prometheus, which
    asks for OpenMetrics first, records each under that name and type (its metadata API). Koordinator's counters have
    no ``_total``, ours do. tests/koordlet/test_metric_names.py covers the families this stack has no sample of."""
    from tests.koordlet import koordinator_metrics as facts
    from tests.support import promtext
    from tests.support.stack import http_get

    served = promtext.parse(http_get(scraped.koordlet_url + "/metrics"))
    recorded = {entry["metric"]: entry["type"] for entry in scraped.prometheus.api(  # type: ignore[attr-defined]
        "/api/v1/targets/metadata", match_target='{job="koordlet"}')}
    theirs = {name: family for name, family in served.items() if name in facts.FAMILIES}
    assert set(theirs) <= set(facts.EXPORTED), "a family koordlet-py says it does not export is served"
    with_samples = {name for name, family in theirs.items() if family.samples}
    wrong = {name: (family.type, recorded.get(name), sorted(family.label_names))
             for name, family in theirs.items()
             if not family.type == recorded.get(name) == facts.FAMILIES[name].type
             or (name in with_samples and family.label_names != frozenset(facts.FAMILIES[name].labels))}
    assert wrong == {}
    ours = {name for name, family in served.items() if name.startswith("koordlet_") and name not in theirs}
    assert all(name.endswith("_total") for name in ours if served[name].type == "counter")
    assert scraped.prometheus.query("koordlet_pod_eviction")  # type: ignore[attr-defined]
    assert not scraped.prometheus.query('{__name__=~"koordlet_pod_eviction.*_total"}')  # type: ignore[attr-defined]
    print(f"Koordinator's families served by the running koordlet: {len(theirs)} of {len(facts.EXPORTED)}, "
          f"{len(with_samples)} with samples; without samples here: {', '.join(sorted(set(theirs) - with_samples))}; "
          f"not served here: {', '.join(sorted(set(facts.EXPORTED) - set(theirs)))}")


@pytest.mark.containerd
def test_prometheus_finds_the_proxy_through_the_nodes_and_sees_it_go_down(containerd_socket: str,
                                                                           tmp_path: Path) -> None:
    """runtime-proxy-scrape.yaml's job as written (only the API server and its credentials added, as outside a cluster)
    in a real Prometheus with Kubernetes service discovery: it lists and watches the Nodes of the project's API server
    (HTTPS, the token of a service account that may get, list and watch nodes, as kube-prometheus-stack's may),
    scrapes port 9318 of the node's address, where a running proxy serves, and labels the
    series with the node. When the proxy stops, KoordRuntimeProxyDown's expression holds and the alert is pending.
    The node's address is a loopback address of this test's own, so port 9318 on it is no one else's."""
    import random

    from tests.support.apiserver import ApiServer, create_objects
    from tests.support.prometheus import PrometheusServer
    from tests.support.proxy import ProxyProcess
    from tests.support.waiting import wait_for

    address = f"127.{random.randint(1, 254)}.{random.randint(1, 254)}.{random.randint(1, 254)}"
    token = tmp_path / "prometheus.token"
    job = yaml.safe_load(PROXY_SCRAPE.read_text())["scrape_configs"][0]
    with contextlib.ExitStack() as stack:
        api = stack.enter_context(ApiServer(crd_dir=None))
        rbac = "rbac.authorization.k8s.io/v1"
        create_objects(api, [
            {"apiVersion": "v1", "kind": "ServiceAccount",
             "metadata": {"name": "prometheus", "namespace": "monitoring"}},
            {"apiVersion": rbac, "kind": "ClusterRole", "metadata": {"name": "prometheus-nodes"},
             "rules": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]}]},
            {"apiVersion": rbac, "kind": "ClusterRoleBinding", "metadata": {"name": "prometheus-nodes"},
             "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "prometheus-nodes"},
             "subjects": [{"kind": "ServiceAccount", "name": "prometheus", "namespace": "monitoring"}]}])
        token.write_text(api.service_account_token("monitoring", "prometheus"))
        api.seed({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-a"},
                  "status": {"addresses": [{"type": "InternalIP", "address": address},
                                           {"type": "Hostname", "address": "node-a"}],
                             "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}}}})
        proxy = ProxyProcess(str(tmp_path / "proxy.sock"), containerd_socket, state_dir=str(tmp_path),
                             metrics_address=(address, 9318)).start()
        stack.callback(lambda: proxy.proc is not None and proxy.terminate())
        job["kubernetes_sd_configs"][0].update(api_server=api.url, tls_config={"ca_file": str(api.ca_file)},
                                               authorization={"credentials_file": str(token)})
        prometheus = PrometheusServer(tmp_path, {}, rule_files=[RULES], scrape_configs=[job],
                                      binary="prometheus-2.53").start()
        stack.callback(prometheus.stop)
        prometheus.wait_up(30.0)
        (target,) = prometheus.api("/api/v1/targets")["activeTargets"]
        assert target["scrapeUrl"] == f"http://{address}:9318/metrics"
        assert (target["labels"]["job"], target["labels"]["instance"], target["labels"]["node"]) == (
            "koord-runtime-proxy", "node-a", "node-a")
        assert prometheus.query('koord_runtimeproxy_calls_served_total{job="koord-runtime-proxy", node="node-a"}')
        # What service discovery asked of the API server: a list, then a watch, of Nodes, with its token.
        nodes = api.requests("GET", r"^/api/v1/nodes$")
        assert [r.query.get("watch") for r in nodes][:2] == [None, "true"]
        assert {(r.user, r.status) for r in nodes} == {("system:serviceaccount:monitoring:prometheus", 200)}

        proxy.terminate()
        down = next(rule["expr"] for rule in alerts() if rule["alert"] == "KoordRuntimeProxyDown")
        assert wait_for(lambda: prometheus.query(down), 30.0, 0.5), f"{down}: no data after the proxy stopped"

        def pending() -> list[dict]:
            return [alert for alert in prometheus.api("/api/v1/alerts")["alerts"]
                    if alert["labels"]["alertname"] == "KoordRuntimeProxyDown"]

        (alert,) = wait_for(pending, 30.0, 0.5)
        # The node role names a target's instance after its node.
        assert (alert["state"], alert["labels"]["instance"], alert["labels"]["node"]) == ("pending", "node-a", "node-a")

