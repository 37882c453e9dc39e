"""Which TP shards each device holds under a Voltron plan (paper §4.2.1 TP shards, §4.3.1 shard pruning): the step from
a `PhasePlan`'s shard *counts* to shard *indices* an executor can load (docs/cluster.md "Executable Voltron plans").

Owns `assign_shards(plan, table) -> ShardMap`, deterministic and placement-only:
- Pruned shards of a sublayer (`plan.pruned[j]` of them) are the least important ones when measured shard importances
  exist for this model (`planner/voltron/data/smollm2_importance.json` via `importance.shard_stats`: per block, one
  score per ATTN shard = KV-head group and per FFN channel group, 0 within measurement noise; a table FFN shard
  inherits the score of the measured group that contains it), ties broken towards the higher shard index; otherwise
  (no measurement for this model, or a shard count the measurement cannot be mapped to) simply the last shards.
  `ShardMap.prune_rule` records which rule was used. This is the planner's own "least important first" order
  (`importance.py`).
- The unpruned shards, in ascending index, are cut into contiguous ranges in device order: device 0 takes the first
  `plan.shards[j, 0]`, device 1 the next `plan.shards[j, 1]`, ... So an MP sublayer puts every unpruned shard on its
  device, and the per-device partial sums of a TP sublayer, added in device order, visit the shards in index order.
- `kv_switch` is the KV-cache consequence of replacing one map by another mid-conversation (moves between live devices,
  drops of newly pruned shards, and whether a re-prefill of the history is needed because an ATTN shard becomes active
  whose cache nobody has: it was pruned, or its device left).

Shard index conventions are `layers.py`'s: ATTN shard g = KV-head group g (query heads g·H/KV … (g+1)·H/KV − 1, K/V
rows g·hd … (g+1)·hd − 1, the same O-projection columns as its query heads, its KV-cache slice); dense FFN shard s =
intermediate channels s·F/S … (s+1)·F/S − 1 (gate/up rows, down columns).
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass

import numpy as np

from planner.voltron.importance import DATA, load_measurement, shard_stats
from planner.voltron.layers import ATTN_GQA, ATTN_MHA, ATTN_SWA, FFN_DENSE, TYPES, LayerTable
from planner.voltron.plan import TP, PhasePlan

ATTN_TYPES = (ATTN_MHA, ATTN_GQA, ATTN_SWA)


@dataclass(frozen=True)
class SublayerShards:
    """Shard placement of one sublayer j (block j // 2; ATTN for even j, FFN for odd j in a dense Llama)."""
    sublayer: int                        # j, index into the LayerTable
    block: int                           # transformer block
    kind: str                            # LayerTable type name (attn_gqa, ffn_dense, ...)
    n_shards: int                        # TP shards of the sublayer (table.shards of its type)
    precision: int                       # weight precision id (devices.PRECISIONS: 0 fp16, 1 int8, 2 int4)
    strategy: int                        # the plan's strategy: TP (-1) or the MP device index (informative)
    pruned: tuple[int, ...]              # pruned shard indices, ascending
    held: tuple[tuple[int, ...], ...]    # (D,) per device: shard indices it holds, ascending

    @property
    def is_attn(self) -> bool:
        return self.kind.startswith("attn")

    def holders(self) -> list[int]:
        """Devices that hold at least one shard, in device order."""
        return [d for d, s in enumerate(self.held) if s]

    def owner(self, shard: int) -> int | None:
        """Device holding `shard` (None if pruned)."""
        for d, s in enumerate(self.held):
            if shard in s:
                return d
        return None


@dataclass
class ShardMap:
    """Shard indices per sublayer and device for one phase plan (JSON-serialisable; see the module docstring)."""
    model: str
    phase: str                           # "prefill" | "decode"
    devices: list[str]                   # cluster order, 0 = main device
    prune_rule: str                      # "importance" (measured, least important first) | "last"
    sublayers: list[SublayerShards]

    @property
    def n_devices(self) -> int:
        return len(self.devices)

    @property
    def ffn_shards(self) -> int:
        """TP shard count of the FFN sublayers (1 if there are none)."""
        return next((s.n_shards for s in self.sublayers if not s.is_attn), 1)

    def device_items(self, d: int) -> list[tuple[int, tuple[int, ...], int]]:
        """Per device: (sublayer, shard indices, precision) of every sublayer it holds shards of, in sublayer order."""
        if not 0 <= d < self.n_devices:
            raise ValueError(f"device: {d} outside 0..{self.n_devices - 1}")
        return [(s.sublayer, s.held[d], s.precision) for s in self.sublayers if s.held[d]]

    def assignment(self, d: int, kv_capacity: int, head_precision: int = 1) -> str:
        """The JSON document a device's executor loads (`hil.cluster.shard_exec.ShardWorker.load`): its items, the
        KV capacity in tokens and, for the main device, the LM-head / embedding precision. Phase-independent: two
        phase maps with the same placement give the same document (no reload)."""
        doc = {"model": self.model, "device": d, "n_devices": self.n_devices, "ffn_shards": self.ffn_shards,
               "kv_capacity": int(kv_capacity), "head_precision": int(head_precision) if d == 0 else None,
               "items": [[j, list(sh), p] for j, sh, p in self.device_items(d)]}
        return json.dumps(doc)

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> "ShardMap":
        d = json.loads(text)
        subs = [SublayerShards(sublayer=int(s["sublayer"]), block=int(s["block"]), kind=str(s["kind"]),
                               n_shards=int(s["n_shards"]), precision=int(s["precision"]), strategy=int(s["strategy"]),
                               pruned=tuple(int(x) for x in s["pruned"]),
                               held=tuple(tuple(int(x) for x in h) for h in s["held"]))
                for s in d["sublayers"]]
        return cls(model=d["model"], phase=d["phase"], devices=list(d["devices"]), prune_rule=d["prune_rule"],
                   sublayers=subs)


def _measured_scores(table: LayerTable, path: str) -> dict[int, np.ndarray] | None:
    """Per sublayer j: (n_shards,) importance score of each shard from the measured data, or None if the measurement
    is not for this model or its shard grouping cannot be mapped onto the table's shards."""
    try:
        doc = load_measurement(path)
    except (FileNotFoundError, ValueError):
        return None
    spec = table.spec
    if doc.get("model") != spec.name:
        return None
    attn = shard_stats(doc, "attn").importance                             # (L, G_attn) (0 = within noise)
    ffn = shard_stats(doc, "ffn").importance                               # (L, G_ffn)
    if attn.shape[0] != spec.n_layers or ffn.shape[0] != spec.n_layers:
        return None
    out: dict[int, np.ndarray] = {}
    for j in range(table.n):
        t = int(table.type_of[j])
        S = int(table.shards[t])
        b = int(table.block_of[j])
        if t in ATTN_TYPES:
            if attn.shape[1] != S:
                return None
            out[j] = attn[b]
        elif t == FFN_DENSE:
            G = ffn.shape[1]
            if S % G:                     # each table shard must lie inside one measured channel group
                return None
            out[j] = ffn[b][np.arange(S) * G // S]
        else:
            return None
    return out


def prune_order(n_shards: int, scores: np.ndarray | None) -> np.ndarray:
    """Shard indices in the order they get pruned: ascending score, ties (and no score) → the last index first."""
    idx = np.arange(n_shards)
    if scores is None:
        return idx[::-1].copy()
    return np.lexsort((-idx, np.asarray(scores, dtype=float)))


def _check(plan: PhasePlan, table: LayerTable) -> None:
    N, D = table.n, len(plan.devices)
    if plan.shards.shape != (N, D):
        raise ValueError(f"plan.shards: shape {plan.shards.shape} != (sublayers {N}, devices {D})")
    for key in ("precision", "strategy", "pruned"):
        if getattr(plan, key).shape != (N,):
            raise ValueError(f"plan.{key}: shape {getattr(plan, key).shape} != ({N},)")
    if (plan.shards < 0).any() or (plan.pruned < 0).any():
        raise ValueError("plan.shards / plan.pruned: negative shard counts")
    total = table.shards[table.type_of]
    bad = np.flatnonzero(plan.shards.sum(axis=1) + plan.pruned != total)
    if bad.size:
        j = int(bad[0])
        raise ValueError(f"plan.shards: sublayer {j} holds {int(plan.shards[j].sum())} + pruned {int(plan.pruned[j])}"
                         f" shards, its type {TYPES[table.type_of[j]]} has {int(total[j])}")
    if not np.isin(plan.precision, (0, 1, 2)).all():
        raise ValueError("plan.precision: ids must be 0 (fp16), 1 (int8) or 2 (int4)")


def assign_shards(plan: PhasePlan, table: LayerTable, importance_path: str = str(DATA)) -> ShardMap:
    """Deterministic shard indices per device for `plan` (see the module docstring for the rules)."""
    _check(plan, table)
    scores = _measured_scores(table, importance_path)
    rule = "importance" if scores is not None else "last"
    subs = []
    for j in range(table.n):
        t = int(table.type_of[j])
        S = int(table.shards[t])
        order = prune_order(S, None if scores is None else scores[j])
        k = int(plan.pruned[j])
        pruned = np.sort(order[:k])
        kept = np.sort(order[k:])                                          # unpruned, ascending
        cuts = np.concatenate([[0], np.cumsum(plan.shards[j])])
        held = tuple(tuple(int(x) for x in kept[cuts[d]:cuts[d + 1]]) for d in range(len(plan.devices)))
        subs.append(SublayerShards(sublayer=j, block=int(table.block_of[j]), kind=TYPES[t], n_shards=S,
                                   precision=int(plan.precision[j]), strategy=int(plan.strategy[j]),
                                   pruned=tuple(int(x) for x in pruned), held=held))
    return ShardMap(model=plan.model, phase=plan.phase, devices=list(plan.devices), prune_rule=rule, sublayers=subs)


def placement_strategy(s: SublayerShards) -> int:
    """How a sublayer executes: the device index when one device holds all its unpruned shards (MP, as
    `HybridPlanner.fixed` defines it), TP (-1) when several do, and TP with no holders when every shard is pruned."""
    h = s.holders()
    return h[0] if len(h) == 1 else TP


@dataclass
class KVSwitch:
    """KV-cache work when map `old` is replaced by `new` with `history` tokens cached."""
    moves: list[tuple[int, int, int, int]]        # (block, shard, from device, to device): copy then drop
    drops: list[tuple[int, int, int]]             # (block, shard, device): newly pruned, cache discarded
    recompute: bool                               # an ATTN shard becomes active without a cache: re-prefill history


def kv_switch(old: ShardMap | None, new: ShardMap, history: int, lost: tuple[int, ...] = ()) -> KVSwitch:
    """KV consequences of switching from `old` to `new` (`lost`: devices that left; their caches are gone)."""
    moves: list[tuple[int, int, int, int]] = []
    drops: list[tuple[int, int, int]] = []
    recompute = False
    if old is None or history == 0:
        return KVSwitch(moves, drops, False)
    if len(old.sublayers) != len(new.sublayers):
        raise ValueError("shard maps: old and new cover different models")
    for so, sn in zip(old.sublayers, new.sublayers):
        if not sn.is_attn:
            continue
        for g in range(sn.n_shards):
            src, dst = so.owner(g), sn.owner(g)
            if src is not None and src in lost:
                src = None
            if dst is None:
                if src is not None:
                    drops.append((sn.block, g, src))
            elif src is None:
                recompute = True
            elif src != dst:
                moves.append((sn.block, g, src, dst))
    return KVSwitch(moves, drops, recompute)
