"""The ablation and sensitivity sections of the multi-device results page (sim/multidevice/report.py `ABLATION`,
`ablation_markdown`; sim/multidevice/sensitivity.py `markdown`; docs/multidevice.md "Ablation", "Assumptions and
sensitivity"): every ablation case switches off a real planner setting, and the tables render their rows. The levers'
effects themselves are tested on their traces in tests/voltron/test_feedback.py and test_controller.py."""
from __future__ import annotations

import dataclasses

from planner.voltron.policy import PlannerConfig
from sim.multidevice.report import ABLATION, ablation_markdown
from sim.multidevice.squeeze import trace_config


def test_every_case_turns_off_one_planner_setting_on_a_shipped_trace():
    fields = {f.name for f in dataclasses.fields(PlannerConfig)}
    seen = set()
    for trace, turns, think_s, variants in ABLATION:
        trace_config(trace)                                   # a shipped trace (conf/trace), else an error
        assert turns >= 1 and (think_s is None or think_s > 0)
        assert variants[0] == ("voltron", {})                 # the reference run first
        for label, kw in variants[1:]:
            assert len(kw) == 1 and set(kw) <= fields, label
            PlannerConfig(name="voltron", **kw)               # a valid config
            seen |= set(kw)
    assert seen == {"feedback", "overlap_reload", "disconnect_kv", "comm_scaling", "compute_pruning"}


def test_ablation_table_names_each_trace_once():
    base = dict(ttft_s_max=8.1, tpot_ms_p50=358.0, tpot_ms_p99=385.0, qos_tpot_violation_rate=0.002,
                accuracy_proxy=78.85, stall_s_total=2.5, kv_recompute_s_total=0.0, kv_rebuild_s_total=None)
    rows = [dict(base, trace="weak_link", turns=3, think_s=20.0, variant="voltron"),
            dict(base, trace="weak_link", turns=3, think_s=20.0, variant="no comm scaling", tpot_ms_p99=None)]
    md = ablation_markdown(rows).splitlines()
    assert len(md) == 4 and md[2].startswith("| weak_link (3, 20) | voltron | 8.10 | 358 / 385 | 0.2 % | 78.85 |")
    assert md[3].startswith("|  | no comm scaling |") and "358 / —" in md[3] and md[3].endswith("| 2.5 | 0.0 | — |")


def test_sensitivity_table_one_row_per_variant_with_defaults_and_caps():
    from sim.multidevice.sensitivity import PARAMETERS, PLANNERS, markdown

    cell = dict(tpot_ms_p50=364.0, ttft_s=3.99, qos_tpot_violation_rate=0.0, oom=False, precision="mixed",
                pred_err_tpot_bias=0.019)
    rows = [{"parameter": "defaults", "alternative": "—", "capped": False, **{p: cell for p in PLANNERS}},
            {"parameter": "truth.overlap", "alternative": "×2", "capped": True,
             **{p: dict(cell, oom=p == "tp") for p in PLANNERS}}]
    md = markdown(rows, 3).splitlines()
    assert md[-2] == "| defaults |  | — | 364 / 3.99 | 364 / 3.99 | 364 / 3.99 | 0.0 % | +1.9 % |"
    assert md[-1] == "| truth.overlap | 0.8 | ×2 (cap 1) | 364 / 3.99 | 364 / 3.99 | OOM | 0.0 % | +1.9 % |"
    assert len({k for k, _, _, _ in PARAMETERS}) == len(PARAMETERS)          # one entry per parameter
