"""Per-sublayer importance for importance-aware precision, pruning and activation quantization (Voltron §4.2.2, §4.3).

Source of the numbers: `data/smollm2_importance.json`, measured on the real SmolLM2-135M by
`python -m quant.measure_importance` (shard pruning → perplexity increase; see that module). Negative
increases (pruning a shard that slightly *helped* perplexity on the sample) are clipped to 0.

- SmolLM2 itself: layer importance = Σ of its measured shard importances.
- Large models (no weights here): documented proxy — the importance of a sublayer at relative depth r = (block + ½)/L is
  the SmolLM2 profile of the same kind (ATTN or FFN) linearly interpolated at r (the paper notes layer importance
  patterns are architecture/task dependent; depth is the one coordinate shared across models). Normalised to sum 1.
- Within a layer, shards are pruned least-important first; `pruned_share(f)` is the share of a layer's importance
  removed when a fraction f of its shards is pruned, from the SmolLM2 shard distributions (mean sorted cumulative
  curve).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from quant.arch import ModelSpec

DATA = Path(__file__).resolve().parent / "data" / "smollm2_importance.json"


@lru_cache(maxsize=2)
def load_measurement(path: str = str(DATA)) -> dict:
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"layer importance data {p} missing (regenerate: python -m "
                                f"quant.measure_importance)")
    doc = json.loads(p.read_text())
    for k in ("attn_shards", "ffn_shards"):
        if k not in doc or not doc[k]:
            raise ValueError(f"{p}: key {k} missing or empty")
    return doc


@dataclass
class Importance:
    per_sublayer: np.ndarray      # (N,) normalised importance (sums to 1), order = LayerTable sublayers
    curve_f: np.ndarray           # (K,) pruned shard fraction grid
    curve_share: np.ndarray       # (K,) share of layer importance removed at that fraction
    source: str                   # "measured" | "depth-proxy"

    def order(self) -> np.ndarray:
        """Sublayers in ascending importance (ties by index)."""
        return np.argsort(self.per_sublayer, kind="stable")

    def pruned_share(self, frac: np.ndarray | float) -> np.ndarray:
        return np.interp(frac, self.curve_f, self.curve_share)


def _curve(shards: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean cumulative share of layer importance removed when pruning the least important shards first."""
    s = np.sort(np.clip(shards, 0, None), axis=1)                          # (L, G) ascending
    tot = s.sum(axis=1, keepdims=True)
    ok = tot[:, 0] > 0
    cum = np.cumsum(s[ok], axis=1) / tot[ok]                               # (L', G)
    G = s.shape[1]
    f = np.concatenate([[0.0], np.arange(1, G + 1) / G])
    share = np.concatenate([[0.0], cum.mean(axis=0)]) if ok.any() else f
    return f, share


def importance_for(spec: ModelSpec, path: str = str(DATA)) -> Importance:
    doc = load_measurement(path)
    attn = np.clip(np.asarray(doc["attn_shards"], dtype=float), 0, None)   # (Ls, G_attn) Δppl
    ffn = np.clip(np.asarray(doc["ffn_shards"], dtype=float), 0, None)     # (Ls, G_ffn)
    a_l, f_l = attn.sum(axis=1), ffn.sum(axis=1)                           # (Ls,)
    Ls = len(a_l)
    if spec.name == doc.get("model") and spec.n_layers == Ls:
        a, f, source = a_l, f_l, "measured"
    else:
        r_src = (np.arange(Ls) + 0.5) / Ls
        r = (np.arange(spec.n_layers) + 0.5) / spec.n_layers
        a, f, source = np.interp(r, r_src, a_l), np.interp(r, r_src, f_l), "depth-proxy"
    per = np.empty(2 * spec.n_layers)
    per[0::2], per[1::2] = a, f
    per = np.maximum(per, 1e-9 * max(per.max(), 1e-12))                    # strictly positive, keeps order defined
    per = per / per.sum()
    fa, sa = _curve(attn)
    ff, sf = _curve(ffn)
    grid = np.linspace(0, 1, 33)
    share = 0.5 * (np.interp(grid, fa, sa) + np.interp(grid, ff, sf))
    return Importance(per_sublayer=per, curve_f=grid, curve_share=share, source=source)
