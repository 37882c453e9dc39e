"""NPU-aware smoothing (EdgeFlow §4.1): move per-channel activation variance into the weights, with no runtime cost.

Paper: W' = diag(S_I^α) · W · diag(S_O^-β) (W is D×C there); the matmul becomes O = (I·diag(S_I^-α)) · W' · diag(S_O^β).
Here weights are (C, D) rows = output channels, so W'[c, d] = W[c, d] · s_in[d] / s_out[c] with s_in = S_I^α and
s_out = S_O^β. α is grid-searched in [0, 1] per smoothing group to minimise the relative output error
Σ_members ||Y - Ŷ||² / ||Y||² on calibration activations, with the method's own weight quantization and the static
per-tensor INT8 activation quantization in the loop; β = 1.

Where the scales fold (so the NPU sees plain per-tensor INT8 inputs and per-channel weights, no extra ops):
- q/k/v share one input (attn_norm output): one s_in, folded into attn_norm's weight.
- gate/up share one input (ffn_norm output): one s_in, folded into ffn_norm's weight.
- ffn_down's input is silu(gate)·up: s_in folds exactly into ffn_up's output rows.
- attn_output's input is the attention output, per head a mix of V rows: s_in folds into attn_v's output rows only if
  it is equal across the query heads sharing one KV head, so it is tied per GQA group (max of S_I over the group).
- s_out (output side, β) folds into the per-channel dequantization scale.

What β = 1 changes (docs/quantization.md): nothing in the weight codes. Symmetric per-output-channel quantization is
scale-equivariant per row (Q(c·w) = c·Q(w)), and RE is scale-invariant, so dividing row c by S_O[c] and multiplying
the dequantization scale back changes neither the codes, nor the allocation, nor the dequantized weights (up to float
rounding; tested). It only flattens the NPU's output tensor O/S_O, which matters if the NPU re-quantizes its output
per tensor; in the EdgeFlow operator placement (appendix B, Fig. 17) outputs are dequantized to FP16 on the CPU, so
it does not change accuracy here. We keep β as a knob for fidelity with the paper.
"""
from __future__ import annotations

import numpy as np

from quant.arch import ModelSpec

SCALE_FLOOR = 1e-5      # smallest per-channel max |activation| used in S^α (avoids 0^α for dead channels)


def smoothing_groups(spec: ModelSpec, layer: int) -> list[list[str]]:
    """Linear names of one block that share an input scale."""
    p = f"blk.{layer}."
    return [[p + "attn_q.weight", p + "attn_k.weight", p + "attn_v.weight"],
            [p + "attn_output.weight"],
            [p + "ffn_gate.weight", p + "ffn_up.weight"],
            [p + "ffn_down.weight"]]


def tie_gqa(s_in: np.ndarray, spec: ModelSpec) -> np.ndarray:
    """Make a (H·hd,) attn_output input scale equal across the query heads of each KV group (max over the group)."""
    group = spec.n_heads // spec.n_kv_heads
    t = s_in.reshape(spec.n_kv_heads, group, spec.head_dim).max(axis=1, keepdims=True)   # (KV, 1, hd)
    return np.broadcast_to(t, (spec.n_kv_heads, group, spec.head_dim)).reshape(-1).copy()


def group_in_max(names: list[str], in_max: dict[str, np.ndarray], spec: ModelSpec) -> np.ndarray:
    """S_I of a smoothing group (members share the input, so take the first), GQA-tied for attn_output."""
    s = np.maximum(in_max[names[0]].astype(np.float64), SCALE_FLOOR)
    return tie_gqa(s, spec) if names[0].endswith("attn_output.weight") else s


def input_scale(s_max: np.ndarray, alpha: float) -> np.ndarray:
    """s_in = S_I^α (D,) float32."""
    return np.power(s_max, alpha).astype(np.float32)


def output_scale(out_max: np.ndarray, beta: float) -> np.ndarray:
    """s_out = S_O^β (C,) float32 (floored like S_I)."""
    return np.power(np.maximum(out_max.astype(np.float64), SCALE_FLOOR), beta).astype(np.float32)


def smooth_weight(w: np.ndarray, s_in: np.ndarray | None, s_out: np.ndarray | None) -> np.ndarray:
    """W' = W · diag(s_in) on inputs, / s_out on output rows. (C, D) float32."""
    out = np.asarray(w, dtype=np.float32)
    if s_in is not None:
        out = out * s_in[None, :]
    if s_out is not None:
        out = out / s_out[:, None]
    return out
