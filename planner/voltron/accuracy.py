"""Accuracy proxy of a plan (what the paper measures with MMLU/HellaSwag/GSM8K/MATH; here a documented model).

    accuracy_proxy = base_score(model) × (1 − Σ_l w_l · [q(p_l) + a(a_l) + share(f_l)])

- base_score: the model's published MMLU (5-shot, base model) — Qwen2.5 blog (Sept 2024): 3B 65.6, 7B 74.2, 14B 79.7;
  Qwen1.5 blog (Feb 2024): 4B 56.1, 7B 61.0, 14B 67.6; Qwen1.5-MoE-A2.7B blog (Mar 2024): 62.5; Gemma 3 technical
  report (pre-trained, Table "MMLU"): 4B 59.6, 12B 74.5.
- w_l: normalised layer importance (`importance.py`, measured on SmolLM2 / depth proxy).
- q(p): relative score loss if the whole model were at precision p: FP16 0, INT8 (Q8_0) `loss_int8`, INT4 (Q4_K)
  `loss_int4` (defaults 0.2 % and 2 %: llama.cpp reports Q8_0 ≈ lossless and Q4_K_M ≈ +1 % perplexity on 7B models;
  published 4-bit k-quant MMLU drops are 1–2 points — assumption, config `accuracy.*`).
- a(a): loss from quantizing the transferred activations of layer l (INT8 `act_loss_int8`, INT4 `act_loss_int4`).
- share(f): share of the layer's importance removed by pruning a fraction f of its shards (least important first).

Every term is weighted by importance, so lowering the least important layers first costs the least — which is exactly
what the binary search exploits. The proxy is a model, labelled `modelled` in metrics.json.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from planner.voltron.importance import Importance

BASE_MMLU = {
    "qwen2_5_3b": 65.6, "qwen2_5_7b": 74.2, "qwen2_5_14b": 79.7,
    "qwen1_5_4b": 56.1, "qwen1_5_7b": 61.0, "qwen1_5_14b": 67.6, "qwen1_5_moe_a2_7b": 62.5,
    "gemma3_4b": 59.6, "gemma3_12b": 74.5,
}
FAMILIES = {
    "gemma3": ["gemma3_4b", "gemma3_12b"],
    "qwen1_5": ["qwen1_5_4b", "qwen1_5_7b", "qwen1_5_moe_a2_7b", "qwen1_5_14b"],
    "qwen2_5": ["qwen2_5_3b", "qwen2_5_7b", "qwen2_5_14b"],
}


@dataclass
class AccuracyConfig:
    loss_int8: float = 0.002          # relative score loss, whole model at INT8 (Q8_0)
    loss_int4: float = 0.02           # relative score loss, whole model at INT4 (Q4_K)
    act_loss_int8: float = 0.001      # relative loss, all transferred activations at INT8
    act_loss_int4: float = 0.01       # relative loss, all transferred activations at INT4

    def __post_init__(self) -> None:
        for k in ("loss_int8", "loss_int4", "act_loss_int8", "act_loss_int4"):
            if not 0 <= getattr(self, k) < 1:
                raise ValueError(f"accuracy.{k} must be in [0, 1) (got {getattr(self, k)})")


def base_score(model: str) -> float:
    if model not in BASE_MMLU:
        raise ValueError(f"model={model}: no published base score for the accuracy proxy (known: {sorted(BASE_MMLU)})")
    return BASE_MMLU[model]


def accuracy_proxy(model: str, imp: Importance, cfg: AccuracyConfig, precision: np.ndarray,
                   act_precision: np.ndarray, pruned_frac: np.ndarray) -> float:
    """Score (MMLU points) of a plan: precision / act precision per sublayer (N,), pruned shard fraction (N,)."""
    q = np.array([0.0, cfg.loss_int8, cfg.loss_int4])
    a = np.array([0.0, cfg.act_loss_int8, cfg.act_loss_int4])
    w = imp.per_sublayer
    loss = float((w * (q[precision] + a[act_precision] + imp.pruned_share(pruned_frac))).sum())
    return base_score(model) * max(0.0, 1.0 - loss)
