"""Latency regression of the Voltron planner (paper §4.2.1: "a regression model … based on runtime features such as
device type, layer type, precision, input token length and the number of tokens accumulated in the KV cache"; the
paper reports ~90 % average accuracy).

Owns:
- `sample_profiles`: profiling runs of every sublayer type of a model on every device, at every precision, for
  prefill (n = 8…1024 new tokens, KV 0…4096) and decode (n = 1, KV 0…8192), whole layers and TP shards (fraction
  1/16…1), timed by a given timer (the device being profiled) × log-normal noise (σ = `noise`, seeded). In a
  simulated run the timer is the simulated cluster's device model (`sim/multidevice/device_model.py`, passed in
  through `registry.build_context(profiler=…)`; the planner never imports it); on hardware, measured runs in the
  same table form. `simulate_profiles` times the planner's own spec roofline (`devices.device_time`), for use
  without any device.
- `LatencyModel`: one non-negative least-squares linear model per (device, precision, phase) on physically derived
  features x = [1, ops, weight bytes read, KV bytes read] (the layer type, token count and KV length enter through
  these features). Linear in x, so a TP shard of fraction f costs β₀ + f·(β·x) and the planner can evaluate every
  layer type × device × precision with one einsum.
- `accuracy`: MAPE / R² / "accuracy" = 1 − MAPE on held-out profile points.

The regression cannot represent a device's max(compute, memory) kink, partial overlap or the small-batch utilisation
curve exactly, so its error is real model error, not just noise.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.optimize import nnls

from planner.voltron.devices import BYTES_PER_WEIGHT, PRECISIONS, EdgeDevice, device_time
from planner.voltron.layers import LayerTable

PHASES = ("prefill", "decode")


@dataclass
class Profile:
    """Profile points (one row per run). Arrays share the first axis."""
    device: np.ndarray       # (M,) device index
    prec: np.ndarray         # (M,) precision id
    phase: np.ndarray        # (M,) 0 prefill, 1 decode
    ltype: np.ndarray        # (M,) sublayer type id
    n_tokens: np.ndarray     # (M,)
    kv_len: np.ndarray       # (M,)
    x: np.ndarray            # (M, 4) features [1, ops, weight bytes, kv bytes]
    time_s: np.ndarray       # (M,) "measured" time


def feature_row(table: LayerTable, ltype: int, prec: int, n: int, kv: int, frac: float) -> np.ndarray:
    """(4,) regression features of one profiling run: [1, ops, weight bytes read, KV bytes read] of a fraction `frac`
    of a sublayer of type `ltype` at precision `prec`, n new tokens after kv cached ones."""
    f, _ = table.features(n, kv)                           # (T, 3): ops, weight params read, kv bytes read
    ops, wparams, kvb = f[ltype]
    return np.array([1.0, frac * ops, frac * wparams * BYTES_PER_WEIGHT[prec], frac * kvb])


def sample_profiles(n_devices: int, table: LayerTable, timer, points: int = 160, noise: float = 0.05,
                    seed: int = 0) -> Profile:
    """`points` random profiling runs per (device, precision, phase), timed by `timer(device, precision, type,
    n_tokens, kv_len, frac, x) -> s` × log-normal noise (σ = `noise`); deterministic for a seed. The timer is the
    device being profiled: the spec roofline (`simulate_profiles`), the simulated cluster, or measured runs."""
    rng = np.random.default_rng(seed)
    present = sorted(set(table.type_of.tolist()) | {5})
    rows: list[tuple] = []
    for di in range(n_devices):
        for p in range(len(PRECISIONS)):
            for ph in range(2):
                for _ in range(points):
                    t = int(rng.choice(present))
                    if ph == 0:
                        n = int(np.exp(rng.uniform(np.log(8), np.log(1024))))
                        kv = int(rng.uniform(0, 4096))
                    else:
                        n, kv = 1, int(rng.uniform(0, 8192))
                    frac = float(rng.choice([1.0, 0.5, 1 / 3, 0.25, 0.125, 1 / 16]))
                    nt = n if t != 5 else 1
                    x = feature_row(table, t, p, nt, kv, frac)
                    true = timer(di, p, t, nt, kv, frac, x)
                    rows.append((di, p, ph, t, n, kv, x, float(true) * float(np.exp(rng.normal(0, noise)))))
    cols = list(zip(*rows))
    return Profile(*(np.array(c) for c in cols[:6]), x=np.stack(cols[6]), time_s=np.array(cols[7]))


def simulate_profiles(devices: list[EdgeDevice], table: LayerTable, points: int = 160, noise: float = 0.05,
                      seed: int = 0) -> Profile:
    """Profiles of the spec-derived roofline (`devices.device_time`): what the planner can fit without a device."""
    def roofline(di, p, t, n, kv, frac, x):
        return device_time(devices[di], np.array(p), np.array(float(n)), x[1], x[2] + x[3])

    return sample_profiles(len(devices), table, roofline, points, noise, seed)


def _nnls_fit(X: np.ndarray, y: np.ndarray) -> np.ndarray:
    """(4,) non-negative coefficients of y ≈ X β, relative-error weighted (small layers count as much as big ones)."""
    scale = np.maximum(np.abs(X).max(axis=0), 1e-30)                        # column scaling for conditioning
    w = 1.0 / y
    b, _ = nnls((X / scale) * w[:, None], y * w)
    return b / scale


MIN_TYPE_POINTS = 6          # profile rows a (device, precision, phase, layer type) needs for its own fit
N_TYPES = 6                  # layer types of `layers.TYPES`


@dataclass
class LatencyModel:
    """β[d, p, phase, :] coefficients (s per feature unit), NNLS-fitted; optionally also per layer type
    (`beta_type[d, p, phase, t, :]`, the paper lists layer type among the regression's features): a type with fewer
    than MIN_TYPE_POINTS rows uses the pooled β."""
    beta: np.ndarray                     # (D, P, 2, 4)
    device_names: list[str]
    beta_type: np.ndarray | None = None  # (D, P, 2, T, 4) or None (pooled over layer types)

    @classmethod
    def fit(cls, prof: Profile, device_names: list[str], by_type: bool = False) -> "LatencyModel":
        D, P = len(device_names), len(PRECISIONS)
        beta = np.zeros((D, P, 2, 4))
        beta_t = np.zeros((D, P, 2, N_TYPES, 4)) if by_type else None
        for d in range(D):
            for p in range(P):
                for ph in range(2):
                    m = (prof.device == d) & (prof.prec == p) & (prof.phase == ph)
                    if m.sum() < 4:
                        raise ValueError(f"too few profile points for {device_names[d]}/{PRECISIONS[p]}/{PHASES[ph]}")
                    beta[d, p, ph] = _nnls_fit(prof.x[m], prof.time_s[m])
                    if beta_t is None:
                        continue
                    for t in range(N_TYPES):
                        mt = m & (prof.ltype == t)
                        beta_t[d, p, ph, t] = (_nnls_fit(prof.x[mt], prof.time_s[mt]) if mt.sum() >= MIN_TYPE_POINTS
                                               else beta[d, p, ph])
        return cls(beta=beta, device_names=list(device_names), beta_type=beta_t)

    def predict(self, prof: Profile) -> np.ndarray:
        """(M,) predicted time for profile rows."""
        if self.beta_type is not None:
            b = self.beta_type[prof.device, prof.prec, prof.phase, prof.ltype]   # (M, 4)
        else:
            b = self.beta[prof.device, prof.prec, prof.phase]                   # (M, 4)
        return np.einsum("mf,mf->m", b, prof.x)

    def type_costs(self, phase: int, feats: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Intercept (D, P, T) and full-layer slope (D, P, T) for per-type features `feats` (T, 3) from LayerTable: a
        TP shard of fraction f of a type-t sublayer costs intercept[..., t] + f · slope[..., t]."""
        X = np.empty((len(PRECISIONS), feats.shape[0], 3))                  # (P, T, 3)
        X[:, :, 0] = feats[:, 0]
        X[:, :, 1] = feats[:, 1][None, :] * BYTES_PER_WEIGHT[:, None]
        X[:, :, 2] = feats[:, 2]
        T = X.shape[1]
        bp = self.beta[:, :, phase]                                         # (D, P, 4)
        if self.beta_type is None:
            icpt = np.broadcast_to(bp[:, :, :1], bp.shape[:2] + (T,)).copy()
            return icpt, np.einsum("dpf,ptf->dpt", bp[:, :, 1:], X)
        # per-type fits, each with its own intercept (the regression's β₀ of that type, fitted on whole layers and TP
        # shards alike), so a shard is charged exactly what the fitted model predicts for it (docs/cluster.md)
        bt = self.beta_type[:, :, phase, :T]                                # (D, P, T, 4)
        return bt[..., 0].copy(), np.einsum("dptf,ptf->dpt", bt[..., 1:], X)


def accuracy(model: LatencyModel, prof: Profile) -> dict[str, float]:
    """Held-out accuracy: MAPE, R² (of time), accuracy = 1 − MAPE; also per phase."""
    pred = model.predict(prof)
    err = np.abs(pred - prof.time_s) / prof.time_s
    ss_res = float(((pred - prof.time_s) ** 2).sum())
    ss_tot = float(((prof.time_s - prof.time_s.mean()) ** 2).sum())
    out = {"mape": float(err.mean()), "r2": 1 - ss_res / ss_tot, "accuracy": float(1 - err.mean()),
           "n_points": int(len(err))}
    for ph, name in enumerate(PHASES):
        m = prof.phase == ph
        out[f"mape_{name}"] = float(err[m].mean())
    return out


def split(prof: Profile, test_frac: float = 0.2, seed: int = 0) -> tuple[Profile, Profile]:
    """Random train / held-out split of profile rows."""
    rng = np.random.default_rng(seed + 1)
    idx = rng.permutation(len(prof.time_s))
    k = int(len(idx) * (1 - test_frac))

    def take(ii):
        return Profile(prof.device[ii], prof.prec[ii], prof.phase[ii], prof.ltype[ii], prof.n_tokens[ii],
                       prof.kv_len[ii], prof.x[ii], prof.time_s[ii])

    return take(idx[:k]), take(idx[k:])


def fit_for(devices: list[EdgeDevice], table: LayerTable, points: int = 160, noise: float = 0.05,
            seed: int = 0, timer=None, by_type: bool = False) -> tuple[LatencyModel, dict[str, float]]:
    """Profile, split, fit, and report held-out accuracy. `timer` (see `sample_profiles`) is the device profiled;
    None = the spec roofline."""
    if timer is None:
        prof = simulate_profiles(devices, table, points=points, noise=noise, seed=seed)
    else:
        prof = sample_profiles(len(devices), table, timer, points=points, noise=noise, seed=seed)
    train, test = split(prof, seed=seed)
    model = LatencyModel.fit(train, [d.name for d in devices], by_type)
    return model, accuracy(model, test)


__all__ = ["LatencyModel", "Profile", "feature_row", "sample_profiles", "simulate_profiles", "fit_for", "accuracy",
           "split"]
