"""Kubernetes resource quantities ("2Gi", "500m", "1000", "1.5", "1e3") as integers.

Same grammar as ``k8s.io/apimachinery`` ``resource.Quantity``: a signed decimal number and an optional
binary (Ki..Ei) or decimal (n, u, m, k, M, G, T, P, E) suffix or a decimal exponent (e3, E-2). Like
``Quantity.Value()`` / ``MilliValue()``, fractions are rounded up (towards +infinity).
"""

from __future__ import annotations

import math
import re
from fractions import Fraction

_QUANTITY = re.compile(r"^([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))([eE][+-]?[0-9]+|[A-Za-z]{0,2})$")
_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 10**3),
    "": Fraction(1),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
}
# apimachinery caps quantities near 2^63; a larger exponent is an error, not a slow bignum.
_MAX_EXPONENT = 18
_INT64_MAX = 2**63 - 1


class QuantityError(ValueError):
    """A string is not a Kubernetes quantity (or does not fit in int64)."""


def _parse_exact(text: str) -> Fraction:
    if not isinstance(text, str):
        raise QuantityError(f"quantity must be a string, got {type(text).__name__}")
    match = _QUANTITY.match(text.strip())
    if match is None:
        raise QuantityError(f"not a quantity: {text!r}")
    number, suffix = match.groups()
    value = Fraction(number)
    if suffix in _BINARY:
        value *= _BINARY[suffix]
    elif suffix in _DECIMAL:
        value *= _DECIMAL[suffix]
    elif suffix[:1] in ("e", "E") and suffix[1:].lstrip("+-").isdigit():
        exponent = int(suffix[1:])
        if abs(exponent) > _MAX_EXPONENT:
            raise QuantityError(f"exponent out of range in quantity {text!r}")
        value *= Fraction(10) ** exponent
    else:
        raise QuantityError(f"unknown suffix {suffix!r} in quantity {text!r}")
    if abs(value) * 1000 > _INT64_MAX:
        raise QuantityError(f"quantity {text!r} does not fit in int64")
    return value


def parse_quantity(text: str) -> int:
    """The quantity in base units, rounded up: "2Gi" → 2147483648, "500m" → 1, "1000" → 1000."""
    return math.ceil(_parse_exact(text))


def parse_quantity_milli(text: str) -> int:
    """The quantity in thousandths, rounded up: "500m" → 500, "2" → 2000, "0.1" → 100."""
    return math.ceil(_parse_exact(text) * 1000)


def parse_resource_quantity(resource: str, text: str) -> int:
    """A quantity in the integer unit Koordinator uses for ``resource``.

    ``cpu`` is counted in milli-cores ("4" → 4000); every other resource in its base unit: bytes for
    memory, and the batch/mid CPU resources are already integer milli-cores ("1000" → 1000, docs/koordinator.md §12).
    """
    return parse_quantity_milli(text) if resource == "cpu" else parse_quantity(text)
