"""Statistics of the validation protocol (docs/hil.md "Validation protocol"): pure functions on measured numbers.

A configuration is measured in R rounds of K cold runs; its TTFT is the median of all runs (pooled), with a
hierarchical bootstrap interval (rounds resampled, then the runs within each resampled round), because the host's
state moves between rounds more than within one: resampling runs alone would pretend the rounds agree. The spread
of the round medians is the host's noise floor for that configuration. Over a set of configurations: the mean
signed error (the model's bias) with a bootstrap interval over configurations, a two-sided sign test of the errors'
signs (scipy.stats.binomtest) and the mean |error|. Speed-ups are medians of paired ratios of runs adjacent in time.

Everything is seeded (numpy Generator); nothing here runs or predicts anything.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Sequence

import numpy as np

LEVEL = 0.90            # two-sided coverage of every interval the protocol reports
N_BOOT = 2000           # bootstrap resamples (percentile intervals; the 5 % / 95 % points move < 1 % of the width)


def _rounds(rounds: Sequence[Sequence[float]]) -> list[np.ndarray]:
    out = [np.asarray(r, dtype=float) for r in rounds]
    out = [r[np.isfinite(r)] for r in out]
    out = [r for r in out if r.size]
    if not out:
        raise ValueError("rounds: no finite measurement")
    return out


def _check_level(level: float) -> None:
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1) (got {level})")


def bootstrap_medians(rounds: Sequence[Sequence[float]], n_boot: int = N_BOOT, seed: int = 0) -> np.ndarray:
    """(n_boot,) medians of hierarchical resamples: R rounds drawn with replacement, then each drawn round's runs
    drawn with replacement (its own count), all pooled."""
    rs = _rounds(rounds)
    if n_boot < 1:
        raise ValueError(f"n_boot must be >= 1 (got {n_boot})")
    rng = np.random.default_rng(seed)
    sizes = np.array([r.size for r in rs])
    width = int(sizes.max())
    padded = np.full((len(rs), width), np.nan)
    for i, r in enumerate(rs):
        padded[i, :r.size] = r
    cols = []
    for _ in rs:                                                   # one slot per round
        pick = rng.integers(len(rs), size=n_boot)                  # which round fills this slot
        n = sizes[pick]
        pos = np.floor(rng.random((n_boot, width)) * n[:, None]).astype(int)
        vals = padded[pick[:, None], pos]
        vals[np.arange(width)[None, :] >= n[:, None]] = np.nan     # a smaller round contributes its own count
        cols.append(vals)
    return np.nanmedian(np.concatenate(cols, axis=1), axis=1)


def percentile_interval(samples: np.ndarray, level: float = LEVEL) -> tuple[float, float]:
    _check_level(level)
    a = (1.0 - level) / 2.0
    lo, hi = np.quantile(np.asarray(samples, dtype=float), [a, 1.0 - a])
    return float(lo), float(hi)


def median_interval(rounds: Sequence[Sequence[float]], level: float = LEVEL, n_boot: int = N_BOOT,
                    seed: int = 0) -> tuple[float, float]:
    """Bootstrap `level` interval of the pooled median (hierarchical, see bootstrap_medians)."""
    return percentile_interval(bootstrap_medians(rounds, n_boot, seed), level)


def error_pct(predicted: float, measured: float) -> float:
    """(predicted - measured) / measured, in %."""
    if measured <= 0:
        raise ValueError(f"measured must be > 0 (got {measured})")
    return 100.0 * (predicted - measured) / measured


@dataclass
class Judged:
    """One configuration (or one paired speed-up) judged against its measurements."""
    predicted: float
    measured: float                  # pooled median of every counted run
    lo: float                        # bootstrap interval of that median
    hi: float
    runs: int
    rounds: int
    round_min: float                 # smallest / largest round median
    round_max: float
    noise_pct: float                 # (round_max - round_min) / measured: the host's noise floor here
    error_pct: float                 # (predicted - measured) / measured
    error_lo_pct: float              # the error against the interval's ends (predicted vs hi, vs lo)
    error_hi_pct: float
    inside: bool                     # lo <= predicted <= hi

    def as_dict(self) -> dict:
        return asdict(self)


def judge(predicted: float, rounds: Sequence[Sequence[float]], level: float = LEVEL, n_boot: int = N_BOOT,
          seed: int = 0) -> Judged:
    """A prediction against R rounds of measurements (module doc)."""
    rs = _rounds(rounds)
    pooled = float(np.median(np.concatenate(rs)))
    lo, hi = median_interval(rs, level, n_boot, seed)
    meds = [float(np.median(r)) for r in rs]
    return Judged(predicted=float(predicted), measured=pooled, lo=lo, hi=hi, runs=int(sum(r.size for r in rs)),
                  rounds=len(rs), round_min=min(meds), round_max=max(meds),
                  noise_pct=100.0 * (max(meds) - min(meds)) / pooled, error_pct=error_pct(predicted, pooled),
                  error_lo_pct=error_pct(predicted, hi), error_hi_pct=error_pct(predicted, lo),
                  inside=bool(lo <= predicted <= hi))


@dataclass
class SetSummary:
    """A set of configurations' errors: is the model biased, and by how much is it off."""
    n: int
    bias_pct: float                  # mean signed error
    bias_lo_pct: float               # bootstrap interval of the mean (configurations resampled)
    bias_hi_pct: float
    over: int                        # errors > 0 (over-predicted) and < 0
    under: int
    sign_p: float                    # two-sided sign test (binomial, p = 0.5) of over vs under
    mean_abs_pct: float
    inside: int                      # configurations whose prediction lies inside their interval
    median_noise_pct: float          # median of the configurations' noise floors

    def as_dict(self) -> dict:
        return asdict(self)


def sign_test(over: int, under: int) -> float:
    """Two-sided p-value that over- and under-predictions are equally likely (ties left out)."""
    from scipy.stats import binomtest

    n = over + under
    return 1.0 if n == 0 else float(binomtest(over, n, 0.5, alternative="two-sided").pvalue)


def summarize(judged: Sequence[Judged], level: float = LEVEL, n_boot: int = N_BOOT, seed: int = 0) -> SetSummary:
    errs = np.array([j.error_pct for j in judged], dtype=float)
    if errs.size == 0:
        raise ValueError("summarize: no judged configuration")
    rng = np.random.default_rng(seed)
    means = errs[rng.integers(errs.size, size=(n_boot, errs.size))].mean(axis=1)
    lo, hi = percentile_interval(means, level)
    over, under = int((errs > 0).sum()), int((errs < 0).sum())
    return SetSummary(n=int(errs.size), bias_pct=float(errs.mean()), bias_lo_pct=lo, bias_hi_pct=hi, over=over,
                      under=under, sign_p=sign_test(over, under), mean_abs_pct=float(np.abs(errs).mean()),
                      inside=sum(j.inside for j in judged),
                      median_noise_pct=float(np.median([j.noise_pct for j in judged])))


def paired_ratios(pairs: Sequence[Sequence[tuple[float, float]]]) -> list[list[float]]:
    """Per round, the ratios a / b of the pairs (a, b) of runs adjacent in time (e.g. a baseline's TTFT over
    EdgeFlow's: EdgeFlow's speed-up); a pair with a missing or non-positive side is left out."""
    return [[a / b for a, b in r if a is not None and b is not None and a > 0 and b > 0] for r in pairs]
