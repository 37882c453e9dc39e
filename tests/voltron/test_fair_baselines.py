"""Fair Voltron baselines (docs/multidevice.md): a baseline chooses the best uniform precision that meets QoS, and no
policy behaviour depends on its name (capabilities are declared by the policy class)."""
from __future__ import annotations

import numpy as np

from planner.voltron.rssi import RssiTable
from planner.voltron.static import SEARCH_EVALS
from sim.multidevice.report import _prec
from sim.multidevice.runner import run_conversation
from sim.multidevice.workload import WorkloadConfig
from sim.wireless import RssiTrace, TraceConfig
from tests.voltron.helpers import links, policy

MEASURED = ("plan_ms_p50", "plan_ms_max", "plan_ms_p50_search")


def _conv(pol, trace="walk_away", turns=3, think=20.0):
    tr = RssiTrace.load(TraceConfig(name=trace, csv=f"{trace}.csv"))
    return run_conversation(pol, pol.ctx, tr, RssiTable(), WorkloadConfig(turns=turns, seed=0, think_s=think), seed=0)


def test_mp_lowers_precision_to_meet_qos_gemma3_12b_office():
    pol = policy("gemma3_12b", name="mp")
    cfg = pol.ctx.cfg
    b = pol.ctx.cluster.budgets()
    dec = pol.env(1, 1, 64 + 64, links(-45, -45), b)
    pre = pol.env(0, 64, 64, links(-45, -45), b)
    cands = pol._candidates(dec, pre)
    assert len(cands) == SEARCH_EVALS == 3
    target = cfg.qos_tpot_s * (1 - cfg.qos_margin)
    # a higher uniform precision fits every device but misses the TPOT QoS; INT4 meets it
    assert any(d.fits and p.fits and d.est_time_s > target for d, p in cands[:2])
    assert cands[2][0].fits and cands[2][0].est_time_s <= target
    d = pol.start_turn(links(-45, -45), b, 64, 64)
    assert not d.oom
    assert (d.next_plan.precision == 2).all() and (d.plan.precision == 2).all()      # lowered to INT4 for QoS
    m = _conv(pol).metrics
    assert m["precision"] == "INT4" and m["precision_share_int4"] == 1.0
    # the old rule (highest uniform precision that fits) on the same conversation: slower and every token over QoS
    old_rule = type("HighestFits", (type(pol),), {"_choose": lambda self, c: next(
        (x for x in c if x[0].fits and (x[1] is None or x[1].fits)), c[-1])})(pol.ctx)
    m_old = _conv(old_rule).metrics
    assert m_old["precision"] in ("FP16", "INT8") and m_old["qos_tpot_violation_rate"] == 1.0
    assert m["tpot_ms_p50"] < 0.85 * m_old["tpot_ms_p50"]
    assert m["qos_ttft_ok"] and m["qos_tpot_violation_rate"] < 0.5 * m_old["qos_tpot_violation_rate"]


def test_baseline_keeps_highest_precision_when_it_meets_qos():
    pol = policy("qwen2_5_3b", name="mp")                 # small model: INT8 (or FP16) already meets QoS
    b = pol.ctx.cluster.budgets()
    d = pol.start_turn(links(-45, -45), b, 64, 0)
    cands = pol._candidates(pol.env(1, 1, 64, links(-45, -45), b), pol.env(0, 64, 0, links(-45, -45), b))
    best = next(i for i, (dp, pp) in enumerate(cands) if dp.fits and pp.fits and dp.est_time_s <= 0.38
                and pp.est_time_s <= 9.5)
    assert int(d.next_plan.precision[0]) == best < 2


def _renamed(pol, new_name: str):
    cls = type(pol)
    return type(f"Renamed{cls.__name__}", (cls,), {"name": new_name})(pol.ctx)


def test_no_policy_behaviour_depends_on_its_name():
    for name, model in (("voltron", "qwen2_5_14b"), ("mp", "qwen2_5_14b"), ("tp", "qwen2_5_7b")):
        pol = policy(model, name=name)
        a = _conv(type(pol)(pol.ctx), "walk_away_disconnect", turns=4, think=40.0)
        b = _conv(_renamed(pol, "not-" + name), "walk_away_disconnect", turns=4, think=40.0)
        ma = {k: v for k, v in a.metrics.items() if k not in MEASURED}
        mb = {k: v for k, v in b.metrics.items() if k not in MEASURED}
        assert ma == mb, name
        assert a.timeline == b.timeline, name
        assert [p.to_json() for p in a.plans.values()] == [p.to_json() for p in b.plans.values()]


def test_kv_handling_is_a_declared_capability():
    """The simulator asks the policy (`lost_kv()`), so a Voltron subclass declaring `recompute` is charged the
    re-prefill, and the default Voltron (prune) is not."""
    pol = policy("qwen2_5_14b")
    rec = type("Recompute", (type(pol),), {"lost_kv": lambda self: "recompute"})(pol.ctx)
    a = _conv(type(pol)(pol.ctx), "walk_away_disconnect", turns=5, think=60.0).metrics
    b = _conv(rec, "walk_away_disconnect", turns=5, think=60.0).metrics
    assert a["kv_lost_events"] >= 1 and a["kv_recompute_s_total"] == 0.0
    assert b["kv_lost_events"] >= 1 and b["kv_recompute_s_total"] > 0.0
    assert policy("qwen2_5_14b", name="mp").lost_kv() == "recompute"


def test_report_shows_chosen_precision():
    row = {"precision": "INT4", "precision_share_fp16": 0.0, "precision_share_int8": 0.0, "precision_share_int4": 1.0}
    assert _prec(row) == "INT4"
    mixed = dict(row, precision="mixed", precision_share_fp16=0.25, precision_share_int8=0.5,
                 precision_share_int4=0.25)
    assert _prec(mixed) == "mixed 25/50/25 %"
    m = _conv(policy("qwen2_5_14b")).metrics
    assert m["precision"] == "mixed" and np.isclose(
        m["precision_share_fp16"] + m["precision_share_int8"] + m["precision_share_int4"], 1.0)
