"""Host directories koordlet makes for containers' mounts (HAMi-core's per-container cache dir
``<library dir>/containers/<pod uid>_<container>``, gate HamiCoreVGPUMonitor, hooks/gpu.py), recorded with their pod
so that they go when the pod goes (the collector, :mod:`koordlet.collector`, through the plan runner).

Both ends stay below one root (``allowed_root``: the HAMi-core cache root) and never follow a symlink: a dir is made
only when its parent resolves inside the root, and removed only when it is a real directory inside it.

A dir is recorded before it is made, never after: the collector removes only what the record names, so a dir made
but not recorded would stay for good. One whose record cannot be written is not made, and its container's mount of
it is left out of the answer (:func:`with_host_dirs`): runc would fail the container on a missing mount source, and
HAMi-core's usage region is monitoring, not isolation. That is reported as a dropped hook value (logged, counted,
a Warning Event on the pod).
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import replace

from hooks.protocol import Changes
from hooks.validate import Rejected
from koordlet.executor.originals import Originals

logger = logging.getLogger(__name__)


def _inside(root: str, path: str) -> bool:
    real_root = os.path.realpath(root)
    return os.path.commonpath([real_root, os.path.realpath(os.path.dirname(path))]) == real_root


def make_host_dirs(changes: Changes, allowed_root: str, record: Originals | None = None,
                   pod_uid: str = "") -> dict[str, str]:
    """Make the host dirs a plugin's mounts need (mode 0777, as HAMi-core's per-container cache dir must be
    writable by any container user), only below ``allowed_root``, each recorded in ``record`` as ``pod_uid``'s
    before it is made (one that was there already too: its name is that pod's); returns the dirs refused or not
    made, each with why."""
    failed: dict[str, str] = {}
    for path in changes.host_dirs:
        if not _inside(allowed_root, path) or os.path.islink(path):
            failed[path] = f"outside {allowed_root}"
            logger.warning("not making %s: %s", path, failed[path])
            continue
        recorded_now = record is not None and bool(pod_uid) and record.get(path) is None
        if recorded_now and record is not None and not record.record(path, f"{pod_uid} {time.time():.0f}"):
            failed[path] = "it cannot be recorded, and a dir koordlet made without a record would never be removed"
            logger.warning("not making %s: %s", path, failed[path])
            continue
        try:
            os.makedirs(path, exist_ok=True)
            os.chmod(path, 0o777)
        except OSError as err:
            if recorded_now and record is not None:
                record.forget(path)
            failed[path] = f"cannot be made: {err}"
            logger.warning("cannot make %s: %s", path, err)
    return failed


def with_host_dirs(changes: Changes, allowed_root: str, record: Originals | None, pod_uid: str,
                   on_reject: Callable[[list[Rejected]], None]) -> Changes:
    """Make ``changes``' host dirs (:func:`make_host_dirs`); ``changes`` without the mounts of the dirs not made,
    each reported through ``on_reject``."""
    if not changes.host_dirs:
        return changes
    failed = make_host_dirs(changes, allowed_root, record, pod_uid)
    if not failed:
        return changes
    on_reject([Rejected("host_dirs", path, f"{why}; the container starts without this mount")
               for path, why in failed.items()])
    return replace(changes, mounts=tuple(m for m in changes.mounts if m.source not in failed),
                   host_dirs=tuple(path for path in changes.host_dirs if path not in failed))


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
