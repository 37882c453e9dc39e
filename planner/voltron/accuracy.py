"""Accuracy proxy of a plan (what the paper measures with MMLU/HellaSwag/GSM8K/MATH; here a documented model).

    accuracy_proxy = base_score(model) × (1 − Σ_l w_l · [q(p_l) + a(a_l) + share(f_l)])

- base_score: the model's published MMLU (5-shot, base model) — Qwen2.5 blog (Sept 2024): 3B 65.6, 7B 74.2, 14B 79.7;
  Qwen1.5 blog (Feb 2024): 4B 56.1, 7B 61.0, 14B 67.6; Qwen1.5-MoE-A2.7B blog (Mar 2024): 62.5; Gemma 3 technical
  report (pre-trained, Table "MMLU"): 4B 59.6, 12B 74.5. SmolLM2-135M, the model the emulated cluster runs and the
  precision / pruning effects are measured on, gets base 100: its proxy is *relative* (% of the FP16 model's score;
  `score_basis`), no published benchmark score is used.
- w_l: normalised layer importance (`importance.py`, measured on SmolLM2 / depth proxy).
- q(p): relative score loss if the whole model were at precision p: FP16 0, INT8 `loss_int8`, INT4 `loss_int4`.
  Default (null in the config): MEASURED on the real SmolLM2-135M by `python -m quant.measure_importance` (whole
  model, every linear at that precision, K ≥ 4 disjoint text slices, `data/smollm2_importance.json`) in the formats
  the Voltron paper's devices run (llama.cpp, `devices.py`): INT8 = Q8_0 (32-weight blocks, fp16 scale), INT4 = Q4_K
  (256-weight super-blocks of 32-weight sub-blocks, 6-bit scales and mins), each with the activation blocks llama.cpp's
  CPU dot product quantizes its input to (Q8_0 / Q8_K); ggml's reference quantizers, bit-exact (`quant.ggml_blocks`).
  Weight-only rows of the same formats are context. The file also holds the emulated cluster's host-kernel semantics
  (W8A8 with dynamic per-tensor activations, per-channel INT4; `hil/cluster/shard_ops.py`) as separate rows; the
  proxy does not use them. Measured (docs/multidevice.md): q(INT8) = 0 (Q8_0 within noise), q(INT4) = 0.198 ± 0.055
  (Q4_K). Mapped to a score loss by the documented PROXY mapping
      q(p) = 1 − ppl_ref / ppl_p = 1 − exp(−ΔNLL)      (per slice, then the mean over slices)
  i.e. the relative drop of the geometric-mean probability the model gives the correct next token, assumed to carry
  over proportionally to the benchmark score. It is a proxy (no benchmark is run), bounded in [0, 1). A mean within
  the measurement noise (≤ NOISE_Z·sd/√K, see importance.py) counts as 0. A number in the config
  (`planner.accuracy.loss_int8=0.002`) overrides the measurement. For every model other than SmolLM2 the measured
  numbers are *extrapolated* (`loss_source` says so and names the formats; metrics.json's `importance_source` reads
  `extrapolated`).
- a(a): loss from quantizing the transferred activations of layer l (INT8 `act_loss_int8`, INT4 `act_loss_int4`;
  still assumptions: 0.1 % / 1 %, config `accuracy.*`).
- share(f): share of the layer's importance removed by pruning a fraction f of its shards (least important first).

Every term is weighted by importance, so lowering the least important layers first costs the least — which is exactly
what the binary search exploits. The proxy is a model, labelled `modelled` in metrics.json.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Optional

import numpy as np

from planner.voltron.importance import DATA, NOISE_Z, Importance, load_measurement

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
    loss_int8: Optional[float] = None  # relative score loss, whole model at INT8; None = measured (SmolLM2, proxy map)
    loss_int4: Optional[float] = None  # relative score loss, whole model at INT4; None = measured (SmolLM2, proxy map)
    act_loss_int8: float = 0.001      # relative loss, all transferred activations at INT8 (assumption)
    act_loss_int4: float = 0.01       # relative loss, all transferred activations at INT4 (assumption)

    def __post_init__(self) -> None:
        for k in ("loss_int8", "loss_int4", "act_loss_int8", "act_loss_int4"):
            v = getattr(self, k)
            if v is None and k.startswith("loss_"):
                continue
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v < 1:
                raise ValueError(f"accuracy.{k} must be in [0, 1) (got {v!r})")


# plan precision -> the measured row the proxy uses (llama.cpp formats, see the module doc)
PROXY_FORMAT = {"fp16": "fp16", "int8": "q8_0", "int4": "q4_k"}
FORMAT_NAME = {"fp16": "FP16", "q8_0": "Q8_0", "q4_k": "Q4_K"}


@dataclass(frozen=True)
class PrecisionLoss:
    """Measured whole-model effect of one precision on SmolLM2 over K slices, and its score-loss proxy."""
    precision: str            # as asked: a plan precision ('fp16' | 'int8' | 'int4') or a measured row name
    fmt: str                  # the measured row: 'q8_0', 'q4_k', ... (PROXY_FORMAT for plan precisions)
    dppl_rel: float           # mean of ppl_p / ppl_ref − 1
    dppl_rel_sd: float        # sample sd over slices
    kl: float                 # mean KL(ref ‖ p), nats per token
    kl_sd: float
    loss: float               # proxy relative score loss: mean of 1 − ppl_ref/ppl_p, 0 if within noise
    loss_sd: float
    slices: int


def _mean_sd(v) -> tuple[float, float]:
    a = np.asarray(v, dtype=float)
    return float(a.mean()), float(a.std(ddof=1)) if a.size > 1 else 0.0


def precision_loss(precision: str, scope: str = "all", path: str = str(DATA)) -> PrecisionLoss:
    """The measured effect of `precision` on scope 'all' | 'attn' | 'ffn' of SmolLM2. A plan precision 'fp16' |
    'int8' | 'int4' reads its llama.cpp-format row (PROXY_FORMAT); any other name reads that row of the file (e.g.
    'host_int8_w8a8', the emulated cluster's kernel semantics)."""
    doc = load_measurement(path)
    fmt = PROXY_FORMAT.get(precision, precision)
    try:
        m = doc["precision"][fmt][scope]
    except KeyError:
        raise ValueError(f"{path}: no measured precision effect for {fmt}/{scope} (regenerate: python -m "
                         f"quant.measure_importance)") from None
    ppl, ref = np.asarray(m["ppl"], dtype=float), np.asarray(m["ref_ppl"], dtype=float)   # (K,)
    loss = 1.0 - ref / ppl                                                   # (K,) proxy mapping per slice
    lm, ls = _mean_sd(loss)
    K = loss.size
    if lm <= NOISE_Z * ls / np.sqrt(K):                                      # within noise (incl. negative) → 0
        lm = 0.0
    return PrecisionLoss(precision, fmt, *_mean_sd(ppl / ref - 1.0), *_mean_sd(m["kl"]), min(lm, 0.999), ls, K)


@lru_cache(maxsize=8)
def _losses(loss_int8: Optional[float], loss_int4: Optional[float], path: str = str(DATA)) -> np.ndarray:
    q8 = precision_loss("int8", path=path).loss if loss_int8 is None else loss_int8
    q4 = precision_loss("int4", path=path).loss if loss_int4 is None else loss_int4
    return np.array([0.0, q8, q4])                                          # by precision id FP16, INT8, INT4


def weight_losses(cfg: AccuracyConfig, path: str = str(DATA)) -> np.ndarray:
    """q(p) by precision id (3,): FP16 0, then INT8 (Q8_0) and INT4 (Q4_K) from the config or, when null, the
    measurement."""
    return _losses(cfg.loss_int8, cfg.loss_int4, path)


def loss_source(model: str, cfg: AccuracyConfig, path: str = str(DATA)) -> str:
    """Where q(INT8) / q(INT4) of `model` come from: "config" (both overridden), else "measured" (SmolLM2 itself) or
    "extrapolated" (measured on SmolLM2, applied to another model), followed by the measured llama.cpp formats, e.g.
    "extrapolated (llama.cpp Q8_0, Q4_K)" or "measured (llama.cpp Q4_K; INT8 from config)"."""
    if cfg.loss_int8 is not None and cfg.loss_int4 is not None:
        return "config"
    kind = "measured" if model == load_measurement(path).get("model") else "extrapolated"
    measured = [FORMAT_NAME[PROXY_FORMAT[p]] for p, v in (("int8", cfg.loss_int8), ("int4", cfg.loss_int4))
                if v is None]
    cfg_part = "; INT8 from config" if cfg.loss_int8 is not None else "; INT4 from config" \
        if cfg.loss_int4 is not None else ""
    return f"{kind} (llama.cpp {', '.join(measured)}{cfg_part})"


RELATIVE = ("smollm2_135m",)      # models whose proxy is relative to their own FP16 score (base 100)


def score_basis(model: str) -> str:
    """What the proxy's scale means for `model`: a published MMLU score, or % of the model's own FP16 score."""
    return "relative to the FP16 model (100)" if model in RELATIVE else "published MMLU (5-shot)"


def base_score(model: str) -> float:
    if model in RELATIVE:
        return 100.0
    if model not in BASE_MMLU:
        raise ValueError(f"model={model}: no published base score for the accuracy proxy (known: "
                         f"{sorted(BASE_MMLU)}; relative: {list(RELATIVE)})")
    return BASE_MMLU[model]


def accuracy_proxy(model: str, imp: Importance, cfg: AccuracyConfig, precision: np.ndarray,
                   act_precision: np.ndarray, pruned_frac: np.ndarray) -> float:
    """Score (MMLU points) of a plan: precision / act precision per sublayer (N,), pruned shard fraction (N,)."""
    q = weight_losses(cfg)
    a = np.array([0.0, cfg.act_loss_int8, cfg.act_loss_int4])
    w = imp.per_sublayer
    loss = float((w * (q[precision] + a[act_precision] + imp.pruned_share(pruned_frac))).sum())
    return base_score(model) * max(0.0, 1.0 - loss)
