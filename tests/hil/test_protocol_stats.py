"""The validation protocol's statistics on synthetic measurements with a known truth (experiments.protocol_stats)."""
import numpy as np
import pytest

from experiments.protocol_stats import bootstrap_medians, judge, median_interval, paired_ratios, sign_test, summarize


def _rounds(rng, truth, rounds=5, runs=3, round_sd=0.05, run_sd=0.05):
    """Lognormal runs around `truth`: a per-round host state times per-run noise (the population median is truth)."""
    return [list(truth * np.exp(rng.normal(0, round_sd) + rng.normal(0, run_sd, runs))) for _ in range(rounds)]


def test_interval_covers_the_true_median_near_its_level():
    rng = np.random.default_rng(7)
    hits, trials = 0, 200
    for t in range(trials):
        lo, hi = median_interval(_rounds(rng, 1.0), level=0.9, n_boot=400, seed=t)
        hits += lo <= 1.0 <= hi
    # 90 % nominal; a percentile bootstrap of a median over 5 rounds under-covers somewhat, never wildly
    assert 0.75 <= hits / trials <= 0.99, hits


def test_interval_shrinks_with_more_rounds_and_widens_with_round_noise():
    rng = np.random.default_rng(1)
    w = lambda r: np.subtract(*median_interval(r, n_boot=1000)[::-1])  # noqa: E731
    assert w(_rounds(rng, 1.0, rounds=20)) < w(_rounds(rng, 1.0, rounds=3))
    assert w(_rounds(rng, 1.0, round_sd=0.3)) > w(_rounds(rng, 1.0, round_sd=0.0))


def test_hierarchical_bootstrap_keeps_unequal_rounds_and_is_seeded():
    r = [[1.0, 1.1, 0.9], [2.0], [1.5, 1.4]]
    a, b = bootstrap_medians(r, 500, seed=3), bootstrap_medians(r, 500, seed=3)
    assert np.array_equal(a, b)
    assert a.min() >= 0.9 and a.max() <= 2.0
    with pytest.raises(ValueError):
        bootstrap_medians([[], [float("nan")]])


def test_judge_reports_error_noise_and_inside():
    j = judge(1.1, [[1.0, 1.0, 1.0], [1.2, 1.2, 1.2], [0.9, 0.9, 0.9]], n_boot=500)
    assert j.measured == 1.0 and j.runs == 9 and j.rounds == 3
    assert j.error_pct == pytest.approx(10.0)
    assert j.noise_pct == pytest.approx(30.0)
    assert j.lo <= 1.0 <= j.hi and j.inside == (j.lo <= 1.1 <= j.hi)
    far = judge(2.0, [[1.0, 1.0], [1.01, 1.0]], n_boot=500)
    assert not far.inside and far.error_lo_pct <= far.error_pct <= far.error_hi_pct


def _set(rng, bias, n=20):
    truths = rng.uniform(0.1, 1.5, n)
    return [judge(t * (1 + bias) * np.exp(rng.normal(0, 0.03)), _rounds(rng, t), n_boot=300, seed=k)
            for k, t in enumerate(truths)]


def test_known_bias_is_detected_and_its_interval_covers_it():
    s = summarize(_set(np.random.default_rng(2), -0.15), n_boot=2000)
    assert s.bias_hi_pct < 0 and s.bias_lo_pct <= -15 + 3 <= s.bias_hi_pct + 6
    assert s.under > s.over and s.sign_p < 0.01
    assert s.mean_abs_pct > 10


def test_no_bias_is_not_flagged():
    s = summarize(_set(np.random.default_rng(4), 0.0), n_boot=2000)
    assert s.bias_lo_pct <= 0 <= s.bias_hi_pct
    assert s.sign_p > 0.05


def test_sign_test_values():
    assert sign_test(0, 0) == 1.0
    assert sign_test(10, 10) == pytest.approx(1.0)
    assert sign_test(15, 0) == pytest.approx(2 * 0.5 ** 15)


def test_paired_ratios_drop_bad_pairs():
    assert paired_ratios([[(2.0, 1.0), (None, 1.0), (3.0, 0.0)], [(1.0, 2.0)]]) == [[2.0], [0.5]]
