"""README's way from koordlet alone (3a) to Koordinator's full install, its commands as written, on the project's API
server holding what the 3a install made.

Helm itself cannot run against that server (it keeps releases in Secrets, sent as protobuf), so the two Helm steps
are Helm's own rules, from Helm v4.1.4's source, applied to what `helm template` renders with the commands' exact
arguments:

- an install or upgrade marks every object it makes with the label ``app.kubernetes.io/managed-by=Helm`` and the
  annotations ``meta.helm.sh/release-name``/``-namespace`` (pkg/action/validate.go, ``setMetadataVisitor``), and
  ``--create-namespace`` makes a Namespace labelled ``name=<namespace>`` only (pkg/action/install.go);
- an install takes over an existing object only when it carries those marks for the installing release, and
  otherwise stops with ``<kind> "<name>" ... exists and cannot be imported into the current release: invalid
  ownership metadata; ...`` (``existingResourceConflict``, ``checkOwnership``, ``requireValue``);
- an upgrade deletes what the old manifest had and the new one has not, unless the live object carries
  ``helm.sh/resource-policy: keep`` (pkg/kube/client.go, ``Update``).

The kubectl steps run with real kubectl. Koordinator's chart is its recorded render (koordinator_v1_8_0.py); with
``KOORDINATOR_CHARTS_DIR`` the last test renders the chart itself with the README's arguments.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kubernetes.client
import yaml

from tests.deploy import koordinator_v1_8_0 as koordinator
from tests.deploy.test_beside_koordinator import schedules_on
from tests.deploy.tools import (
    CHART,
    PLURALS,
    ROOT,
    create_object,
    documents,
    object_key,
    object_path,
    request,
    tool,
)
from tests.support.apiserver import ApiServer, kube_api_client, write_kubeconfig
from tests.test_docs_commands import extract

NAMESPACE = koordinator.NAMESPACE
MANAGED_BY, RELEASE_NAME, RELEASE_NAMESPACE = ("app.kubernetes.io/managed-by", "meta.helm.sh/release-name",
                                               "meta.helm.sh/release-namespace")
KEEP = "helm.sh/resource-policy"
NODES = ("worker-1", "worker-2")
Key = tuple[str, str, str]


def _section(heading: str) -> list[list[str]]:
    """The commands of the README's section under ``heading``, split as the shell splits them."""
    text = (ROOT / "README.md").read_text()
    start = text.index(heading)
    ends = [i for i in (text.find("\n### ", start + 1), text.find("\n#### ", start + 1)) if i > 0]
    return [shlex.split(c.text) for c in extract("README.md", text[start:min(ends)]) if not c.inline]


def _steps() -> list[list[str]]:
    return _section("#### From koordlet alone (3a) to Koordinator's full install")


def _one(commands: list[list[str]], *prefix: str) -> list[str]:
    [words] = [w for w in commands if w[:len(prefix)] == list(prefix)]
    return words


def _template_flags(words: list[str]) -> list[str]:
    """The flags of `helm install|upgrade RELEASE CHART ...` that `helm template` takes (the release-only ones and
    the repository chart's --version dropped)."""
    kept, skip = [], False
    for flag in words[4:]:
        if skip:
            skip = False
        elif flag == "--version":
            skip = True
        elif flag not in ("--reuse-values", "--create-namespace"):
            kept.append(flag)
    return kept


