"""K disjoint evaluation slices (quant.evaluate): offsets, disjointness from each other and from the calibration slice,
clear errors, per-slice metrics and their mean ± sd (issue: accuracy grounded in measurement)."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from quant.evaluate import SliceEval, check_slices, mean_sd, slice_offsets
from quant.settings import QuantSettings
from tests.quant.conftest import needs_model


def test_offsets_disjoint_and_clear_errors():
    offs = slice_offsets(4, 512, 0, 20_000)
    assert offs == [0, 20_000, 40_000, 60_000]
    spans = sorted((o, o + 512) for o in offs)
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))                 # pairwise disjoint
    assert slice_offsets(3, 10, 5) == [5, 15, 25]                              # stride None = contiguous
    with pytest.raises(ValueError, match="eval_stride"):
        slice_offsets(4, 512, 0, 100)                                          # overlapping slices
    with pytest.raises(ValueError, match="eval_slices"):
        slice_offsets(0, 512)
    with pytest.raises(ValueError, match=r"eval_slices: 4 slices of 512 tokens .* need tokens up to 60512, but the "
                                         r"evaluation text has 50000"):
        check_slices(50_000, offs, 512)
    with pytest.raises(ValueError, match=r"calib_offset: .*overlaps evaluation slice 2"):
        check_slices(112_877, offs, 512, (40_100, 256))
    check_slices(112_877, offs, 512, (100_000, 256))                           # the defaults are fine


def test_settings_slices_disjoint_from_calibration():
    s = QuantSettings()
    offs = slice_offsets(s.eval_slices, s.eval_tokens, s.eval_offset, s.eval_stride)
    assert len(offs) >= 4
    c0, c1 = s.calib_offset, s.calib_offset + s.calib_tokens
    assert all(o + s.eval_tokens <= c0 or o >= c1 for o in offs)
    with pytest.raises(ValueError, match="quant.calib_offset"):
        QuantSettings(eval_slices=6)                                           # slice 5 at 100000 hits calibration
    with pytest.raises(ValueError, match="quant.eval_stride"):
        QuantSettings(eval_stride=100)
    with pytest.raises(ValueError, match="quant.eval_slices"):
        QuantSettings(eval_slices=0)


def test_mean_sd_and_metrics():
    ev = SliceEval(ppl=np.array([20.0, 30.0, 12.0, 9.0]), ref_ppl=np.array([10.0, 20.0, 10.0, 6.0]),
                   kl=np.array([0.1, 0.3, 0.2, 0.2]))
    m = ev.metrics()
    assert m["ppl"] == pytest.approx(17.75) and m["ppl_sd"] == pytest.approx(np.std([20, 30, 12, 9], ddof=1))
    assert m["kl_mean"] == pytest.approx(0.2) and m["kl_mean_sd"] == pytest.approx(np.sqrt(0.02 / 3))
    assert m["dppl_rel"] == pytest.approx(np.mean([1.0, 0.5, 0.2, 0.5]))
    assert m["ppl_slices"] == [20.0, 30.0, 12.0, 9.0]
    assert mean_sd([3.0]) == (3.0, 0.0)


@needs_model
def test_real_slices_differ_and_aggregate(smol, smol_weights):
    from quant.evaluate import eval_slices, eval_text_tokens, evaluate_slices
    from quant.measure_importance import PrecisionHook

    spec = dataclasses.replace(smol, n_layers=2)                               # fast: the first 2 blocks only
    sl = eval_slices(spec, 4, 24, 0, 20_000, (100_000, 256))                   # (4, 24)
    assert sl.shape == (4, 24)
    for k in range(4):
        assert np.array_equal(sl[k], eval_text_tokens(spec, 24, 20_000 * k))
    ev = evaluate_slices(smol_weights, spec, sl, PrecisionHook(smol_weights, spec, "q4_k"))
    assert len(set(np.round(ev.ppl, 6))) == 4 and len(set(np.round(ev.kl, 8))) == 4   # slices really differ
    m = ev.metrics()
    assert m["ppl"] == pytest.approx(ev.ppl.mean()) and m["ppl_sd"] == pytest.approx(ev.ppl.std(ddof=1))
    assert m["kl_mean_sd"] > 0
