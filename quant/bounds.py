"""The one numeric-setting rule of every config (apps' top-level keys, every group's schema, hil/cluster settings):
a number is a real int/float (not bool), finite, and inside its documented range; comparisons are written so that NaN
fails them (`not lo <= v <= hi`), never `v < lo` alone, which NaN passes. Errors are `ConfigError` (a ValueError)
naming the key. At the bottom of the dependency order (quant/) so that planner/, sim/ and hil/ schemas use it too;
`experiments.common` re-exports it.
"""
from __future__ import annotations

import math
from typing import Any

MAX_MAGNITUDE = 1e15    # no setting of this project is larger (bytes ≤ 1e13, bit/s ≤ 1e11, seeds ≤ 2^32): a bound
#                         every numeric key has even where its schema names no tighter one (`check_numbers`)


class ConfigError(ValueError):
    """A config value is invalid; the message names the key."""


def finite(value: Any, key: str, lo: float | None = None, hi: float | None = None, *, lo_open: bool = False) -> float:
    """A real number (int or float, not bool, not NaN/inf) in [lo, hi] ((lo, hi] with lo_open) -> float."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{key}: must be a number (got {value!r})")
    v = float(value)
    if not math.isfinite(v):
        raise ConfigError(f"{key}: must be a finite number (got {value!r})")
    if lo is not None and not (v > lo if lo_open else v >= lo):
        raise ConfigError(f"{key}: must be {'>' if lo_open else '>='} {lo:g} (got {value!r})")
    if hi is not None and not v <= hi:
        raise ConfigError(f"{key}: must be <= {hi:g} (got {value!r})")
    return v


def int_in(value: Any, key: str, lo: int | None = None, hi: int | None = None) -> int:
    """An integer (not bool; a float only when integral, e.g. 1e3) in [lo, hi] -> int."""
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{key}: must be an integer (got {value!r})")
    if lo is not None and not value >= lo:
        raise ConfigError(f"{key}: must be >= {lo} (got {value})")
    if hi is not None and not value <= hi:
        raise ConfigError(f"{key}: must be <= {hi} (documented maximum; got {value})")
    return value


TRUE_WORDS = ("true", "1", "yes", "on")
FALSE_WORDS = ("false", "0", "no", "off")


def strict_bool(value: Any, key: str) -> bool:
    """The one truth-value rule (config keys and environment variables alike): a bool, the integers 1 / 0, or
    true/false, 1/0, yes/no, on/off in any case -> bool; anything else is an error naming `key`. Use the returned
    value: the text "no" is truthy in Python."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str):
        word = value.strip().lower()
        if word in TRUE_WORDS:
            return True
        if word in FALSE_WORDS:
            return False
    raise ConfigError(f"{key}: must be true or false (also 1/0, yes/no, on/off; got {value!r})")


def check_numbers(node: Any, key: str = "") -> None:
    """Every number in a (nested) mapping / list — every leaf of a composed config — is finite and within
    ±MAX_MAGNITUDE; the error names the full key (`live.trace_speed`, `cluster.emulation.mem_budget_mb[1]`)."""
    if isinstance(node, dict):
        for k, v in node.items():
            check_numbers(v, f"{key}.{k}" if key else str(k))
    elif isinstance(node, (list, tuple)):
        for i, v in enumerate(node):
            check_numbers(v, f"{key}[{i}]")
    elif isinstance(node, (int, float)) and not isinstance(node, bool):
        finite(node, key, -MAX_MAGNITUDE, MAX_MAGNITUDE)
