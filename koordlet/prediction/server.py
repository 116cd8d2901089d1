"""The peak predict server (Koordinator pkg/koordlet/prediction predict_server.go): decaying histograms of CPU and
memory usage per pod, for the node, per priority class and for the system, trained from the metric cache.

Every training interval (1 min) it takes, from the metric cache, the p90 over that interval of each pod's CPU
(cores) and memory (bytes without page cache), and of the node's; adds them as one sample (weight 1) to the
pod's and the node's histograms; sums the pods per priority class (``__node-koord-prod__`` … ``__node-__`` for
pods without one; a class with no pod gets a 0 sample) and adds ``sys`` = max(node − Σ pods, 0). A pod without
samples in the interval is left out of that round (as in Koordinator). CPU histograms: 0.025 cores first
bucket, ×1.05, up to 1024 cores, half-life 12 h; memory: 5 MiB first bucket, ×1.05, up to 2 TiB, half-life 24 h.

A model goes only once it has not been updated for the model expiration time (30 min; Koordinator's gcModels,
every minute: ``now − last update > expiration``), the pods' and the node items' alike: a pod left out of one
round's list (an informer resync, a kubelet answer that missed it) keeps what was learnt and goes on from there.
Memory stays bounded by the pods of the last expiration time. Checkpoints (koordlet.prediction.checkpoint): every
minute, up to 12 models not saved for 10 min; restored at start (after the states synced; as in Koordinator, the
checkpoints of pods not on the node then are removed), so a restart keeps what was learnt. A restore that fails is
logged and not tried again: training goes on without it.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

from koordlet.api.pod import PodMeta
from koordlet.api.qos import PriorityClass
from koordlet.metriccache import Label, MetricCache, MetricKind, SeriesKey
from koordlet.prediction.checkpoint import CheckpointError, FileCheckpointer, ModelCheckpoint
from koordlet.prediction.histogram import DecayingHistogram, ExponentialBuckets
from koordlet.ticker import PeriodicThread

logger = logging.getLogger(__name__)

HOUR = 3600.0
MIN_SAMPLE_WEIGHT = 0.1
EPSILON = 0.001 * MIN_SAMPLE_WEIGHT
BUCKET_GROWTH = 0.05
CPU_BUCKETS = ExponentialBuckets(1024, 0.025, 1 + BUCKET_GROWTH, EPSILON)  # cores
MEMORY_BUCKETS = ExponentialBuckets(float(1 << 41), float(5 << 20), 1 + BUCKET_GROWTH, EPSILON)  # bytes
NODE_UID = "__node__"
SYSTEM_ITEM = "sys"  # node usage not counted in any pod
ALL_PODS_ITEM = "all-pods"  # summed, never stored
KNOWN_PRIORITY_CLASSES = (PriorityClass.PROD, PriorityClass.MID, PriorityClass.BATCH, PriorityClass.FREE,
                          PriorityClass.NONE)
PERCENTILES = {"p60": 0.6, "p90": 0.9, "p95": 0.95, "p98": 0.98, "max": 1.0}
GC_INTERVAL_S = 60.0  # Koordinator's gcModels and doCheckpoint run every minute


def node_item_uid(item: str) -> str:
    """``__node-<item>__``: a priority class (``koord-prod``…, "" for none) or ``sys``."""
    return f"__node-{item}__"


NODE_ITEM_UIDS = frozenset({node_item_uid(SYSTEM_ITEM), *(node_item_uid(c.value) for c in KNOWN_PRIORITY_CLASSES)})


@dataclass(frozen=True, slots=True)
class PredictionConfig:
    """Koordinator's ``-prediction-*`` flags (docs/koordinator.md §9.1)."""

    checkpoint_dir: str = "/var/run/koordlet/prediction-checkpoints"
    cold_start_s: float = 24 * HOUR
    safety_margin_percent: int = 10
    memory_half_life_s: float = 24 * HOUR
    cpu_half_life_s: float = 12 * HOUR
    training_interval_s: float = 60.0
    model_expiration_s: float = 30 * 60.0
    checkpoint_interval_s: float = 10 * 60.0
    checkpoint_max_per_step: int = 12


@dataclass(frozen=True, slots=True)
class Prediction:
    """Percentiles (``p60``, ``p90``, ``p95``, ``p98``, ``max``) of a model: CPU in milli-cores, memory in bytes,
    truncated as Koordinator's quantities are."""

    cpu_milli: Mapping[str, int]
    memory_bytes: Mapping[str, int]


