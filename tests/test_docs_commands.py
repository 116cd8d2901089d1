"""Every shell command in README.md, deploy/README.md and docs/*.md runs here, exactly as written, or is marked as
not runnable here; a wrong comma, a stale flag or a renamed value then fails the build.

Which text is a command:
- every command line of a fenced block tagged ``sh`` (continuation lines joined, ``#`` comments dropped);
- an inline code span in prose whose first word (after ``VAR=value`` prefixes) is a program of PROGRAMS or a path
  under PATH_PREFIXES, with at least one argument: `make test` and `sudo scripts/uninstall.sh` are commands, a bare
  name such as `scripts/containerd-up.sh` or `koordlet` is not.

A command that cannot run here is marked by a line ``<!-- not runnable here: <reason> -->`` directly before its block
(a fenced block, or the paragraph, list item or table an inline command is in), or directly before an inline span.

How each runs here (``plan``), always from the repository root, with Helm, kubectl and promtool from
scripts/fetch-tools.sh:
- ``helm template``/``lint``/``show``: as written; ``helm install`` of a chart in this repository: as written plus
  ``--dry-run=client`` (renders and checks every value; contacts no cluster);
- ``kubectl kustomize``: as written; ``kubectl get``: as written, against the project's API server holding the
  chart's CRDs;
- ``make``: ``make lint`` as written; every other target (the suite, the demo, the image, the VM stage, benchmarks)
  is not cheap and runs as ``make -n`` (the target exists and its recipe expands);
- a script of scripts/ that has ``--dry-run``: with ``--dry-run`` (``sudo`` dropped: the tests run as root);
- ``.venv/bin/python -m pytest``: with ``--collect-only`` (the paths and options are right; running them is the suite);
- ``.venv/bin/python`` with ``--seconds N``, N at most 10: as written (it ends by itself);
- ``koordlet``/``koord-runtime-proxy`` with ``-h``: as written;
- ``promtool check rules``/``test rules``: as written (Debian 12's promtool from scripts/fetch-tools.sh).
Anything else (a cluster, systemd, a node, a benchmark, a pipeline) must be marked.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.deploy.tools import chart_documents, create_object, tool
from tests.support.apiserver import ApiServer, kube_api_client, write_kubeconfig

ROOT = Path(__file__).resolve().parents[1]
DOCS = ("README.md", "deploy/README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md")))
PROGRAMS = frozenset({"helm", "kubectl", "make", "sudo", "curl", "systemctl", "journalctl", "ctr", "crictl", "skopeo",
                      "docker", "podman", "buildah", "apt-get", "apt", "pip", "git", "bash", "python", "python3",
                      "koordlet", "koord-runtime-proxy", "promtool"})
PATH_PREFIXES = ("scripts/", "./", ".venv/", "bench/", "demo/")
CHEAP_MAKE_TARGETS = frozenset({"lint"})
MARKER = re.compile(r"<!--\s*not runnable here:\s*(?P<reason>[^>]*?)\s*-->")
_FENCE = re.compile(r"^\s*```\s*(?P<lang>[\w+-]*)")
_SPAN = re.compile(r"(?<!`)`(?P<code>[^`]+)`(?!`)")
_ENV = re.compile(r"^(?:[A-Za-z_][A-Za-z0-9_]*=\S*\s+)+")
_OPERATORS = frozenset({"|", "||", "&&", ";", ">", ">>", "<", "&"})


@dataclass(frozen=True, slots=True)
class DocCommand:
    doc: str
    line: int
    text: str
    inline: bool
    marked: str | None  # the reason given, when marked not runnable here

    @property
    def where(self) -> str:
        return f"{self.doc}:{self.line}"


@dataclass(frozen=True, slots=True)
class Plan:
    """How a command runs here: argv and environment, and how that differs from the text (``how``)."""

    argv: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)
    how: str = "as written"
    needs_api_server: bool = False


def is_command(span: str) -> bool:
    """An inline span is a command when it names a program or a script and gives it an argument."""
    words = _ENV.sub("", span.strip()).split()
    return len(words) >= 2 and (words[0] in PROGRAMS or words[0].startswith(PATH_PREFIXES))


def _block_commands(lines: list[tuple[int, str]]) -> Iterator[tuple[int, str]]:
    """The command lines of an ``sh`` block: continuations joined, blank and comment lines dropped."""
    pending: list[str] = []
    start = 0
    for number, raw in lines:
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if not pending:
            start = number
        if line.endswith("\\"):
            pending.append(line[:-1].rstrip())
            continue
        pending.append(line)
        yield start, " ".join(pending)
        pending = []
    if pending:
        yield start, " ".join(pending)


def _marker(line: str) -> str | None:
    match = MARKER.fullmatch(line.strip())
    return match.group("reason") if match else None


def extract(doc: str, text: str) -> list[DocCommand]:
    """Every command of one markdown document, in order."""
    lines = text.splitlines()
    out: list[DocCommand] = []
    index = 0
    paragraph: list[tuple[int, str]] = []
    paragraph_mark: str | None = None

    def flush() -> None:
        nonlocal paragraph, paragraph_mark
        if paragraph:
            out.extend(_inline_commands(doc, paragraph, paragraph_mark))
        paragraph, paragraph_mark = [], None

    while index < len(lines):
        line = lines[index]
        fence = _FENCE.match(line)
        if fence:
            flush()
            mark = _marker(lines[index - 1]) if index else None
            body: list[tuple[int, str]] = []
            index += 1
            while index < len(lines) and not _FENCE.match(lines[index]):
                body.append((index + 1, lines[index]))
                index += 1
            if fence.group("lang") == "sh":
                out.extend(DocCommand(doc, number, command, False, mark) for number, command in _block_commands(body))
            index += 1
            continue
        if not line.strip() or _marker(line) is not None:
            flush()
            if _marker(line) is not None:
                paragraph_mark = _marker(line)
            index += 1
            continue
        paragraph.append((index + 1, line))
        index += 1
    flush()
    return out


def _inline_commands(doc: str, paragraph: list[tuple[int, str]], mark: str | None) -> list[DocCommand]:
    joined = "\n".join(line for _, line in paragraph)
    first = paragraph[0][0]
    out = []
    for match in _SPAN.finditer(joined):
        code = " ".join(match.group("code").replace("\\|", "|").split())  # a table cell escapes its pipes
        if not is_command(code):
            continue
        inline_mark = None
        preceding = joined[:match.start()].rstrip()
        found = list(MARKER.finditer(preceding))
        if found and found[-1].end() == len(preceding):
            inline_mark = found[-1].group("reason")
        out.append(DocCommand(doc, first + joined.count("\n", 0, match.start()), code, True, inline_mark or mark))
    return out


def all_commands() -> list[DocCommand]:
    return [command for doc in DOCS for command in extract(doc, (ROOT / doc).read_text())]


def _tokens(text: str) -> list[str]:
    lexer = shlex.shlex(text, posix=True, punctuation_chars=";&|<>")
    lexer.whitespace_split = True
    lexer.commenters = "#"
    return list(lexer)


def plan(text: str) -> Plan | str:
    """How ``text`` runs here, or why it cannot."""
    try:
        words = _tokens(text)
    except ValueError as exc:
        return f"does not parse as a shell command: {exc}"
    if _OPERATORS & set(words):
        return "a pipeline or a list of commands"
    env: dict[str, str] = {}
    while words and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", words[0]):
        name, _, value = words.pop(0).partition("=")
        env[name] = value
    if words[:1] == ["sudo"]:
        words = words[1:]
    if not words:
        return "no command"
    program, args = words[0], words[1:]
    for planner in (_helm, _kubectl, _make, _script, _python, _agent, _promtool):
        planned = planner(program, args, env)
        if planned is not None:
            return planned
    return f"{program} needs what this machine has not (a cluster, systemd, a node of its own)"


def _helm(program: str, args: list[str], env: dict[str, str]) -> Plan | str | None:
    if program != "helm":
        return None
    sub = args[:1]
    if sub in (["template"], ["lint"], ["show"], ["version"]):
        return Plan(("helm", *args), env)
    if sub == ["install"]:
        chart = args[2] if len(args) > 2 else ""  # helm install NAME CHART [flags], as the docs write it
        if chart.startswith("-") or not (ROOT / chart).is_dir():
            return "helm install of a chart that is not in this repository"
        return Plan(("helm", *args, "--dry-run=client"), env, "with --dry-run=client")
    return f"helm {' '.join(sub)} needs a release in a cluster"


def _kubectl(program: str, args: list[str], env: dict[str, str]) -> Plan | str | None:
    if program != "kubectl":
        return None
    if args[:1] == ["kustomize"]:
        return Plan(("kubectl", *args), env)
    if args[:1] == ["get"]:
        return Plan(("kubectl", *args), env, "against the project's API server", needs_api_server=True)
    return f"kubectl {args[0] if args else ''} needs a cluster"


def _make(program: str, args: list[str], env: dict[str, str]) -> Plan | str | None:
    if program != "make":
        return None
    targets = [a for a in args if not a.startswith("-") and "=" not in a]
    if targets and set(targets) <= CHEAP_MAKE_TARGETS:
        return Plan(("make", *args), env)
    return Plan(("make", "-n", *args), env, "make -n: the target is not cheap")


def _script(program: str, args: list[str], env: dict[str, str]) -> Plan | str | None:
    if program == "bash" and args[:1] and args[0].startswith("scripts/"):
        program, args = args[0], args[1:]
    if not program.startswith("scripts/"):
        return None
    script = ROOT / program
    if not script.is_file():
        return f"{program} does not exist"
    if "--dry-run" not in script.read_text():
        return f"{program} has no --dry-run"
    return Plan(("bash", program, *args, *([] if "--dry-run" in args else ["--dry-run"])), env, "with --dry-run")


def _python(program: str, args: list[str], env: dict[str, str]) -> Plan | str | None:
    if program not in (".venv/bin/python", "python", "python3"):
        return None
    if args[:2] == ["-m", "pytest"]:
        return Plan((".venv/bin/python", *args, "--collect-only", "-q"), env,
                    "with --collect-only: running it is the suite")
    if "--seconds" in args and args[args.index("--seconds") + 1:][:1] and \
            args[args.index("--seconds") + 1].isdigit() and int(args[args.index("--seconds") + 1]) <= 10:
        return Plan((".venv/bin/python", *args), env, "as written: it ends by itself within --seconds")
    return "a program or benchmark that runs for minutes"


def _agent(program: str, args: list[str], env: dict[str, str]) -> Plan | str | None:
    if program in ("koordlet", "koord-runtime-proxy") and set(args) & {"-h", "--help"}:
        return Plan((f".venv/bin/{program}", *args), env)
    return None


def _promtool(program: str, args: list[str], env: dict[str, str]) -> Plan | str | None:
    if program != "promtool":
        return None
    if args[:2] in (["check", "rules"], ["test", "rules"]):
        return Plan(("promtool", *args), env)
    return f"promtool {' '.join(args[:2])} needs a Prometheus server"


# ---------------------------------------------------------------------------------------------------- the tests

COMMANDS = all_commands()
RUNNABLE = [c for c in COMMANDS if c.marked is None and isinstance(plan(c.text), Plan)]


@pytest.fixture(scope="module")
def run_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """PATH with Helm, kubectl (1.35) and promtool first and the project's venv; KUBECONFIG for the project's API
    server, which holds the chart's CRDs (so `kubectl get crd ...` sees what an install of ours leaves)."""

    home = tmp_path_factory.mktemp("docs-commands")
    bin_dir = home / "bin"
    bin_dir.mkdir()
    (bin_dir / "helm").symlink_to(tool("helm"))
    (bin_dir / "kubectl").symlink_to(tool("kubectl-1.35"))
    (bin_dir / "promtool").symlink_to(tool("promtool"))
    with ApiServer(crd_dir=None) as server, kube_api_client(server) as client:
        for doc in chart_documents():
            if doc["kind"] == "CustomResourceDefinition":
                create_object(client, doc)
        yield {"PATH": f"{bin_dir}:{ROOT / '.venv' / 'bin'}:{os.environ['PATH']}", "HOME": str(home),
               "KUBECONFIG": str(write_kubeconfig(server, home / "kubeconfig")), "LANG": "C.UTF-8"}


