"""Executable Voltron plans on the real SmolLM2-135M: three in-process ShardWorkers driven by the Coordinator must
produce the same greedy tokens as the single-process Reference (same quantized weights, per-shard activation scales,
pruning), for MP, TP and hybrid plans from the real planners, hand-made edge cases, phase switches and re-plans; the
budget refusal; and the reference itself against the float model (quant.llama)."""
from __future__ import annotations

import json

import numpy as np
import pytest

from hil.cluster.coordinator import Coordinator
from hil.cluster.reference import Reference
from hil.cluster.shard_exec import BudgetError, ShardWorker
from planner.voltron.plan import TP
from planner.voltron.shard_map import assign_shards
from quant.gguf_model import encode, gguf_path
from tests.hil_cluster import plans as P

# Distributed and reference runs differ only by float64 re-association of the TP partial sums (see
# hil/cluster/shard_ops.py); a flipped INT8 activation code would show as a logit difference of ~1e-3..1e-2.
LOGIT_TOL = 0.05
PROMPT = "The Eiffel Tower is in Paris, the capital of France. The Colosseum is in"
N_NEW = 4
KV_CAP = 64


@pytest.fixture(scope="module")
def setup():
    spec = P.spec()
    return spec, str(gguf_path(spec)), encode(spec, PROMPT)[:12]


def _workers(setup, budgets=(1e9, 1e9, 1e9)):
    spec, path, _ = setup
    return [ShardWorker(path, spec, d, b) for d, b in enumerate(budgets)]


def run_both(setup, plans: dict, n_new: int = N_NEW, on_step=None, budgets=(1e9, 1e9, 1e9)):
    """Greedy run of the coordinator (3 in-process workers) and of the reference, each following its own tokens; KV
    reserved for KV_CAP tokens (the plans' kv_plan is sized for their planned turns, the tests run short ones).
    Returns (tokens coordinator, tokens reference, max |Δlogit| over the steps, coordinator)."""
    spec, path, tok = setup
    maps = {ph: assign_shards(p, P.table()) for ph, p in plans.items()}
    co = Coordinator(plans, maps, _workers(setup, budgets), kv_capacity=KV_CAP, parallel=True)
    ref = Reference(path, spec, plans, maps, kv_capacity=KV_CAP)
    out, dmax = [], 0.0
    for runner in (co, ref):
        toks, logs = [], []
        lg = runner.prefill(tok)
        for i in range(n_new):
            logs.append(lg)
            toks.append(int(np.argmax(lg)))
            if i == n_new - 1:
                break
            if on_step is not None:
                on_step(i, runner)
            lg = runner.decode(toks[-1])
        out.append((toks, logs))
    for a, b in zip(out[0][1], out[1][1]):
        dmax = max(dmax, float(np.abs(a - b).max()))
    co.close()
    return out[0][0], out[1][0], dmax, co


# hybrid (MP prefill, TP decode) in the fast tier; MP and TP alone: slow tier
@pytest.mark.parametrize("kind", [pytest.param("mp", marks=pytest.mark.slow),
                                  pytest.param("tp", marks=pytest.mark.slow), "hybrid"])
def test_planner_plans_equal_reference(setup, kind):
    if kind == "hybrid":
        plans = {"prefill": P.hybrid_plan(), "decode": P.voltron_plans()[1]}
    else:
        plans = dict(zip(("prefill", "decode"), P.planner_plans(kind)))
    budgets = tuple(plans["decode"].budget_bytes)               # the planner's per-device budgets
    tc, tr, dmax, co = run_both(setup, plans, budgets=budgets)
    assert tc == tr, f"{kind}: coordinator {tc} != reference {tr} (max |Δlogit| {dmax:.3g})"
    assert dmax <= LOGIT_TOL
    used = {s.device for s in co.spans if s.method in ("run_sublayers", "attn", "ffn")}
    assert used == {0, 1, 2}, f"{kind}: only devices {used} computed"
    if kind != "mp":
        assert any(s.method in ("attn", "ffn") for s in co.spans)                # TP calls happened
    if kind == "mp":
        assert not any(s.method in ("attn", "ffn") for s in co.spans)


def test_edge_case_hand_plan(setup):
    """Device 0 holds nothing of some TP sublayers, device 2 holds nothing at all in the second half, two of three
    KV-head groups pruned in one block, 31 of 32 FFN shards pruned in another, FP16 / INT8 / INT4 interleaved."""
    tb = P.table()
    N = tb.n
    S = tb.shards[tb.type_of]
    sh = np.zeros((N, 3), dtype=np.int64)
    pruned = np.zeros(N, dtype=np.int64)
    prec = np.arange(N) % 3
    strat = np.full(N, TP)
    sh[0::2] = [1, 1, 1]
    sh[1::2] = [10, 12, 10]
    sh[2:10:2] = [0, 2, 1]                                      # TP without the main device
    sh[30:] = 0
    sh[30:, 1] = S[30:]                                         # second half MP on device 1
    strat[30:] = 1
    pruned[6], sh[6] = 2, [0, 1, 0]                             # block 3 ATTN: one KV group left (MP on 1)
    strat[6] = 1
    pruned[41], sh[41] = 31, [0, 1, 0]
    plan = P.hand_plan(strat, sh, prec, pruned=pruned)
    tc, tr, dmax, co = run_both(setup, {"decode": plan}, n_new=3)
    assert tc == tr and dmax <= LOGIT_TOL
    assert {s.device for s in co.spans if s.method == "run_sublayers"} == {1}


