"""Statistical twin of per-channel weight statistics, for models without weights on this machine (docs/quantization.md;
docs/design.md §7).

Owns: fitting, storing (quant/data/twin_<model>.json) and sampling the per-output-channel statistics the RE metric
depends on, and the twin's bit allocation for a big model (used by the cold-start simulator for packed sizes).

What is fitted, from the real SmolLM2-135M (the dequantized GGUF weights), after EdgeFlow's input-side smoothing
W' = W · diag(S_I^α) (EdgeFlow §4.1: the bits are allocated on the smoothed weights, so their crest factors are the
statistic; the raw weights' crest factors spread 1.7x less in ln κ and put 97 % of channels at a 5-bit budget against
Fig. 4a's 78 %). S_I = max |X| per input channel on the calibration slice (`quant.twin_fit`); α is fixed at
`SMOOTH_ALPHA` in place of EdgeFlow's per-group search (an assumption, stated in the stored file):
- The closed-form RE depends on a channel only through its crest factor κ = max|w| / rms(w) (quant.relerr). The crest
  factor of a channel of D weights grows with D like the expected maximum of D light-tailed samples, so the twin stores
  the normalised crest z = κ / √(2 ln D) — an assumption (stated, not fitted) that lets a 576-wide SmolLM2 row stand
  for a 4096-wide Llama3-8B row.
- For each tensor kind (attn_q/k/v/output, ffn_gate/up/down) and each of `DEPTH_BINS` equal slices of model depth,
  the empirical quantiles of ln z at fixed probabilities `PROBS`; and per kind the quantiles of ln(rms·√D) (the rms at
  unit fan-in; only sizes the statistics, RE does not depend on it).
Sampling: inverse-CDF with linear interpolation between stored quantiles (no extrapolation beyond the observed range),
crest and rms sampled independently; deterministic for a given seed. MoE experts / shared experts / router map to the
dense FFN kinds by suffix (`*_gate`, `*_up`, `*_down`; router -> ffn_gate).

This is a twin of the distribution, stated as such in every output: it never sees the big model's weights.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from quant.allocate import allocate
from quant.arch import ModelSpec
from quant.atomic import atomic_write_text
from quant.gguf_file import check_shapes
from quant.smoothing import group_in_max, input_scale, smoothing_groups

KINDS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")
DEPTH_BINS = 5                       # equal slices of relative depth; per-kind statistics drift with depth
PROBS = (0.0, 0.001, 0.005, 0.01, 0.02, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5, 0.55, 0.6, 0.65,
         0.7, 0.75, 0.8, 0.85, 0.9, 0.95, 0.98, 0.99, 0.995, 0.999, 1.0)     # quantile levels stored per distribution
DATA_DIR = Path(__file__).resolve().parent / "data"
DEFAULT_SOURCE = "smollm2_135m"
ROUND = 6                            # decimals stored in the JSON (ln-space; 1e-6 relative)
SMOOTH_ALPHA = 0.5                   # migration strength of the fitted smoothing: SmoothQuant's default (Xiao et al.
#                                      2023), standing in for EdgeFlow's per-group α search (§4.1)


@dataclass
class Twin:
    source: str                                       # model the twin was fitted on
    probs: list[float]                                # quantile levels
    depth_bins: int
    log_z: dict[str, list[list[float]]] = field(default_factory=dict)    # kind -> [bin][q] quantiles of ln(κ/√(2 ln D))
    log_rms_unit: dict[str, list[float]] = field(default_factory=dict)   # kind -> [q] quantiles of ln(rms·√D)
    smoothing_alpha: float = 0.0                      # α of W' = W · diag(S_I^α) the statistics were taken on
    calibration: str = ""                             # where S_I came from

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1) + "\n"

    @classmethod
    def from_json(cls, text: str) -> "Twin":
        return cls(**json.loads(text))


def kind_of(name: str) -> str:
    """Map a linear-layer key of `ModelSpec.linear_shapes()` to a twin kind."""
    if name in KINDS:
        return name
    if name == "router":
        return "ffn_gate"
    for suffix in ("gate", "up", "down"):
        if name.endswith("_" + suffix):
            return "ffn_" + suffix
    raise ValueError(f"no twin kind for linear layer {name!r}")


def _crest_norm(d: int) -> float:
    return float(np.sqrt(2.0 * np.log(d)))


def smoothing_scales(spec: ModelSpec, in_max: dict[str, np.ndarray], alpha: float = SMOOTH_ALPHA
                     ) -> dict[str, np.ndarray]:
    """GGUF weight name -> s_in = S_I^α (D,) of its smoothing group (members share the input; GQA-tied)."""
    out = {}
    for i in range(spec.n_layers):
        for names in smoothing_groups(spec, i):
            s_in = input_scale(group_in_max(names, in_max, spec), alpha)
            out.update({n: s_in for n in names})
    return out


def fit_twin(weights: dict[str, np.ndarray], source: str = DEFAULT_SOURCE, s_in: dict[str, np.ndarray] | None = None,
             alpha: float = 0.0, calibration: str = "") -> Twin:
    """Fit the twin on a real model's weights dict (GGUF names, (C, D) linear weights), each weight smoothed by its
    input scale `s_in[name]` (None: the raw weights; alpha / calibration only describe s_in in the stored file)."""
    n_layers = 1 + max(int(k.split(".")[1]) for k in weights if k.startswith("blk."))
    probs = np.asarray(PROBS)
    twin = Twin(source=source, probs=list(PROBS), depth_bins=DEPTH_BINS, smoothing_alpha=alpha,
                calibration=calibration)
    for kind in KINDS:
        per_bin: list[list[float]] = []
        rms_all = []
        for b in range(DEPTH_BINS):
            layers = [i for i in range(n_layers) if i * DEPTH_BINS // n_layers == b]
            zs = []
            for i in layers:
                name = f"blk.{i}.{kind}.weight"
                w = np.asarray(weights[name], dtype=np.float64)
                if s_in is not None:
                    w = w * s_in[name][None, :]
                d = w.shape[1]
                rms = np.sqrt(np.mean(w * w, axis=1))
                keep = rms > 0
                zs.append(np.abs(w[keep]).max(axis=1) / rms[keep] / _crest_norm(d))
                rms_all.append(rms[keep] * np.sqrt(d))
            per_bin.append(np.round(np.quantile(np.log(np.concatenate(zs)), probs), ROUND).tolist())
        twin.log_z[kind] = per_bin
        twin.log_rms_unit[kind] = np.round(np.quantile(np.log(np.concatenate(rms_all)), probs), ROUND).tolist()
    return twin


def twin_path(source: str = DEFAULT_SOURCE) -> Path:
    return DATA_DIR / f"twin_{source}.json"


def regenerate_twin(spec: ModelSpec, weights: dict[str, np.ndarray], in_max: dict[str, np.ndarray],
                    calibration: str, path: Path | None = None) -> Path:
    """Refit the twin from the real model `spec` (its weights, the calibration S_I per linear) and store it (atomic
    write). Deliberate, never implicit: `python -m quant.twin_fit`."""
    check_shapes(spec, weights)
    twin = fit_twin(weights, spec.name, smoothing_scales(spec, in_max), SMOOTH_ALPHA, calibration)
    return atomic_write_text(path or twin_path(spec.name), twin.to_json())


def load_twin(source: str = DEFAULT_SOURCE) -> Twin:
    p = twin_path(source)
    if not p.is_file():
        raise FileNotFoundError(f"twin parameters {p} missing (regenerate: python -m quant.twin_fit)")
    return Twin.from_json(p.read_text())


def _sample(quantiles: list[float], u: np.ndarray, probs: np.ndarray) -> np.ndarray:
    return np.interp(u, probs, np.asarray(quantiles))


def twin_channel_stats(spec: ModelSpec, seed: int,
                       twin: Twin | None = None) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """kind-key of spec.linear_shapes() -> (max_abs (L·C,), mean_sq (L·C,)) float64, layer-major, sampled from the
    twin."""
    twin = twin or load_twin()
    probs = np.asarray(twin.probs)
    rng = np.random.default_rng(seed)
    out: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    L = spec.n_layers
    for name, (c, d) in spec.linear_shapes().items():
        kind = kind_of(name)
        log_z = np.empty((L, c))
        for i in range(L):
            b = i * twin.depth_bins // L
            log_z[i] = _sample(twin.log_z[kind][b], rng.random(c), probs)
        crest = np.exp(log_z.ravel()) * _crest_norm(d)                          # κ = max|w|/rms
        rms = np.exp(_sample(twin.log_rms_unit[kind], rng.random(L * c), probs)) / np.sqrt(d)
        out[name] = (crest * rms, rms * rms)
    return out


def twin_bits(spec: ModelSpec, budget: float, seed: int = 0, twin: Twin | None = None,
              scope: str = "global") -> dict[str, np.ndarray]:
    """Bits of every output channel (layer-major, (L·C,) int8) per kind-key of spec.linear_shapes().

    scope="global": one budget in bits per weight across all linear layers (each channel's cost = its D weights);
    scope="tensor": `budget` average bits per channel within every tensor (one layer's one kind).
    """
    stats = twin_channel_stats(spec, seed, twin)
    shapes = spec.linear_shapes()
    if scope == "tensor":
        out = {}
        for name, (m, s) in stats.items():
            c = shapes[name][0]
            out[name] = np.concatenate([allocate(m[i * c:(i + 1) * c], s[i * c:(i + 1) * c], budget)
                                        for i in range(spec.n_layers)])
        return out
    if scope != "global":
        raise ValueError(f"scope must be 'global' or 'tensor' (got {scope!r})")
    names = list(stats)
    m = np.concatenate([stats[n][0] for n in names])
    s = np.concatenate([stats[n][1] for n in names])
    cost = np.concatenate([np.full(stats[n][0].size, float(shapes[n][1])) for n in names])
    bits = allocate(m, s, budget, cost=cost)
    out, at = {}, 0
    for n in names:
        k = stats[n][0].size
        out[n] = bits[at:at + k]
        at += k
    return out


def bits_histogram(bits: np.ndarray, weights: np.ndarray | None = None) -> dict[int, float]:
    """Share (0..1) of channels (or of `weights`) at each bit width 1..8."""
    counts = np.bincount(np.asarray(bits, dtype=np.int64), weights=weights, minlength=9)[1:9]
    total = counts.sum()
    return {b + 1: float(counts[b] / total) if total else 0.0 for b in range(8)}
