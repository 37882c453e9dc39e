"""planner.voltron.shard_map: deterministic shard indices per device from a PhasePlan's counts, and the KV-cache
consequences of switching maps. No model weights are read here."""
from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from hil.cluster.coordinator import segments
from planner.voltron.importance import DATA
from planner.voltron.layers import layer_table
from planner.voltron.plan import TP
from planner.voltron.shard_map import ShardMap, _measured_scores, assign_shards, kv_switch, prune_order
from quant.arch import model_spec
from tests.hil_cluster import plans as P


def _check_map(plan, m: ShardMap, tb) -> None:
    assert len(m.sublayers) == tb.n
    for s in m.sublayers:
        j = s.sublayer
        assert [len(h) for h in s.held] == plan.shards[j].tolist()                   # counts per device
        assert len(s.pruned) == plan.pruned[j]
        flat = [x for h in s.held for x in h]
        assert len(set(flat)) == len(flat)                                            # disjoint
        assert not set(flat) & set(s.pruned)
        assert sorted(flat + list(s.pruned)) == list(range(tb.shards[tb.type_of[j]]))  # cover every shard
        assert flat == sorted(flat)                                                   # contiguous, device order
        assert s.precision == plan.precision[j]


@pytest.mark.parametrize("which", ["mp", "tp", "hybrid", "mp_hand", "tp_hand"])
def test_counts_disjoint_cover_deterministic(which):
    plan = {"mp": lambda: P.planner_plans("mp")[1], "tp": lambda: P.planner_plans("tp")[1], "hybrid": P.hybrid_plan,
            "mp_hand": P.mp_split_plan, "tp_hand": P.tp_even_plan}[which]()
    tb = P.table()
    m = assign_shards(plan, tb)
    _check_map(plan, m, tb)
    assert m == assign_shards(plan, tb)                                               # deterministic
    assert ShardMap.from_json(m.to_json()) == m                                       # JSON round trip
    for d in range(3):
        items = m.device_items(d)
        assert sum(len(sh) for _, sh, _ in items) == plan.shards[:, d].sum()


def test_hybrid_plan_is_mixed():
    """The hybrid test plan really mixes MP and TP, three precisions and pruned shards, within the budgets."""
    plan = P.hybrid_plan()
    assert (plan.strategy == TP).any() and (plan.strategy >= 0).any()
    assert set(np.unique(plan.precision)) == {0, 1, 2}
    assert plan.pruned.sum() > 0
    assert plan.fits


def test_pruned_are_least_important_else_last():
    tb = P.table()
    N = tb.n
    S = tb.shards[tb.type_of]
    sh = np.zeros((N, 3), dtype=np.int64)
    pruned = np.where(np.arange(N) % 2 == 0, 1, 8)
    sh[:, 0] = S - pruned
    plan = P.hand_plan(np.zeros(N), sh, np.ones(N), pruned=pruned)
    m = assign_shards(plan, tb)
    scores = _measured_scores(tb, str(DATA))
    if scores is None:
        assert m.prune_rule == "last"
    else:
        assert m.prune_rule == "importance"
        for s in m.sublayers:
            sc = scores[s.sublayer]
            kept = [x for h in s.held for x in h]
            assert max(sc[list(s.pruned)]) <= min(sc[kept])                           # least important pruned
    # a model without a measurement: the last shards
    spec = dataclasses.replace(model_spec("qwen2_5_3b"), n_layers=2)
    tb2 = layer_table(spec)
    N2 = tb2.n
    S2 = tb2.shards[tb2.type_of]
    sh2 = np.zeros((N2, 3), dtype=np.int64)
    sh2[:, 1] = S2 - 1
    plan2 = dataclasses.replace(plan, model=spec.name, precision=np.ones(N2, dtype=np.int64),
                                act_precision=np.zeros(N2, dtype=np.int64), strategy=np.ones(N2, dtype=np.int64),
                                shards=sh2, pruned=np.ones(N2, dtype=np.int64), act_pruned=np.zeros(N2, dtype=bool))
    m2 = assign_shards(plan2, tb2)
    assert m2.prune_rule == "last"
    assert all(s.pruned == (s.n_shards - 1,) for s in m2.sublayers)


