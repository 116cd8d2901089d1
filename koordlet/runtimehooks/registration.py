"""koordlet's hook server registration file for the proxy (docs/koordinator.md §2.4)."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Sequence

from wire.files import write_atomic

log = logging.getLogger(__name__)

FILE_NAME = "koordlet.json"


def write_registration(config_dir: str, endpoint: str, failure_policy: str, hooks: Sequence[str]) -> str:
    """Write ``koordlet.json`` atomically (tab-indented, like Koordinator); returns its path."""
    os.makedirs(config_dir, mode=0o755, exist_ok=True)
    doc = {"remote-endpoint": endpoint, "failure-policy": failure_policy, "runtime-hooks": list(hooks)}
    path = os.path.join(config_dir, FILE_NAME)
    write_atomic(path, json.dumps(doc, indent="\t") + "\n", prefix=".koordlet-", suffix=".tmp", mode=0o644)
    log.info("registered hook server %s for %s in %s", endpoint, ", ".join(hooks) or "no hooks", path)
    return path


def remove_registration(config_dir: str) -> None:
    try:
        os.unlink(os.path.join(config_dir, FILE_NAME))
    except FileNotFoundError:
        pass
