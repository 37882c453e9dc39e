"""Packed-file export: smoothing folded into norms / preceding scales gives the same model as the simulated hook."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from quant.calibrate import calibrate
from quant.evaluate import eval_text_tokens, kl_mean
from quant.export import packed_tensors, write_pack
from quant.llama import LinearHook, forward_logits
from quant.methods import METHODS
from quant.quantize import fake_quant_act
from quant.settings import QuantSettings
from tests.quant.conftest import needs_model

pack = pytest.importorskip("quant.pack")


class _PackedRuntime(LinearHook):
    """What a runtime does with the file: per-tensor INT8 input, integer weights, one float scale per channel."""

    def __init__(self, tensors, act):
        self.t, self.act = tensors, act

    def __call__(self, name, x, w):
        q, bits, scale = self.t[name]
        return fake_quant_act(x, self.act[name]) @ (q.astype(np.float32) * scale[:, None]).T


@needs_model
@pytest.mark.parametrize("method", ["edgeflow", "smoothquant"])
def test_folded_file_reproduces_the_quantized_model(method, smol, smol_weights, tmp_path):
    spec = dataclasses.replace(smol, n_layers=1)
    st = QuantSettings(calib_tokens=32, search_tokens=16, eval_tokens=24, alpha_steps=3)
    calib = calibrate(smol_weights, spec, eval_text_tokens(spec, 32, 100_000))
    qm = METHODS[method](st).build(smol_weights, spec, calib, 6, 6.0)
    assert any(l.s_in is not None for l in qm.layers.values())              # smoothing is really exercised
    path = write_pack(qm, spec, smol_weights, tmp_path)
    back = pack.read_packed_model(path, backend="numpy")
    tensors, meta = packed_tensors(qm, spec, smol_weights)
    for n, l in qm.layers.items():
        q, bits, scale = back[n]
        assert (q == l.q).all() and (bits == l.bits).all()
        np.testing.assert_array_equal(scale, tensors[n][2])
    folded = dict(smol_weights)
    for n, v in back.items():
        if isinstance(v, np.ndarray):
            folded[n] = v
    toks = eval_text_tokens(spec, 24)
    sim = forward_logits(smol_weights, spec, toks, qm)
    run = forward_logits(folded, spec, toks, _PackedRuntime(back, meta["act_scales"]))
    assert kl_mean(sim, run) < 1e-3                                         # only INT8 rounding-boundary flips differ