def test_prune_order_ties_last_first():
    assert prune_order(4, None).tolist() == [3, 2, 1, 0]
    assert prune_order(4, np.array([0.0, 0.0, 1.0, 0.0])).tolist() == [3, 1, 0, 2]


def test_bad_counts_name_the_sublayer():
    plan = P.mp_split_plan()
    plan.shards[5, 0] += 1
    with pytest.raises(ValueError, match="sublayer 5"):
        assign_shards(plan, P.table())
    plan = P.mp_split_plan()
    with pytest.raises(ValueError, match="plan.shards: shape"):
        assign_shards(dataclasses.replace(plan, shards=plan.shards[:, :2]), P.table())


def test_assignment_json():
    m = assign_shards(P.tp_even_plan(), P.table())
    d0, d2 = json.loads(m.assignment(0, 64)), json.loads(m.assignment(2, 64))
    assert d0["head_precision"] == 1 and d2["head_precision"] is None
    assert d0["kv_capacity"] == 64 and d0["ffn_shards"] == 32
    assert [it[1] for it in d2["items"][:2]] == [[2], [22, 23, 24, 25, 26, 27, 28, 29, 30, 31]]
    dec = dataclasses.replace(P.tp_even_plan(), phase="prefill")
    assert assign_shards(dec, P.table()).assignment(1, 64) == m.assignment(1, 64)     # phase-independent


def test_kv_switch_moves_drops_recompute():
    tb = P.table()
    mp, tp = assign_shards(P.mp_split_plan(), tb), assign_shards(P.tp_even_plan(), tb)
    assert kv_switch(None, tp, 10).moves == [] and not kv_switch(mp, tp, 0).recompute
    sw = kv_switch(mp, tp, 10)
    assert not sw.recompute
    # block 0 (device 0 in mp) shards 1, 2 move to devices 1, 2; block 29 (device 2) shards 0, 1 move to 0, 1
    assert (0, 1, 0, 1) in sw.moves and (0, 2, 0, 2) in sw.moves and (29, 0, 2, 0) in sw.moves
    assert not any(mv[0] == 0 and mv[1] == 0 for mv in sw.moves)                    # shard 0 stays on device 0
    # prune one attention shard: dropped, no recompute; un-prune it again: recompute
    N = tb.n
    S = tb.shards[tb.type_of]
    sh = np.zeros((N, 3), dtype=np.int64)
    pruned = np.zeros(N, dtype=np.int64)
    pruned[4] = 1
    sh[:, 0] = S - pruned
    pm = assign_shards(P.hand_plan(np.zeros(N), sh, np.ones(N), pruned=pruned), tb)
    full = assign_shards(P.mp_split_plan(cuts=(60, 60)), tb)
    sw = kv_switch(full, pm, 10)
    assert sw.drops == [(2, pm.sublayers[4].pruned[0], 0)] and not sw.recompute
    assert kv_switch(pm, full, 10).recompute
    # a device leaves: its caches are gone → recompute if its shards stay active, not if they are pruned
    assert kv_switch(tp, mp, 10, lost=(2,)).recompute


def test_segments_batch_mp_runs():
    tb = P.table()
    segs = segments(assign_shards(P.mp_split_plan(), tb))
    assert [(s.kind, s.devices, s.j0, s.j1) for s in segs] == [("mp", (0,), 0, 20), ("mp", (1,), 20, 40),
                                                               ("mp", (2,), 40, 60)]
    segs = segments(assign_shards(P.tp_even_plan(), tb))
    assert len(segs) == 60 and all(s.kind == "tp" and s.devices == (0, 1, 2) for s in segs)
