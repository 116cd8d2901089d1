"""Dependency direction (docs/design.md §2): wire (the stubs and socket helpers both sides share) imports
nothing of koordlet, runtimeproxy or hooks; runtimeproxy imports nothing of koordlet or hooks, and
koordlet nothing of runtimeproxy (both meet only in wire); hooks imports only koordlet.api (and itself,
and wire if it needs to); koordlet.api imports no other koordlet part, and koordlet.system only
koordlet.api (the two leaves, api the lower one)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _imports(package: str) -> list[tuple[Path, str]]:
    """Every import of ``package`` (a package dir or a module file). A package a rule guards that is not there
    fails the rule: a renamed package must not turn its rule off."""
    found = []
    root = REPO / package
    paths = [root] if root.is_file() else sorted(root.rglob("*.py"))
    if not paths:
        pytest.fail(f"{package} is guarded by a layering rule but holds no Python module (renamed or moved?)")
    for path in paths:
        tree = ast.parse(path.read_text(), str(path))
        package_parts = path.parent.relative_to(REPO).parts
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                found += [(path, alias.name) for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:  # relative: resolve against the importing module's package
                    base = list(package_parts[: len(package_parts) - (node.level - 1)])
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                found.append((path, target))
    return found


def _violations(package: str, allowed) -> list[str]:
    return [f"{p.relative_to(REPO)} imports {name}" for p, name in _imports(package) if not allowed(name)]


def _top(name: str) -> str:
    return name.split(".")[0]


def test_wire_imports_nothing_of_koordlet_runtimeproxy_or_hooks() -> None:
    assert _violations("wire", lambda n: _top(n) not in ("koordlet", "runtimeproxy", "hooks")) == []


def test_runtimeproxy_imports_nothing_of_koordlet_or_hooks() -> None:
    assert _violations("runtimeproxy", lambda n: _top(n) not in ("koordlet", "hooks")) == []


def test_koordlet_imports_nothing_of_runtimeproxy() -> None:
    assert _violations("koordlet", lambda n: _top(n) != "runtimeproxy") == []


def test_hooks_import_only_koordlet_api() -> None:
    def allowed(name: str) -> bool:
        return _top(name) not in ("koordlet", "runtimeproxy") or name.startswith("koordlet.api")

    assert _violations("hooks", allowed) == []


@pytest.mark.parametrize("leaf,may_import", [("koordlet/api", ()), ("koordlet/system", ("koordlet.api",))])
def test_koordlet_leaves_import_no_other_koordlet_part(leaf: str, may_import: tuple[str, ...]) -> None:
    allowed = (leaf.replace("/", "."), *may_import)
    assert _violations(leaf, lambda n: _top(n) != "koordlet" or n == "koordlet" or n.startswith(allowed)) == []


def test_the_executor_stands_on_system_api_and_plan_only() -> None:
    """The executor is below everything that writes through it: it imports the kernel interfaces, the API shapes
    and the plan's keys (its records), never a part that decides what to write."""
    allowed = ("koordlet.executor", "koordlet.system", "koordlet.api", "koordlet.plan")
    assert _violations("koordlet/executor", lambda n: _top(n) != "koordlet" or n.startswith(allowed)) == []


# The executor's writers (cgroups, resctrl, nodefiles, pageidle) and their helpers are reached through
# ResourceExecutor only; what else of the package koordlet imports is its records and their keepers.
_EXECUTOR_PUBLIC = ("koordlet.executor", "koordlet.executor.records", "koordlet.executor.lines",
                    "koordlet.executor.originals", "koordlet.executor.metrics")


def test_only_the_executors_face_and_records_are_imported_from_outside_it() -> None:
    found = [(p, name) for p, name in _imports("koordlet") if "executor" not in p.relative_to(REPO).parts
             and name.startswith("koordlet.executor")]
    assert [f"{p.relative_to(REPO)} imports {name}" for p, name in found if name not in _EXECUTOR_PUBLIC] == []


def test_the_audit_log_stands_on_api_and_system_only() -> None:
    """Audit events are written by the runner and the hooks; the log itself knows pods (api) and cgroup dir names
    (system), nothing that acts."""
    allowed = ("koordlet.audit", "koordlet.api", "koordlet.system")
    assert _violations("koordlet/audit", lambda n: _top(n) != "koordlet" or n.startswith(allowed)) == []


