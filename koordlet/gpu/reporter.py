"""Writes the Device object: through the API server (:class:`koordlet.kubeapi.CustomObjects`), or as a YAML file.

With an API server: the object as koordlet's last read or write left it is the comparison base, so an unchanged
Device costs no request (Koordinator GETs it every 3 s). It is read when the reporter starts and every
``resync_s`` (the first at a random point of it, then ±10 %) from the watch cache (``resourceVersion=0``), and
from etcd only after a 409 (someone else wrote in between: read the newest once and try again). Missing ->
create; semantically equal -> skip; otherwise replace with the base's resourceVersion. Labels and annotations
others put on the object are kept. Without one, the same object is written atomically to a YAML file so a user can
see it. A label or annotation whose desired value is None is one the object must not carry (it is taken off when
present).
The node's GPU model and driver labels (docs/koordinator.md §5.4) are patched when they differ.
"""

from __future__ import annotations

import copy
import enum
import logging
import random
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from kubernetes.client.exceptions import ApiException

from koordlet.api import device as api
from koordlet.api.safeload import MAX_DOCUMENT_BYTES, SafeLoadError, load_yaml
from koordlet.gpu.devicecr import semantically_equal
from koordlet.kubeapi import CoreV1, CustomObjects, Throttled, section
from koordlet.kubeclient.timing import SYSTEM_CLOCK, Clock, phase, spread
from wire.files import write_atomic

_log = logging.getLogger(__name__)

DEFAULT_RESYNC_S = 600.0  # a read from the watch cache: catches an object others changed or deleted


class DeviceReportError(RuntimeError):
    """The Device object could not be written."""


class ReportResult(enum.Enum):
    CREATED = "created"
    UPDATED = "updated"
    UNCHANGED = "unchanged"
    WRITTEN = "written"


class DeviceReporter:
    """Creates or updates the node's Device object; give `custom_api` or `file_path` (or both)."""

    def __init__(
        self,
        node_name: str,
        custom_api: CustomObjects | None = None,
        file_path: Path | None = None,
        *,
        resync_s: float = DEFAULT_RESYNC_S,
        clock: Clock = SYSTEM_CLOCK,
        rng: random.Random | None = None,
    ) -> None:
        if custom_api is None and file_path is None:
            raise ValueError("DeviceReporter needs a CustomObjects client or a file path")
        self.node_name = node_name
        self._api = custom_api
        self._file_path = file_path
        self._resync_s = resync_s
        self._clock = clock
        self._rng = rng or random.Random()
        self._stored: dict[str, Any] | None = None  # as koordlet's last read or write left it on the server
        self._resync_at = -float("inf")
        self.last_written: dict[str, Any] | None = None

    def previous(self) -> dict[str, Any] | None:
        """The object as last stored (API server first), so condition transition times are kept."""
        if self._api is not None:
            now = self._clock.monotonic()
            if self._stored is None or now >= self._resync_at:
                first = self._resync_at == -float("inf")
                self._stored = self._get(self._api, "0")
                self._resync_at = now + (phase(self._resync_s, self._rng) if first else spread(self._resync_s,
                                                                                                self._rng))
            return self._stored
        return self._read_file(self._file_path) if self._file_path is not None else None

    def report(self, desired: Mapping[str, Any]) -> ReportResult:
        result = ReportResult.UNCHANGED
        if self._api is not None:
            result = self._report_api(self._api, desired)
        if self._file_path is not None:
            written = self._write_file(self._file_path, desired)
            if self._api is None:
                result = written
        return result

    def _get(self, custom_api: CustomObjects, resource_version: str | None) -> dict[str, Any] | None:
        """The stored object (None: there is none); ``"0"``: from the watch cache, None: the newest."""
        try:
            return custom_api.get_cluster_custom_object(api.DEVICE_GROUP, api.DEVICE_VERSION, api.DEVICE_PLURAL,
                                                        self.node_name, resource_version=resource_version)
        except Throttled:
            raise
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise DeviceReportError(f"get Device {self.node_name}: {exc.status} {exc.reason}") from exc

    def _report_api(self, custom_api: CustomObjects, desired: Mapping[str, Any]) -> ReportResult:
        existing = self.previous()
        for attempt in (1, 2):
            if existing is None:
                try:
                    created = custom_api.create_cluster_custom_object(
                        api.DEVICE_GROUP, api.DEVICE_VERSION, api.DEVICE_PLURAL, _without_nones(desired)
                    )
                except Throttled:
                    raise
                except ApiException as create_exc:
                    if create_exc.status != 409 or attempt == 2:  # 409: created by someone else meanwhile
                        raise DeviceReportError(
                            f"create Device {self.node_name}: {create_exc.status} {create_exc.body}"
                        ) from create_exc
                    existing = self._stored = self._get(custom_api, None)
                    continue
                _log.info("Device %s created with %d GPUs", self.node_name, len(desired["spec"]["devices"]))
                self.last_written = _without_nones(desired)
                self._stored = created if isinstance(created, dict) else self.last_written
                return ReportResult.CREATED
            if semantically_equal(existing, desired):
                return ReportResult.UNCHANGED
            updated = _merged(existing, desired)
            try:
                written = custom_api.replace_cluster_custom_object(
                    api.DEVICE_GROUP, api.DEVICE_VERSION, api.DEVICE_PLURAL, self.node_name, updated
                )
            except Throttled:
                raise
            except ApiException as exc:
                if exc.status not in (404, 409) or attempt == 2:
                    raise DeviceReportError(f"update Device {self.node_name}: {exc.status} {exc.body}") from exc
                _log.debug("Device %s changed meanwhile; reading it again", self.node_name)
                existing = self._stored = self._get(custom_api, None)
                continue
            _log.info("Device %s updated", self.node_name)
            self.last_written = updated
            self._stored = written if isinstance(written, dict) else updated
            return ReportResult.UPDATED
        raise DeviceReportError(f"update Device {self.node_name}: still conflicting")

    @staticmethod
    def _read_file(path: Path) -> dict[str, Any] | None:
        try:
            with open(path, "rb") as f:
                loaded = load_yaml(f.read(MAX_DOCUMENT_BYTES + 1), str(path))
        except FileNotFoundError:
            return None
        except (OSError, SafeLoadError) as exc:
            _log.warning("Device file %s unreadable, rewriting it: %s", path, exc)
            return None
        return loaded if isinstance(loaded, dict) else None

    def _write_file(self, path: Path, desired: Mapping[str, Any]) -> ReportResult:
        existing = self._read_file(path)
        if existing is not None and semantically_equal(existing, desired):
            return ReportResult.UNCHANGED
        path.parent.mkdir(parents=True, exist_ok=True)
        written = _without_nones(desired)
        text = yaml.safe_dump(written, sort_keys=False)
        try:
            write_atomic(path, text, prefix=".device-")
        except OSError as exc:
            raise DeviceReportError(f"write {path}: {exc}") from exc
        self.last_written = written
        return ReportResult.WRITTEN


