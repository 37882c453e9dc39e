"""experiments.protocol_verdict: met / not met / cannot be judged, on hand-made sets whose answer is known."""
from __future__ import annotations

from experiments.protocol_verdict import (
    MET,
    NOT_MET,
    UNJUDGED,
    bias_verdict,
    mean_abs_verdict,
    rows_verdict,
    speedup_verdict,
    verdicts,
    verdicts_md,
)


def _m(b, lo, hi):
    return {"protocol_n": 3, "protocol_bias_pct": b, "protocol_bias_lo_pct": lo, "protocol_bias_hi_pct": hi}


def _row(e, lo, hi, inside=False):
    return {"error_pct": e, "error_lo_pct": lo, "error_hi_pct": hi, "inside": str(inside)}


def test_bias_outcomes():
    assert bias_verdict(_m(-2.0, -6.0, 3.0)).outcome == MET
    assert bias_verdict(_m(-13.6, -19.4, -8.1)).outcome == NOT_MET           # noise cannot explain it
    assert bias_verdict(_m(-4.0, -20.0, 9.0)).outcome == UNJUDGED            # interval wider than the band
    assert bias_verdict(_m(-4.3, -11.6, 2.9)).outcome == NOT_MET             # point passes, interval does not


def test_mean_abs_uses_the_most_favourable_interval_end():
    assert mean_abs_verdict([_row(5, 0, 9), _row(-8, -12, -3)]).outcome == MET
    # 20 % mean, but both intervals reach 0: the noise explains it
    assert mean_abs_verdict([_row(20, -1, 30), _row(-20, -25, 2)]).outcome == UNJUDGED
    # even the favourable ends miss by more than 12 %
    assert mean_abs_verdict([_row(30, 20, 40), _row(-30, -40, -15)]).outcome == NOT_MET
    assert mean_abs_verdict([{"error_pct": ""}]) is None


def test_rows_share_counts_inside_or_within_tolerance():
    ok = [_row(2, -1, 4)] * 7 + [_row(30, 25, 35)] * 3                     # 7 of 10 within +-10 %
    assert rows_verdict(ok).outcome == MET
    bad = [_row(2, -1, 4)] * 6 + [_row(30, 25, 35)] * 4
    assert rows_verdict(bad).outcome == NOT_MET
    noisy = [_row(2, -1, 4)] * 6 + [_row(30, 5, 35)] * 4                    # the misses reach +-10 %
    assert rows_verdict(noisy).outcome == UNJUDGED
    inside = [_row(40, 30, 50, inside=True)] * 10                          # inside counts whatever the error
    assert rows_verdict(inside).outcome == MET


def test_speedups():
    cell = lambda err, p, lo, hi: {"speedup_error_pct": err, "predicted_speedup": p, "measured_lo": lo,  # noqa
                                   "measured_hi": hi}
    good = [cell(3, 1.03, 0.95, 1.05)] * 7 + [cell(30, 1.3, 0.98, 1.02)] * 2
    assert speedup_verdict(good).outcome == MET
    bad = [cell(3, 1.03, 0.95, 1.05)] * 5 + [cell(30, 1.3, 0.98, 1.02)] * 4
    assert speedup_verdict(bad).outcome == NOT_MET
    wide = [cell(3, 1.03, 0.95, 1.05)] * 5 + [cell(30, 1.3, 0.9, 1.5)] * 4
    assert speedup_verdict(wide).outcome == UNJUDGED


def test_verdicts_render_one_line_each():
    vs = verdicts(_m(-2.0, -6.0, 3.0), [_row(2, -1, 4)] * 3, [])
    assert [v.outcome for v in vs] == [MET, MET, MET]
    assert verdicts_md(vs).count("\n") == 2 and "**met**" in verdicts_md(vs)
    assert verdicts({"protocol_n": None}, [], []) == []
    assert verdicts({**_m(-2.0, -6.0, 3.0), "protocol_peer": True}, [_row(2, -1, 4)] * 3, []) == []
