"""Several calibration rounds merged into one set of measurements (docs/hil.md "Host profile", "Rounds").

On a shared 2-vCPU host one calibration moves a plan's prediction by 10-20 % (measured, docs/hil.md "Rounds"): two full
calibrations ten minutes apart gave the 2-thread GEMM's parallel efficiency 0.91 and 0.47, the interrupt-side read cost
17.7 and 4.8 GB/s, the INT8 GEMM rate 184 and 221 GOP/s — each figure the median of its own repeats, taken within a few
seconds, so a noisy stretch of seconds moves the figures measured in it together. `rounds` full passes of every
measurement, merged figure by figure with the median over rounds, are robust to one noisy stretch per figure (with 3
rounds a figure is right when 2 of its 3 rounds are), and every round stays self-consistent (a round's later steps use
that round's request size and read costs).

Merge rules, by type (the same tree in every round, else ValueError: rounds of different settings are not merged):
- float: the median over rounds; int: the lower median (a member of the rounds: a request size stays one that was
  measured); bool / str / None: equal in every round.
- `Stat`: median of the rounds' medians; spread = the larger of the rounds' median spread and the spread of the
  rounds' medians (between-round movement is reported, not hidden); n = the sum.
- dict: per key (same keys); keys named `*_min` / `*_max`: min / max over rounds; `wall_s` (seconds per step):
  the sum, as the wall time the calibration took. A dict that is a row of a curve (an element of a list: a GEMM
  shape, a read request size) is a point: its ints are its coordinates and must be equal in every round.
- list / tuple: element by element (same length); dataclass: field by field.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from hil.calibrate_stats import Stat

SUMMED = ("wall_s",)


def merge_rounds(rounds: list[Any]) -> Any:
    """One value merged from the same structure measured in each of `rounds` (module docstring)."""
    if not rounds:
        raise ValueError("merge_rounds: no rounds to merge")
    return _merge(list(rounds), "measurements")


def _lower_median(vals: list[int]) -> int:
    return sorted(vals)[(len(vals) - 1) // 2]


def _merge_stat(vals: list[Stat]) -> Stat:
    meds = np.array([v.median for v in vals], dtype=np.float64)
    med = float(np.median(meds))
    between = float(np.ptp(meds) / med) if med > 0 else 0.0
    return Stat(med, max(float(np.median([v.spread for v in vals])), between), int(sum(v.n for v in vals)))


def _same_type(vals: list[Any], where: str) -> type:
    kinds = {type(v) for v in vals}
    if kinds <= {int, float} and len(kinds) == 2:      # a figure that came out integral in one round only
        return float
    if len(kinds) != 1:
        raise ValueError(f"{where}: rounds disagree in type ({', '.join(sorted(k.__name__ for k in kinds))})")
    return kinds.pop()


def _merge(vals: list[Any], where: str, row: bool = False) -> Any:
    kind = _same_type(vals, where)
    if kind is dict and where.rsplit(".", 1)[-1] in SUMMED:
        return {k: float(sum(v[k] for v in vals)) for k in vals[0]}
    if kind is Stat:
        return _merge_stat(vals)
    if dataclasses.is_dataclass(kind):
        return kind(**{f.name: _merge([getattr(v, f.name) for v in vals], f"{where}.{f.name}")
                       for f in dataclasses.fields(kind)})
    if kind is dict:
        keys = list(vals[0])
        if any(list(v) != keys for v in vals[1:]):
            raise ValueError(f"{where}: rounds measured different keys")
        out = {}
        for k in keys:
            col = [v[k] for v in vals]
            name = str(k)
            if row and all(type(x) is int for x in col):
                if any(x != col[0] for x in col[1:]):
                    raise ValueError(f"{where}.{name}: rounds measured different points ({col})")
                out[k] = col[0]
            elif name.endswith("_min") and all(isinstance(x, (int, float)) for x in col):
                out[k] = min(col)
            elif name.endswith("_max") and all(isinstance(x, (int, float)) for x in col):
                out[k] = max(col)
            else:
                out[k] = _merge(col, f"{where}.{name}")
        return out
    if kind in (list, tuple):
        n = len(vals[0])
        if any(len(v) != n for v in vals[1:]):
            raise ValueError(f"{where}: rounds measured different numbers of points ({[len(v) for v in vals]})")
        return kind(_merge([v[i] for v in vals], f"{where}[{i}]", row=True) for i in range(n))
    if kind is bool or kind is str or vals[0] is None:
        if any(v != vals[0] for v in vals[1:]):
            raise ValueError(f"{where}: rounds disagree ({vals[0]!r} vs {next(v for v in vals if v != vals[0])!r})")
        return vals[0]
    if kind is int:
        return _lower_median(vals)
    if kind is float:
        return float(np.median(np.asarray(vals, dtype=np.float64)))
    raise ValueError(f"{where}: cannot merge values of type {kind.__name__}")


def measure_rounds(scratch_dir, s, log=lambda m: None) -> tuple[Any, list[Any]]:
    """`s.rounds` full passes of `hil.calibrate.measure_all`: (the merged measurements, each round's)."""
    from hil.calibrate import measure_all

    rounds = []
    for i in range(s.rounds):
        if s.rounds > 1:
            log(f"calibrate: round {i + 1}/{s.rounds}")
        rounds.append(measure_all(scratch_dir, s, log))
    return (rounds[0] if len(rounds) == 1 else merge_rounds(rounds)), rounds
