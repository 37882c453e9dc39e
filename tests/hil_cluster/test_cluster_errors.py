"""The emulated cluster's error report (experiments/validate_cluster.py `prediction_errors`): both planner estimates
judged, over all steps and without the steps that contain a plan switch. Synthetic rows, no cluster."""
from __future__ import annotations

import pytest

from experiments.validate_cluster import prediction_errors


def _row(phase, pred, plan, meas, switch_s=0.0, replanned=False, retries=0):
    return {"phase": phase, "predicted_s": pred, "predicted_plan_s": plan, "measured_step_s": meas,
            "switch_s": switch_s, "replanned": replanned, "retries": retries}


def test_errors_per_estimate_and_without_switch_steps():
    rows = [_row("prefill", 1.0, 1.2, 1.0),
            _row("decode", 0.30, 0.30, 0.30), _row("decode", 0.30, 0.25, 0.30), _row("decode", 0.30, 0.30, 0.30),
            _row("decode", 0.30, 0.30, 0.60, switch_s=0.5, replanned=True),
            _row("decode", 0.30, 0.30, 0.60, retries=1), _row("decode", 0.30, 0.30, 0.60, switch_s=0.2)]
    e = prediction_errors(rows)
    assert e["decode_all_n"] == 6 and e["decode_no_switch_n"] == 3 and e["prefill_all_n"] == 1
    assert e["decode_all_recosted_p50_error_pct"] == pytest.approx(100 * (0.30 - 0.45) / 0.45)
    assert e["decode_no_switch_recosted_p50_error_pct"] == pytest.approx(0.0)
    assert e["decode_no_switch_plan_mape_pct"] == pytest.approx(100 * (0.05 / 0.30) / 3)
    assert e["prefill_all_plan_p50_error_pct"] == pytest.approx(20.0)
    assert e["prefill_no_switch_recosted_p50_error_pct"] == pytest.approx(0.0)
