"""host_coldstart reads validate results from disk: the golden test reads a stored validate metrics.json
(`golden/host_validate/`); without results there is no figure — `figure=all` leaves it out and says why, asking for
it by name stops with that reason — instead of an empty placeholder."""
from pathlib import Path

import pytest

from experiments.figures import host_coldstart, unavailable
from experiments.figures.app import FiguresConfig, left_out, resolve
from experiments.figures.index import markdown as index_markdown
from tests.figures.golden_check import check

FIXTURE = Path(__file__).parent / "golden" / "host_validate"


def test_golden(monkeypatch):
    monkeypatch.setattr(host_coldstart, "RESULT_ROOTS", [FIXTURE])
    df = check("host_coldstart")
    assert {"modelled", "measured"} == set(df.source)


def test_without_results_left_out_of_all_with_the_reason(monkeypatch, tmp_path):
    monkeypatch.setattr(host_coldstart, "RESULT_ROOTS", [tmp_path / "none"])
    why = unavailable("host_coldstart")
    assert why and "no validate results" in why and "experiments.validate" in why
    assert left_out() == {"host_coldstart": why}
    assert "host_coldstart" not in resolve(FiguresConfig(figure="all"))
    with pytest.raises(ValueError, match="figure: host_coldstart: no validate results"):
        resolve(FiguresConfig(figure="host_coldstart"))
    with pytest.raises(ValueError, match="no validate results"):
        host_coldstart.data("toy")
    assert "`host_coldstart` is drawn only from results of `python -m experiments.validate`" in index_markdown()


def test_with_results_drawn_in_all(monkeypatch):
    monkeypatch.setattr(host_coldstart, "RESULT_ROOTS", [FIXTURE])
    assert unavailable("host_coldstart") is None
    assert "host_coldstart" in resolve(FiguresConfig(figure="all"))


def test_markdown_tables_carry_the_run_time_speed_error_and_the_scheduler_breakdown(tmp_path):
    import json

    m = {"framework": "edgeflow", "model": "smollm2_135m", "bits": 5, "prompt_tokens": 16, "repeats": 5,
         "predicted_ttft_s": 0.12, "measured_ttft_s": 0.15, "measured_ttft_min_s": 0.14, "measured_ttft_max_s": 0.16,
         "ttft_error_pct": -20.0, "host_speed": 0.9, "host_speed_min": 0.8, "host_speed_max": 1.0,
         "ttft_error_at_host_speed_pct": -12.5, "ttft_error_at_run_speed_pct": -7.25,
         "ttft_error_at_run_speed_min_pct": -11.0, "ttft_error_at_run_speed_max_pct": 3.0,
         "predicted_core_busy_pct": 96.0, "measured_sched_running_pct": 70.6,
         "measured_sched_queued_pct": 17.6, "measured_sched_waking_pct": 3.9, "measured_sched_no_work_pct": 7.6,
         "measured_sched_other_pct": 0.3, "measured_sched_packed_share": 0.4,
         "measured_sched_wakes_other_core_idle": 462}
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "metrics.json").write_text(json.dumps(m))
    md = host_coldstart.markdown([tmp_path])
    assert "| TTFT error at that speed |" in md and "| -12.5 % |" in md
    assert "| -7.2 % (-11.0 … +3.0) |" in md
    assert "| 96 % | 70.6 % | 17.6 % | 3.9 % | 7.6 % | 40 % of 462 |" in md
    assert "packed, calibration" not in md                                  # older results: no placement table
    m.update(measured_calibration_pack_share=0.6, measured_calibration_pack_idle_s=9.4e-5,
             measured_run_pack_share=0.0, measured_run_pack_idle_s=0.0, predicted_at_run_placement_ttft_s=0.13,
             ttft_error_at_run_placement_pct=-13.3)
    (tmp_path / "r" / "metrics.json").write_text(json.dumps(m))
    assert "| 60 % from 94 us | none | -20.0 % | -13.3 % |" in host_coldstart.markdown([tmp_path])
    del m["measured_sched_running_pct"]
    (tmp_path / "r" / "metrics.json").write_text(json.dumps(m))
    assert "queued behind" not in host_coldstart.markdown([tmp_path])      # runs without a trace: no such table


def test_repeatability_counts_invocations_of_one_prediction(tmp_path):
    import json

    base = {"framework": "edgeflow", "model": "smollm2_135m", "bits": 5, "prompt_tokens": 64, "repeats": 5,
            "measured_ttft_min_s": 0.1, "measured_ttft_max_s": 0.2, "ttft_error_pct": 0.0}
    for i, (pred, meas) in enumerate([(0.100, 0.095), (0.100, 0.125), (0.100, 0.104), (0.200, 0.2)]):
        (tmp_path / f"r{i}").mkdir()
        (tmp_path / f"r{i}" / "metrics.json").write_text(
            json.dumps({**base, "predicted_ttft_s": pred, "measured_ttft_s": meas}))
    rows = host_coldstart.repeatability([tmp_path])
    assert len(rows) == 1                                  # the 0.2 s prediction is another profile: one invocation
    r = rows[0]
    assert r["invocations"] == 3 and r["within_10pct"] == 2
    assert abs(r["spread_pct"] - 100 * (0.125 - 0.095) / 0.095) < 1e-9
    assert r["constant_within_10pct_possible"] is False    # 0.125 / 0.095 > 1.1 / 0.9
    md = host_coldstart.markdown([tmp_path])
    assert "| 3 | 0.095–0.125 | 31.6 % | no | 2 of 3 |" in md
    assert "2 of 3 invocations within ±10 % of their prediction" in md


def test_speedup_repeatability_from_interleaved_rows(tmp_path):
    import json

    base = {"framework": "mnn", "model": "smollm2_135m", "bits": 5, "prompt_tokens": 16, "repeats": 5,
            "predicted_ttft_s": 0.1, "measured_ttft_s": 0.1, "measured_ttft_min_s": 0.1, "measured_ttft_max_s": 0.1,
            "ttft_error_pct": 0.0, "versus_framework": "edgeflow", "predicted_versus_speedup": 1.05}
    for i, s in enumerate([1.0, 1.3, 1.1]):
        (tmp_path / f"v{i}").mkdir()
        (tmp_path / f"v{i}" / "metrics.json").write_text(json.dumps({**base, "measured_versus_speedup": s}))
    (r,) = host_coldstart.speedup_repeatability([tmp_path])
    assert (r["invocations"], r["within_15pct"]) == (3, 2)            # 1.05 vs 1.3: −19 %
    assert r["constant_within_15pct_possible"] is True                  # 1.3 / 1.0 ≤ 1.15 / 0.85
    assert "| smollm2_135m | mnn | 16 | 1.05× | 3 | 1.00–1.30× | yes | 2 of 3 |" in host_coldstart.markdown([tmp_path])
