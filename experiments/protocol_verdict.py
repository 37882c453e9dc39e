"""The host model's acceptance criteria judged on one protocol set, noise included (docs/hil.md "Validation
protocol").

Each criterion gets one of three verdicts:
- **met**: the point value passes;
- **not met**: it fails even at the most favourable point of every measured interval, so the host's noise cannot
  explain the miss (a model error);
- **cannot be judged here**: the point value fails but the intervals reach the pass region, so this host's noise is
  as large as the criterion's tolerance; the verdict line gives the figure.

The criteria (the project's acceptance criteria for a host prediction model, judged on the held-out set):
- bias: |mean signed error| <= BIAS_MAX_PCT with its interval inside +-BIAS_BAND_PCT;
- mean |error| <= MEAN_ABS_MAX_PCT;
- prediction inside its configuration's interval or within +-ROW_TOL_PCT, for >= ROW_SHARE_MIN of configurations;
- paired speed-ups within +-SPEEDUP_TOL_PCT for >= SPEEDUP_SHARE_MIN of cells.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

BIAS_MAX_PCT = 5.0
BIAS_BAND_PCT = 8.0
MEAN_ABS_MAX_PCT = 12.0
ROW_TOL_PCT = 10.0
ROW_SHARE_MIN = 0.70
SPEEDUP_TOL_PCT = 15.0
SPEEDUP_SHARE_MIN = 7 / 9

MET, NOT_MET, UNJUDGED = "met", "not met", "cannot be judged here"


@dataclass(frozen=True)
class Verdict:
    criterion: str
    outcome: str      # MET | NOT_MET | UNJUDGED
    detail: str       # the figures behind the outcome


def _num(v: Any) -> float | None:
    """A CSV / JSON cell as a float; None for empty or NaN."""
    if v is None or v == "":
        return None
    x = float(v)
    return None if math.isnan(x) else x


def _truthy(v: Any) -> bool:
    return v is True or str(v).lower() == "true"


def _closest_to_zero(lo: float, hi: float) -> float:
    """|e| at the most favourable point of [lo, hi]."""
    return 0.0 if lo <= 0.0 <= hi else min(abs(lo), abs(hi))


def _pc(x: float) -> str:
    return f"{x:+.1f} %"


def bias_verdict(m: dict[str, Any]) -> Verdict:
    """From the set's metrics (protocol_bias_pct and its interval)."""
    b, lo, hi = m["protocol_bias_pct"], m["protocol_bias_lo_pct"], m["protocol_bias_hi_pct"]
    name = f"|bias| ≤ {BIAS_MAX_PCT:g} %, interval inside ±{BIAS_BAND_PCT:g} %"
    detail = f"bias {_pc(b)}, interval {_pc(lo)} … {_pc(hi)} (width {hi - lo:.1f} points)"
    if abs(b) <= BIAS_MAX_PCT and lo >= -BIAS_BAND_PCT and hi <= BIAS_BAND_PCT:
        return Verdict(name, MET, detail)
    if hi - lo > 2 * BIAS_BAND_PCT:
        return Verdict(name, UNJUDGED, detail + f": wider than the ±{BIAS_BAND_PCT:g} % band")
    if hi < -BIAS_MAX_PCT or lo > BIAS_MAX_PCT:
        return Verdict(name, NOT_MET, detail + f": the whole interval is beyond ±{BIAS_MAX_PCT:g} %")
    return Verdict(name, NOT_MET, detail)


def mean_abs_verdict(rows: Sequence[dict[str, Any]]) -> Verdict | None:
    """From per-configuration rows (protocol.csv: error_pct, error_lo_pct, error_hi_pct)."""
    errs = [(e, _num(r.get("error_lo_pct")), _num(r.get("error_hi_pct")))
            for r in rows if (e := _num(r.get("error_pct"))) is not None]
    if not errs:
        return None
    point = sum(abs(e) for e, _, _ in errs) / len(errs)
    best = sum(_closest_to_zero(lo, hi) if lo is not None and hi is not None else abs(e)
               for e, lo, hi in errs) / len(errs)
    name = f"mean |error| ≤ {MEAN_ABS_MAX_PCT:g} %"
    detail = f"{point:.1f} % ({best:.1f} % at the most favourable end of every interval)"
    if point <= MEAN_ABS_MAX_PCT:
        return Verdict(name, MET, detail)
    return Verdict(name, NOT_MET if best > MEAN_ABS_MAX_PCT else UNJUDGED, detail)


