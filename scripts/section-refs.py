#!/usr/bin/env python3
"""Section references must name a file in the repository (issue 25).

Code and docs cite sections as ``docs/koordinator.md §4.2``. This checks every tracked text file:
- a ``§N`` must follow the name of a ``.md`` file that exists, relative to the repository root or to
  the citing file (continuations such as ``§2.6–§2.7`` or ``§5.4 and §12`` share the name before them);
- names of the research notes that live outside the repository (``reference/…``, ``DESIGN.md``,
  ``seed 000``…) must not appear at all.

``--rewrite`` first turns the old forms into the docs/ pages that replaced them:
``reference/koordinator.md §N`` and a bare ``§N`` → ``docs/koordinator.md §N``; ``peers.md §N`` →
``docs/node-interfaces.md §N``; ``DESIGN.md §N`` → ``docs/design.md §N``; ``seed 000`` →
``docs/node-lock.md``; ``seed 004`` → ``docs/koordinator.md §5.4``; and a few single files. A mapping
applies only when its target page exists. What is left is printed for a person to fix; exit 1 then.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MAX_LINE = 120  # ruff's line-length: rewritten lines that grow past it are reported

# Old name as cited → the page that replaced it (section numbers kept).
RENAMES: tuple[tuple[str, str], ...] = (
    ("reference/koordinator.md", "docs/koordinator.md"),
    ("koordinator.md", "docs/koordinator.md"),
    ("reference/peers.md", "docs/node-interfaces.md"),
    ("peers.md", "docs/node-interfaces.md"),
    ("../shared/DESIGN.md", "docs/design.md"),
    ("DESIGN.md", "docs/design.md"),
)
# Whole phrases (checked before RENAMES), for references whose section numbers changed.
PHRASES: tuple[tuple[str, str], ...] = (
    ("reference/containerd/README.md §4", "docs/design.md §7"),
    ("reference/gpu-machine.md", "docs/node-interfaces.md §15"),
    ("(gpu-machine.md)", "(docs/node-interfaces.md §15)"),
    ("reference/proxy-designs.md", "docs/design.md §3.1"),
    ("seed 000's format", "the format of docs/node-lock.md §2"),
    ("as the seed says", "as the proposal says (docs/node-lock.md §2)"),
    ("seed 000", "docs/node-lock.md"),
    ("seed 004", "docs/koordinator.md §5.4"),
)
# Names of documents outside the repository; any mention of one is reported.
OUTSIDE = re.compile(
    r"(?<![\w/.-])(?:\.\./shared/|reference/)[\w./-]+\.md"
    r"|(?<![\w/.-])(?:koordinator|peers|DESIGN|gpu-machine|proxy-designs|cgroup-v2-vm|image-build)\.md"
    r"|\bseeds?\b[ /]*0\d\d|\bthe seed\b",
)
_NUM = r"\d+(?:\.\d+)*"
_MORE = rf"(?:\s*(?:[–-]|,|and|or)\s*§?{_NUM}(?!\w))*"
# A citation: an optional .md name (possibly wrapped onto the next comment line), then § numbers.
CITATION = re.compile(
    rf"(?:(?P<name>[\w./-]+\.md)\)?(?P<gap>[ \t]+|[ \t]*\n[ \t]*(?:#|//|\*|\"\"\")?[ \t]*))?"
    rf"(?P<refs>§{_NUM}{_MORE})"
)
RFC = re.compile(rf"\b(RFC \d+) §({_NUM})")
# A comment rule such as "# ------- resctrl (§3.3)": dashes give way when the reference makes it longer.
RULE = re.compile(r"^(?P<lead>\s*# )(?P<dashes>-{3,})(?P<rest> .*)$")
SELF = Path(__file__).resolve()
POSSESSIVE = re.compile(r"\.md's\b")


@dataclass(frozen=True, slots=True)
class Finding:
    path: str
    line: int
    text: str
    why: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.why}: {self.text.strip()[:110]}"


def tracked_files() -> list[Path]:
    out = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, check=True, capture_output=True).stdout
    paths = [REPO / name for name in out.decode().split("\0") if name and "_pb2" not in name]
    return [path for path in paths if path.resolve() != SELF]


def read_text(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except (UnicodeDecodeError, IsADirectoryError, FileNotFoundError):
        return None


def resolves(name: str, citing: Path) -> bool:
    return (REPO / name).is_file() or (citing.parent / name).is_file()


def _line_of(text: str, offset: int) -> tuple[int, str]:
    start = text.rfind("\n", 0, offset) + 1
    end = text.find("\n", offset)
    return text.count("\n", 0, offset) + 1, text[start : end if end >= 0 else len(text)]


def check_text(path: Path, text: str) -> list[Finding]:
    rel = str(path.relative_to(REPO))
    found: list[Finding] = []
    for match in CITATION.finditer(text):
        name = match.group("name")
        if name is not None and resolves(name, path):
            continue
        line, shown = _line_of(text, match.start("refs"))
        why = f"{name} is not in the repository" if name else "§ without a file name"
        found.append(Finding(rel, line, shown, why))
    for match in POSSESSIVE.finditer(text):
        line, shown = _line_of(text, match.start())
        found.append(Finding(rel, line, shown, "a file name as a possessive: reword"))
    for match in OUTSIDE.finditer(text):
        if match.group(0).endswith(".md") and resolves(match.group(0), path):
            continue  # e.g. "koordinator.md" inside docs/, next to docs/koordinator.md
        line, shown = _line_of(text, match.start())
        found.append(Finding(rel, line, shown, f"names {match.group(0)!r}, which is not in the repository"))
    first: dict[int, Finding] = {}
    for finding in found:  # one finding per line is enough to send a person there
        first.setdefault(finding.line, finding)
    return [first[line] for line in sorted(first)]


def _target(name: str) -> str | None:
    for old, new in RENAMES:
        if name == old or name.endswith("/" + old) and not name.startswith("docs/"):
            return new if (REPO / new).is_file() else None
    return None


def _rewrite_citation(match: re.Match[str], in_docs: bool) -> str:
    name, refs = match.group("name"), match.group("refs")
    if name is None:
        if in_docs or not (REPO / "docs/koordinator.md").is_file():
            return match.group(0)
        return "docs/koordinator.md " + refs
    new = None if in_docs else _target(name)
    if new is None:
        return match.group(0)
    return match.group(0).replace(name, new, 1)


def rewrite_text(path: Path, text: str) -> str:
    in_docs = path.relative_to(REPO).parts[0] == "docs"
    if in_docs:
        return text
    text = RFC.sub(r"\1 section \2", text)
    for old, new in PHRASES:
        target = re.search(r"docs/[\w./-]+\.md", new)
        if target is not None and (REPO / target.group(0)).is_file():
            text = text.replace(old, new)
    text = CITATION.sub(lambda m: _rewrite_citation(m, in_docs), text)
    for old, new in RENAMES:  # names cited without a section (e.g. "design in ../shared/DESIGN.md")
        if (REPO / new).is_file():
            text = re.sub(rf"(?<![\w/.-]){re.escape(old)}(?![\w])", new, text)
    return "\n".join(_fit_rule(line) for line in text.split("\n"))


def _fit_rule(line: str) -> str:
    match = RULE.match(line)
    if match is None or len(line) <= MAX_LINE:
        return line
    keep = max(3, len(match.group("dashes")) - (len(line) - MAX_LINE))
    return match.group("lead") + "-" * keep + match.group("rest")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rewrite", action="store_true", help="rewrite the old forms in place first")
    args = parser.parse_args(argv)
    findings: list[Finding] = []
    for path in tracked_files():
        text = read_text(path)
        if text is None or ("§" not in text and "seed" not in text and ".md" not in text):
            continue
        if args.rewrite:
            new = rewrite_text(path, text)
            if new != text:
                path.write_text(new, encoding="utf-8")
                old_lines = set(text.splitlines())
                for number, line in enumerate(new.splitlines(), 1):
                    if len(line) > MAX_LINE and line not in old_lines:
                        findings.append(Finding(str(path.relative_to(REPO)), number, line, "longer than 120"))
                text = new
        findings += check_text(path, text)
    for finding in findings:
        print(finding)
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
