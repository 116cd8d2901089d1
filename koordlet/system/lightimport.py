"""Register a package without running its ``__init__``, so only the submodules asked for are loaded.

pyroute2's ``__init__`` imports every netlink family it ships (NDB, IPDB, conntrack, nl80211, WireGuard,
IPVS, …) to offer them as top-level names. The tc network QoS needs rtnetlink's tc calls only: importing the
package whole costs the agent about 10 MiB of RSS, its ``iproute`` and ``netlink`` parts about 4 MiB
(measured with grpc and the kubernetes client already loaded, pyroute2 0.9.7).

The package's ``__init__`` still runs, once, in the same module object, the first time anything asks it for a
top-level name that is not a submodule (``from pyroute2 import NetNS``): a PEP 562 module ``__getattr__`` does
it, so code that uses the package the usual way keeps working.
"""

from __future__ import annotations

import importlib.util
import sys
import threading

_lock = threading.Lock()


def register_without_init(name: str) -> None:
    """Make ``import name.sub`` load ``sub`` without running ``name/__init__.py`` (no-op if already imported)."""
    with _lock:
        if name in sys.modules:
            return
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None or spec.submodule_search_locations is None:
            raise ImportError(f"{name} is not an importable package")
        module = importlib.util.module_from_spec(spec)  # __path__ set, __init__ not run

        def run_init(attr: str) -> object:
            # A submodule (``from pyroute2 import config`` inside the package) is imported as one, not a reason
            # to run the __init__.
            if not attr.startswith("__") and importlib.util.find_spec(f"{name}.{attr}") is not None:
                return importlib.import_module(f"{name}.{attr}")
            with _lock:
                if module.__dict__.get("__getattr__") is run_init:
                    del module.__dict__["__getattr__"]
                    spec.loader.exec_module(module)  # type: ignore[union-attr]
            try:
                return module.__dict__[attr]
            except KeyError:
                raise AttributeError(f"module {name!r} has no attribute {attr!r}") from None

        module.__dict__["__getattr__"] = run_init
        sys.modules[name] = module
