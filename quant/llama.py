"""NumPy reference forward pass of the Llama architecture: the accuracy oracle for every quantizer
(docs/quantization.md).

Owns: RMSNorm, RoPE (adjacent-pair convention: GGUF's llama conversion permutes q/k rows, so pairs (0,1), (2,3), …
rotate; the half-split convention gives perplexity ~345 instead of 17.83), grouped-query causal attention, SwiGLU
FFN, tied output head; and the hook through which quantizers see every linear layer.

Design: one function, `forward_logits(weights, spec, tokens, quant=None)`, float32 throughout, `@` matmuls on a cached
weights dict (a 512-token forward of SmolLM2 is a few seconds on 2 cores). Every linear layer goes through
`quant(name, x, w)` where `name` is the GGUF tensor name (`blk.{i}.attn_q.weight`), `x` the (T, D) input activation
and `w` the (C, D) weight. `LinearHook` (the default) computes `x @ w.T`; a quantizer subclasses it to apply smoothing,
fake-quantized weights and static per-tensor INT8 activation quantization, and a calibration collector subclasses it
to record activations. The weights dict may have rows zeroed (channel pruning): nothing here assumes non-zero rows.
"""
from __future__ import annotations

import numpy as np

from quant.arch import ModelSpec


class LinearHook:
    """y = x @ w.T for the linear layer `name` (x: (T, D) float32, w: (C, D) float32) -> (T, C)."""

    def __call__(self, name: str, x: np.ndarray, w: np.ndarray) -> np.ndarray:
        return x @ w.T


def rms_norm(x: np.ndarray, g: np.ndarray, eps: float) -> np.ndarray:
    """x: (T, d), g: (d,) -> (T, d)."""
    return (x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)) * g


def rope_tables(n_pos: int, head_dim: int, base: float) -> tuple[np.ndarray, np.ndarray]:
    """cos, sin tables (T, head_dim/2) for positions 0..n_pos-1."""
    inv = base ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)    # (hd/2,)
    ang = np.arange(n_pos, dtype=np.float64)[:, None] * inv[None, :]             # (T, hd/2)
    return np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)


def apply_rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """Rotate adjacent pairs (0,1), (2,3), ... of each head. x: (T, H, hd); cos/sin: (T, hd/2)."""
    x0, x1 = x[..., 0::2], x[..., 1::2]                                           # (T, H, hd/2)
    c, s = cos[:, None, :], sin[:, None, :]
    out = np.empty_like(x)
    out[..., 0::2] = x0 * c - x1 * s
    out[..., 1::2] = x0 * s + x1 * c
    return out


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def forward_logits(weights: dict[str, np.ndarray], spec: ModelSpec, tokens: np.ndarray,
                   quant: LinearHook | None = None) -> np.ndarray:
    """Logits (T, vocab) float32 for a causal forward over `tokens` (T,) int; `quant` sees every linear layer."""
    hook = quant if quant is not None else LinearHook()
    tokens = np.asarray(tokens, dtype=np.int64)
    if tokens.ndim != 1 or tokens.size == 0:
        raise ValueError(f"tokens must be a non-empty 1-D array (got shape {tokens.shape})")
    if tokens.min() < 0 or tokens.max() >= spec.vocab:
        raise ValueError(f"token ids must be in 0..{spec.vocab - 1}")
    T, H, KV, hd, eps = tokens.size, spec.n_heads, spec.n_kv_heads, spec.head_dim, spec.norm_eps
    group = H // KV
    emb = weights["token_embd.weight"]                                           # (V, d)
    x = emb[tokens].astype(np.float32)                                           # (T, d)
    cos, sin = rope_tables(T, hd, spec.rope_base)
    mask = np.triu(np.full((T, T), -np.inf, dtype=np.float32), k=1)              # (T, T) causal
    scale = np.float32(1.0 / np.sqrt(hd))
    for i in range(spec.n_layers):
        p = f"blk.{i}."
        h = rms_norm(x, weights[p + "attn_norm.weight"], eps)                     # (T, d)
        q = hook(p + "attn_q.weight", h, weights[p + "attn_q.weight"]).reshape(T, H, hd)
        k = hook(p + "attn_k.weight", h, weights[p + "attn_k.weight"]).reshape(T, KV, hd)
        v = hook(p + "attn_v.weight", h, weights[p + "attn_v.weight"]).reshape(T, KV, hd)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        qh = q.transpose(1, 0, 2).reshape(KV, group * T, hd)                      # (KV, group*T, hd)
        kh = k.transpose(1, 2, 0)                                                 # (KV, hd, T)
        att = (qh @ kh).reshape(KV, group, T, T) * scale + mask                  # (KV, group, T, T)
        att = np.exp(att - att.max(axis=-1, keepdims=True))
        att /= att.sum(axis=-1, keepdims=True)
        o = att.reshape(KV, group * T, T) @ v.transpose(1, 0, 2)                 # (KV, group*T, hd)
        o = o.reshape(KV, group, T, hd).transpose(2, 0, 1, 3).reshape(T, H * hd)  # (T, H*hd), head-major
        x = x + hook(p + "attn_output.weight", o, weights[p + "attn_output.weight"])
        h = rms_norm(x, weights[p + "ffn_norm.weight"], eps)
        g = hook(p + "ffn_gate.weight", h, weights[p + "ffn_gate.weight"])      # (T, f)
        u = hook(p + "ffn_up.weight", h, weights[p + "ffn_up.weight"])          # (T, f)
        x = x + hook(p + "ffn_down.weight", silu(g) * u, weights[p + "ffn_down.weight"])
    x = rms_norm(x, weights["output_norm.weight"], eps)
    head = weights.get("output.weight", emb) if not spec.tied_embeddings else emb
    return x @ head.T                                                            # (T, V)


def linear_names(spec: ModelSpec) -> list[str]:
    """GGUF names of every linear weight of the blocks, in forward order."""
    return [f"blk.{i}.{k}.weight" for i in range(spec.n_layers) for k in spec.linear_shapes()]
