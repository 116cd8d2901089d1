"""Dependency direction (DESIGN.md §2): wire (the stubs and socket helpers both sides share) imports
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
    found = []
    root = REPO / package
    for path in [root] if root.is_file() else sorted(root.rglob("*.py")):
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
    if not (REPO / "hooks").is_dir():
        pytest.skip("no hooks package yet")
    def allowed(name: str) -> bool:
        return _top(name) not in ("koordlet", "runtimeproxy") or name.startswith("koordlet.api")

    assert _violations("hooks", allowed) == []


@pytest.mark.parametrize("leaf,may_import", [("koordlet/api", ()), ("koordlet/system", ("koordlet.api",))])
def test_koordlet_leaves_import_no_other_koordlet_part(leaf: str, may_import: tuple[str, ...]) -> None:
    if not (REPO / leaf).is_dir():
        pytest.skip(f"no {leaf} yet")
    allowed = (leaf.replace("/", "."), *may_import)
    assert _violations(leaf, lambda n: _top(n) != "koordlet" or n == "koordlet" or n.startswith(allowed)) == []


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
