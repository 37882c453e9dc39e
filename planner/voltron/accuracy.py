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
  (`planner.accuracy.loss_int8=0.002`) overrides the measurement.
  Model size: a 135M model is far more sensitive to 4-bit weights than a 7–14B one, so for every other model q(p)
  scales with its parameter count N (`ModelSpec.total_params`, from the exact shapes; MoE: all experts, every one is
  quantized) along published llama.cpp perplexity measurements of the same formats, mapped by the same proxy
  (`PUBLISHED`): LLaMA-7B / 13B on wikitext-2 (ctx 512) — Q4_K (= llama.cpp's Q4_K_S, every linear Q4_K) from the
  k-quants pull request (ggml-org/llama.cpp #1684): F16 5.9066 → 6.0215 (7B), 5.2543 → 5.3404 (13B), q = 0.0191 /
  0.0161; Q8_0 from llama.cpp's examples/quantize/README.md table: 5.9066 → 5.9070, 5.2543 → 5.2548, q = 0.00007 /
  0.00010. With SmolLM2-135M's measured q as the small-model point, log q is interpolated linearly in log N between
  the points (beyond 13B: the 7B→13B slope, −0.26; below 135M: the 135M value). E.g. q(INT4) = 0.198 (135M),
  0.026 (Gemma-3-4B, 3.9B), 0.019 (7.6B), 0.017 (Gemma-3-12B, 11.8B), 0.016 (14.8B). These are LLaMA-1 numbers
  applied to the Qwen and Gemma families (no per-family Q4_K measurement was found); family-specific task data
  (Qwen2-Instruct MMLU, GPTQ-Int4: 7B 70.5 → 67.8, −3.8 %; 72B 82.3 → 80.8, −1.8 %; qwen.readthedocs.io
  "Performance of Quantized Models") lose about twice as much, which `int4_scale` (default 1) lets the sensitivity
  analysis apply (docs/multidevice.md). `loss_source` names the source of a model's q.
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
from quant.arch import model_spec

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
    int4_scale: float = 1.0           # × the size-scaled q(INT4) of every model but SmolLM2 (sensitivity: ~2 = the
                                      # Qwen2 GPTQ-Int4 MMLU drops; 1 = the llama.cpp Q4_K perplexity curve)

    def __post_init__(self) -> None:
        for k in ("loss_int8", "loss_int4", "act_loss_int8", "act_loss_int4"):
            v = getattr(self, k)
            if v is None and k.startswith("loss_"):
                continue
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v < 1:
                raise ValueError(f"accuracy.{k} must be in [0, 1) (got {v!r})")
        if isinstance(self.int4_scale, bool) or not 0 < self.int4_scale <= 10:
            raise ValueError(f"accuracy.int4_scale must be in (0, 10] (got {self.int4_scale!r})")


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
    within_noise: bool = False  # the mean loss was within the noise rule and `loss` was set to 0


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
    noise = bool(lm <= NOISE_Z * ls / np.sqrt(K))                            # within noise (incl. negative) → 0
    if noise:
        lm = 0.0
    return PrecisionLoss(precision, fmt, *_mean_sd(ppl / ref - 1.0), *_mean_sd(m["kl"]), min(lm, 0.999), ls, K,
                         noise)


# Published whole-model effects of the llama.cpp formats by model size (wikitext-2 perplexity, ctx 512), mapped by the
# proxy q = 1 − ppl_ref/ppl: (source, params in billions, ppl F16, ppl at the format). LLaMA-1 7B / 13B have 6.74B /
# 13.0B parameters (LLaMA paper, Table 2).
PUBLISHED = {
    "int4": [("llama.cpp k-quants PR #1684, LLaMA-7B Q4_K_S", 6.74, 5.9066, 6.0215),
             ("llama.cpp k-quants PR #1684, LLaMA-13B Q4_K_S", 13.0, 5.2543, 5.3404)],
    "int8": [("llama.cpp examples/quantize/README.md, LLaMA-7B Q8_0", 6.74, 5.9066, 5.9070),
             ("llama.cpp examples/quantize/README.md, LLaMA-13B Q8_0", 13.0, 5.2543, 5.2548)],
}


def size_curve(precision: str, path: str = str(DATA)) -> list[tuple[float, float]]:
    """[(params in billions, q)] of `precision` ('int8' | 'int4'): the SmolLM2 measurement, then `PUBLISHED`."""
    n_small = model_spec(load_measurement(path)["model"]).total_params() / 1e9
    published = [(n, 1.0 - ref / ppl) for _, n, ref, ppl in PUBLISHED[precision]]
    return [(n_small, precision_loss(precision, path=path).loss)] + published


def scaled_loss(precision: str, params_b: float, path: str = str(DATA)) -> float:
    """q(precision) of a model of `params_b` billion parameters: log q linear in log N between the curve's points,
    the last segment's slope beyond them, the smallest point's value below them (q = 0 anywhere on the curve: q is
    interpolated linearly instead, as the log is undefined)."""
    n, q = map(np.asarray, zip(*size_curve(precision, path)))
    x = np.log(n)
    if (q <= 0).any():
        return float(max(np.interp(np.log(params_b), x, q), 0.0))
    y = np.log(q)
    if params_b <= n[-1]:
        return float(np.exp(np.interp(np.log(params_b), x, y)))
    slope = (y[-1] - y[-2]) / (x[-1] - x[-2])
    return float(np.exp(y[-1] + slope * (np.log(params_b) - x[-1])))


@lru_cache(maxsize=64)
def _losses(model: str, loss_int8: Optional[float], loss_int4: Optional[float], int4_scale: float,
            path: str = str(DATA)) -> np.ndarray:
    if model == load_measurement(path).get("model"):
        q8, q4 = precision_loss("int8", path=path).loss, precision_loss("int4", path=path).loss
    else:
        n = model_spec(model).total_params() / 1e9                 # MoE: every expert is quantized
        q8, q4 = scaled_loss("int8", n, path), min(scaled_loss("int4", n, path) * int4_scale, 0.999)
    return np.array([0.0, q8 if loss_int8 is None else loss_int8, q4 if loss_int4 is None else loss_int4])


def weight_losses(cfg: AccuracyConfig, model: str, path: str = str(DATA)) -> np.ndarray:
    """q(p) of `model` by precision id (3,): FP16 0, then INT8 (Q8_0) and INT4 (Q4_K) from the config or, when null,
    the measurement (SmolLM2) or the size curve through it and the published points (any other model)."""
    return _losses(model, cfg.loss_int8, cfg.loss_int4, cfg.int4_scale, path)


def loss_source(model: str, cfg: AccuracyConfig, path: str = str(DATA)) -> str:
    """Where q(INT8) / q(INT4) of `model` come from: "config" (both overridden), else "measured" (SmolLM2 itself) or
    "size-scaled" (the size curve through the SmolLM2 measurement and the published llama.cpp points), followed by the
    llama.cpp formats, e.g. "size-scaled (llama.cpp Q8_0, Q4_K)" or "measured (llama.cpp Q4_K; INT8 from config)"."""
    if cfg.loss_int8 is not None and cfg.loss_int4 is not None:
        return "config"
    kind = "measured" if model == load_measurement(path).get("model") else "size-scaled"
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
    q = weight_losses(cfg, model)
    a = np.array([0.0, cfg.act_loss_int8, cfg.act_loss_int4])
    w = imp.per_sublayer
    loss = float((w * (q[precision] + a[act_precision] + imp.pruned_share(pruned_frac))).sum())
    return base_score(model) * max(0.0, 1.0 - loss)
