"""Removing koordlet loses nothing (README, "Upgrade, uninstall, rollback"): each removal command the README gives is
rendered the way it would act (`helm uninstall` deletes the release's objects but those kept by
``helm.sh/resource-policy: keep``; `kubectl delete -k DIR` deletes what `kubectl kustomize DIR` builds), and none
deletes a CRD, a Namespace, or an object of Koordinator's chart the release did not make."""

from __future__ import annotations

import shlex
import subprocess
from typing import Any

from tests.deploy import koordinator_v1_8_0 as koordinator
from tests.deploy.test_beside_koordinator import _helm_template, _template_args
from tests.deploy.tools import ROOT, documents, object_key, tool
from tests.test_docs_commands import extract

# What removing koordlet may delete: koordlet's own objects, and what a release made for it.
KOORDLET_KINDS = {"DaemonSet", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Service", "ServiceMonitor",
                  "PodMonitor", "ConfigMap"}


def _section(title: str, end: str) -> str:
    text = (ROOT / "README.md").read_text()
    start = text.index(title)
    return text[start:text.index(end, start + len(title))]


def _commands(section: str) -> list[list[str]]:
    return [shlex.split(c.text, comments=True) for c in extract("README.md", section) if not c.inline]


def removal_commands() -> list[list[str]]:
    section = _section("- **Remove koordlet**", "\n## ")
    return [words for words in _commands(section) if words[:2] in (["helm", "uninstall"], ["kubectl", "delete"])]


def installs() -> dict[str, list[str]]:
    """The README's `helm install` commands of our chart, by where they install: alone or beside Koordinator."""
    alone = _commands(_section("### 3a. koordlet alone", "\n### "))
    beside = _commands(_section("#### (b) Our chart beside Koordinator's control plane", "\n#### "))
    [alone_install] = [w for w in alone if w[:2] == ["helm", "install"]]
    [beside_install] = [w for w in beside if w[:2] == ["helm", "install"]]
    return {"alone": alone_install, "beside Koordinator": beside_install}


def deleted_by(words: list[str], install: list[str]) -> list[dict[str, Any]]:
    """What a removal command deletes, for a release installed by ``install``."""
    if words[:2] == ["helm", "uninstall"]:
        release, chart, flags = _template_args(install)
        assert words[2] == release and "--namespace" in words and "--namespace" in flags
        assert words[words.index("--namespace") + 1] == flags[flags.index("--namespace") + 1]
        return [d for d in _helm_template(release, chart, flags)
                if (d["metadata"].get("annotations") or {}).get("helm.sh/resource-policy") != "keep"]
    assert words[:3] == ["kubectl", "delete", "-k"], words
    done = subprocess.run([tool("kubectl-1.35"), "kustomize", words[3]], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    return documents(done.stdout)


def test_the_readme_gives_a_removal_command_for_helm_and_for_kustomize() -> None:
    assert [w[:2] for w in removal_commands()] == [["helm", "uninstall"], ["kubectl", "delete"]]


def test_no_removal_command_deletes_a_crd_a_namespace_or_koordinators_objects() -> None:
    for where, install in installs().items():
        for words in removal_commands():
            deleted = deleted_by(words, install)
            kinds = {d["kind"] for d in deleted}
            assert kinds and kinds <= KOORDLET_KINDS, (where, words, kinds)
            taken = {object_key(d) for d in deleted} & koordinator.OBJECTS
            if where == "beside Koordinator":
                assert not taken, (words, taken)  # Koordinator's CRDs, ConfigMap and koordlet stay
            else:
                assert taken <= {("ConfigMap", koordinator.NAMESPACE, "slo-controller-config")}  # the release's own


def test_what_each_removal_command_deletes() -> None:
    """The figures in the report: kind and name of every object each command deletes."""
    install = installs()["beside Koordinator"]
    seen = {" ".join(words): sorted(object_key(d) for d in deleted_by(words, install)) for words in removal_commands()}
    koordlet = sorted([("ClusterRole", "", "koordlet-py"), ("ClusterRoleBinding", "", "koordlet-py"),
                       ("DaemonSet", "koordinator-system", "koordlet-py"),
                       ("ServiceAccount", "koordinator-system", "koordlet-py")])
    assert seen == {"helm uninstall koordlet-py --namespace koordinator-system": koordlet,
                    "kubectl delete -k deploy/": koordlet}
