"""What kubelet's own memory QoS writes on this node (koordlet/api/kubeletmemqos.py), from its KubeletConfiguration:
the file ``-kubelet-config-file`` names when it is given (read again when it changes), else kubelet's ``GET /configz``
(Koordinator's koordlet reads it too; skipped with ``-disable-query-kubelet-config`` and in local mode), asked again
at most every :data:`REFRESH_S` (kubelet's config changes only with a kubelet restart). The kubelet's version, for the
defaults a config leaves out, is the Node's ``status.nodeInfo.kubeletVersion``.

A config that cannot be read or makes no sense is logged (each new reason once) and the last good answer is kept; with
none yet, kubelet is taken to write nothing (koordlet's memory QoS then writes every file, as before 1.37).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from koordlet.api.kubeletmemqos import KubeletConfigError, KubeletMemoryQoS, from_kubelet_config
from koordlet.api.safeload import SafeLoadError, load_yaml
from koordlet.statesinformer.informer import PodSourceError

logger = logging.getLogger(__name__)

REFRESH_S = 60.0
MAX_CONFIG_BYTES = 1 << 20


class KubeletMemoryQoSSource:
    """Callable: the :class:`KubeletMemoryQoS` in effect. Called from the QoS manager's thread; the answer is replaced
    whole, under a lock (the file's stamp, the last answer)."""

    def __init__(self, config_file: str | None, configz: Callable[[], dict[str, Any]] | None,
                 kubelet_version: Callable[[], str], clock: Callable[[], float] = time.monotonic) -> None:
        """``config_file``: the KubeletConfiguration file (None: ask ``configz``, kubelet's ``/configz``; None too:
        kubelet's config is not known)."""
        self._file = config_file
        self._configz = configz
        self._version = kubelet_version
        self._clock = clock
        self._lock = threading.Lock()
        self._key: object = None  # what the answer was read from: (file stamp, version) or (time slot, version)
        self._answer = KubeletMemoryQoS(source="kubelet's config not read yet")
        self._last_problem = ""

    def _document(self) -> tuple[dict[str, Any], str]:
        if self._file:
            with open(self._file, "rb") as handle:
                raw = handle.read(MAX_CONFIG_BYTES + 1)
            if len(raw) > MAX_CONFIG_BYTES:
                raise KubeletConfigError(f"{self._file}: larger than {MAX_CONFIG_BYTES} bytes")
            doc = load_yaml(raw, self._file)
            if not isinstance(doc, dict):
                raise KubeletConfigError(f"{self._file}: expected a KubeletConfiguration object")
            return doc, f"file {self._file}"
        assert self._configz is not None
        return self._configz(), "kubelet's /configz"

    def _stamp(self) -> object:
        if self._file:
            try:
                info = os.stat(self._file)
            except OSError:
                return None
            return (info.st_mtime_ns, info.st_size)
        return int(self._clock() // REFRESH_S)

    def __call__(self) -> KubeletMemoryQoS:
        if not self._file and self._configz is None:
            return self._answer
        version = self._version()
        key = (self._stamp(), version)
        with self._lock:
            if key == self._key:
                return self._answer
            self._key = key
            try:
                doc, source = self._document()
                self._answer = from_kubelet_config(doc, version, source)
                self._last_problem = ""
            except (OSError, SafeLoadError, KubeletConfigError, PodSourceError) as err:
                if str(err) != self._last_problem:
                    self._last_problem = str(err)
                    logger.warning("kubelet's memory QoS not known (%s); keeping: %s", err, self._answer.describe())
            return self._answer
