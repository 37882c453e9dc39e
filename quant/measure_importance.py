"""Measure per-sublayer importance and per-precision accuracy effects on the real SmolLM2-135M (Voltron paper §4.2.2,
channel-level importance [43]; §4.3 mixed precision). Every number is measured, over K disjoint text slices.

Lives in `quant/` because it runs the real model (GGUF weights, the NumPy reference Llama of `quant.llama`); the
planner only reads its output, `planner/voltron/data/smollm2_importance.json` (`planner.voltron.importance`,
`planner.voltron.accuracy`).

Slices: K disjoint slices of L tokens of the evaluation text (`quant.evaluate.eval_slices`: offsets offset + k·stride,
checked against the text length and disjoint from the quantizer's calibration slice).

Shard pruning. For every block and every shard of its ATTN (one KV-head group: its query heads' slice of the
attention output) and FFN (`ffn_groups` equal groups of intermediate channels) the shard is pruned — its inputs to
`attn_output` / `ffn_down` zeroed, which removes its whole contribution — and, on every slice, the perplexity increase
Δppl and the mean per-token KL(ref ‖ pruned) (nats) against the unpruned reference (dequantized GGUF weights, fp32)
are recorded. Layer importance = Σ of its shards (paper: "add up the importance scores of all channels within each
layer"); `planner.voltron.importance` turns the per-slice values into mean ± sd and applies the noise rule. Channels
are grouped into shards (the TP shard unit of `planner/voltron/layers.py`, which is also what is pruned at run time).

Speed: the reference forward of a slice is run once and keeps every block's residual input, attention output and
SwiGLU activation; pruning shard g of block i then starts from there (residual − the shard's contribution) and runs
only blocks i+1.. (all G shards of a sublayer as one batch (G, L, d)). The batched block forward (`_attn_half`,
`_ffn_half`) is the math of `quant.llama.forward_logits` (a test checks that they agree).

Precision. The whole-model effect of each precision, and of each precision applied to one sublayer kind (every ATTN
linear, or every FFN linear, the rest fp32). Embedding, norms, attention and the tied head stay fp32. Per slice: ppl,
Δppl relative (ppl/ppl_ref − 1) and mean KL. Three groups of rows (`precision_semantics` in the file says which is
which):
- llama.cpp formats — what the Voltron paper's devices run (llama.cpp; `planner/voltron/devices.py` Q8_0 / Q4_K) and
  what the accuracy proxy uses (`planner.voltron.accuracy`); ggml's reference quantizers, bit-exact
  (`quant.ggml_blocks`):
  - fp16: every linear weight rounded to float16 (activations fp32);
  - q8_0 (plan INT8): Q8_0 weights (blocks of 32, one fp16 scale) and, as llama.cpp's CPU dot product does, each
    linear input quantized to Q8_0 blocks of 32 on the same block grid;
  - q4_k (plan INT4): Q4_K weights (256-weight super-blocks of 32-weight sub-blocks, 6-bit scales and mins) and each
    linear input quantized to Q8_K blocks of 256 (llama.cpp's activation format for Q4_K).
  The reference weights are the shipped GGUF's Q4_1 weights (blocks of 32 along the input dimension); a format with
  blocks on the same grid partly reproduces that grid and understates its error on the original weights, so both
  formats use blocks offset by BLOCK_SHIFT = 16 columns (`quant.ggml_blocks`, `shift`). Rows of 576 (d_model) are
  zero-padded to a multiple of 256 for Q4_K / Q8_K (see `quant.ggml_blocks`).
- Context: q8_0_weights_only, q4_k_weights_only — the same weights, activations fp32 (separates the activation-block
  effect); q4_k_aligned — Q4_K weights only, blocks on the shipped Q4_1 grid (the size of the artefact above).
- Host-kernel semantics — what the emulated cluster's executor (`hil/cluster/shard_ops.py`) runs, not the devices'
  formats (docs/multidevice.md "Accuracy"):
  - host_int8_w8a8: per-output-channel symmetric INT8 weights, dynamic per-tensor symmetric INT8 activations
    (scale = max|x|/127 of each linear input, recomputed for every input);
  - host_int4_per_channel: weight-only per-output-channel symmetric 4-bit weights (|q| ≤ 7), activations fp32;
  - host_int8_weight_only: INT8 per-channel weights with fp32 activations (separates the W8A8 activation error).

Regenerate (writes atomically; about 15 min on this 2-core host when it is otherwise idle, see `seconds` in the file):
    python -m quant.measure_importance --slices 4 --tokens 128 --stride 20000 --ffn-groups 8 \\
        --out planner/voltron/data/smollm2_importance.json
Only the precision rows (keeps the file's shard-pruning data; the slice arguments must match the file's):
    python -m quant.measure_importance --only precision
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from quant.arch import smollm2_spec
from quant.atomic import atomic_write_json
from quant.evaluate import eval_slices, kl_mean, perplexity_from_logits, slice_offsets
from quant.ggml_blocks import q4_k_roundtrip, q8_0_roundtrip, q8_k_roundtrip
from quant.gguf_model import load_weights
from quant.llama import LinearHook, apply_rope, forward_logits, rms_norm, rope_tables, silu
from quant.quantize import act_scale, fake_quant_act, fake_quant_rows
from quant.settings import QuantSettings

BLOCK_SHIFT = 16           # block-grid offset (columns) of the llama.cpp formats from the shipped Q4_1 blocks
PRECISIONS = ("fp16", "q8_0", "q4_k",                                  # llama.cpp formats: the accuracy proxy's
              "q8_0_weights_only", "q4_k_weights_only", "q4_k_aligned",   # context
              "host_int8_w8a8", "host_int4_per_channel", "host_int8_weight_only")   # emulated-cluster kernels
SCOPES = ("all", "attn", "ffn")
KIND_LINEARS = {"attn": ("attn_q", "attn_k", "attn_v", "attn_output"), "ffn": ("ffn_gate", "ffn_up", "ffn_down")}
# precision -> (weight format, activation format); rows with the same weight format share the quantized weights
FORMATS = {"fp16": ("fp16", None), "q8_0": ("q8_0", "q8_0"), "q4_k": ("q4_k", "q8_k"),
           "q8_0_weights_only": ("q8_0", None), "q4_k_weights_only": ("q4_k", None),
           "q4_k_aligned": ("q4_k_aligned", None), "host_int8_w8a8": ("int8_per_channel", "int8_per_tensor"),
           "host_int4_per_channel": ("int4_per_channel", None), "host_int8_weight_only": ("int8_per_channel", None)}
_SHIFTED = f"block grid offset {BLOCK_SHIFT} columns from the shipped Q4_1 blocks"
SEMANTICS = {
    "fp16": "llama.cpp format: weights rounded to float16, activations fp32",
    "q8_0": "llama.cpp format (plan INT8): Q8_0 weights (32-weight blocks, fp16 scale; ggml quantize_row_q8_0_ref) "
            f"and Q8_0 activation blocks of each linear input, {_SHIFTED}",
    "q4_k": "llama.cpp format (plan INT4): Q4_K weights (256-weight super-blocks of 32-weight sub-blocks, 6-bit "
            "scales and mins; ggml quantize_row_q4_K_ref) and Q8_K activation blocks (256; quantize_row_q8_K_ref) "
            f"of each linear input, {_SHIFTED}, rows zero-padded to a multiple of 256",
    "q8_0_weights_only": f"context: q8_0 weights, activations fp32 ({_SHIFTED})",
    "q4_k_weights_only": f"context: q4_k weights, activations fp32 ({_SHIFTED})",
    "q4_k_aligned": "context: Q4_K weights with blocks on the shipped Q4_1 grid, activations fp32 (understates the "
                    "error: partly reproduces the reference's own grid)",
    "host_int8_w8a8": "host-kernel semantics (hil/cluster/shard_ops.py): W8A8, per-output-channel symmetric INT8 "
                      "weights, dynamic per-tensor symmetric INT8 activations",
    "host_int4_per_channel": "host-kernel semantics: weight-only per-output-channel symmetric 4-bit weights "
                             "(|q| <= 7), activations fp32",
    "host_int8_weight_only": "host-kernel semantics, context: per-output-channel symmetric INT8 weights, activations "
                             "fp32 (separates the W8A8 activation error from the weight error)",
}


class PruneHook(LinearHook):
    """Zero input columns `cols` of the linear layer `name` (removes those heads / channels)."""

    def __init__(self, name: str | None = None, cols: np.ndarray | None = None):
        self.name, self.cols = name, cols

    def __call__(self, name: str, x: np.ndarray, w: np.ndarray) -> np.ndarray:
        if name == self.name:
            x = x.copy()
            x[:, self.cols] = 0.0
        return x @ w.T


def quantize_weight(w: np.ndarray, precision: str) -> np.ndarray:
    """(C, D) float32 weight at `precision` (one of PRECISIONS), dequantized back to float32."""
    if precision not in FORMATS:
        raise ValueError(f"precision must be one of {PRECISIONS} (got {precision!r})")
    fmt = FORMATS[precision][0]
    if fmt == "fp16":
        return w.astype(np.float16).astype(np.float32)
    if fmt == "q8_0":
        return q8_0_roundtrip(w, BLOCK_SHIFT)
    if fmt == "q4_k":
        return q4_k_roundtrip(w, BLOCK_SHIFT)
    if fmt == "q4_k_aligned":
        return q4_k_roundtrip(w, 0)
    return fake_quant_rows(w, 8 if fmt == "int8_per_channel" else 4)


def quantize_activation(x: np.ndarray, precision: str) -> np.ndarray:
    """A linear input x (T, D) as `precision` feeds it to the dot product (fp32 when the row has no activation
    format)."""
    act = FORMATS[precision][1]
    if act is None:
        return x
    if act == "int8_per_tensor":
        return fake_quant_act(x, act_scale(float(np.abs(x).max()) if x.size else 0.0))   # dynamic per-tensor
    return (q8_0_roundtrip if act == "q8_0" else q8_k_roundtrip)(x, BLOCK_SHIFT)    # per block of each row


def quantize_linears(weights: dict[str, np.ndarray], spec, precision: str) -> dict[str, np.ndarray]:
    """Every linear weight of every block at `precision` (name -> dequantized (C, D) float32)."""
    kinds = KIND_LINEARS["attn"] + KIND_LINEARS["ffn"]
    return {f"blk.{i}.{k}.weight": quantize_weight(weights[f"blk.{i}.{k}.weight"], precision)
            for i in range(spec.n_layers) for k in kinds}


class PrecisionHook(LinearHook):
    """Every linear of `scope` ('all' | 'attn' | 'ffn') at `precision` with the semantics above. `qw`: the output of
    `quantize_linears` for this precision's weight format (reused across scopes and rows); computed when None."""

    def __init__(self, weights: dict[str, np.ndarray], spec, precision: str, scope: str = "all",
                 qw: dict[str, np.ndarray] | None = None):
        if scope not in SCOPES:
            raise ValueError(f"scope must be one of {SCOPES} (got {scope!r})")
        if precision not in FORMATS:
            raise ValueError(f"precision must be one of {PRECISIONS} (got {precision!r})")
        kinds = KIND_LINEARS["attn"] + KIND_LINEARS["ffn"] if scope == "all" else KIND_LINEARS[scope]
        qw = quantize_linears(weights, spec, precision) if qw is None else qw
        self.qw = {n: q for n, q in qw.items() if n.split(".")[2] in kinds}
        self.precision = precision

    def __call__(self, name: str, x: np.ndarray, w: np.ndarray) -> np.ndarray:
        q = self.qw.get(name)
        if q is None:
            return x @ w.T
        return quantize_activation(x, self.precision) @ q.T


