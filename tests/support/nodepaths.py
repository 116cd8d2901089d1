"""Guards the node's own koordlet paths during a test session (a pytest plugin, loaded by tests/conftest.py).

A test runs its koordlets, proxies and hook servers on paths under its tmp_path. A test that starts one on a
default path (``/var/run/koordlet/...``, ``/etc/runtime/hookserver.d``) writes into what a real koordlet on the
node owns, and leaves it behind for the deploy tests that refuse to touch a node with a koordlet of its own. So:

- in this process, an audit hook sees every ``mkdir`` and file opened for writing under those paths, and the test
  that does it fails, named, with what it wrote (a test that owns them says so with the ``owns_node_paths``
  marker: the image test, which checks they are empty first and removes what it made);
- a path that appears during a test in a subprocess (a koordlet started as a command) is caught after the test
  when this process is no xdist worker: a plain run, or the serial and alone sessions of scripts/test-all.sh, where
  the tests that own those paths run one after another (a worker's neighbour might own them at that moment).

Whatever a failing test left is removed, so one mistake fails one test, not the next one that looks.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator

import pytest

from tests.support.nodestate import normal_path, written_by_open

NODE_PATHS = ("/run/koordlet", "/etc/runtime/hookserver.d")  # /var/run/koordlet is /run/koordlet
_seen: list[str] = []
_active = False
_owns = False


def _under_node_paths(path: object) -> str | None:
    """``path`` (made absolute, /var/run as /run) when it lies under NODE_PATHS, else None."""
    normal = normal_path(path)
    if normal is None or not any(normal == p or normal.startswith(p + "/") for p in NODE_PATHS):
        return None
    return normal


def _audit(event: str, args: tuple[object, ...]) -> None:
    if not _active or _owns:
        return
    if event == "os.mkdir":
        hit = _under_node_paths(args[0])
    elif event == "open":
        hit = _under_node_paths(written_by_open(args))
    else:
        return
    if hit is not None:
        _seen.append(hit)


sys.addaudithook(_audit)


def _existing() -> set[str]:
    return {p for p in NODE_PATHS if os.path.exists(p)}


@pytest.fixture(autouse=True)
def _node_paths_stay_untouched(request: pytest.FixtureRequest) -> Iterator[None]:
    global _active, _owns
    owns = request.node.get_closest_marker("owns_node_paths") is not None
    alone = "PYTEST_XDIST_WORKER" not in os.environ
    before = _existing()
    _seen.clear()
    _active, _owns = True, owns
    try:
        yield
    finally:
        _active, _owns = False, False
    if owns:
        return
    written = sorted(set(_seen))
    appeared = sorted(_existing() - before) if alone else []
    for root in NODE_PATHS:
        if root not in before and (root in appeared or any(w == root or w.startswith(root + "/") for w in written)):
            shutil.rmtree(root, ignore_errors=True)
    if written or appeared:
        pytest.fail(f"this test wrote into the node's own koordlet paths ({', '.join(written or appeared)}): "
                    "give the koordlet, proxy or hook server it starts paths under tmp_path", pytrace=False)