class _Model:
    __slots__ = ("cpu", "last_checkpointed", "last_updated", "memory")

    def __init__(self, config: PredictionConfig) -> None:
        self.cpu = DecayingHistogram(CPU_BUCKETS, config.cpu_half_life_s)
        self.memory = DecayingHistogram(MEMORY_BUCKETS, config.memory_half_life_s)
        self.last_updated = 0.0
        self.last_checkpointed = 0.0


class PredictServer:
    """Trains the models on a timer (:meth:`start`), answers :meth:`prediction`; thread-safe."""

    def __init__(self, config: PredictionConfig, pods: Callable[[], Sequence[PodMeta]], cache: MetricCache,
                 has_synced: Callable[[], bool] = lambda: True, clock: Callable[[], float] = time.time) -> None:
        self.config = config
        self._pods = pods
        self._cache = cache
        self._states_synced = has_synced
        self._clock = clock
        self._checkpointer = FileCheckpointer(config.checkpoint_dir)
        self._models: dict[str, _Model] = {}
        self._lock = threading.Lock()
        self._trained = False
        self._restored = False
        self._next_housekeeping = 0.0
        # The first round one interval after the start, so that it sees a whole interval of samples (Koordinator
        # trains at once, and its first sys and class samples are then zeros).
        self._thread = PeriodicThread("prediction", lambda: config.training_interval_s, self._tick,
                                      first_delay_s=config.training_interval_s, fixed_rate=True,
                                      on_error=lambda err: logger.exception("prediction training failed"))

    # ---------------------------------------------------------------------------------------- queries

    @property
    def synced(self) -> bool:
        """A first training has run (Koordinator's HasSynced)."""
        return self._trained

    def uids(self) -> frozenset[str]:
        with self._lock:
            return frozenset(self._models)

    def prediction(self, uid: str) -> Prediction | None:
        """The model's percentiles; None when there is no model for ``uid``."""
        with self._lock:
            model = self._models.get(uid)
            if model is None:
                return None
            cpu = {name: int(model.cpu.percentile(p) * 1000.0) for name, p in PERCENTILES.items()}
            memory = {name: int(model.memory.percentile(p)) for name, p in PERCENTILES.items()}
        return Prediction(MappingProxyType(cpu), MappingProxyType(memory))

    # --------------------------------------------------------------------------------------- training

    def _p90(self, key: SeriesKey, now: float) -> float | None:
        aggregate = self._cache.query(key, now - self.config.training_interval_s, now)
        return None if aggregate is None else aggregate.p90

    def _update(self, uid: str, cpu: float, memory: float, now: float) -> None:
        model = self._models.get(uid)
        if model is None:
            model = self._models[uid] = _Model(self.config)
        model.last_updated = now
        model.cpu.add_sample(cpu, 1.0, now)
        model.memory.add_sample(memory, 1.0, now)

    def train(self, now: float | None = None) -> None:
        """One training round (Koordinator's ``training``). Models of pods not in the list are left alone: they go
        only when stale (:meth:`gc`)."""
        now = self._clock() if now is None else now
        pods = self._pods()
        sums: dict[str, list[float]] = {}
        samples: list[tuple[str, float, float]] = []
        for pod in pods:
            cpu = self._p90(SeriesKey.of(MetricKind.POD_CPU_USAGE, **{Label.POD_UID: pod.uid}), now)
            memory = self._p90(SeriesKey.of(MetricKind.POD_MEMORY_USAGE, **{Label.POD_UID: pod.uid}), now)
            if cpu is None or memory is None:
                continue
            samples.append((pod.uid, cpu, memory))
            for item in (pod.priority_class.value, ALL_PODS_ITEM):
                total = sums.setdefault(item, [0.0, 0.0])
                total[0] += cpu
                total[1] += memory
        node_cpu = self._p90(SeriesKey.of(MetricKind.NODE_CPU_USAGE), now)
        node_memory = self._p90(SeriesKey.of(MetricKind.NODE_MEMORY_USAGE), now)
        with self._lock:
            for uid, cpu, memory in samples:
                self._update(uid, cpu, memory, now)
            if node_cpu is None or node_memory is None:
                logger.warning("prediction: no node CPU and memory samples in the last %.0f s",
                               self.config.training_interval_s)
            else:
                self._update(NODE_UID, node_cpu, node_memory, now)
            for priority_class in KNOWN_PRIORITY_CLASSES:
                cpu, memory = sums.get(priority_class.value, (0.0, 0.0))
                self._update(node_item_uid(priority_class.value), cpu, memory, now)
            all_cpu, all_memory = sums.get(ALL_PODS_ITEM, (0.0, 0.0))
            # Koordinator: a missing node sample counts as 0 here (so sys gets a 0 sample that round)
            self._update(node_item_uid(SYSTEM_ITEM), max((node_cpu or 0.0) - all_cpu, 0.0),
                         max((node_memory or 0.0) - all_memory, 0.0), now)
        self._trained = True

    def gc(self, now: float | None = None) -> list[str]:
        """Drop the models not updated for the expiration time (Koordinator's gcModels)."""
        if not self._trained:
            return []
        now = self._clock() if now is None else now
        with self._lock:
            expired = [uid for uid, m in self._models.items() if now - m.last_updated > self.config.model_expiration_s]
            for uid in expired:
                del self._models[uid]
        for uid in expired:
            logger.info("prediction: model %s expired", uid)
            self._remove_checkpoint(uid)
        return expired

    # ------------------------------------------------------------------------------------- checkpoints

    def _remove_checkpoint(self, uid: str) -> None:
        try:
            self._checkpointer.remove(uid)
        except (OSError, CheckpointError) as err:
            logger.warning("prediction: cannot remove the checkpoint of %s: %s", uid, err)

    def checkpoint(self, now: float | None = None) -> int:
        """Save up to ``checkpoint_max_per_step`` models, those saved longest ago first, none saved within the
        checkpoint interval; returns how many were written."""
        if not self._trained:
            return 0
        now = self._clock() if now is None else now
        with self._lock:
            models = sorted(self._models.items(), key=lambda item: item[1].last_checkpointed)
        written = 0
        for uid, model in models[: self.config.checkpoint_max_per_step]:
            if now - model.last_checkpointed < self.config.checkpoint_interval_s:
                break
            with self._lock:
                saved = ModelCheckpoint(uid, model.cpu.save(), model.memory.save(), now)
            try:
                self._checkpointer.save(saved)
                written += 1
            except (OSError, CheckpointError) as err:
                logger.error("prediction: cannot save the checkpoint of %s: %s", uid, err)
            model.last_checkpointed = now
        return written

    def restore(self) -> int:
        """Load the checkpoints of the pods and node items known now; the others are removed (their pod is gone)
        or set aside (unreadable). Returns how many models were restored."""
        known = {pod.uid for pod in self._pods()} | {NODE_UID} | NODE_ITEM_UIDS
        restored = 0
        for saved in self._checkpointer.restore():
            if saved.uid not in known:
                logger.info("prediction: removing the checkpoint of %s (not on this node any more)", saved.uid)
                self._remove_checkpoint(saved.uid)
                continue
            model = _Model(self.config)
            try:
                model.cpu.load(saved.cpu)
                model.memory.load(saved.memory)
            except ValueError as err:
                self._checkpointer.set_aside(saved.uid, f"does not fit the histograms: {err}")
                continue
            model.last_updated = saved.last_updated if math.isfinite(saved.last_updated) else 0.0
            with self._lock:
                self._models[saved.uid] = model
            restored += 1
        self._restored = True
        if restored:
            logger.info("prediction: restored %d models from %s", restored, self.config.checkpoint_dir)
        return restored

    # -------------------------------------------------------------------------------------------- loop

    def _restore_once(self) -> None:
        """Restore at the first chance; a failure is logged, never tried again, never stops the training."""
        if self._restored:
            return
        try:
            self.restore()
        except Exception:  # noqa: BLE001 - a restore that fails must not stop every later training
            logger.exception("prediction: restoring the checkpoints from %s failed; training without them",
                             self.config.checkpoint_dir)
        finally:
            self._restored = True

    def _tick(self) -> None:
        if not self._states_synced():
            return
        self._restore_once()
        self.train()
        now = self._clock()
        if now >= self._next_housekeeping:
            self._next_housekeeping = now + GC_INTERVAL_S
            self.gc(now)
            self.checkpoint(now)

    def start(self) -> None:
        """Restore the checkpoints (once the states have synced), then train every training interval, collect and
        checkpoint every minute."""
        if self._states_synced():
            self._restore_once()
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> bool:
        return self._thread.stop(timeout_s)
