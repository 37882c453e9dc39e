"""Export a quantized model to the packed weight file (quant.pack, docs/packing.md), with the smoothing scales FOLDED
the way EdgeFlow §4.1 says they cost nothing at run time:

- per-channel scale stored = S_i · s_out[i] (output-side smoothing absorbed by dequantization);
- q/k/v input scale s_qkv -> attn_norm.weight / s_qkv; gate/up input scale -> ffn_norm.weight / s_gu;
- attn_output input scale (GQA-tied) -> attn_v's per-channel scales / s_o (one value per KV channel);
- ffn_down input scale -> ffn_up's per-channel scales / s_down (silu(gate)·up is linear in up).
A runtime then computes, per linear: x8 = round(x / act_scale) (per-tensor INT8), y = (x8 @ q^T) · act_scale · scale.
The per-tensor activation scales go into the file's metadata. Token embeddings (= tied head) are stored as per-row
INT8 (8 bits + one float32 scale per row) in the raw `int8` format whatever the file's format (the planner streams the
LM head as INT8 straight into NPU buffers, no unpack); norms as float32.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from quant.arch import ModelSpec
from quant.methods.base import QuantizedModel
from quant.pack import write_packed_model
from quant.quantize import quantize_rows


def packed_tensors(qm: QuantizedModel, spec: ModelSpec, weights: dict[str, np.ndarray]) -> tuple[dict, dict]:
    """({name: (q, bits, scales) | float32 array}, meta) with all smoothing folded."""
    if any(l.shadow_idx is not None for l in qm.layers.values()):
        raise ValueError("method=shadow_outlier has an FP16 CPU path that the packed format does not store")
    out: dict = {}
    act: dict[str, float] = {}
    for n, l in qm.layers.items():
        sc = l.scale.astype(np.float64) * (l.s_out if l.s_out is not None else 1.0)
        out[n] = [l.q, l.bits, sc]
        act[n] = float(l.act_scale)
    group = spec.n_heads // spec.n_kv_heads
    for i in range(spec.n_layers):
        p = f"blk.{i}."
        s_qkv = qm.layers[p + "attn_q.weight"].s_in
        s_gu = qm.layers[p + "ffn_gate.weight"].s_in
        s_o = qm.layers[p + "attn_output.weight"].s_in
        s_d = qm.layers[p + "ffn_down.weight"].s_in
        an = weights[p + "attn_norm.weight"].astype(np.float64)
        fn = weights[p + "ffn_norm.weight"].astype(np.float64)
        out[p + "attn_norm.weight"] = (an / s_qkv if s_qkv is not None else an).astype(np.float32)
        out[p + "ffn_norm.weight"] = (fn / s_gu if s_gu is not None else fn).astype(np.float32)
        if s_o is not None:
            s_v = s_o.reshape(spec.n_kv_heads, group, spec.head_dim)[:, 0, :].reshape(-1)   # (kv_dim,)
            out[p + "attn_v.weight"][2] = out[p + "attn_v.weight"][2] / s_v
        if s_d is not None:
            out[p + "ffn_up.weight"][2] = out[p + "ffn_up.weight"][2] / s_d
    for n in list(qm.layers):
        q, b, sc = out[n]
        out[n] = (q, b, sc.astype(np.float32))
    emb_q, emb_s = quantize_rows(weights["token_embd.weight"], 8)
    out["token_embd.weight"] = (emb_q, np.full(emb_q.shape[0], 8, dtype=np.int8), emb_s)
    out["output_norm.weight"] = np.asarray(weights["output_norm.weight"], dtype=np.float32)
    meta = {"model": spec.name, "method": qm.method, "act_scales": act, "tied_embeddings": spec.tied_embeddings,
            "smoothing": "folded into norms, attn_v / ffn_up scales and per-channel scales"}
    return out, meta


def write_pack(qm: QuantizedModel, spec: ModelSpec, weights: dict[str, np.ndarray], out_dir,
               fmt: str = "weightlet") -> Path:
    """Write `<out_dir>/<model>.<method>.efpk`; returns its path."""
    tensors, meta = packed_tensors(qm, spec, weights)
    return write_packed_model(Path(out_dir) / f"{spec.name}.{qm.method}.efpk", tensors, fmt=fmt, meta=meta,
                              fmt_of={"token_embd.weight": "int8"})
