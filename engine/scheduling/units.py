"""Quantities and durations as users write them in a queue configuration.

Each parser takes what YAML or JSON can hold (a number or a string), returns the canonical value the
policy computes with, and raises ``ValueError`` with a message that completes ``"<field>: "`` (the
caller prefixes the field path). Decimal arithmetic, not floats, decides whether a value is whole:
``0.3`` CPUs is exactly 300 millicores, and ``1.5Gi`` exactly 1610612736 bytes.

- GPUs: a whole number, ``2`` or ``"2"``.
- CPUs: integer *millicores*, Kubernetes style: ``16`` and ``"16"`` are 16 CPUs, ``0.5`` half a CPU,
  ``"500m"`` 500 millicores.
- Memory: integer *bytes*: ``68719476736``, ``"64Gi"`` (binary), ``"64G"`` (decimal), ``"512Mi"``.
  Suffixes are case-insensitive, as in ``engine.core.Resources``, so ``"512m"`` is 512 megabytes, never
  Kubernetes' 0.512 bytes.
- Durations: seconds: ``60``, ``1.5``, ``"60s"``, ``"2m"``, ``"1h"``, ``"1m30s"``, ``"500ms"``, ``"1d"``.
"""

from __future__ import annotations

import math
import re
from decimal import Decimal, InvalidOperation

from engine.core.resources import MEMORY_UNITS

__all__ = ["MILLI", "cpus_of", "parse_cpu", "parse_duration", "parse_gpu", "parse_mem"]

MILLI = 1000

# the suffixes ``Resources(mem=...)`` takes, plus peta: one table for a task's memory and a quota's
_MEM_UNITS = {**MEMORY_UNITS, "p": 10**15, "pb": 10**15, "pi": 2**50, "pib": 2**50}
_DURATION_UNITS = {"ms": Decimal("0.001"), "s": Decimal(1), "m": Decimal(60), "h": Decimal(3600), "d": Decimal(86400)}
# a plain decimal number: no sign (negatives get their own message), no exponent, no inf/nan
_NUMBER = r"(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9][0-9_]*)"
_QUANTITY = re.compile(rf"({_NUMBER})\s*([a-zA-Z]*)")
_DURATION_PART = re.compile(rf"({_NUMBER})\s*(ms|s|m|h|d)")


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _number(value: object, what: str, examples: str) -> Decimal:
    """A finite, non-negative number from an int, a float or a bare numeric string."""
    # bool is an int to Python, but ``gpu: true`` is a mistake, not 1 GPU
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ValueError(f"must be {what} like {examples}, got {_shown(value)}")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"must be a finite number, got {value!r}")
    try:
        # str(float) is its shortest repr, so 0.3 is Decimal("0.3"), not 0.299999...
        number = Decimal(str(value).strip().replace("_", "")) if not isinstance(value, int) else Decimal(value)
    except InvalidOperation:
        raise ValueError(f"must be {what} like {examples}, got {_shown(value)}") from None
    if not number.is_finite():
        raise ValueError(f"must be a finite number, got {_shown(value)}")
    if number < 0:
        raise ValueError(f"must be >= 0, got {_shown(value)}")
    return number


def _split(value: str, what: str, examples: str) -> tuple[Decimal, str]:
    """``"64Gi"`` -> (64, "gi"); a leading minus gets the ">= 0" message rather than "not a quantity"."""
    text = value.strip()
    if text.startswith("-"):
        raise ValueError(f"must be >= 0, got {_shown(value)}")
    match = _QUANTITY.fullmatch(text)
    if not match:
        raise ValueError(f"must be {what} like {examples}, got {_shown(value)}")
    return Decimal(match.group(1).replace("_", "")), match.group(2).lower()


def parse_gpu(value: object) -> int:
    """A whole number of GPUs (``2`` or ``"2"``); a fraction of a GPU cannot be placed."""
    examples = "2 or '2'"
    number = _number(value, "a whole number of GPUs", examples)
    if number != number.to_integral_value():
        raise ValueError(f"must be a whole number of GPUs, got {_shown(value)}")
    return int(number)


def parse_cpu(value: object) -> int:
    """Millicores from CPUs (``16``, ``0.5``, ``"16"``) or millicores (``"500m"``)."""
    examples = "16, 0.5 or '500m'"
    if isinstance(value, str):
        number, unit = _split(value, "a CPU quantity", examples)
        if unit not in ("", "m"):
            raise ValueError(f"must be a CPU quantity like {examples}, got {_shown(value)} (unknown unit {unit!r})")
        millis = number if unit == "m" else number * MILLI
    else:
        millis = _number(value, "a CPU quantity", examples) * MILLI
    if millis != millis.to_integral_value():
        raise ValueError(f"must be a whole number of millicores (0.001 CPU), got {_shown(value)}")
    return int(millis)


def parse_mem(value: object) -> int:
    """Bytes from an int or a quantity string (``"64Gi"``, ``"64G"``, ``"512Mi"``)."""
    examples = "'64Gi', '512Mi', '64G' or a number of bytes"
    if isinstance(value, str):
        number, unit = _split(value, "a memory quantity", examples)
        if unit not in _MEM_UNITS:
            raise ValueError(
                f"must be a memory quantity like {examples}, got {_shown(value)} (unknown unit {unit!r}; "
                "use Ki, Mi, Gi, Ti, Pi or K, M, G, T, P)"
            )
        size = number * _MEM_UNITS[unit]
    else:
        size = _number(value, "a memory quantity", examples)
    if size != size.to_integral_value():
        raise ValueError(f"must be a whole number of bytes, got {_shown(value)}")
    return int(size)


def parse_duration(value: object) -> float:
    """Seconds from a number or a string of number+unit parts: ``"90s"``, ``"2m"``, ``"1h"``, ``"1m30s"``."""
    examples = "60, '60s', '2m', '1h' or '1m30s'"
    if not isinstance(value, str):
        return float(_number(value, "a duration", examples))
    text = value.strip().replace(" ", "")
    if text.startswith("-"):
        raise ValueError(f"must be >= 0, got {_shown(value)}")
    if not text:
        raise ValueError(f"must be a duration like {examples}, got {_shown(value)}")
    if re.fullmatch(_NUMBER, text):
        return float(Decimal(text.replace("_", "")))
    total = Decimal(0)
    position = 0
    for match in _DURATION_PART.finditer(text):
        # parts must tile the whole string: "1m30" or "1x30s" are refused, not read as "1m"
        if match.start() != position:
            break
        total += Decimal(match.group(1).replace("_", "")) * _DURATION_UNITS[match.group(2)]
        position = match.end()
    if position != len(text):
        raise ValueError(f"must be a duration like {examples}, got {_shown(value)} (units: ms, s, m, h, d)")
    return float(total)


def cpus_of(millicores: int) -> int | float:
    """Millicores as CPUs for people and for the written configuration: ``16000`` -> 16, ``500`` -> 0.5."""
    whole, rest = divmod(millicores, MILLI)
    return whole if rest == 0 else millicores / MILLI