def shard_columns(spec, sub: str, g: int, ffn_groups: int) -> tuple[str, np.ndarray]:
    """(linear name suffix, input columns) of shard g of sublayer kind `sub` ('attn' | 'ffn')."""
    if sub == "attn":
        per = spec.n_heads // spec.n_kv_heads * spec.head_dim                 # query heads of one KV group × hd
        return "attn_output.weight", np.arange(g * per, (g + 1) * per)
    per = spec.d_ffn // ffn_groups
    return "ffn_down.weight", np.arange(g * per, (g + 1) * per)


# ---- batched forward (B variants of one slice): the math of quant.llama.forward_logits ---------------------------

class _Ctx:
    def __init__(self, spec, T: int):
        self.cos, self.sin = rope_tables(T, spec.head_dim, spec.rope_base)           # (T, hd/2)
        self.mask = np.triu(np.full((T, T), -np.inf, dtype=np.float32), k=1)       # (T, T) causal
        self.scale = np.float32(1.0 / np.sqrt(spec.head_dim))


def _attn_half(w, spec, i: int, x: np.ndarray, c: _Ctx) -> tuple[np.ndarray, np.ndarray]:
    """x (B, T, d) -> (residual after attention (B, T, d), attention output before attn_output (B, T, H*hd))."""
    B, T, d = x.shape
    H, KV, hd = spec.n_heads, spec.n_kv_heads, spec.head_dim
    group, p = H // KV, f"blk.{i}."
    h = rms_norm(x, w[p + "attn_norm.weight"], spec.norm_eps).reshape(B * T, d)
    q = apply_rope((h @ w[p + "attn_q.weight"].T).reshape(B * T, H, hd), np.tile(c.cos, (B, 1)),
                   np.tile(c.sin, (B, 1))).reshape(B, T, H, hd)
    k = apply_rope((h @ w[p + "attn_k.weight"].T).reshape(B * T, KV, hd), np.tile(c.cos, (B, 1)),
                   np.tile(c.sin, (B, 1))).reshape(B, T, KV, hd)
    v = (h @ w[p + "attn_v.weight"].T).reshape(B, T, KV, hd)
    qh = q.transpose(0, 2, 1, 3).reshape(B, KV, group * T, hd)                    # (B, KV, group*T, hd)
    kh = k.transpose(0, 2, 3, 1)                                                   # (B, KV, hd, T)
    att = (qh @ kh).reshape(B, KV, group, T, T) * c.scale + c.mask               # (B, KV, group, T, T)
    att = np.exp(att - att.max(axis=-1, keepdims=True))
    att /= att.sum(axis=-1, keepdims=True)
    o = att.reshape(B, KV, group * T, T) @ v.transpose(0, 2, 1, 3)                # (B, KV, group*T, hd)
    o = o.reshape(B, KV, group, T, hd).transpose(0, 3, 1, 2, 4).reshape(B, T, H * hd)
    return x + (o.reshape(B * T, H * hd) @ w[p + "attn_output.weight"].T).reshape(B, T, d), o


