"""Per-sublayer importance for importance-aware precision, pruning and activation quantization (Voltron §4.2.2, §4.3).

Source of the numbers: `data/smollm2_importance.json`, measured on the real SmolLM2-135M by
`python -m quant.measure_importance` (shard pruning → perplexity increase and KL, on K ≥ 4 disjoint text slices; see
that module).

- Shard importance = mean over the K slices of the relative perplexity increase Δppl/ppl_ref of pruning it.
- Noise rule (stated, not silent clipping): a shard whose mean is not above NOISE_Z standard errors,
  mean ≤ NOISE_Z · sd / √K (sd over slices, ddof = 1) — this includes every negative mean, i.e. pruning a shard that
  *helped* perplexity on average — is within the measurement noise and counts as unimportant (importance 0).
  `Importance.noise_share` says which share of the shards that is (per kind in `noise_share_kind`).
- SmolLM2 itself: layer importance = Σ of its shard importances; `source` = "measured".
- Other models (no weights here): `source` = "extrapolated" — a documented depth proxy: the importance of a sublayer
  at relative depth r = (block + ½)/L is the SmolLM2 profile of the same kind (ATTN or FFN) linearly interpolated at r
  (the paper notes layer importance patterns are architecture/task dependent; depth is the one coordinate shared
  across models). Normalised to sum 1.
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


NOISE_Z = 2.0      # a shard is important only if its mean Δppl/ppl_ref exceeds NOISE_Z standard errors (sd/√K)
KINDS = ("attn", "ffn")


@lru_cache(maxsize=2)
def load_measurement(path: str = str(DATA)) -> dict:
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"layer importance data {p} missing (regenerate: python -m "
                                f"quant.measure_importance)")
    doc = json.loads(p.read_text())
    for k in ("ref_ppl_slices", "attn_dppl_slices", "ffn_dppl_slices", "attn_kl_slices", "ffn_kl_slices"):
        if k not in doc or not doc[k]:
            raise ValueError(f"{p}: key {k} missing or empty (regenerate: python -m quant.measure_importance)")
    K = len(doc["ref_ppl_slices"])
    for k in ("attn_dppl_slices", "ffn_dppl_slices", "attn_kl_slices", "ffn_kl_slices"):
        if np.asarray(doc[k]).ndim != 3 or len(doc[k]) != K:
            raise ValueError(f"{p}: key {k} must be (slices={K}, layers, shards)")
    return doc


@dataclass
class ShardStats:
    """Per-shard statistics of one sublayer kind over the K slices, each (L, G)."""
    mean: np.ndarray          # mean relative perplexity increase Δppl/ppl_ref
    sd: np.ndarray            # sample sd over slices (ddof = 1; 0 when K = 1)
    kl_mean: np.ndarray       # mean KL(ref ‖ pruned), nats per token
    kl_sd: np.ndarray
    noise: np.ndarray         # bool: within noise (mean ≤ NOISE_Z·sd/√K) → unimportant
    slices: int               # K

    @property
    def importance(self) -> np.ndarray:
        """(L, G) shard importance: the mean, 0 for within-noise shards."""
        return np.where(self.noise, 0.0, self.mean)

    @property
    def layer_importance(self) -> np.ndarray:
        """(L,) layer importance: Σ of its shards' importance (within-noise shards count 0)."""
        return self.importance.sum(axis=1)


def shard_stats(doc: dict, kind: str) -> ShardStats:
    """Mean ± sd over slices of pruning each shard of kind 'attn' | 'ffn', and the noise rule."""
    ref = np.asarray(doc["ref_ppl_slices"], dtype=float)                      # (K,)
    rel = np.asarray(doc[f"{kind}_dppl_slices"], dtype=float) / ref[:, None, None]   # (K, L, G)
    kl = np.asarray(doc[f"{kind}_kl_slices"], dtype=float)                    # (K, L, G)
    K = rel.shape[0]
    sd = rel.std(axis=0, ddof=1) if K > 1 else np.zeros(rel.shape[1:])
    kl_sd = kl.std(axis=0, ddof=1) if K > 1 else np.zeros(kl.shape[1:])
    m = rel.mean(axis=0)
    return ShardStats(mean=m, sd=sd, kl_mean=kl.mean(axis=0), kl_sd=kl_sd, noise=m <= NOISE_Z * sd / np.sqrt(K),
                      slices=K)


@dataclass
class Importance:
    per_sublayer: np.ndarray      # (N,) normalised importance (sums to 1), order = LayerTable sublayers
    curve_f: np.ndarray           # (K,) pruned shard fraction grid
    curve_share: np.ndarray       # (K,) share of layer importance removed at that fraction
    source: str                   # "measured" (SmolLM2) | "extrapolated" (depth proxy of the SmolLM2 profile)
    noise_share: float = 0.0      # share of SmolLM2's shards within noise (importance 0), both kinds
    noise_share_kind: dict[str, float] | None = None   # the same per kind ('attn', 'ffn')

    def order(self) -> np.ndarray:
        """Sublayers in ascending importance (ties by index)."""
        return np.argsort(self.per_sublayer, kind="stable")

    def pruned_share(self, frac: np.ndarray | float) -> np.ndarray:
        return np.interp(frac, self.curve_f, self.curve_share)


def _curve(shards: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean cumulative share of layer importance removed when pruning the least important shards first."""
    s = np.sort(shards, axis=1)                                            # (L, G) ascending, >= 0
    tot = s.sum(axis=1, keepdims=True)
    ok = tot[:, 0] > 0
    cum = np.cumsum(s[ok], axis=1) / tot[ok]                               # (L', G)
    G = s.shape[1]
    f = np.concatenate([[0.0], np.arange(1, G + 1) / G])
    share = np.concatenate([[0.0], cum.mean(axis=0)]) if ok.any() else f
    return f, share


def importance_for(spec: ModelSpec, path: str = str(DATA)) -> Importance:
    doc = load_measurement(path)
    st = {k: shard_stats(doc, k) for k in KINDS}
    attn, ffn = st["attn"].importance, st["ffn"].importance                  # (Ls, G) ≥ 0, noise → 0
    a_l, f_l = st["attn"].layer_importance, st["ffn"].layer_importance      # (Ls,)
    Ls = len(a_l)
    if spec.name == doc.get("model") and spec.n_layers == Ls:
        a, f, source = a_l, f_l, "measured"
    else:
        r_src = (np.arange(Ls) + 0.5) / Ls
        r = (np.arange(spec.n_layers) + 0.5) / spec.n_layers
        a, f, source = np.interp(r, r_src, a_l), np.interp(r, r_src, f_l), "extrapolated"
    per = np.empty(2 * spec.n_layers)
    per[0::2], per[1::2] = a, f
    per = np.maximum(per, 1e-9 * max(per.max(), 1e-12))                    # strictly positive, keeps order defined
    per = per / per.sum()
    fa, sa = _curve(attn)
    ff, sf = _curve(ffn)
    grid = np.linspace(0, 1, 33)
    share = 0.5 * (np.interp(grid, fa, sa) + np.interp(grid, ff, sf))
    noise = np.concatenate([st[k].noise.ravel() for k in KINDS])
    return Importance(per_sublayer=per, curve_f=grid, curve_share=share, source=source,
                      noise_share=float(noise.mean()), noise_share_kind={k: float(st[k].noise.mean()) for k in KINDS})
