"""Writing a file so that a reader sees the old or the new content, never a torn one (stdlib only).

Both sides use it: the proxy's store checkpoint, and the agent's hook registration, NodeMetric and Device
YAML files.
"""

from __future__ import annotations

import os
import tempfile


def write_atomic(path: str | os.PathLike[str], text: str, *, prefix: str = ".tmp-", suffix: str = "",
                 mode: int | None = None) -> None:
    """Write ``text`` to a temp file in ``path``'s directory (which must exist), then rename it over ``path``.

    ``mode``: the file's permission bits (default: the temp file's 0600). No fsync: these files only have to
    survive a crashed agent, not a power loss.
    """
    fd, tmp = tempfile.mkstemp(prefix=prefix, suffix=suffix, dir=os.path.dirname(os.fspath(path)) or ".")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as file:
            file.write(text)
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
