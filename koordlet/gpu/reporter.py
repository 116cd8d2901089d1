"""Writes the Device object: through the API server (:class:`koordlet.kubeapi.CustomObjects`), or as a YAML file.

With an API server: GET the node's Device; 404 -> create; present and semantically equal -> skip;
otherwise replace with the object's resourceVersion (a 409 means someone else wrote in between:
read again and retry, a few times). Labels and annotations others put on the object are kept.
Without one, the same object is written atomically to a YAML file so a user can see it. A label or annotation
whose desired value is None is one the object must not carry (it is taken off when present).
The node's GPU model and driver labels (docs/koordinator.md §5.4) are patched when they differ.
"""

from __future__ import annotations

import copy
import enum
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from kubernetes.client.exceptions import ApiException

from koordlet.api import device as api
from koordlet.api.safeload import MAX_DOCUMENT_BYTES, SafeLoadError, load_yaml
from koordlet.gpu.devicecr import semantically_equal
from koordlet.kubeapi import CoreV1, CustomObjects, section
from wire.files import write_atomic

_log = logging.getLogger(__name__)

_CONFLICT_RETRIES = 3


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
    ) -> None:
        if custom_api is None and file_path is None:
            raise ValueError("DeviceReporter needs a CustomObjects client or a file path")
        self.node_name = node_name
        self._api = custom_api
        self._file_path = file_path
        self.last_written: dict[str, Any] | None = None

    def previous(self) -> dict[str, Any] | None:
        """The object as last stored (API server first), so condition transition times are kept."""
        if self._api is not None:
            try:
                return self._get(self._api)
            except ApiException as exc:
                if exc.status == 404:
                    return None
                raise DeviceReportError(f"get Device {self.node_name}: {exc.status} {exc.reason}") from exc
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

    def _get(self, custom_api: CustomObjects) -> dict[str, Any]:
        return custom_api.get_cluster_custom_object(
            api.DEVICE_GROUP, api.DEVICE_VERSION, api.DEVICE_PLURAL, self.node_name
        )

    def _report_api(self, custom_api: CustomObjects, desired: Mapping[str, Any]) -> ReportResult:
        for _attempt in range(_CONFLICT_RETRIES):
            try:
                existing = self._get(custom_api)
            except ApiException as exc:
                if exc.status != 404:
                    raise DeviceReportError(f"get Device {self.node_name}: {exc.status} {exc.reason}") from exc
                try:
                    custom_api.create_cluster_custom_object(
                        api.DEVICE_GROUP, api.DEVICE_VERSION, api.DEVICE_PLURAL, _without_nones(desired)
                    )
                except ApiException as create_exc:
                    if create_exc.status == 409:  # created by someone else meanwhile: compare again
                        continue
                    raise DeviceReportError(
                        f"create Device {self.node_name}: {create_exc.status} {create_exc.body}"
                    ) from create_exc
                _log.info("Device %s created with %d GPUs", self.node_name, len(desired["spec"]["devices"]))
                self.last_written = _without_nones(desired)
                return ReportResult.CREATED
            if semantically_equal(existing, desired):
                return ReportResult.UNCHANGED
            updated = copy.deepcopy(existing)
            updated["spec"] = copy.deepcopy(desired["spec"])
            meta = updated.setdefault("metadata", {})
            for key in ("labels", "annotations"):
                ours = (desired.get("metadata") or {}).get(key) or {}
                if ours:
                    merged = {**(meta.get(key) or {}), **ours}
                    meta[key] = {k: v for k, v in merged.items() if v is not None}
            if "ownerReferences" in desired["metadata"] and not meta.get("ownerReferences"):
                meta["ownerReferences"] = desired["metadata"]["ownerReferences"]
            try:
                custom_api.replace_cluster_custom_object(
                    api.DEVICE_GROUP, api.DEVICE_VERSION, api.DEVICE_PLURAL, self.node_name, updated
                )
            except ApiException as exc:
                if exc.status == 409:
                    _log.debug("Device %s changed meanwhile; retrying", self.node_name)
                    continue
                raise DeviceReportError(f"update Device {self.node_name}: {exc.status} {exc.body}") from exc
            _log.info("Device %s updated", self.node_name)
            self.last_written = updated
            return ReportResult.UPDATED
        raise DeviceReportError(f"update Device {self.node_name}: still conflicting after {_CONFLICT_RETRIES} tries")

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
        node = core_api.read_node(node_name)
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