@pytest.mark.parametrize("command", RUNNABLE, ids=[c.where for c in RUNNABLE])
def test_the_command_runs_as_written(command: DocCommand, run_env: dict[str, str]) -> None:
    planned = plan(command.text)
    assert isinstance(planned, Plan)
    done = subprocess.run(planned.argv, cwd=ROOT, env=run_env | planned.env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, (f"{command.where}: `{command.text}` ({planned.how}) failed with "
                                  f"{done.returncode}:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")


def test_every_command_that_cannot_run_here_is_marked() -> None:
    unmarked = [f"{c.where}: `{c.text}`: {plan(c.text)}" for c in COMMANDS
                if c.marked is None and not isinstance(plan(c.text), Plan)]
    assert unmarked == [], ("mark these <!-- not runnable here: <reason> --> (or make them runnable):\n"
                            + "\n".join(unmarked))


def test_the_marked_commands_are_listed_with_their_reasons() -> None:
    marked = [c for c in COMMANDS if c.marked is not None]
    assert all(c.marked for c in marked), "a marker needs a reason"
    print(f"\n{len(RUNNABLE)} commands run here, {len(marked)} are marked not runnable here:")
    for command in marked:
        print(f"  {command.where}: `{command.text}` -- {command.marked}")


def test_a_marker_marks_a_command() -> None:
    """A marker left behind when its command went is stale: every marker line precedes at least one command."""
    stale = []
    for doc in DOCS:
        lines = (ROOT / doc).read_text().splitlines()
        marked_lines = {c.line for c in extract(doc, "\n".join(lines))}
        for number, line in enumerate(lines, 1):
            if _marker(line) is None:
                continue
            end = next((n for n in range(number, len(lines)) if not lines[n].strip()), len(lines))
            body_end = end
            if _FENCE.match(lines[number] if number < len(lines) else ""):
                body_end = next(n for n in range(number + 1, len(lines)) if _FENCE.match(lines[n])) + 1
            if not any(number < m <= body_end + 1 for m in marked_lines):
                stale.append(f"{doc}:{number}")
    assert stale == []


def test_the_rules_on_a_small_document() -> None:
    text = "\n".join([
        "Run `make test` or `helm lint --strict deploy/chart/koordlet-py`; `scripts/containerd-up.sh` is a name.",
        "",
        "<!-- not runnable here: needs a cluster -->",
        "| a | `kubectl apply -k deploy/` |",
        "| b | `ctr plugins ls \\| grep nri` |",
        "",
        "See <!-- not runnable here: a node --> `systemctl restart containerd` and `KPY_CONTAINERD=1.7 make test`.",
        "```sh",
        "helm template x deploy/chart/koordlet-py \\",
        "  --set a=b   # a comment",
        "# only a comment",
        "```",
        "<!-- not runnable here: systemd -->",
        "```sh",
        "systemctl daemon-reload",
        "```",
        "```text",
        "helm not a command here",
        "```",
    ])
    found = [(c.line, c.text, c.inline, c.marked) for c in extract("x.md", text)]
    assert found == [
        (1, "make test", True, None), (1, "helm lint --strict deploy/chart/koordlet-py", True, None),
        (4, "kubectl apply -k deploy/", True, "needs a cluster"),
        (5, "ctr plugins ls | grep nri", True, "needs a cluster"),
        (7, "systemctl restart containerd", True, "a node"), (7, "KPY_CONTAINERD=1.7 make test", True, None),
        (9, "helm template x deploy/chart/koordlet-py --set a=b   # a comment", False, None),
        (15, "systemctl daemon-reload", False, "systemd")]
    assert plan("KPY_CONTAINERD=1.7 make test") == Plan(("make", "-n", "test"), {"KPY_CONTAINERD": "1.7"},
                                                        "make -n: the target is not cheap")
    assert plan("sudo scripts/uninstall.sh").argv == ("bash", "scripts/uninstall.sh", "--dry-run")
    assert plan('helm install r deploy/chart/koordlet-py --set koordlet.features="A=true\\,B=true"').argv == (
        "helm", "install", "r", "deploy/chart/koordlet-py", "--set", "koordlet.features=A=true\\,B=true",
        "--dry-run=client")
    assert isinstance(plan("ctr plugins ls | grep nri"), str) and isinstance(plan("helm uninstall r"), str)
