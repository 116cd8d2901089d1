"""The predict server's checkpoints on disk: one JSON file per model, in Koordinator's format (pkg/koordlet/
prediction checkpoint.go), so a restarted agent goes on from where it stopped instead of relearning for 24 h.

A file is named by the model's UID and holds ``{"UID", "CPU", "Memory", "LastUpdated"}``, each histogram as
``{"referenceTimestamp", "bucketWeights": {"<bucket>": <uint32>}, "totalWeight"}``. Writes are atomic (a temp
file renamed over the old one). Bounded: a file is at most :data:`MAX_FILE_BYTES`, and there is one per live
model. On restore, a file that cannot be read back (corrupt, too large, not a checkpoint, a foreign name) is
logged and set aside as ``.set-aside/<name>.<time>`` (the newest :data:`MAX_SET_ASIDE` kept), never fatal;
half-written temp files are removed (one that cannot be removed is logged and skipped).
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from koordlet.prediction.histogram import HistogramCheckpoint
from wire.files import write_atomic

logger = logging.getLogger(__name__)

MAX_FILE_BYTES = 64 << 10
MAX_SET_ASIDE = 16
SET_ASIDE_DIR = ".set-aside"
_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,252}$")
_TEMP_PREFIX = ".tmp-"
_KOORDINATOR_TEMP_SUFFIX = ".tmp"
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class CheckpointError(ValueError):
    """A checkpoint file that cannot be read back."""


@dataclass(frozen=True, slots=True)
class ModelCheckpoint:
    uid: str
    cpu: HistogramCheckpoint
    memory: HistogramCheckpoint
    last_updated: float  # Unix seconds


def format_time(t: float) -> str:
    """RFC 3339 in UTC, as Go marshals a time.Time (year 1 included: Go's zero time)."""
    moment = _EPOCH + timedelta(seconds=t)
    text = moment.isoformat(timespec="microseconds" if moment.microsecond else "seconds")
    return text.replace("+00:00", "Z")


def parse_time(text: object) -> float:
    if not isinstance(text, str) or len(text) > 64:
        raise CheckpointError(f"not a time: {text!r:.80}")
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError as err:
        raise CheckpointError(f"not a time: {text!r:.80}") from err
    if moment.tzinfo is None:
        raise CheckpointError(f"time without a zone: {text!r:.80}")
    return (moment - _EPOCH).total_seconds()


def _histogram_json(checkpoint: HistogramCheckpoint) -> dict[str, object]:
    data: dict[str, object] = {"referenceTimestamp": format_time(checkpoint.reference_timestamp)}
    if checkpoint.bucket_weights:
        data["bucketWeights"] = {str(bucket): weight for bucket, weight in sorted(checkpoint.bucket_weights.items())}
    if checkpoint.total_weight:
        data["totalWeight"] = checkpoint.total_weight
    return data


def _histogram_from(data: object, where: str) -> HistogramCheckpoint:
    if not isinstance(data, dict):
        raise CheckpointError(f"{where}: not an object")
    weights: dict[int, int] = {}
    raw = data.get("bucketWeights") or {}
    if not isinstance(raw, dict) or len(raw) > 4096:
        raise CheckpointError(f"{where}.bucketWeights: not an object of at most 4096 buckets")
    for key, value in raw.items():
        if not (isinstance(key, str) and key.isascii() and key.isdigit()) or isinstance(value, bool) \
                or not isinstance(value, int) or not 0 <= value <= 2**32 - 1:
            raise CheckpointError(f"{where}.bucketWeights: {key!r:.20}: {value!r:.20} is not bucket → uint32")
        weights[int(key)] = value
    total = data.get("totalWeight", 0)
    if isinstance(total, bool) or not isinstance(total, int | float):
        raise CheckpointError(f"{where}.totalWeight: not a number")
    return HistogramCheckpoint(parse_time(data.get("referenceTimestamp")), weights, float(total))


def encode(checkpoint: ModelCheckpoint) -> str:
    return json.dumps({"UID": checkpoint.uid, "CPU": _histogram_json(checkpoint.cpu),
                       "Memory": _histogram_json(checkpoint.memory),
                       "LastUpdated": format_time(int(checkpoint.last_updated))}) + "\n"


def decode(text: str, uid: str) -> ModelCheckpoint:
    """A checkpoint file's content; the UID is the file's name (Koordinator resets it to the file name too)."""
    try:
        data = json.loads(text)
    except ValueError as err:
        raise CheckpointError(f"not JSON: {err}") from err
    if not isinstance(data, dict) or "CPU" not in data or "Memory" not in data:
        raise CheckpointError("not a model checkpoint (no CPU and Memory histograms)")
    return ModelCheckpoint(uid, _histogram_from(data["CPU"], "CPU"), _histogram_from(data["Memory"], "Memory"),
                           parse_time(data.get("LastUpdated", "0001-01-01T00:00:00Z")))


class FileCheckpointer:
    """Checkpoints as files in ``directory`` (created 0700 at the first save)."""

    def __init__(self, directory: str) -> None:
        self.directory = directory

    def path(self, uid: str) -> str:
        if not _NAME.match(uid):
            raise CheckpointError(f"unsafe checkpoint name {uid!r:.80}")
        return os.path.join(self.directory, uid)

    def save(self, checkpoint: ModelCheckpoint) -> None:
        text = encode(checkpoint)
        if len(text) > MAX_FILE_BYTES:
            raise CheckpointError(f"checkpoint of {checkpoint.uid} is {len(text)} bytes, above {MAX_FILE_BYTES}")
        os.makedirs(self.directory, mode=0o700, exist_ok=True)
        write_atomic(self.path(checkpoint.uid), text, prefix=_TEMP_PREFIX, mode=0o600)

    def remove(self, uid: str) -> None:
        try:
            os.unlink(self.path(uid))
        except FileNotFoundError:
            pass

    def set_aside(self, name: str, why: str) -> None:
        """Move ``name`` out of the way (kept for a person to look at), keeping only the newest few."""
        aside = os.path.join(self.directory, SET_ASIDE_DIR)
        target = os.path.join(aside, f"{name}.{int(time.time())}")
        logger.error("prediction checkpoint %s set aside as %s: %s", os.path.join(self.directory, name), target, why)
        try:
            os.makedirs(aside, mode=0o700, exist_ok=True)
            os.replace(os.path.join(self.directory, name), target)
            kept = sorted((os.path.join(aside, n) for n in os.listdir(aside)), key=os.path.getmtime)
            for old in kept[:-MAX_SET_ASIDE]:
                os.unlink(old)
        except OSError as err:
            logger.error("cannot set %s aside: %s", name, err)

    def restore(self) -> list[ModelCheckpoint]:
        """Every checkpoint that reads back; the others are set aside (temp files removed)."""
        try:
            entries = sorted(os.scandir(self.directory), key=lambda e: e.name)
        except FileNotFoundError:
            return []
        except OSError as err:
            logger.error("cannot list prediction checkpoints in %s: %s", self.directory, err)
            return []
        restored = []
        for entry in entries:
            if entry.name == SET_ASIDE_DIR or entry.is_dir(follow_symlinks=False):
                continue
            if entry.name.startswith(_TEMP_PREFIX) or entry.name.endswith(_KOORDINATOR_TEMP_SUFFIX):
                self._remove_leftover(entry.path)
                continue
            checkpoint = self._read(entry)
            if checkpoint is not None:
                restored.append(checkpoint)
        return restored

    @staticmethod
    def _remove_leftover(path: str) -> None:
        """A save that never finished; one that cannot be removed (an immutable file, a read-only dir) is logged and
        left: it is no checkpoint, and the others still restore."""
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        except OSError as err:
            logger.warning("cannot remove the unfinished checkpoint %s: %s; left in place", path, err)

    def _read(self, entry: os.DirEntry[str]) -> ModelCheckpoint | None:
        if not _NAME.match(entry.name) or not entry.is_file(follow_symlinks=False):
            self.set_aside(entry.name, "not a checkpoint file of ours")
            return None
        try:
            if entry.stat(follow_symlinks=False).st_size > MAX_FILE_BYTES:
                raise CheckpointError(f"larger than {MAX_FILE_BYTES} bytes")
            with open(entry.path, encoding="utf-8") as file:
                return decode(file.read(MAX_FILE_BYTES + 1), entry.name)
        except (OSError, UnicodeDecodeError, CheckpointError) as err:
            self.set_aside(entry.name, str(err))
            return None
