"""The chart as a versioned product (deploy/chart/koordlet-py/CHANGELOG.md, scripts/chart-version.py): its version
is SemVer 2, its own, and names one content: the chart's files are the content recorded for Chart.yaml's version, so
a change to the chart without a new version (and its entry) fails here; and the recording itself refuses to give a
recorded version another content, shown on a copy of the chart."""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import yaml

from tests.deploy.tools import CHART, ROOT

SCRIPT = ROOT / "scripts" / "chart-version.py"


def _module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("chart_version", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


chart_version = _module()


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=60)


def _semver_key(version: str) -> tuple[int, int, int, int, tuple[tuple[int, int | str], ...]]:
    """SemVer 2 precedence (rule 11): a pre-release sorts before its release; build metadata does not count."""
    match = chart_version.SEMVER.match(version)
    assert match, f"{version} is not SemVer 2"
    major, minor, patch, pre = int(match[1]), int(match[2]), int(match[3]), match[4]
    fields = tuple((0, int(f)) if f.isdigit() else (1, f) for f in pre.split(".")) if pre else ()
    return major, minor, patch, 0 if pre else 1, fields


def test_the_chart_is_the_content_recorded_for_its_version() -> None:
    done = _run("--check")
    assert done.returncode == 0, done.stderr
    version = yaml.safe_load((CHART / "Chart.yaml").read_text())["version"]
    assert done.stdout.split() == [version, chart_version.digest()]


def test_the_changelog_has_one_entry_per_version_newest_first_each_with_its_content() -> None:
    entries = chart_version.entries()
    versions = [version for version, _ in entries]
    assert versions[0] == yaml.safe_load((CHART / "Chart.yaml").read_text())["version"]
    assert len(set(versions)) == len(versions)
    keys = [_semver_key(v) for v in versions]
    assert keys == sorted(keys, reverse=True)
    assert all(content is not None for _, content in entries), "every released version names its content"
    assert len({content for _, content in entries}) == len(entries)


def test_the_chart_version_is_its_own_and_the_earlier_chart_is_0_1_0() -> None:
    """The version left 0.1.0 when the chart broke it (README's "the earlier chart (0.1.0)" is that one)."""
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert _semver_key(chart["version"]) >= _semver_key("1.0.0")
    assert [v for v, _ in chart_version.entries()][-1] == "0.1.0"
    readme = (ROOT / "README.md").read_text()
    assert "the earlier chart (0.1.0" in readme and chart["version"] != "0.1.0"


@pytest.fixture
def copy(tmp_path: Path) -> Path:
    target = tmp_path / "koordlet-py"
    shutil.copytree(CHART, target)
    return target


def _bump(chart: Path, version: str) -> None:
    path = chart / "Chart.yaml"
    path.write_text(re.sub(r"^version: .*$", f"version: {version}", path.read_text(), count=1, flags=re.MULTILINE))


def test_a_changed_template_without_a_new_version_fails_the_check_and_cannot_be_recorded(copy: Path) -> None:
    template = copy / "templates" / "daemonset.yaml"
    template.write_text(template.read_text().replace("terminationGracePeriodSeconds: 10",
                                                     "terminationGracePeriodSeconds: 30"))
    checked = _run("--check", "--chart", str(copy))
    assert checked.returncode == 1 and "the chart changed after version" in checked.stderr
    assert "raise `version` in Chart.yaml" in checked.stderr and "make chart-digest" in checked.stderr
    recorded = _run("--chart", str(copy))
    assert recorded.returncode == 1 and "is recorded with" in recorded.stderr


def test_a_new_version_needs_its_entry_then_is_recorded_once(copy: Path) -> None:
    values = copy / "values.yaml"
    values.write_text(values.read_text() + "\n# a change\n")
    _bump(copy, "1.0.1")
    done = _run("--chart", str(copy))
    assert done.returncode == 1 and "add an entry `## 1.0.1`" in done.stderr
    changelog = copy / "CHANGELOG.md"
    text = changelog.read_text()
    first = text.index("\n## ")
    changelog.write_text(text[:first] + "\n## 1.0.1\n\nA comment in values.yaml.\n\nContent: `not recorded`\n"
                         + text[first:])
    assert _run("--check", "--chart", str(copy)).returncode == 1  # not recorded yet
    done = _run("--chart", str(copy))
    assert done.returncode == 0, done.stderr
    assert _run("--check", "--chart", str(copy)).returncode == 0
    assert _run("--chart", str(copy)).returncode == 0  # the same content again: nothing to do


def test_files_helm_does_not_package_and_the_changelog_are_not_content(copy: Path) -> None:
    before = chart_version.digest(copy)
    (copy / "templates" / "daemonset.yaml.orig").write_text("left by a merge tool\n")  # .helmignore: *.orig
    (copy / "files" / "crds" / "kustomization.yaml").write_text("# kustomize's, not the chart's\n")
    (copy / "CHANGELOG.md").write_text((copy / "CHANGELOG.md").read_text() + "\nA note.\n")
    assert chart_version.digest(copy) == before
    (copy / "files" / "crds" / "extra.yaml").write_text("# packaged\n")
    assert chart_version.digest(copy) != before
