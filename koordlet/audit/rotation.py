"""The names of the log's files: ``audit.log`` now, ``audit-<UTC time %Y-%m-%d-%H-%M-%S>-<n>.log`` once rotated,
ordered by (time, n). The time is UTC and never before the newest name's (a clock set back reuses that time with
a higher ``n``): with local time, the hour repeated at a DST fall-back would name the newest file as the oldest,
and it would be the next one removed."""

from __future__ import annotations

import glob
import os
import re
from collections.abc import Sequence

CURRENT_FILE = "audit.log"
ROTATED_GLOB = "audit-*.log"
ROTATED_NAME = re.compile(r"^audit-(\d{4}-\d\d-\d\d-\d\d-\d\d-\d\d)-(\d+)\.log$")
STAMP_FORMAT = "%Y-%m-%d-%H-%M-%S"


def rotation_key(path: str) -> tuple[str, int]:
    """(UTC time, n) of a rotated file's name; a name of another shape sorts first (removed first)."""
    match = ROTATED_NAME.match(os.path.basename(path))
    return (match[1], int(match[2])) if match else ("", -1)


def rotated_files(log_dir: str) -> list[str]:
    """The rotated files of ``log_dir``, oldest first."""
    return sorted(glob.glob(os.path.join(glob.escape(log_dir), ROTATED_GLOB)), key=rotation_key)


def next_rotated_name(rotated: Sequence[str], stamp: str) -> str:
    """The name that sorts after every one of ``rotated``: ``stamp`` (UTC) with n 0, or, when the newest name's
    time is not before it, that time with the next n."""
    newest_stamp, newest_n = rotation_key(rotated[-1]) if rotated else ("", -1)
    if stamp > newest_stamp:
        return f"audit-{stamp}-0.log"
    return f"audit-{newest_stamp}-{newest_n + 1}.log"
