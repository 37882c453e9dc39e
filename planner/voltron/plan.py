"""Voltron plan objects (typed, JSON-serialisable; the simulator and the HIL take the same object).

A `PhasePlan` says, for every sublayer of a model (ATTN/FFN of each block, see `layers.py`) in one phase (prefill or
decode): its weight precision, the precision of the activations it sends over the air, its parallel strategy (MP on one
device, or TP), how many TP shards each device holds, and how many shards are pruned. It also carries the planner's
own estimates (time, per-device memory) so predictions can be compared with the simulator / HIL.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

import numpy as np

from planner.voltron.devices import PRECISIONS

TP = -1      # strategy value for tensor parallelism (else: the MP device index)


@dataclass
class PhasePlan:
    model: str
    phase: str                                  # "prefill" | "decode"
    devices: list[str]                          # cluster order; 0 = main device
    n_tokens: int                               # tokens per step the plan was made for
    kv_len: int                                 # KV length the time estimate assumes
    kv_plan: int                                # KV length the memory check reserves
    precision: np.ndarray                       # (N,) weight precision id per sublayer (0 fp16, 1 int8, 2 int4)
    act_precision: np.ndarray                   # (N,) transferred-activation precision id per sublayer
    strategy: np.ndarray                        # (N,) TP (-1) or MP device index
    shards: np.ndarray                          # (N, D) shards held per device (MP: all unpruned shards on one device)
    pruned: np.ndarray                          # (N,) pruned shards per sublayer
    act_pruned: np.ndarray                      # (N,) bool: remote shards + their activations pruned (comm scaling)
    fits: bool = True                           # every device within its memory budget
    est_time_s: float = 0.0                     # planner estimate of one step (regression + comm model)
    est_comm_s: float = 0.0                     # of which communication
    mem_bytes: np.ndarray = field(default_factory=lambda: np.zeros(0))   # (D,) planned resident bytes per device
    budget_bytes: np.ndarray = field(default_factory=lambda: np.zeros(0))  # (D,) budgets used
    layer_comp_s: np.ndarray = field(default_factory=lambda: np.zeros(0))  # (N,) estimated compute per sublayer
    layer_comm_s: np.ndarray = field(default_factory=lambda: np.zeros(0))  # (N,) estimated TP comm per sublayer
    freq: np.ndarray = field(default_factory=lambda: np.ones(0))          # (D,) DVFS frequency fraction (empty = 1)

    @property
    def n_tp(self) -> int:
        return int((self.strategy == TP).sum())

    def summary(self) -> str:
        p = np.bincount(self.precision, minlength=3)
        return (f"{self.phase}: TP {self.n_tp}/{len(self.strategy)} "
                f"fp16/int8/int4 {p[0]}/{p[1]}/{p[2]} pruned {int(self.pruned.max(initial=0))}")

    def to_json(self) -> str:
        d = asdict(self)
        for k, v in d.items():
            if isinstance(v, np.ndarray):
                d[k] = v.tolist()
            if isinstance(v, float) and not np.isfinite(v):
                d[k] = None if np.isnan(v) else ("inf" if v > 0 else "-inf")
        d["precision_names"] = list(PRECISIONS)
        return json.dumps(d)

    @classmethod
    def from_json(cls, text: str) -> "PhasePlan":
        d = json.loads(text)
        d.pop("precision_names", None)
        for k in ("est_time_s", "est_comm_s"):
            if isinstance(d[k], str):
                d[k] = float(d[k])
        for k in ("precision", "act_precision", "strategy", "shards", "pruned"):
            d[k] = np.asarray(d[k], dtype=np.int64)
        d["act_pruned"] = np.asarray(d["act_pruned"], dtype=bool)
        d["mem_bytes"] = np.asarray(d["mem_bytes"], dtype=float)
        for k in ("budget_bytes", "layer_comp_s", "layer_comm_s", "freq"):
            d[k] = np.asarray(d[k], dtype=float)
        return cls(**d)