def rows_verdict(rows: Sequence[dict[str, Any]]) -> Verdict | None:
    """Share of configurations whose prediction is inside the measured interval or within ±ROW_TOL_PCT."""
    have = [r for r in rows if _num(r.get("error_pct")) is not None]
    if not have:
        return None
    ok = [r for r in have if _truthy(r.get("inside")) or abs(_num(r["error_pct"])) <= ROW_TOL_PCT]
    reach = [r for r in have if r in ok or (
        (lo := _num(r.get("error_lo_pct"))) is not None and (hi := _num(r.get("error_hi_pct"))) is not None
        and _closest_to_zero(lo, hi) <= ROW_TOL_PCT)]
    name = f"inside the interval or within ±{ROW_TOL_PCT:g} % for ≥ {100 * ROW_SHARE_MIN:g} % of configurations"
    return _share_verdict(name, len(ok), len(reach), len(have), ROW_SHARE_MIN, ROW_TOL_PCT)


def speedup_verdict(speedups: Sequence[dict[str, Any]]) -> Verdict | None:
    """Share of paired speed-up cells whose predicted speed-up is within ±SPEEDUP_TOL_PCT of the measured one."""
    have = [s for s in speedups if _num(s.get("speedup_error_pct")) is not None]
    if not have:
        return None
    ok = [s for s in have if abs(_num(s["speedup_error_pct"])) <= SPEEDUP_TOL_PCT]

    def reaches(s: dict[str, Any]) -> bool:
        p, lo, hi = _num(s.get("predicted_speedup")), _num(s.get("measured_lo")), _num(s.get("measured_hi"))
        if p is None or lo is None or hi is None or lo <= 0:
            return False
        e_lo, e_hi = 100 * (p / hi - 1), 100 * (p / lo - 1)     # error at the interval's ends
        return _closest_to_zero(e_lo, e_hi) <= SPEEDUP_TOL_PCT

    reach = [s for s in have if s in ok or reaches(s)]
    name = f"paired speed-ups within ±{SPEEDUP_TOL_PCT:g} % for ≥ 7 in 9 cells"
    return _share_verdict(name, len(ok), len(reach), len(have), SPEEDUP_SHARE_MIN, SPEEDUP_TOL_PCT)


def _share_verdict(name: str, ok: int, reach: int, n: int, share: float, tol: float) -> Verdict:
    """A share criterion: met with `ok` of `n` passing; not met when even the `reach` cases whose interval touches
    the tolerance somewhere fall short of the share."""
    need = math.ceil(share * n - 1e-9)
    detail = f"{ok} of {n} (need {need}); {reach} reach ±{tol:g} % somewhere in their interval"
    if ok >= need:
        return Verdict(name, MET, detail)
    return Verdict(name, NOT_MET if reach < need else UNJUDGED, detail)


def verdicts(m: dict[str, Any], rows: Sequence[dict[str, Any]], speedups: Sequence[dict[str, Any]]
             ) -> list[Verdict]:
    """Every criterion that the set's data can speak to, in the order of the module docstring; none for a peer set
    (real llama.cpp against the llama.cpp policy: it has its own acceptance line, experiments.protocol_peer)."""
    if m.get("protocol_n") is None or m.get("protocol_peer"):
        return []
    out = [bias_verdict(m), mean_abs_verdict(rows), rows_verdict(rows), speedup_verdict(speedups)]
    return [v for v in out if v is not None]


def verdicts_md(vs: Sequence[Verdict]) -> str:
    """One bullet per criterion: '- Criterion — outcome: figures'."""
    return "\n".join(f"- Criterion {v.criterion}: **{v.outcome}** — {v.detail}" for v in vs)