def test_budget_refusal(setup):
    spec, path, _ = setup
    m = assign_shards(P.mp_split_plan(precision=0), P.table())
    doc = m.assignment(1, 64)
    need_int4 = assign_shards(P.mp_split_plan(precision=2), P.table()).assignment(1, 64)
    w = ShardWorker(path, spec, 1, 20e6)
    with pytest.raises(BudgetError, match="device 1: assignment needs .* > budget_bytes 20.00 MB"):
        w.load(doc)                                             # FP16 third of the model: ~45 MB
    assert w.memory()["shards"] == 0                            # nothing loaded
    mem = w.load(need_int4)                                     # the INT4 third fits
    assert 0 < mem["total_nominal"] <= 20e6
    all1 = P.mp_split_plan(precision=0, cuts=(0, 60))           # everything on device 1
    co = Coordinator({"decode": all1}, {"decode": assign_shards(all1, P.table())},
                     [ShardWorker(path, spec, d, b) for d, b in enumerate((1e9, 20e6, 1e9))], kv_capacity=64)
    with pytest.raises(BudgetError, match="device 1"):
        co.prefill(setup[2])                                    # the coordinator passes the refusal on
    with pytest.raises(ValueError, match="no context"):
        co.decode(5)
    co.close()
    with pytest.raises(ValueError, match="this worker is device 1"):
        w.load(m.assignment(2, 64))
    with pytest.raises(ValueError, match="assignment: malformed"):
        w.load(json.dumps({"model": spec.name}))


def test_replan_mid_generation(setup):
    """MP → TP (KV moves between devices) → a plan that prunes an ATTN shard (KV dropped) → back to all shards with a
    device lost (history re-prefilled): tokens stay equal to the reference doing the same switches."""
    tb = P.table()
    N = tb.n
    S = tb.shards[tb.type_of]
    mp, tp = P.mp_split_plan(precision=1), P.tp_even_plan(precision=2)
    sh = np.zeros((N, 3), dtype=np.int64)
    pruned = np.zeros(N, dtype=np.int64)
    pruned[0::2] = 1
    sh[:, 0] = S - pruned
    sh[1::4] = [S[1] // 2, S[1] // 2, 0]
    pr = P.hand_plan(np.where(sh[:, 1] > 0, TP, 0), sh, np.ones(N), pruned=pruned)
    two = P.mp_split_plan(precision=1, cuts=(30, 60))           # devices 0, 1 only
    seq = [{"decode": tp}, {"decode": pr}, {"decode": two}]
    lost = [(), (), (2,)]

    def step(i, runner):
        if i < len(seq):
            maps = {ph: assign_shards(p, tb) for ph, p in seq[i].items()}
            runner.replan(seq[i], maps, lost[i])

    tc, tr, dmax, co = run_both(setup, {"prefill": mp, "decode": mp}, n_new=5, on_step=step)
    assert tc == tr and dmax <= LOGIT_TOL
    assert co.recomputes == 1                                   # un-pruned ATTN shards (+ the lost device)
    assert any(s.method == "export_kv" for s in co.spans) and any(s.method == "import_kv" for s in co.spans)
    assert all(s.device != 2 for s in co.spans[-40:])


@pytest.mark.slow      # an all-FP16 forward: NumPy float16 matmuls have no BLAS path (~1 min on 2 cores)
def test_reference_matches_float_model(setup):
    """Independent check of the shard slicing: all-FP16 with an FP16 head vs the float32 NumPy forward."""
    from quant.gguf_model import load_weights
    from quant.llama import forward_logits

    spec, path, tok = setup
    plan = P.mp_split_plan(precision=0, cuts=(60, 60))
    maps = {"decode": assign_shards(plan, P.table())}
    ref = Reference(path, spec, {"decode": plan}, maps, head_precision=0)
    got = ref.prefill(tok)
    want = forward_logits(load_weights(spec), spec, tok)[-1]
    assert np.argmax(got) == np.argmax(want)
    assert np.abs(got - want).max() < 0.1                       # FP16 weight rounding only


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["mp", "tp", "hybrid"])
def test_planner_plans_long_generation(setup, kind):
    if kind == "hybrid":
        plans = {"prefill": P.hybrid_plan(), "decode": P.voltron_plans()[1]}
    else:
        plans = dict(zip(("prefill", "decode"), P.planner_plans(kind)))
    tc, tr, dmax, _ = run_both(setup, plans, n_new=16)
    assert tc == tr and dmax <= LOGIT_TOL
