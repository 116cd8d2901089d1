"""Reads a ``/metrics`` answer in text format 0.0.4 as Prometheus' text parser does: every sample under the name it
is written with, and the family a ``# TYPE`` line declares.

prometheus_client's own parser cannot be used to check names: it renames a counter's samples to ``<name>_total``
(OpenMetrics' rule) whatever the text says, so a bare Koordinator counter and a ``_total`` one read back the same.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+-?\d+)?$")
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"\s*(?:,|$)')
_UNESCAPE = re.compile(r"\\(.)")
# The samples a histogram or summary family writes besides its own name (text format 0.0.4).
_SUFFIXES = {"histogram": ("_bucket", "_sum", "_count"), "summary": ("_sum", "_count")}


@dataclass(frozen=True, slots=True)
class Sample:
    name: str
    labels: dict[str, str]
    value: float


@dataclass(slots=True)
class Family:
    name: str
    type: str  # as the # TYPE line says; "untyped" when there is none
    samples: list[Sample] = field(default_factory=list)

    @property
    def label_names(self) -> frozenset[str]:
        """The label names of its samples, without a histogram's ``le`` or a summary's ``quantile``."""
        return frozenset(name for sample in self.samples for name in sample.labels) - {"le", "quantile"}


def _labels(text: str) -> dict[str, str]:
    labels: dict[str, str] = {}
    position = 0
    while position < len(text):
        match = _LABEL.match(text, position)
        if match is None:
            raise ValueError(f"bad label set {{{text}}}")
        labels[match.group(1)] = _UNESCAPE.sub(lambda m: "\n" if m.group(1) == "n" else m.group(1), match.group(2))
        position = match.end()
    return labels


def _family_of(name: str, families: dict[str, Family]) -> Family:
    if name in families:
        return families[name]
    for family in families.values():
        if any(name == family.name + suffix for suffix in _SUFFIXES.get(family.type, ())):
            return family
    return families.setdefault(name, Family(name, "untyped"))


def parse(text: str) -> dict[str, Family]:
    """Family name -> family; a sample is its family's when named as the family or, for a histogram or summary,
    with one of its suffixes."""
    families: dict[str, Family] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        if line.startswith("#"):
            parts = line.split(None, 3)
            if len(parts) >= 4 and parts[1] == "TYPE":
                families.setdefault(parts[2], Family(parts[2], parts[3])).type = parts[3]
            continue
        match = _SAMPLE.match(line)
        if match is None:
            raise ValueError(f"bad sample line {line!r}")
        name, labels, value = match.groups()
        _family_of(name, families).samples.append(Sample(name, _labels(labels or ""), float(value)))
    return families


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """(sample name, sorted labels) -> value of every sample."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for family in parse(text).values()
            for s in family.samples}
