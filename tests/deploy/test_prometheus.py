"""The alert rules and the dashboard (deploy/prometheus/), checked by Debian 12's Prometheus 2.42 and its promtool
(scripts/fetch-tools.sh): the rules pass ``promtool check rules``, their unit tests pass ``promtool test rules``
(every alert fires on trouble and stays quiet beside it), the chart's PrometheusRule is the same rules, and a real
Prometheus scraping a running koordlet and a running proxy evaluates every alert expression and every dashboard
query with data. A metric renamed in the code fails here."""

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
            fired = {alert["exp_labels"]["instance"] for alert in check["exp_alerts"]}
            if fired:
                fires.add(check["alertname"])
                assert instances - fired, f"{case['name']}: no healthy instance left quiet beside the one firing"
    assert fires == {alert["alert"] for alert in alerts()}, "every alert has a unit test in which it fires"


def test_every_alert_has_a_runbook_section_in_the_operations_doc() -> None:
    operations = (ROOT / "docs" / "operations.md").read_text()
    for alert in alerts():
        assert alert["annotations"]["runbook"] == f"docs/operations.md#{alert['alert'].lower()}"
        assert f"\n#### {alert['alert']}\n" in operations, alert["alert"]


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


def test_the_chart_refuses_an_unknown_prometheusrule_value() -> None:
    done = subprocess.run([tool("helm"), "template", "x", str(CHART), "--set", "prometheusRule.enable=true"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "enable" in done.stderr


# ------------------------------------------------------------------------------------ real Prometheus


@dataclass
class Scraped:
    prometheus: object  # PrometheusServer
    families: set[str]


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
        koordlet.args += koordlet_nri_args(runtime, "-feature-gates=BEMemoryEvict=true,BECPUEvict=true")
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
        yield Scraped(prometheus, prometheus.metadata())


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
