"""A tiny random Llama written as a packed file (weightlet or int8) with calibrated activation scales: the HIL
runner's test model and the model the calibration runs the runner on (`hil.calibrate_runner`)."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from quant.arch import ModelSpec
from quant.llama import LinearHook, forward_logits
from quant.pack import write_packed_model
from quant.quantize import act_scale, quantize_rows


def tiny_spec(n_layers: int = 2) -> ModelSpec:
    return ModelSpec(name="tiny", n_layers=n_layers, d_model=64, d_ffn=96, n_heads=4, n_kv_heads=2, head_dim=16,
                     vocab=97, tied_embeddings=True)


class _Max(LinearHook):
    def __init__(self):
        self.mx: dict[str, float] = {}

    def __call__(self, name, x, w):
        self.mx[name] = max(self.mx.get(name, 0.0), float(np.abs(x).max()))
        return x @ w.T


def tiny_weights(spec: ModelSpec, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    w = {"token_embd.weight": rng.normal(0, 1, (spec.vocab, spec.d_model)).astype(np.float32),
         "output_norm.weight": rng.uniform(0.5, 1.5, spec.d_model).astype(np.float32)}
    for i in range(spec.n_layers):
        for kind, (c, d) in spec.linear_shapes().items():
            w[f"blk.{i}.{kind}.weight"] = rng.normal(0, 1 / np.sqrt(d), (c, d)).astype(np.float32)
        w[f"blk.{i}.attn_norm.weight"] = rng.uniform(0.5, 1.5, spec.d_model).astype(np.float32)
        w[f"blk.{i}.ffn_norm.weight"] = rng.uniform(0.5, 1.5, spec.d_model).astype(np.float32)
    return w


def write_tiny(out_dir: Path, spec: ModelSpec, fmt: str, seed: int = 0) -> Path:
    """Packed file with random per-channel bits 3..8, act scales calibrated on random tokens (the q/k/v act scales
    of layer 1 made different, so per-consumer quantization is exercised)."""
    w = tiny_weights(spec, seed)
    rng = np.random.default_rng(seed + 1)
    hook = _Max()
    forward_logits(w, spec, rng.integers(0, spec.vocab, 48), hook)
    act = {n: act_scale(m) for n, m in hook.mx.items()}
    if spec.n_layers > 1:
        act["blk.1.attn_k.weight"] *= 1.25
        act["blk.1.ffn_up.weight"] *= 0.8
    tensors: dict = {}
    for n, a in w.items():
        if a.ndim == 1:
            tensors[n] = a
        elif n == "token_embd.weight":
            q, s = quantize_rows(a, 8)
            tensors[n] = (q, np.full(a.shape[0], 8, np.int8), s)
        else:
            bits = rng.integers(3, 9, a.shape[0]).astype(np.int8)
            q, s = quantize_rows(a, bits)
            tensors[n] = (q, bits, s)
    meta = {"model": spec.name, "act_scales": act, "tied_embeddings": True}
    return write_packed_model(Path(out_dir) / f"tiny.{fmt}.efpk", tensors, fmt=fmt, meta=meta)
