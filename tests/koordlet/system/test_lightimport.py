"""register_without_init: a package's submodules load without its __init__, which runs once, on demand."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from koordlet.system.lightimport import register_without_init


@pytest.fixture
def package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    name = f"kpy_light_{id(tmp_path)}"
    root = tmp_path / name
    (root / "sub").mkdir(parents=True)
    (root / "__init__.py").write_text(textwrap.dedent(f"""
        import sys
        sys.modules[{name!r}].INIT_RUNS = getattr(sys.modules[{name!r}], "INIT_RUNS", 0) + 1
        from {name}.heavy import HEAVY
        TOP = "top-level name"
    """))
    (root / "heavy.py").write_text("HEAVY = 'loaded by __init__ only'\n")
    (root / "config.py").write_text("VALUE = 1\n")
    (root / "sub" / "__init__.py").write_text(f"from {name} import config\nUSES = config.VALUE\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    for module in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
        del sys.modules[module]


def test_submodules_load_without_the_init_which_runs_once_when_a_top_level_name_is_asked(package: str) -> None:
    register_without_init(package)
    sub = __import__(f"{package}.sub", fromlist=["USES"])
    assert sub.USES == 1  # `from package import config` inside it: a submodule, no __init__ for it
    assert f"{package}.heavy" not in sys.modules and "INIT_RUNS" not in vars(sys.modules[package])
    top = sys.modules[package]
    assert top.TOP == "top-level name"  # asked for: the real __init__ runs, in the same module
    assert top.INIT_RUNS == 1 and f"{package}.heavy" in sys.modules
    assert top.HEAVY == "loaded by __init__ only" and top.TOP == "top-level name" and top.INIT_RUNS == 1
    with pytest.raises(AttributeError):
        top.NOT_THERE  # noqa: B018


def test_an_already_imported_package_is_left_alone_and_a_module_is_refused(package: str) -> None:
    top = __import__(package)
    register_without_init(package)
    assert sys.modules[package] is top and top.INIT_RUNS == 1
    with pytest.raises(ImportError):
        register_without_init("colorsys")  # a module, not a package


def test_the_agents_tc_code_loads_pyroute2s_rtnetlink_parts_only() -> None:
    """In a fresh interpreter: importing koordlet's tc code leaves pyroute2's __init__ (NDB, IPDB, …) unrun."""
    probe = ("import sys, koordlet.netqos.manager; "
             "print(sorted(m for m in ('pyroute2.ndb.main', 'pyroute2.ipdb', 'pyroute2.iproute.linux') "
             "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]"
    probe = ("import sys; from koordlet.system import tc; ipr = tc.open_iproute(); "
             "print(ipr.link_lookup(ifname='lo'), 'pyroute2.ndb.main' in sys.modules); ipr.close()")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.split()[-1] == "False"
