"""`resource.Quantity` parsing (`128Mi`, `500m`, `1e3`, `2`), with the API server's grammar.

Only the suffixes Kubernetes accepts are accepted: `Ki Mi Gi Ti Pi Ei`, `n u m k M G T P E` and
`e`/`E` exponents. `128K` is rejected as it is by a real API server (the decimal kilo is `k`).
"""

from __future__ import annotations

import math
import re
from fractions import Fraction

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
_QUANTITY_RE = re.compile(r"^([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))([a-zA-Z]*)([-+]?[0-9]*)$")

QUANTITY_HINT = "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"


class QuantityError(ValueError):
    """The text is not a Kubernetes quantity; `str()` is the API server's message."""


def parse_quantity(value: str | int | float) -> Fraction:
    """The exact value of a quantity.

    Raises:
        QuantityError: not a quantity Kubernetes would accept.
    """
    if isinstance(value, bool):
        raise QuantityError(QUANTITY_HINT)
    if isinstance(value, int | float):
        return Fraction(value)
    m = _QUANTITY_RE.match(value.strip())
    if m is None or value != value.strip():
        raise QuantityError(QUANTITY_HINT)
    number = Fraction(m.group(1))
    suffix, exponent = m.group(2), m.group(3)
    if suffix in ("e", "E") and exponent not in ("", "+", "-"):
        return number * Fraction(10) ** int(exponent)
    if exponent:
        raise QuantityError(QUANTITY_HINT)
    if suffix in _BINARY:
        return number * _BINARY[suffix]
    if suffix in _DECIMAL:
        return number * _DECIMAL[suffix]
    raise QuantityError("unable to parse quantity's suffix")


def to_bytes(value: str | int | float) -> int:
    """A memory or storage quantity in whole bytes, rounded up as the kubelet does."""
    return math.ceil(parse_quantity(value))


def to_nano_cpus(value: str | int | float) -> int:
    """A CPU quantity (`500m`, `2`) in Docker's `nano_cpus` unit."""
    return math.ceil(parse_quantity(value) * 10**9)


def to_millicores(value: str | int | float) -> int:
    return math.ceil(parse_quantity(value) * 1000)
