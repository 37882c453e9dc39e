"""Quantize the real model with one method and evaluate it (EdgeFlow §4.1; docs/quantization.md): the core of
`experiments.quantize`.

Flow: reference weights (GGUF, dequantized) -> calibration activations on a slice of the text -> method.build ->
reference and quantized forward on a disjoint evaluation slice -> perplexity, mean KL(reference‖quantized), the bit
histogram and the packed-size estimate. Plain typed inputs, a plain dict out; no Hydra here.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from quant.arch import ModelSpec
from quant.calibrate import calibrate
from quant.evaluate import eval_text_tokens, kl_mean, perplexity_from_logits
from quant.gguf_model import load_weights
from quant.llama import forward_logits
from quant.methods import METHODS, QuantizedModel
from quant.settings import QuantSettings
from quant.twin import bits_histogram

MEASURED_KEYS = ["ppl", "ref_ppl", "kl_mean", "avg_bits", "avg_bits_channel", "bits_histogram", "alpha_mean",
                 "quantize_s", "eval_s", "n_linear_weights"]
INPUT_KEYS = ["eval_tokens", "calib_tokens", "budget"]    # settings echoed into metrics.json
MODELLED_KEYS = ["model_bytes", "model_mb", "weight_bytes_linear", "compression_vs_fp16", "stored_bits_per_weight"]


@dataclass
class QuantResult:
    metrics: dict
    model: QuantizedModel


def check_method(method: str) -> None:
    if method not in METHODS:
        raise ValueError(f"method must be one of {sorted(METHODS)} (got {method!r})")


def run_quantization(spec: ModelSpec, method: str, bits: int, budget: float, settings: QuantSettings,
                     progress=None) -> QuantResult:
    check_method(method)
    weights = load_weights(spec)
    calib_toks = eval_text_tokens(spec, settings.calib_tokens, settings.calib_offset)
    eval_toks = eval_text_tokens(spec, settings.eval_tokens, settings.eval_offset)
    t0 = time.perf_counter()
    calib = calibrate(weights, spec, calib_toks)
    m = METHODS[method](settings)
    qm = m.build(weights, spec, calib, bits, budget, progress)
    t1 = time.perf_counter()
    ref_logits = forward_logits(weights, spec, eval_toks)
    q_logits = forward_logits(weights, spec, eval_toks, qm)
    t2 = time.perf_counter()
    b, d = qm.all_bits()
    lin_bytes = sum(l.weight_bytes() for l in qm.layers.values())
    total = qm.model_bytes(spec)
    alphas = getattr(m, "alphas", None)
    metrics = {
        "method": method,
        "model": spec.name,
        "scope": settings.scope,
        "budget": float(getattr(m, "fixed_bits", budget)),           # int8/int4 fix their width, ignoring bits
        "ppl": perplexity_from_logits(q_logits, eval_toks),
        "ref_ppl": perplexity_from_logits(ref_logits, eval_toks),
        "kl_mean": kl_mean(ref_logits, q_logits),
        "avg_bits": float((b * d).sum() / d.sum()),                   # bits per linear weight
        "avg_bits_channel": float(b.mean()),
        "bits_histogram": {str(k): v for k, v in bits_histogram(b).items()},   # share of output channels per width
        "alpha_mean": float(np.mean(list(alphas.values()))) if alphas else 0.0,
        "model_bytes": float(total),
        "model_mb": float(total / 1e6),
        "weight_bytes_linear": float(lin_bytes),
        "n_linear_weights": int(d.sum()),
        "stored_bits_per_weight": float(lin_bytes * 8 / d.sum()),   # incl. scales, widths, shadow FP16 columns
        "compression_vs_fp16": float(spec.total_params() * 2 / total),
        "quantize_s": t1 - t0,
        "eval_s": t2 - t1,
        "eval_tokens": int(eval_toks.size),
        "calib_tokens": int(calib_toks.size),
    }
    return QuantResult(metrics, qm)



def pack_available() -> bool:
    """True when the packed-format writer (quant.pack.write_packed_model) is importable."""
    try:
        from quant.pack import write_packed_model  # noqa: F401
    except ImportError:
        return False
    return True