# The composition root: the command line (`koordlet explain`) and the agent's lifecycle (the /debug endpoints).
_COMPOSITION_ROOT = ("koordlet/main.py", "koordlet/agent/lifecycle.py")


def test_history_stands_on_system_and_hooks_only_and_only_the_composition_root_imports_debug() -> None:
    """What koordlet did (koordlet.history) is recorded by the runner and the runtime hooks, so it stands below them;
    what shows it (koordlet.debug) reads the states, the QoS manager and the runtime hooks, so only the top (the
    command line and the agent's lifecycle) imports it."""
    allowed = ("koordlet.history", "koordlet.system", "koordlet.api")
    assert _violations("koordlet/history", lambda n: _top(n) != "koordlet" or n.startswith(allowed)) == []
    assert all((REPO / path).is_file() for path in _COMPOSITION_ROOT), "the composition root moved: follow it here"
    found = [(p, name) for p, name in _imports("koordlet") if name.startswith("koordlet.debug")
             and "debug" not in p.relative_to(REPO).parts and p.relative_to(REPO).as_posix() not in _COMPOSITION_ROOT]
    assert [f"{p.relative_to(REPO)} imports {name}" for p, name in found] == []


_MANAGER_MODULES = ("__init__.py", "framework.py", "snapshot.py")  # the manager, its wiring, the snapshot reads


def test_strategies_never_touch_the_executor_or_the_evictor() -> None:
    """A strategy hands a Plan to the runner; only the manager's modules know the runner, the executor (for the
    snapshot's reads) and the evictor."""
    forbidden = ("koordlet.executor", "koordlet.eviction", "koordlet.actuator")
    found = [(p, name) for p, name in _imports("koordlet/qosmanager") if p.name not in _MANAGER_MODULES]
    assert [f"{p.relative_to(REPO)} imports {name}" for p, name in found if name.startswith(forbidden)] == []


def test_plan_is_plain_data_below_every_writer() -> None:
    """koordlet.plan imports only koordlet.api: the strategies, the runtime hooks and the runner all use it."""
    assert _violations("koordlet/plan.py", lambda n: _top(n) != "koordlet" or n.startswith("koordlet.api")) == []


# Kernel state (/proc, /sys, cgroups, resctrl, /dev, tc) is read and written under koordlet/system only; the
# rest of koordlet gets mount dirs from koordlet.system.roots and values from system functions. Flag
# defaults in config.py are the one place above system that spells such a path; docstrings may name them.
# Subprocesses (tc, ip, nvidia-smi...) are kernel state too. The executor writes cgroup and resctrl files
# but only below the CgroupFS and resctrl dir it is given, so it spells no path and passes.
_KERNEL_PREFIXES = ("/proc", "/sys", "/dev")
_MAY_SPELL_KERNEL_PATHS = ("koordlet/system/", "koordlet/config.py")


def _docstring_nodes(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                ids.add(id(first.value))
    return ids


def _is_kernel_path(text: str) -> bool:
    """``/proc``, ``/sys/...``, ``/dev/...``, and the same below a host root (``sys/bus/...`` joined to ``/``)."""
    return any(text == prefix or text.startswith((prefix + "/", prefix[1:] + "/")) for prefix in _KERNEL_PREFIXES)


def _kernel_access_outside_system() -> list[str]:
    found = []
    for path in sorted((REPO / "koordlet").rglob("*.py")):
        rel = path.relative_to(REPO).as_posix()
        if rel.startswith(_MAY_SPELL_KERNEL_PATHS):
            continue
        tree = ast.parse(path.read_text(), rel)
        docstrings = _docstring_nodes(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
                if _is_kernel_path(node.value):
                    found.append(f"{rel}:{node.lineno} spells {node.value!r}")
            elif isinstance(node, ast.Import):
                found += [f"{rel}:{node.lineno} imports {a.name}" for a in node.names if _top(a.name) == "subprocess"]
            elif isinstance(node, ast.ImportFrom) and not node.level and _top(node.module or "") == "subprocess":
                found.append(f"{rel}:{node.lineno} imports from subprocess")
    return found


def test_only_koordlet_system_touches_kernel_files() -> None:
    assert _kernel_access_outside_system() == []


def test_a_rule_over_a_missing_package_fails_rather_than_passing() -> None:
    with pytest.raises(pytest.fail.Exception, match="no_such_package is guarded"):
        _violations("no_such_package", lambda name: True)
