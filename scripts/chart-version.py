#!/usr/bin/env python3
"""Record, or check, the digest of the chart's content for its version (deploy/chart/koordlet-py/CHANGELOG.md).

    python3 scripts/chart-version.py          # (make chart-digest) records it under Chart.yaml's version
    python3 scripts/chart-version.py --check  # exit 1 when the chart is not the content recorded for its version

The content is every file Helm packages (the chart's directory, .helmignore's patterns left out) but CHANGELOG.md:
templates, values, the schema, the CRDs and Chart.yaml itself, version included. Each version's entry in
CHANGELOG.md ends with a line ``Content: `sha256:<hex>```. Recording fills that line for the version Chart.yaml
names, once: a version whose entry has another digest already is refused, because a version names one content
(raise it and add an entry instead). tests/deploy/test_chart_version.py runs ``--check``.
"""

from __future__ import annotations

import argparse
import fnmatch
import hashlib
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "deploy" / "chart" / "koordlet-py"
CHANGELOG = "CHANGELOG.md"
# SemVer 2 (https://semver.org, the regular expression it suggests), which Helm requires of a chart's version.
SEMVER = re.compile(r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
                    r"(?:-((?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(?:\.(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?"
                    r"(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?$")
HEADING = re.compile(r"^## (\S+)", re.MULTILINE)
CONTENT = re.compile(r"^Content: `(sha256:[0-9a-f]{64}|not recorded)`$", re.MULTILINE)
RECORD_COMMAND = "make chart-digest"


class ChartVersionError(Exception):
    """The chart, its version or its CHANGELOG.md is not as a release needs it; the message says what to do."""


def _ignored(relative: str, patterns: list[str]) -> bool:
    name = relative.rsplit("/", 1)[-1]
    return any(fnmatch.fnmatch(relative if "/" in p else name, p.rstrip("/")) for p in patterns)


def digest(chart: Path = CHART) -> str:
    """sha256 over each packaged file's path and bytes, in path order."""
    helmignore = chart / ".helmignore"
    patterns = [line.strip() for line in helmignore.read_text().splitlines()
                if line.strip() and not line.startswith("#")] if helmignore.exists() else []
    files = sorted(p for p in chart.rglob("*") if p.is_file())
    sha = hashlib.sha256()
    for path in files:
        relative = path.relative_to(chart).as_posix()
        if relative == CHANGELOG or _ignored(relative, patterns):
            continue
        sha.update(relative.encode() + b"\0" + path.read_bytes() + b"\0")
    return f"sha256:{sha.hexdigest()}"


def chart_version(chart: Path = CHART) -> str:
    found = re.search(r"^version:\s*[\"']?([^\s\"']+)", (chart / "Chart.yaml").read_text(), re.MULTILINE)
    if found is None:
        raise ChartVersionError(f"{chart / 'Chart.yaml'} names no version")
    return found.group(1)


def entries(chart: Path = CHART) -> list[tuple[str, str | None]]:
    """(version, recorded content or None) of each entry of CHANGELOG.md, in the file's order."""
    text = (chart / CHANGELOG).read_text()
    headings = list(HEADING.finditer(text))
    out = []
    for heading, following in zip(headings, [*headings[1:], None], strict=True):
        body = text[heading.end():following.start() if following else len(text)]
        contents = CONTENT.findall(body)
        if len(contents) != 1:
            raise ChartVersionError(f"{CHANGELOG}: the entry of {heading.group(1)} needs exactly one "
                                    "``Content: `...` `` line, its last")
        out.append((heading.group(1), None if contents[0] == "not recorded" else contents[0]))
    return out


def check(chart: Path = CHART) -> str:
    """The content's digest when it is the one recorded for Chart.yaml's version; else ChartVersionError."""
    version, content = chart_version(chart), digest(chart)
    recorded = dict(entries(chart))
    if version not in recorded:
        raise ChartVersionError(f"Chart.yaml's version {version} has no entry in {CHANGELOG}: add one at the top "
                                f"(what changed, and for whom), then run `{RECORD_COMMAND}`")
    if recorded[version] is None:
        raise ChartVersionError(f"the content of {version} is not recorded: run `{RECORD_COMMAND}`")
    if recorded[version] != content:
        raise ChartVersionError(
            f"the chart changed after version {version} was recorded ({recorded[version]}, now {content}): raise "
            f"`version` in Chart.yaml (SemVer: major for a change that breaks an install or upgrade made with the "
            f"earlier values, minor for something new, patch otherwise), add its entry at the top of {CHANGELOG}, "
            f"then run `{RECORD_COMMAND}`")
    return content


def record(chart: Path = CHART) -> str:
    """Fill in the content line of Chart.yaml's version; refuse to change one already filled in."""
    version, content = chart_version(chart), digest(chart)
    if not SEMVER.match(version):
        raise ChartVersionError(f"Chart.yaml's version {version!r} is not SemVer 2, which Helm requires")
    recorded = dict(entries(chart))
    if version not in recorded:
        raise ChartVersionError(f"add an entry `## {version}` at the top of {CHANGELOG} first (what changed)")
    if recorded[version] == content:
        return content
    if recorded[version] is not None:
        raise ChartVersionError(
            f"version {version} is recorded with {recorded[version]} already and names that content: raise "
            f"`version` in Chart.yaml and add an entry for it (if {version} was never merged or released, delete "
            f"its content line by hand and run this again)")
    path = chart / CHANGELOG
    text = path.read_text()
    start = text.index(f"## {version}")
    line = CONTENT.search(text, start)
    assert line is not None  # entries() found it
    path.write_text(text[:line.start()] + f"Content: `{content}`" + text[line.end():])
    return content


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="check only; exit 1 when the chart is not recorded")
    parser.add_argument("--chart", type=Path, default=CHART,
                        help="the chart's directory (default: deploy/chart/koordlet-py)")
    args = parser.parse_args(argv)
    try:
        content = check(args.chart) if args.check else record(args.chart)
    except ChartVersionError as err:
        print(f"chart-version: {err}", file=sys.stderr)
        return 1
    print(f"{chart_version(args.chart)} {content}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
