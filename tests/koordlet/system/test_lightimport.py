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


def test_the_agent_loads_the_kubernetes_clients_parts_it_uses_and_the_rest_on_demand(tmp_path: Path) -> None:
    """In a fresh interpreter: koordlet's modules and an in-cluster ApiClient leave kube_config's auth plugins
    (google.auth, oauthlib), dynamic and leader election unloaded; a kubeconfig file loads kube_config, and the
    package's usual names still work."""
    unused = ("kubernetes.config.kube_config", "google.auth", "oauthlib", "requests_oauthlib", "kubernetes.dynamic",
              "kubernetes.leaderelection")
    probe = ("import sys, koordlet.main, koordlet.kubeapi, kubernetes.client; kubernetes.client.ApiClient(); "
             f"print(sorted(m for m in {unused!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]"
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(textwrap.dedent("""
        apiVersion: v1
        kind: Config
        clusters: [{name: c, cluster: {server: "https://127.0.0.1:6443"}}]
        users: [{name: u, user: {token: t}}]
        contexts: [{name: x, context: {cluster: c, user: u}}]
        current-context: x
    """))
    probe = ("import sys, types, kubernetes, koordlet.main, koordlet.agent.lifecycle as m; "
             f"c = m.new_api_client(types.SimpleNamespace(kubeconfig={str(kubeconfig)!r})); "
             "print(c.configuration.host, c.user_agent, 'kubernetes.config.kube_config' in sys.modules, "
             "kubernetes.config.load_kube_config.__name__, kubernetes.watch.Watch.__name__)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.split() == ["https://127.0.0.1:6443", "koordlet", "True", "load_kube_config", "Watch"]
