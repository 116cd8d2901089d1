"""Exponentially bucketed histograms whose samples decay with a half-life (Koordinator pkg/util/histogram, which
is the Kubernetes vertical-pod-autoscaler's; our own implementation of the same arithmetic, so that percentiles
and checkpoints agree with Koordinator's to the bucket).

Buckets: bucket 0 covers [0, first); bucket n ≥ 1 starts at ``first × (ratio^n − 1) / (ratio − 1)``; the last
bucket starts at or above ``max_value`` and has no end. A sample's weight is multiplied by
``2^((t − reference) / half_life)``: newer samples weigh more, and every half-life the older ones count half.
The reference time moves forward (rescaling every weight) when the exponent would exceed 100 half-lives.
``percentile(p)`` returns the end of the bucket where the cumulative weight reaches ``p × total`` (the start of
the last bucket if it is that one); an empty histogram answers 0. Weights below ``epsilon`` count as empty.

Weights are kept in an ``array('d')`` (8 bytes a bucket: 158 + 205 buckets for a pod's CPU and memory).
Times are Unix seconds; the reference time is kept in Go's convention (multiples of the half-life counted from
Go's zero time, year 1), so a checkpoint's ``referenceTimestamp`` is what Koordinator would have written.
"""

from __future__ import annotations

import math
from array import array
from dataclasses import dataclass

GO_ZERO_TIME_UNIX = -62135596800.0  # 0001-01-01T00:00:00Z, Go's zero time.Time
MAX_DECAY_EXPONENT = 100
MAX_CHECKPOINT_WEIGHT = 10000


def _go_round(x: float) -> int:
    """Go's histogram ``round``: floor(x + 0.5)."""
    return math.floor(x + 0.5)


@dataclass(frozen=True, slots=True)
class ExponentialBuckets:
    """NewExponentialHistogramOptions(max_value, first_bucket_size, ratio, epsilon)."""

    max_value: float
    first_bucket_size: float
    ratio: float
    epsilon: float

    def __post_init__(self) -> None:
        if self.max_value <= 0 or self.first_bucket_size <= 0 or self.ratio <= 1 or self.epsilon <= 0:
            raise ValueError("max_value, first_bucket_size and epsilon must be > 0, ratio > 1")

    @property
    def num_buckets(self) -> int:
        return math.ceil(math.log(self.max_value * (self.ratio - 1) / self.first_bucket_size + 1)
                         / math.log(self.ratio)) + 1

    def find_bucket(self, value: float) -> int:
        if value < self.first_bucket_size:
            return 0
        bucket = int(math.log(value * (self.ratio - 1) / self.first_bucket_size + 1) / math.log(self.ratio))
        return min(bucket, self.num_buckets - 1)

    def bucket_start(self, bucket: int) -> float:
        if not 0 <= bucket < self.num_buckets:
            raise IndexError(f"bucket {bucket} outside [0, {self.num_buckets - 1}]")
        if bucket == 0:
            return 0.0
        return self.first_bucket_size * (self.ratio ** bucket - 1) / (self.ratio - 1)


@dataclass(frozen=True, slots=True)
class HistogramCheckpoint:
    """What a histogram is saved as (Koordinator's HistogramCheckpoint): weights scaled so the largest is
    10000, the total, and the reference time (Unix seconds)."""

    reference_timestamp: float
    bucket_weights: dict[int, int]
    total_weight: float


