"""What every writer of the executor does to a kernel file once it has a checked path: the containment check
(:func:`path_inside`), the one timed write (:func:`write_file`, ``O_NOFOLLOW``, errors translated) and the quiet
read of what a file holds now (:func:`read_current`). The syscalls are :mod:`koordlet.system.kernfs`'s."""

from __future__ import annotations

import errno
import logging
import os
import time

from koordlet.executor import metrics
from koordlet.executor.errors import UnsafePathError, WriteFailedError
from koordlet.system import kernfs

logger = logging.getLogger(__name__)


def path_inside(real_base: str, path: str) -> bool:
    """``path``, symlinks resolved, is ``real_base`` (itself resolved) or below it."""
    real = os.path.realpath(path)
    return real == real_base or real.startswith(real_base.rstrip("/") + "/")


class RealRoots:
    """The resolved real path of each root a writer checks paths against, resolved once (a mount dir does not
    move while the agent runs)."""

    def __init__(self) -> None:
        self._roots: dict[str, str] = {}

    def check(self, root: str, path: str, label: str) -> str:
        """``path`` when it resolves inside ``root``; UnsafePathError naming the root (``label`` says what it is)
        else."""
        real_root = self._roots.get(root)
        if real_root is None:
            real_root = self._roots[root] = os.path.realpath(root)
        if not path_inside(real_root, path):
            raise UnsafePathError(f"{path} resolves outside {label} {root}")
        return path


def write_file(resource_name: str, path: str, content: str) -> None:
    """One write of ``content`` to ``path`` (never through a symlink), timed in
    ``koordlet_resource_update_duration_milliseconds``; UnsafePathError or WriteFailedError when it fails."""
    started = time.perf_counter()
    try:
        kernfs.write_nofollow(path, content)
    except OSError as exc:
        observe(resource_name, "failed", started)
        if exc.errno == errno.ELOOP:
            raise UnsafePathError(f"{path} is a symlink") from exc
        raise WriteFailedError(f"write {content!r} to {path}: {exc.strerror}", exc.errno) from exc
    observe(resource_name, "succeeded", started)
    logger.debug("wrote %r to %s", content, path)


def observe(resource_name: str, status: str, started: float) -> None:
    """How long a write that began at ``started`` (``time.perf_counter``) took."""
    elapsed_ms = (time.perf_counter() - started) * 1000.0
    metrics.RESOURCE_UPDATE_DURATION_MS.labels(type=resource_name, status=status).observe(elapsed_ms)


def read_current(path: str) -> str | None:
    """The file's content (stripped); None when it cannot be read."""
    try:
        return kernfs.read_text(path)
    except OSError:
        return None
