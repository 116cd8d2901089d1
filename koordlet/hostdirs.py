"""Host directories koordlet makes for containers' mounts (HAMi-core's per-container cache dir
``<library dir>/containers/<pod uid>_<container>``, gate HamiCoreVGPUMonitor, hooks/gpu.py), recorded with their pod
so that they go when the pod goes (the collector, :mod:`koordlet.collector`, through the plan runner).

Both ends stay below one root (``allowed_root``: the HAMi-core cache root) and never follow a symlink: a dir is made
only when its parent resolves inside the root, and removed only when it is a real directory inside it.
"""

from __future__ import annotations

import logging
import os
import shutil
import time

from hooks.protocol import Changes
from koordlet.executor.originals import Originals

logger = logging.getLogger(__name__)


def _inside(root: str, path: str) -> bool:
    real_root = os.path.realpath(root)
    return os.path.commonpath([real_root, os.path.realpath(os.path.dirname(path))]) == real_root


def make_host_dirs(changes: Changes, allowed_root: str, record: Originals | None = None,
                   pod_uid: str = "") -> list[str]:
    """Make the host dirs a plugin's mounts need (mode 0777, as HAMi-core's per-container cache dir must be
    writable by any container user), only below ``allowed_root``, each recorded in ``record`` as ``pod_uid``'s
    (one that was there already too: its name is that pod's); returns the dirs refused or not made."""
    failed: list[str] = []
    for path in changes.host_dirs:
        if not _inside(allowed_root, path) or os.path.islink(path):
            logger.warning("not making %s: outside %s", path, allowed_root)
            failed.append(path)
            continue
        try:
            os.makedirs(path, exist_ok=True)
            os.chmod(path, 0o777)
        except OSError as err:
            logger.warning("cannot make %s: %s", path, err)
            failed.append(path)
            continue
        if record is not None and pod_uid:
            record.record(path, f"{pod_uid} {time.time():.0f}")
    return failed


def remove_host_dir(path: str, allowed_root: str) -> bool:
    """Remove ``path`` and what is in it, if it is a directory (not a symlink) below ``allowed_root``; True when
    removed, False when it was not there. Raises OSError (ValueError for a path outside the root)."""
    if not _inside(allowed_root, path):
        raise ValueError(f"{path} is not below {allowed_root}")
    if os.path.islink(path):
        raise ValueError(f"{path} is a symlink")
    if not os.path.lexists(path):
        return False
    shutil.rmtree(path)
    return True
