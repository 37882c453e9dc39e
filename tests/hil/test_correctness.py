"""The logits check can fail (experiments.hostrun.agreement / correctness; docs/hil.md "Logits"): the NumPy reference
against the native forward (bit-exact with the runner) on SmolLM2-135M, with the tolerance stated by TOP1_MIN and
KL_MEAN_MAX — a corrupted logit vector and wrong weights are caught."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from experiments.hostrun import KL_MEAN_MAX, TOP1_MIN, agreement, correctness
from quant.packed_forward import read_model
from tests.hil.test_runner import smol_pack  # noqa: F401 (fixture: SmolLM2 packed at 5 bits, cached)
from tests.quant.conftest import needs_model


def test_agreement_passes_identical_and_fails_corrupted_logits():
    rng = np.random.default_rng(0)
    ref = rng.normal(0, 3, (64, 1000)).astype(np.float32)
    same = agreement(ref, ref.copy())
    assert same["ok"] and same["top1"] == 1.0 and same["kl_mean"] == pytest.approx(0.0, abs=1e-12)
    assert same["positions"] == 64
    shuffled = ref.copy()
    for row in shuffled:                                        # every position's logits permuted
        rng.shuffle(row)
    bad = agreement(ref, shuffled)
    assert not bad["ok"] and bad["top1"] < TOP1_MIN and bad["kl_mean"] > KL_MEAN_MAX
    one = ref.copy()
    one[::3] = rng.normal(0, 3, one[::3].shape)                 # a third of the positions replaced
    assert not agreement(ref, one)["ok"]
    nan = ref.copy()
    nan[5, 7] = np.nan
    assert not agreement(ref, nan)["ok"]
    with pytest.raises(ValueError, match="shapes"):
        agreement(ref, ref[:10])


def test_the_reference_own_noise_widens_the_tolerance_never_narrows_it():
    rng = np.random.default_rng(1)
    ref = rng.normal(0, 3, (64, 500))
    drift = ref + rng.normal(0, 1.0, ref.shape)                 # a chaotic forward: far from the reference
    noisy_self = agreement(ref, ref + rng.normal(0, 1.0, ref.shape))
    assert not agreement(ref, drift)["ok"]
    wide = agreement(ref, drift, noise=noisy_self)               # the reference itself moves that much
    assert wide["ok"] and wide["tol_kl_mean"] > KL_MEAN_MAX and wide["tol_top1"] < TOP1_MIN
    quiet = agreement(ref, drift, noise=agreement(ref, ref.copy()))
    assert quiet["tol_top1"] == TOP1_MIN and quiet["tol_kl_mean"] == KL_MEAN_MAX and not quiet["ok"]


@needs_model
def test_smollm2_check_fails_on_wrong_weights(smol_pack):  # noqa: F811
    """Gate and up projections swapped in every layer (a binding mix-up): the native side disagrees with the
    reference beyond the tolerance; the right weights on the same prompt agree."""
    from quant.evaluate import eval_text_tokens

    spec, path = smol_pack
    pm = read_model(path)
    prompts = [eval_text_tokens(spec, 16, 800)]
    good = correctness(path, spec, pm, prompts=prompts)
    assert good["correct_ok"] and good["correct_positions"] == 16
    assert good["correct_tol_top1"] <= TOP1_MIN and good["correct_tol_kl_mean"] >= KL_MEAN_MAX
    q = dict(pm.q)
    for i in range(spec.n_layers):
        g, u = f"blk.{i}.ffn_gate.weight", f"blk.{i}.ffn_up.weight"
        q[g], q[u] = pm.q[u], pm.q[g]
    wrong = correctness(path, spec, pm, native_pm=dataclasses.replace(pm, q=q), prompts=prompts)
    assert not wrong["correct_ok"]
    assert wrong["correct_top1"] < TOP1_MIN or wrong["correct_kl_mean"] > KL_MEAN_MAX