def _helm_template(release: str, chart: Path, flags: list[str]) -> list[dict[str, Any]]:
    done = subprocess.run([tool("helm"), "template", release, str(chart), *flags], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return documents(done.stdout)


def _marked(doc: dict[str, Any], release: str) -> dict[str, Any]:
    """``doc`` as Helm's install of ``release`` writes it (setMetadataVisitor)."""
    meta = doc["metadata"]
    meta.setdefault("labels", {})[MANAGED_BY] = "Helm"
    meta.setdefault("annotations", {}).update({RELEASE_NAME: release, RELEASE_NAMESPACE: NAMESPACE})
    return doc


def _require(meta: dict[str, str], key: str, value: str) -> str | None:
    """Helm's requireValue, its text as Go's %q prints these plain strings."""
    if key not in meta:
        return f"missing key {json.dumps(key)}: must be set to {json.dumps(value)}"
    if meta[key] != value:
        return f"key {json.dumps(key)} must equal {json.dumps(value)}: current value is {json.dumps(meta[key])}"
    return None


def ownership_error(live: dict[str, Any], release: str) -> str | None:
    """Helm's checkOwnership of an existing object for an install of ``release`` in NAMESPACE; None: adopted."""
    labels, annotations = live["metadata"].get("labels") or {}, live["metadata"].get("annotations") or {}
    errors = [f"label validation error: {e}" for e in [_require(labels, MANAGED_BY, "Helm")] if e]
    errors += [f"annotation validation error: {e}" for e in (_require(annotations, RELEASE_NAME, release),
                                                           _require(annotations, RELEASE_NAMESPACE, NAMESPACE)) if e]
    return "invalid ownership metadata; " + "; ".join(errors) if errors else None


@dataclass
class Cluster:
    server: ApiServer
    client: kubernetes.client.ApiClient
    env: dict[str, str]

    def get(self, key: Key) -> dict[str, Any] | None:
        kind, namespace, name = key
        return self.server.get_object(PLURALS[kind], name, namespace or None) if kind in PLURALS else None

    def kubectl(self, words: list[str]) -> str:
        done = subprocess.run([tool("kubectl-1.35"), *words[1:]], env=self.env, capture_output=True, text=True,
                              timeout=60)
        assert done.returncode == 0, f"{shlex.join(words)}: {done.stderr}"
        return done.stdout

    def refusals(self, keys: set[Key], release: str) -> dict[Key, str]:
        """What Helm's install of ``release`` would refuse among objects of ``keys`` that exist."""
        found = {key: self.get(key) for key in keys}
        return {key: error for key, live in found.items()
                if live is not None and (error := ownership_error(live, release)) is not None}

    def upgrade(self, old: list[dict[str, Any]], new: list[dict[str, Any]], release: str) -> set[Key]:
        """Helm's upgrade: the new manifest written over the live objects, then what only the old one had
        deleted unless the live object keeps itself; returns the keys it kept that way."""
        kept: set[Key] = set()
        for doc in new:
            live = self.get(object_key(doc))
            doc = _marked(doc, release)
            if live is None:
                create_object(self.client, doc)
            else:
                doc["metadata"]["resourceVersion"] = live["metadata"]["resourceVersion"]
                request(self.client, "PUT", object_path(doc, named=True), doc)
        for doc in old:
            if object_key(doc) in {object_key(d) for d in new}:
                continue
            live = self.get(object_key(doc))
            if live is not None and (live["metadata"].get("annotations") or {}).get(KEEP) == "keep":
                kept.add(object_key(doc))
            elif live is not None:
                request(self.client, "DELETE", object_path(doc, named=True))
        return kept


@contextmanager
def _after_3a(tmp_path: Path) -> Iterator[tuple[Cluster, list[dict[str, Any]], list[str]]]:
    """The project's API server as README's 3a `helm install` left it (two nodes, a NodeSLO in the CRDs), with the
    objects that install made and its flags."""
    install = _one(_section("### 3a. koordlet alone, with Helm"), "helm", "install", "koordlet-py")
    assert "--create-namespace" in install and install[install.index("--namespace") + 1] == NAMESPACE
    flags = _template_flags(install)
    ours = _helm_template("koordlet-py", CHART, flags)
    with ApiServer(crd_dir=None) as server, kube_api_client(server) as client:
        cluster = Cluster(server, client, {"PATH": os.environ["PATH"], "HOME": str(tmp_path),
                                           "KUBECONFIG": str(write_kubeconfig(server, tmp_path / "kubeconfig"))})
        for name in NODES:
            server.seed({"apiVersion": "v1", "kind": "Node",
                         "metadata": {"name": name, "labels": {"kubernetes.io/os": "linux"}}})
        create_object(client, {"apiVersion": "v1", "kind": "Namespace",
                               "metadata": {"name": NAMESPACE, "labels": {"name": NAMESPACE}}})
        for doc in sorted(ours, key=lambda d: d["kind"] != "CustomResourceDefinition"):
            create_object(client, _marked(json.loads(json.dumps(doc)), "koordlet-py"))
        create_object(client, {"apiVersion": "slo.koordinator.sh/v1alpha1", "kind": "NodeSLO",
                               "metadata": {"name": NODES[0]},
                               "spec": {"resourceUsedThresholdWithBE": {"enable": True,
                                                                        "cpuSuppressThresholdPercent": 60}}})
        yield cluster, ours, flags


def _koordinators_install(steps: list[list[str]]) -> tuple[list[str], dict[str, Any]]:
    """The README's `helm install koordinator ...`: its template flags and the affinity it gives Koordinator's
    koordlet (its chart renders koordlet.nodeAffinity as the pod's whole affinity: recorded fact)."""
    install = _one(steps, "helm", "install", "koordinator")
    assert install[3] == "koordinator-sh/koordinator" and install[install.index("--version") + 1] == "1.8.0"
    flags = _template_flags(install)
    [value] = [flags[i + 1] for i, f in enumerate(flags) if f == "--set-json"]
    key, _, affinity = value.partition("=")
    assert key == koordinator.KOORDLET_AFFINITY_VALUE
    return flags, json.loads(affinity)


def _walk(cluster: Cluster, ours: list[dict[str, Any]], flags: list[str], tmp_path: Path) -> set[Key]:
    """README's steps up to Koordinator's install, in order; returns what our upgrade left in place by keep."""
    steps = _steps()
    kept: set[Key] = set()
    for words in steps:
        if words[:2] == ["helm", "install"]:
            break
        if words[:3] == ["helm", "upgrade", "koordlet-py"]:
            upgraded = _helm_template("koordlet-py", CHART, [*flags, *_template_flags(words)])
            kept = cluster.upgrade(ours, upgraded, "koordlet-py")
        elif words[-2] == ">":  # kubectl ... > file
            (tmp_path / words[-1]).write_text(cluster.kubectl(words[:-2]))
        else:
            cluster.kubectl(words)
    return kept


def test_the_steps_hand_koordinators_chart_exactly_the_objects_it_shares_with_3a(tmp_path: Path) -> None:
    steps = _steps()
    install_flags, affinity = _koordinators_install(steps)
    theirs = koordinator.OBJECTS
    with _after_3a(tmp_path) as (cluster, ours, flags):
        # As 3a left it, Helm would refuse Koordinator's install on the Namespace, the CRDs and the ConfigMap.
        before = cluster.refusals(theirs, "koordinator")
        shared = {("Namespace", "", NAMESPACE), ("ConfigMap", NAMESPACE, "slo-controller-config"),
                  *(("CustomResourceDefinition", "", name) for name in koordinator.CRD_VERSIONS)}
        assert set(before) == shared
        assert before[("Namespace", "", NAMESPACE)] == (
            'invalid ownership metadata; label validation error: missing key "app.kubernetes.io/managed-by": must be '
            'set to "Helm"; annotation validation error: missing key "meta.helm.sh/release-name": must be set to '
            '"koordinator"; annotation validation error: missing key "meta.helm.sh/release-namespace": must be set '
            'to "koordinator-system"')
        assert 'key "meta.helm.sh/release-name" must equal "koordinator": current value is "koordlet-py"' in \
            before[("CustomResourceDefinition", "", "nodeslos.slo.koordinator.sh")]
        saved = next(w[-1] for w in steps if w[-2:-1] == [">"])
        kept = _walk(cluster, ours, flags, tmp_path)
        assert yaml.safe_load((tmp_path / saved).read_text())["metadata"]["name"] == "slo-controller-config"
        # Our release let go of the CRDs (kept by their policy, with the NodeSLO in them) and of the ConfigMap.
        assert kept == {k for k in shared if k[0] == "CustomResourceDefinition"}
        assert cluster.get(("ConfigMap", NAMESPACE, "slo-controller-config")) is None
        assert cluster.server.get_object("nodeslos", NODES[0]) is not None
        # Now Helm's install takes every object of Koordinator's chart that exists, and refuses none.
        assert cluster.refusals(theirs, "koordinator") == {}
        existing = {key for key in theirs if cluster.get(key) is not None}
        assert existing == shared - {("ConfigMap", NAMESPACE, "slo-controller-config")}
        # Exactly one koordlet per node: ours on every labelled node, Koordinator's on none of them.
        [daemonset] = [d for d in ours if d["kind"] == "DaemonSet"]
        live = cluster.get(object_key(daemonset))
        assert live is not None
        ours_pod = live["spec"]["template"]["spec"]
        for node in cluster.server.list_objects("nodes"):
            labels = node["metadata"]["labels"]
            assert schedules_on(ours_pod, labels) and not schedules_on({"affinity": affinity}, labels), labels
    assert "--namespace" in install_flags and install_flags[install_flags.index("--namespace") + 1] == NAMESPACE


def test_the_steps_leave_no_object_koordinators_real_chart_would_refuse(koordinator_chart: Path,
                                                                          tmp_path: Path) -> None:
    """With Koordinator's chart at hand: rendered with the README's install arguments, every object of it that
    exists after the steps is one Helm adopts, and its koordlet gets the affinity the test above placed."""
    install_flags, affinity = _koordinators_install(_steps())
    rendered = _helm_template("koordinator", koordinator_chart, install_flags)
    keys = {object_key(d) for d in rendered}
    [koordlet] = [d for d in rendered if d["kind"] == "DaemonSet" and d["metadata"]["name"] == "koordlet"]
    assert koordlet["spec"]["template"]["spec"]["affinity"] == affinity
    with _after_3a(tmp_path) as (cluster, ours, flags):
        assert cluster.refusals(keys, "koordinator")
        _walk(cluster, ours, flags, tmp_path)
        assert cluster.refusals(keys, "koordinator") == {}
        assert {k for k in keys if cluster.get(k) is not None} == {
            ("Namespace", "", NAMESPACE), *(("CustomResourceDefinition", "", n) for n in koordinator.CRD_VERSIONS)}