class DecayingHistogram:
    """A decaying, exponentially bucketed histogram (not thread-safe: the predict server locks around it)."""

    __slots__ = ("_buckets", "_count", "_epsilon", "_half_life_s", "_max_bucket", "_min_bucket", "_reference",
                 "_total", "_weights")

    def __init__(self, buckets: ExponentialBuckets, half_life_s: float) -> None:
        if half_life_s <= 0:
            raise ValueError("half-life must be positive")
        self._buckets = buckets
        self._count = buckets.num_buckets
        self._epsilon = buckets.epsilon
        self._half_life_s = half_life_s
        self._weights = array("d", bytes(8 * self._count))
        self._total = 0.0
        self._min_bucket = self._count - 1
        self._max_bucket = 0
        self._reference = GO_ZERO_TIME_UNIX

    @property
    def reference_timestamp(self) -> float:
        return self._reference

    @property
    def total_weight(self) -> float:
        return self._total

    def is_empty(self) -> bool:
        return self._weights[self._min_bucket] < self._epsilon

    # ------------------------------------------------------------------------------------------- decay

    def _round_to_half_life(self, t: float) -> float:
        """Go's time.Round(halfLife): the nearest multiple of the half-life since Go's zero time (halves up)."""
        since_zero = t - GO_ZERO_TIME_UNIX
        quotient = math.floor(since_zero / self._half_life_s)
        if since_zero - quotient * self._half_life_s >= self._half_life_s / 2:
            quotient += 1
        return GO_ZERO_TIME_UNIX + quotient * self._half_life_s

    def _shift_reference(self, t: float) -> None:
        new_reference = self._round_to_half_life(t)
        exponent = _go_round((self._reference - new_reference) / self._half_life_s)
        self._scale(math.ldexp(1.0, exponent))
        self._reference = new_reference

    def _decay_factor(self, t: float) -> float:
        if t > self._reference + self._half_life_s * MAX_DECAY_EXPONENT:
            self._shift_reference(t)
        return 2.0 ** ((t - self._reference) / self._half_life_s)

    def _scale(self, factor: float) -> None:
        weights = self._weights
        for bucket in range(self._min_bucket, self._max_bucket + 1):
            weights[bucket] *= factor
        self._total *= factor
        self._update_min_max()

    def _update_min_max(self) -> None:
        weights, epsilon, last = self._weights, self._epsilon, self._count - 1
        while weights[self._min_bucket] < epsilon and self._min_bucket < last:
            self._min_bucket += 1
        while weights[self._max_bucket] < epsilon and self._max_bucket > 0:
            self._max_bucket -= 1

    # --------------------------------------------------------------------------------------- samples

    def add_sample(self, value: float, weight: float, t: float) -> None:
        if weight < 0:
            raise ValueError("sample weight must be non-negative")
        weight *= self._decay_factor(t)
        bucket = self._buckets.find_bucket(value)
        self._weights[bucket] += weight
        self._total += weight
        if bucket < self._min_bucket and self._weights[bucket] >= self._epsilon:
            self._min_bucket = bucket
        if bucket > self._max_bucket and self._weights[bucket] >= self._epsilon:
            self._max_bucket = bucket

    def percentile(self, p: float) -> float:
        """p in [0, 1]: the end of the bucket where the cumulative weight reaches p × total."""
        if self.is_empty():
            return 0.0
        threshold = p * self._total
        partial = 0.0
        bucket = self._min_bucket
        while bucket < self._max_bucket:
            partial += self._weights[bucket]
            if partial >= threshold:
                break
            bucket += 1
        if bucket < self._count - 1:
            return self._buckets.bucket_start(bucket + 1)
        return self._buckets.bucket_start(bucket)

    # ------------------------------------------------------------------------------------ checkpoint

    def save(self) -> HistogramCheckpoint:
        weights = self._weights
        largest = max((weights[b] for b in range(self._min_bucket, self._max_bucket + 1)), default=0.0)
        scaled: dict[int, int] = {}
        if largest > 0:
            ratio = MAX_CHECKPOINT_WEIGHT / largest
            for bucket in range(self._min_bucket, self._max_bucket + 1):
                value = _go_round(weights[bucket] * ratio)
                if value > 0:
                    scaled[bucket] = value
        return HistogramCheckpoint(self._reference, scaled, self._total)

    def load(self, checkpoint: HistogramCheckpoint) -> None:
        """Add a checkpoint's samples; raises ValueError for one that does not fit these buckets."""
        if checkpoint.total_weight < 0 or not math.isfinite(checkpoint.total_weight):
            raise ValueError(f"checkpoint with total weight {checkpoint.total_weight}")
        total = 0
        for bucket, weight in checkpoint.bucket_weights.items():
            if not 0 <= bucket < self._count:
                raise ValueError(f"checkpoint bucket {bucket} outside [0, {self._count - 1}]")
            if not 0 <= weight <= 2**32 - 1:
                raise ValueError(f"checkpoint bucket weight {weight} is not a uint32")
            total += weight
        self._reference = checkpoint.reference_timestamp
        if total == 0:
            return
        ratio = checkpoint.total_weight / total
        for bucket, weight in checkpoint.bucket_weights.items():
            self._min_bucket = min(self._min_bucket, bucket)
            self._max_bucket = max(self._max_bucket, bucket)
            self._weights[bucket] += weight * ratio
        self._total += checkpoint.total_weight
