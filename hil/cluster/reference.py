"""Single-process reference of an executable Voltron plan (docs/cluster.md "Executable Voltron plans"): the same
quantized weights, per-shard activation scales, pruning and KV-switch rules as the distributed run, with no placement.

Owns `Reference`: one `shard_ops.ShardState` holding every unpruned shard of the active phase plan; each sublayer is
RMSNorm + the float64 sum of all its shards' outputs in ascending shard order + the float32 residual. Against the
`Coordinator` it differs only in how that float64 sum is parenthesised (per device, then across devices), so greedy
tokens must be equal and logits equal to float64-rounding noise (amplified by any INT8 activation code it flips).
Plan switches follow the same rule as the coordinator (`shard_map.kv_switch`): KV kept for shards that stay active,
history re-prefilled on the new plan when an ATTN shard becomes active without a cache. The pruned shard indices come
from the same `ShardMap`s (placement-independent: `assign_shards` picks them before placing).
"""
from __future__ import annotations

import numpy as np

from hil.cluster.coordinator import check_plans, greedy
from hil.cluster.shard_ops import ShardState, residual, tensor_source
from planner.voltron.plan import PhasePlan
from planner.voltron.shard_map import ShardMap, kv_switch
from quant.arch import ModelSpec


def all_items(m: ShardMap) -> list[tuple[int, tuple[int, ...], int]]:
    """Every unpruned shard of every sublayer (placement dropped): [(sublayer, shards, precision)]."""
    out = []
    for s in m.sublayers:
        sh = tuple(sorted(x for held in s.held for x in held))
        if sh:
            out.append((s.sublayer, sh, s.precision))
    return out


class Reference:
    """Greedy generation in one process with the plans' precisions and pruning (same API as `Coordinator`)."""

    def __init__(self, model_path: str, spec: ModelSpec, plans: dict[str, PhasePlan], maps: dict[str, ShardMap], *,
                 kv_capacity: int | None = None, head_precision: int = 1, isa: str | None = None):
        self.plans, self.maps = check_plans(plans, maps)
        self.kv_capacity = int(kv_capacity or max(p.kv_plan for p in self.plans.values()))
        self.head_precision = int(head_precision)
        self.state = ShardState(spec, tensor_source(str(model_path)), isa)
        self.active: ShardMap | None = None
        self.lost: set[int] = set()
        self.history: list[int] = []
        self.recomputes = 0

    def _activate(self, phase: str) -> None:
        new = self.maps[phase]
        if self.active is new:
            return
        sw = kv_switch(self.active, new, len(self.history), tuple(sorted(self.lost)))
        self.state.set(all_items(new), self.kv_capacity, self.head_precision, new.ffn_shards)
        self.active = new
        if sw.recompute:
            hist, self.history = self.history, []
            self.recomputes += 1
            self.state.reset_kv()
            self._forward(np.asarray(hist, dtype=np.int64), 0)
            self.history = hist

    def replan(self, plans: dict[str, PhasePlan], maps: dict[str, ShardMap], lost: tuple[int, ...] = ()) -> None:
        self.plans, self.maps = check_plans(plans, maps)
        self.lost |= {int(d) for d in lost}

    def _forward(self, tokens: np.ndarray, pos0: int) -> np.ndarray:
        st = self.state
        h = st.embed(tokens)                                                  # (T, d)
        for j in range(2 * st.spec.n_layers):
            if st.holds(j):
                h = residual(h, st.partial(j, h, pos0))
        return st.logits(np.ascontiguousarray(h[-1:]))

    def prefill(self, tokens) -> np.ndarray:
        tok = np.asarray(tokens, dtype=np.int64).ravel()
        if tok.size == 0:
            raise ValueError("tokens: empty prompt")
        self.history = []
        self._activate("prefill")
        self.state.reset_kv()
        if tok.size > self.kv_capacity:
            raise ValueError(f"kv_capacity: {tok.size} prompt tokens exceed {self.kv_capacity}")
        out = self._forward(tok, 0)
        self.history = tok.tolist()
        return out

    def decode(self, token: int) -> np.ndarray:
        if not self.history:
            raise ValueError("decode: no context (call prefill first)")
        self._activate("decode")
        if len(self.history) + 1 > self.kv_capacity:
            raise ValueError(f"kv_capacity: {len(self.history)} cached + 1 new token exceed {self.kv_capacity}")
        out = self._forward(np.array([int(token)], dtype=np.int64), len(self.history))
        self.history.append(int(token))
        return out

    def generate(self, prompt_tokens, n_new: int, on_step=None) -> list[int]:
        return greedy(self, prompt_tokens, n_new, on_step)
