"""The multi-device simulator's own device and link model (docs/multidevice.md): independent of the planner's cost
functions, deterministic for a seed, and the planner's prediction error against it is reported."""
from __future__ import annotations

import ast
import dataclasses

import numpy as np
import pytest

from planner.voltron.comm import LinkState
from planner.voltron.hybrid import HybridPlanner
from planner.voltron.rssi import RssiTable
from sim.multidevice.device_model import GroundTruth, TruthAssumptions
from sim.multidevice.runner import run_conversation
from sim.multidevice.workload import WorkloadConfig
from sim.wireless import RssiTrace, TraceConfig
from tests.conftest import REPO
from tests.voltron.helpers import links, policy

PLANNER_COST = {"device_time", "tp_comm", "boundary_comm", "hop", "HybridPlanner", "LatencyModel", "type_costs",
                "simulate_profiles"}


def test_simulator_sources_never_name_planner_cost_functions():
    for path in (REPO / "sim" / "multidevice").glob("*.py"):
        tree = ast.parse(path.read_text())
        names = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
        names |= {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
        names |= {a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}
        assert not (names & PLANNER_COST), (path.name, names & PLANNER_COST)


def _plan(pol, dbm=-45, kv=512):
    env = pol.env(1, 1, kv, links(dbm, dbm), pol.ctx.cluster.budgets())
    return pol.search.search([(env, pol.tpot_target())]).plans[0], env


def test_step_runs_with_planner_cost_functions_disabled(monkeypatch):
    pol = policy("qwen2_5_14b")
    plan, env = _plan(pol)
    assert plan.n_tp > 0                                            # TP layers and MP boundaries are exercised
    truth = GroundTruth(pol.ctx.cluster, pol.ctx.table)

    def boom(*a, **k):
        raise AssertionError("the simulator called a planner cost function")

    import planner.voltron.devices as devices
    monkeypatch.setattr(devices, "device_time", boom)
    monkeypatch.setattr(LinkState, "tp_comm", boom)
    monkeypatch.setattr(LinkState, "hop", boom)
    monkeypatch.setattr(HybridPlanner, "boundary_comm", staticmethod(boom))
    t, comm, e = truth.step(plan, 1, 512, env.links, np.random.default_rng(0), 0.03)
    assert np.isfinite(t) and 0 < comm < t and e > 0


def test_deterministic_for_a_seed():
    pol = policy("qwen2_5_7b")
    tr = RssiTrace.load(TraceConfig(name="walk_away", csv="walk_away.csv"))

    def run(seed):
        p = type(pol)(pol.ctx)
        return run_conversation(p, p.ctx, tr, RssiTable(), WorkloadConfig(turns=2, seed=0), seed=seed).timeline

    a, b, c = run(3), run(3), run(4)
    assert [r["step_s"] for r in a] == [r["step_s"] for r in b]
    assert [r["step_s"] for r in a] != [r["step_s"] for r in c]


def test_tp_layer_schedule_bounds():
    """A TP sublayer takes at least its slowest member's compute plus the serialised airtime of broadcast + reply
    of one remote member, and more than the same sublayer with a weaker link."""
    pol = policy("qwen2_5_14b")
    truth = GroundTruth(pol.ctx.cluster, pol.ctx.table, assumptions=TruthAssumptions(msg_jitter=0.0))
    used = np.array([[True, True, False]])
    t_dev = np.array([[0.004, 0.003, 0.0]])
    nb = np.array([10_000.0])
    eps = np.ones((1, 3))
    strong = truth.tp_layers(links(-45, -45), nb, used, t_dev, eps, eps)[0]
    weak = truth.tp_layers(links(-75, -45), nb, used, t_dev, eps, eps)[0]
    lk = links(-45, -45)
    air = 2 * nb[0] / lk.goodput[1]
    assert strong >= max(t_dev[0, 0], air + t_dev[0, 1] + 2 * lk.latency[1]) - 1e-12
    assert weak > strong


def test_prediction_error_reported_and_follows_the_truth():
    """pred_err_* are in the metrics; making only the simulated devices slower (less compute/memory overlap) makes
    the open-loop planner's estimates more optimistic (more negative bias) — it does not see it; the closed loop
    (planner.feedback) corrects its model from the measured steps and removes most of that bias."""
    import dataclasses

    from planner.voltron.feedback import FeedbackConfig
    from planner.voltron.registry import make_policy

    pol = policy("qwen2_5_7b")
    tr = RssiTrace.load(TraceConfig(name="steady_strong", csv="steady_strong.csv"))
    out = {}
    for loop in (False, True):
        cfg = dataclasses.replace(pol.ctx.cfg, feedback=FeedbackConfig(enabled=loop))
        for ov in (0.8, 0.0):
            p = make_policy(dataclasses.replace(pol.ctx, cfg=cfg))
            m = run_conversation(p, p.ctx, tr, RssiTable(), WorkloadConfig(turns=2, seed=0), seed=0,
                                 truth=TruthAssumptions(overlap=ov)).metrics
            for k in ("pred_err_ttft_mape", "pred_err_ttft_bias", "pred_err_tpot_mape", "pred_err_tpot_bias"):
                assert m[k] is not None and np.isfinite(m[k])
            out[loop, ov] = m
    assert out[False, 0.0]["pred_err_tpot_bias"] < out[False, 0.8]["pred_err_tpot_bias"] - 0.02
    assert out[False, 0.0]["tpot_ms_p50"] > out[False, 0.8]["tpot_ms_p50"]
    assert abs(out[True, 0.0]["pred_err_tpot_bias"]) < 0.5 * abs(out[False, 0.0]["pred_err_tpot_bias"])
    assert out[True, 0.0]["qos_tpot_violation_rate"] <= 0.01 < out[False, 0.0]["qos_tpot_violation_rate"]


def test_bad_truth_assumptions_name_the_key():
    with pytest.raises(ValueError, match="truth.overlap"):
        TruthAssumptions(overlap=1.5)
    with pytest.raises(ValueError, match="truth.attn_eff"):
        dataclasses.replace(TruthAssumptions(), attn_eff=0.0)
