"""Quantize the real model with one method and evaluate it (EdgeFlow §4.1; docs/quantization.md): the core of
`experiments.quantize`.

Flow: reference weights (GGUF, dequantized) -> calibration activations on a slice of the text -> method.build ->
reference and quantized forward on K disjoint evaluation slices (disjoint from calibration) -> perplexity and mean
KL(reference‖quantized) as mean ± sd over the slices (`quant.evaluate.evaluate_slices`), the bit histogram and the
packed-size estimate. Plain typed inputs, a plain dict out; no Hydra here.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from quant.arch import ModelSpec
from quant.calibrate import calibrate
from quant.evaluate import eval_text_tokens, evaluate_slices, settings_slices
from quant.gguf_model import load_weights
from quant.methods import METHODS, QuantizedModel
from quant.settings import QuantSettings
from quant.twin import bits_histogram

MEASURED_KEYS = ["ppl", "ref_ppl", "kl_mean", "ppl_sd", "ref_ppl_sd", "kl_mean_sd", "ppl_slices", "ref_ppl_slices",
                 "kl_mean_slices", "dppl_rel", "dppl_rel_sd", "dppl_rel_slices", "avg_bits", "avg_bits_channel",
                 "bits_histogram", "alpha_mean",
                 "quantize_s", "eval_s", "n_linear_weights"]
INPUT_KEYS = ["eval_tokens", "eval_slices", "eval_offsets", "calib_tokens", "budget"]   # settings echoed in metrics
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
    slices = settings_slices(spec, settings)                         # (K, L) disjoint evaluation slices
    t0 = time.perf_counter()
    calib = calibrate(weights, spec, calib_toks)
    m = METHODS[method](settings)
    qm = m.build(weights, spec, calib, bits, budget, progress)
    t1 = time.perf_counter()
    ev = evaluate_slices(weights, spec, slices, qm)
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
        **ev.metrics(),                                               # ppl / ref_ppl / kl_mean: mean over slices
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
        "eval_tokens": int(slices.shape[1]),
        "eval_slices": int(slices.shape[0]),
        "eval_offsets": [settings.eval_offset + k * settings.eval_stride for k in range(slices.shape[0])],
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
