"""Measure per-sublayer importance on the real SmolLM2-135M (Voltron paper §4.2.2, channel-level importance [43]).

Lives in `quant/` because it runs the real model (GGUF weights, the NumPy reference forward of `quant.llama`); the
planner only reads its output, `planner/voltron/data/smollm2_importance.json` (`planner.voltron.importance`).

For every block and every shard of its ATTN (one KV-head group: its query heads' slice of the attention output) and
FFN (`ffn_groups` equal groups of intermediate channels), the shard is pruned (its inputs to `attn_output` /
`ffn_down` zeroed, which removes its whole contribution) and the perplexity increase over the unpruned reference
(dequantized GGUF weights, fp32 NumPy forward of `quant.llama`) is recorded on the first `tokens` tokens of the
evaluation text. Shard importance = Δppl; layer importance = Σ of its shards (paper: "add up the importance scores of
all channels within each layer"). Channels are grouped into shards (not pruned one by one) to keep the offline run at a
few minutes on 2 cores; the grouping is the TP shard unit of `layers.py`, which is also what gets pruned at run time.

Regenerate (writes atomically):
    python -m quant.measure_importance --tokens 128 --ffn-groups 8 \
        --out planner/voltron/data/smollm2_importance.json
"""
from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from quant.llama import LinearHook


class PruneHook(LinearHook):
    """Zero input columns `cols` of the linear layer `name` (removes those heads / channels)."""

    def __init__(self, name: str | None = None, cols: np.ndarray | None = None):
        self.name, self.cols = name, cols

    def __call__(self, name: str, x: np.ndarray, w: np.ndarray) -> np.ndarray:
        if name == self.name:
            x = x.copy()
            x[:, self.cols] = 0.0
        return x @ w.T


def shard_columns(spec, sub: str, g: int, ffn_groups: int) -> tuple[str, np.ndarray]:
    """(linear name suffix, input columns) of shard g of sublayer kind `sub` ('attn' | 'ffn')."""
    if sub == "attn":
        per = spec.n_heads // spec.n_kv_heads * spec.head_dim                 # query heads of one KV group × hd
        return "attn_output.weight", np.arange(g * per, (g + 1) * per)
    per = spec.d_ffn // ffn_groups
    return "ffn_down.weight", np.arange(g * per, (g + 1) * per)


def measure(spec, tokens: np.ndarray, ffn_groups: int, layers: list[int] | None = None, progress=True) -> dict:
    from quant.evaluate import perplexity
    from quant.gguf_model import load_weights

    w = load_weights(spec)
    base = perplexity(w, spec, tokens)
    layers = list(range(spec.n_layers)) if layers is None else layers
    out = {"attn": {}, "ffn": {}}
    t0 = time.time()
    for i in layers:
        for sub, n_groups in (("attn", spec.n_kv_heads), ("ffn", ffn_groups)):
            deltas = []
            for g in range(n_groups):
                suffix, cols = shard_columns(spec, sub, g, ffn_groups)
                ppl = perplexity(w, spec, tokens, PruneHook(f"blk.{i}.{suffix}", cols))
                deltas.append(ppl - base)
            out[sub][str(i)] = deltas
        if progress:
            print(f"layer {i}: attn {sum(out['attn'][str(i)]):+.3f} ffn {sum(out['ffn'][str(i)]):+.3f} "
                  f"({time.time() - t0:.0f} s)", file=sys.stderr, flush=True)
    return {"base_ppl": base, "shards": out}


def main(argv: list[str] | None = None) -> None:
    from quant.atomic import atomic_write_json
    from quant.evaluate import eval_text_tokens
    from quant.gguf_model import smollm2_spec

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--offset", type=int, default=0)
    ap.add_argument("--ffn-groups", type=int, default=8)
    ap.add_argument("--out", default="planner/voltron/data/smollm2_importance.json")
    a = ap.parse_args(argv)
    spec = smollm2_spec()
    toks = eval_text_tokens(spec, a.tokens, a.offset)
    res = measure(spec, toks, a.ffn_groups)
    L = spec.n_layers
    doc = {
        "model": spec.name,
        "method": "shard pruning (attn: KV-head group; ffn: channel group) -> perplexity increase, fp32 reference",
        "tokens": a.tokens, "offset": a.offset, "ffn_groups": a.ffn_groups, "base_ppl": res["base_ppl"],
        "attn_shards": [res["shards"]["attn"][str(i)] for i in range(L)],      # (L, n_kv_heads) Δppl
        "ffn_shards": [res["shards"]["ffn"][str(i)] for i in range(L)],        # (L, ffn_groups) Δppl
        "regenerate": "python -m quant.measure_importance --tokens 128 --ffn-groups 8",
    }
    atomic_write_json(a.out, doc)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
