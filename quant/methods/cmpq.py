"""CMPQ adapted to NPU constraints (EdgeFlow §3.2 baseline; docs/quantization.md). CMPQ (channel-wise mixed precision)
gives a fixed share of "important" channels more bits and the rest fewer; the NPU only allows per-OUTPUT-channel,
uniform, symmetric quantization, so the adaptation ranks output channels by the RE metric at B bits: the
`cmpq_high_frac` highest-RE channels get B+1 bits, the `cmpq_low_frac` lowest get B-1, the rest B (equal shares keep the
average at B; at B = 1 or 8 one side is impossible, so both shares shrink to what fits). Static per-tensor INT8
activations. With `quant.baseline_smoothing=npu` (default, the papers' adaptation to the per-tensor constraint) the
tiers are chosen on EdgeFlow's NPU-smoothed weights (same α search and β as EdgeFlow), so the comparison with EdgeFlow
isolates the allocation; `original` is CMPQ without smoothing. Unlike EdgeFlow it uses fixed tiers instead of the
optimal (greedy) allocation.
"""
from __future__ import annotations

import numpy as np

from quant.methods.base import Method, QuantizedModel, make_qlinear
from quant.methods.edgeflow import npu_smoothed
from quant.relerr import channel_stats, re_closed_form


def cmpq_bits(w: np.ndarray, bits: int, high_frac: float, low_frac: float) -> np.ndarray:
    c = w.shape[0]
    out = np.full(c, bits, dtype=np.int8)
    if bits <= 1 or bits >= 8:
        return out
    m, s = channel_stats(w)
    order = np.argsort(-re_closed_form(m, s, bits), kind="stable")                 # highest RE first
    k = int(round(min(high_frac, low_frac) * c))
    out[order[:k]] = bits + 1
    if k:
        out[order[-k:]] = bits - 1
    return out


class CMPQ(Method):
    name = "cmpq"
    adaptive = True

    def build(self, weights, spec, calib, bits, budget, progress=None) -> QuantizedModel:
        st = self.settings
        if st.baseline_smoothing == "npu":
            return npu_smoothed(self.name, weights, spec, calib, st,
                                lambda wp: cmpq_bits(wp, bits, st.cmpq_high_frac, st.cmpq_low_frac), progress)
        layers = {}
        for k, (n, x) in enumerate(calib.inputs.items()):
            w = weights[n]
            layers[n] = make_qlinear(w, cmpq_bits(w, bits, st.cmpq_high_frac, st.cmpq_low_frac), x)
            if progress and (k + 1) % len(spec.linear_shapes()) == 0:
                progress((k + 1) // len(spec.linear_shapes()), spec.n_layers)
        return QuantizedModel(layers, self.name)
