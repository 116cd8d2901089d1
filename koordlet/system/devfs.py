"""Device nodes (``/dev``): which exist under ``dev_dir`` (:mod:`koordlet.system.roots`), and the path a
container runtime uses for one."""

from __future__ import annotations

import os
from collections.abc import Iterable

from koordlet.system.roots import DEV_DIR


def device_path(name: str) -> str:
    """A device node's path on the host as the container runtime sees it: always under ``/dev``, whatever
    ``dev_dir`` the agent itself reads through."""
    return os.path.join(DEV_DIR, name)


def existing_devices(names: Iterable[str], dev_dir: str = DEV_DIR) -> tuple[str, ...]:
    """The ``names`` that exist under ``dev_dir``, in the given order."""
    return tuple(name for name in names if os.path.exists(os.path.join(dev_dir, name)))