def _ffn_half(w, spec, i: int, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """x (B, T, d) -> (residual after the FFN (B, T, d), SwiGLU activation before ffn_down (B, T, f))."""
    B, T, d = x.shape
    p = f"blk.{i}."
    h = rms_norm(x, w[p + "ffn_norm.weight"], spec.norm_eps).reshape(B * T, d)
    a = silu(h @ w[p + "ffn_gate.weight"].T) * (h @ w[p + "ffn_up.weight"].T)    # (B*T, f)
    return x + (a @ w[p + "ffn_down.weight"].T).reshape(B, T, d), a.reshape(B, T, -1)


def _log_probs(w, spec, x: np.ndarray) -> np.ndarray:
    """Final norm + tied head of one variant x (T, d) -> log-probabilities (T, V) float32."""
    z = rms_norm(x, w["output_norm.weight"], spec.norm_eps) @ w["token_embd.weight"].T    # (T, V)
    z -= z.max(axis=-1, keepdims=True)
    z -= np.log(np.exp(z).sum(axis=-1, keepdims=True))
    return z


def _ppl_kl(lp: np.ndarray, ref_lp: np.ndarray, ref_p: np.ndarray, tokens: np.ndarray) -> tuple[float, float]:
    """(perplexity of tokens[1:], mean over positions of KL(ref ‖ variant) in nats)."""
    nll = -lp[np.arange(tokens.size - 1), tokens[1:]].astype(np.float64)
    kl = (ref_p * (ref_lp - lp)).sum(axis=-1, dtype=np.float64)                  # (T,)
    return float(np.exp(nll.mean())), float(kl.mean())


def reference_trace(w, spec, tokens: np.ndarray) -> dict:
    """Reference forward of one slice keeping every block's intermediates (B = 1 dropped)."""
    c = _Ctx(spec, tokens.size)
    x = w["token_embd.weight"][tokens].astype(np.float32)[None]                   # (1, T, d)
    mid, attn_o, out, ffn_a = [], [], [], []
    for i in range(spec.n_layers):
        x, o = _attn_half(w, spec, i, x, c)
        mid.append(x[0])
        attn_o.append(o[0])
        x, a = _ffn_half(w, spec, i, x)
        out.append(x[0])
        ffn_a.append(a[0])
    lp = _log_probs(w, spec, x[0])
    return {"ctx": c, "mid": mid, "attn_o": attn_o, "out": out, "ffn_a": ffn_a, "lp": lp, "p": np.exp(lp)}


def prune_slice(w, spec, tokens: np.ndarray, ffn_groups: int, layers: list[int]) -> dict:
    """One slice: reference ppl and, per layer and kind, Δppl and mean KL of pruning each shard (G,)."""
    tr = reference_trace(w, spec, tokens)
    c = tr["ctx"]
    ref_ppl, _ = _ppl_kl(tr["lp"], tr["lp"], tr["p"], tokens)
    res: dict = {"ref_ppl": ref_ppl, "attn": {}, "ffn": {}}
    for i in layers:
        for sub, n_groups in (("attn", spec.n_kv_heads), ("ffn", ffn_groups)):
            suffix = shard_columns(spec, sub, 0, ffn_groups)[0]
            W = w[f"blk.{i}.{suffix}"]                                              # (d, D_in)
            base, act = (tr["mid"][i], tr["attn_o"][i]) if sub == "attn" else (tr["out"][i], tr["ffn_a"][i])
            x = np.stack([base - act[:, cols] @ W[:, cols].T
                          for cols in (shard_columns(spec, sub, g, ffn_groups)[1] for g in range(n_groups))])
            if sub == "attn":
                x, _ = _ffn_half(w, spec, i, x)                                      # rest of block i
            for j in range(i + 1, spec.n_layers):
                x, _ = _attn_half(w, spec, j, x, c)
                x, _ = _ffn_half(w, spec, j, x)
            vals = [_ppl_kl(_log_probs(w, spec, x[g]), tr["lp"], tr["p"], tokens) for g in range(n_groups)]
            res[sub][i] = ([v[0] - ref_ppl for v in vals], [v[1] for v in vals])
    return res


def measure(spec, slices: np.ndarray, ffn_groups: int, layers: list[int] | None = None, progress=True) -> dict:
    """Shard pruning on every slice (K, L): Δppl and KL arrays (K, n_layers, G) per kind, reference ppl (K,)."""
    w = load_weights(spec)
    slices = np.atleast_2d(np.asarray(slices, dtype=np.int64))
    layers = list(range(spec.n_layers)) if layers is None else list(layers)
    K, G = slices.shape[0], {"attn": spec.n_kv_heads, "ffn": ffn_groups}
    if spec.d_ffn % ffn_groups:
        raise ValueError(f"ffn_groups ({ffn_groups}) must divide d_ffn ({spec.d_ffn})")
    out = {f"{sub}_{m}": np.full((K, spec.n_layers, G[sub]), np.nan) for sub in G for m in ("dppl", "kl")}
    ref = np.empty(K)
    t0 = time.time()
    for k, toks in enumerate(slices):
        r = prune_slice(w, spec, toks, ffn_groups, layers)
        ref[k] = r["ref_ppl"]
        for sub in G:
            for i, (d, kl) in r[sub].items():
                out[f"{sub}_dppl"][k, i], out[f"{sub}_kl"][k, i] = d, kl
        if progress:
            print(f"slice {k + 1}/{K}: ref ppl {ref[k]:.3f}, shard pruning done ({time.time() - t0:.0f} s)",
                  file=sys.stderr, flush=True)
    return {"ref_ppl": ref, **out}


def measure_precision(spec, slices: np.ndarray, progress=True) -> dict:
    """{precision: {scope: {"ppl", "ref_ppl", "dppl_rel", "kl": per-slice lists (K,)}}} (see the module doc)."""
    w = load_weights(spec)
    slices = np.atleast_2d(np.asarray(slices, dtype=np.int64))
    refs = [forward_logits(w, spec, t) for t in slices]
    ref_ppl = [perplexity_from_logits(r, t) for r, t in zip(refs, slices)]
    out: dict = {}
    t0 = time.time()
    cache: dict[str, dict] = {}                                          # weight format -> quantized linears
    for prec in PRECISIONS:
        out[prec] = {}
        wf = FORMATS[prec][0]
        qw = cache[wf] if wf in cache else cache.setdefault(wf, quantize_linears(w, spec, prec))
        for scope in SCOPES:
            hook = PrecisionHook(w, spec, prec, scope, qw)
            ppl, kl = [], []
            for r, t in zip(refs, slices):
                q = forward_logits(w, spec, t, hook)
                ppl.append(perplexity_from_logits(q, t))
                kl.append(kl_mean(r, q))
            out[prec][scope] = {"ppl": ppl, "ref_ppl": ref_ppl, "kl": kl,
                                "dppl_rel": [p / b - 1.0 for p, b in zip(ppl, ref_ppl)]}
            if progress:
                print(f"{prec} {scope}: Δppl rel {np.mean(out[prec][scope]['dppl_rel']):+.4f}, KL "
                      f"{np.mean(kl):.4f} ({time.time() - t0:.0f} s)", file=sys.stderr, flush=True)
    return out


def _existing(path: str, a) -> dict:
    """The measurement file at `path`, checked to hold shard-pruning data measured on the same slices as `a`."""
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"out: {path} does not exist (--only precision updates an existing file)")
    doc = json.loads(p.read_text())
    want = {"count": a.slices, "tokens": a.tokens, "offset": a.offset, "stride": a.stride}
    got = {k: doc.get("slices", {}).get(k) for k in want}
    if got != want or "attn_dppl_slices" not in doc:
        raise ValueError(f"out: {path} was measured on other slices ({got}, asked {want}) or has no shard-pruning "
                         f"data; run without --only")
    return doc


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--slices", type=int, default=4, help="K disjoint evaluation slices (>= 1; >= 4 for the spread)")
    ap.add_argument("--tokens", type=int, default=128, help="L tokens per slice")
    ap.add_argument("--offset", type=int, default=0, help="token offset of the first slice")
    ap.add_argument("--stride", type=int, default=20_000, help="tokens between slice starts (>= --tokens)")
    ap.add_argument("--ffn-groups", type=int, default=8)
    ap.add_argument("--out", default="planner/voltron/data/smollm2_importance.json")
    ap.add_argument("--only", choices=("all", "precision"), default="all",
                    help="precision: re-measure only the precision rows, keeping --out's shard-pruning data (the "
                         "slice arguments must match the file's)")
    a = ap.parse_args(argv)
    spec = smollm2_spec()
    q = QuantSettings()
    try:
        slices = eval_slices(spec, a.slices, a.tokens, a.offset, a.stride, (q.calib_offset, q.calib_tokens))
        if spec.d_ffn % a.ffn_groups:
            raise ValueError(f"ffn_groups: {a.ffn_groups} must divide d_ffn = {spec.d_ffn}")
        old = _existing(a.out, a) if a.only == "precision" else None
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    t0 = time.time()
    prec = measure_precision(spec, slices)
    t1 = time.time()
    if old is not None:
        old.update({"precision_semantics": SEMANTICS, "precision": prec,
                    "seconds": {**old.get("seconds", {}), "precision": round(t1 - t0, 1)}})
        atomic_write_json(a.out, old)
        print(f"wrote {a.out} (precision rows only, {t1 - t0:.0f} s; shard-pruning data kept)")
        return
    res = measure(spec, slices, a.ffn_groups)
    t2 = time.time()
    r = lambda v: np.round(np.asarray(v, dtype=float), 8).tolist()  # noqa: E731
    doc = {
        "model": spec.name,
        "label": "measured",
        "method": "shard pruning (attn: KV-head group; ffn: channel group) -> perplexity increase and mean "
                  "KL(ref || pruned) per token, fp32 reference (dequantized GGUF), on K disjoint slices",
        "slices": {"count": a.slices, "tokens": a.tokens, "offset": a.offset, "stride": a.stride,
                   "offsets": slice_offsets(a.slices, a.tokens, a.offset, a.stride),
                   "calibration_excluded": [q.calib_offset, q.calib_offset + q.calib_tokens]},
        "ffn_groups": a.ffn_groups,
        "ref_ppl_slices": r(res["ref_ppl"]),                                     # (K,)
        "attn_dppl_slices": r(res["attn_dppl"]),                                 # (K, L, n_kv_heads) Δppl
        "ffn_dppl_slices": r(res["ffn_dppl"]),                                   # (K, L, ffn_groups) Δppl
        "attn_kl_slices": r(res["attn_kl"]),                                     # (K, L, n_kv_heads) nats
        "ffn_kl_slices": r(res["ffn_kl"]),                                       # (K, L, ffn_groups) nats
        "precision_semantics": SEMANTICS,
        "precision": prec,                                                       # {prec: {scope: per-slice lists}}
        "seconds": {"precision": round(t1 - t0, 1), "pruning": round(t2 - t1, 1)},
        "regenerate": f"python -m quant.measure_importance --slices {a.slices} --tokens {a.tokens} --offset "
                      f"{a.offset} --stride {a.stride} --ffn-groups {a.ffn_groups}",
    }
    atomic_write_json(a.out, doc)
    print(f"wrote {a.out} ({t2 - t0:.0f} s: precision {t1 - t0:.0f} s, pruning {t2 - t1:.0f} s)")


if __name__ == "__main__":
    main()
