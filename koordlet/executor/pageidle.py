"""The executor's writes of the page-idle bitmap (``<sys>/kernel/mm/page_idle/bitmap``): the marks of the cold
page collector's page-idle mode (koordlet/metricsadvisor/pageidle.py), a chunk of pages at a time.

A mark sets the idle bit of a range of page frames; the kernel clears the bit of every page touched since, which
is how the collector tells cold page cache. There is nothing to put back: the bit has no effect on the pages
(the kernel only clears their accessed bits as it sets it), and a page touched later clears it again. So a mark
is checked (whole u64 words, at most one chunk, the path inside the ``sys`` mount, ``O_NOFOLLOW``), timed and
counted like every executor write (``koordlet_resource_update_total{resource="page_idle.bitmap"}``), and not
recorded.
"""

from __future__ import annotations

import errno
import logging
import os
import time

from koordlet.executor import metrics
from koordlet.executor.errors import InvalidUpdateError, UnsafePathError, UnsupportedResourceError, WriteFailedError
from koordlet.executor.files import observe, path_inside
from koordlet.system.coldpage import mark_idle_range, page_idle_bitmap_path

logger = logging.getLogger(__name__)

RESOURCE = "page_idle.bitmap"


def mark_page_idle(sys_dir: str | None, first_page: int, pages: int) -> int:
    """Mark ``pages`` page frames from ``first_page`` idle; returns how many the bitmap covered (0: past the
    last frame). Raises ExecutorError."""
    try:
        if sys_dir is None:
            raise UnsupportedResourceError("no sys root configured for the page-idle bitmap")
        path = page_idle_bitmap_path(sys_dir)
        if not path_inside(os.path.realpath(sys_dir), path):
            raise UnsafePathError(f"{path} resolves outside {sys_dir}")
        started = time.perf_counter()
        try:
            covered = mark_idle_range(path, first_page, pages)
        except ValueError as exc:
            raise InvalidUpdateError(str(exc)) from exc
        except FileNotFoundError as exc:
            raise UnsupportedResourceError(f"{path} does not exist on this kernel") from exc
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise UnsafePathError(f"{path} is a symlink") from exc
            raise WriteFailedError(f"mark pages {first_page}+{pages} idle in {path}: {exc.strerror}",
                                   exc.errno) from exc
    except (InvalidUpdateError, UnsafePathError, UnsupportedResourceError, WriteFailedError) as exc:
        metrics.count_update(RESOURCE, exc.status)
        raise
    if covered:
        observe(RESOURCE, "succeeded", started)
        metrics.count_update(RESOURCE, metrics.STATUS_WRITTEN)
    return covered