def _merged(existing: Mapping[str, Any], desired: Mapping[str, Any]) -> dict[str, Any]:
    """``existing`` with ``desired``'s spec, labels and annotations; others' labels and annotations kept."""
    updated = copy.deepcopy(dict(existing))
    updated["spec"] = copy.deepcopy(desired["spec"])
    meta = updated.setdefault("metadata", {})
    for key in ("labels", "annotations"):
        ours = (desired.get("metadata") or {}).get(key) or {}
        if ours:
            merged = {**(meta.get(key) or {}), **ours}
            meta[key] = {k: v for k, v in merged.items() if v is not None}
    if "ownerReferences" in desired["metadata"] and not meta.get("ownerReferences"):
        meta["ownerReferences"] = desired["metadata"]["ownerReferences"]
    return updated


def _without_nones(desired: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of ``desired`` whose labels and annotations leave out the ones set to None (not to be carried)."""
    out = copy.deepcopy(dict(desired))
    meta = out.get("metadata") or {}
    for key in ("labels", "annotations"):
        if isinstance(meta.get(key), dict):
            meta[key] = {k: v for k, v in meta[key].items() if v is not None}
    return out


def sync_node_labels(core_api: CoreV1, node_name: str, labels: Mapping[str, str]) -> bool:
    """Patch the node's GPU labels when they differ; returns True when a patch was sent."""
    try:
        node = core_api.read_node(node_name, resource_version="0")  # the watch cache's copy: a merge patch follows
    except ApiException as exc:
        raise DeviceReportError(f"read node {node_name}: {exc.status} {exc.reason}") from exc
    current = section(node, "metadata", "labels")
    if all(current.get(k) == v for k, v in labels.items()):
        return False
    try:
        core_api.patch_node(node_name, {"metadata": {"labels": dict(labels)}})
    except ApiException as exc:
        raise DeviceReportError(f"label node {node_name}: {exc.status} {exc.reason}") from exc
    _log.info("node %s labelled %s", node_name, dict(labels))
    return True
