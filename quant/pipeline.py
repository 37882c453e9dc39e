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


@dataclass(frozen=True)
class QuantInputs:
    """What every method and bit budget of one model and settings share: the reference weights, the calibration
    activations, the K evaluation slices and their reference logits, with the measured seconds each took, so a run
    that reuses them still reports the time its numbers cost."""
    weights: dict[str, np.ndarray]
    calib_tokens: np.ndarray
    calib: object                      # quant.calibrate.calibrate's result
    slices: np.ndarray                 # (K, L) token ids
    refs: list[np.ndarray] | None      # K reference logits, (L, vocab) each; None: computed slice by slice
    calib_s: float                     # measured: calibration forward
    ref_s: float                       # measured: the K reference forwards (0 when `refs` is None)


def quant_inputs(spec: ModelSpec, settings: QuantSettings, refs: bool = True) -> QuantInputs:
    """The shared inputs of `run_quantization` (depend on the model and the calibration / evaluation slices only).
    `refs=False` leaves the reference logits to the evaluation, one slice at a time: peak memory then does not grow
    with the number of slices (one run); `True` keeps all K for runs that share them."""
    from quant.llama import forward_logits

    weights = load_weights(spec)
    calib_toks = eval_text_tokens(spec, settings.calib_tokens, settings.calib_offset)
    slices = settings_slices(spec, settings)                         # (K, L) disjoint evaluation slices
    t0 = time.perf_counter()
    calib = calibrate(weights, spec, calib_toks)
    t1 = time.perf_counter()
    logits = [forward_logits(weights, spec, t) for t in slices] if refs else None
    return QuantInputs(weights, calib_toks, calib, slices, logits, t1 - t0, time.perf_counter() - t1)


def inputs_key(spec: ModelSpec, settings: QuantSettings) -> tuple:
    """What `quant_inputs` depends on: equal keys, equal inputs (a caller may keep one per key)."""
    return (repr(spec), settings.calib_tokens, settings.calib_offset, settings.eval_tokens, settings.eval_offset,
            settings.eval_slices, settings.eval_stride)


def run_quantization(spec: ModelSpec, method: str, bits: int, budget: float, settings: QuantSettings,
                     progress=None, inputs: QuantInputs | None = None) -> QuantResult:
    """One method at one budget, evaluated; `inputs` (from `quant_inputs` of the same model and settings) skips
    recomputing what every method shares. `quantize_s` / `eval_s` include the calibration / reference forwards
    either way."""
    check_method(method)
    x = inputs or quant_inputs(spec, settings, refs=False)
    weights, calib_toks, slices = x.weights, x.calib_tokens, x.slices
    t0 = time.perf_counter()
    m = METHODS[method](settings)
    qm = m.build(weights, spec, x.calib, bits, budget, progress)
    t1 = time.perf_counter()
    ev = evaluate_slices(weights, spec, slices, qm, x.refs)
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
        "quantize_s": x.calib_s + t1 - t0,
        "eval_s": x.ref_s + t2 - t1,
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
