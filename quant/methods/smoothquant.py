"""SmoothQuant-like baseline under NPU constraints (EdgeFlow §5 baseline; docs/quantization.md): every channel of every
tensor at the same B bits (per-output-channel scales, the NPU's weight granularity), static per-tensor INT8 activations,
and SmoothQuant's migration (Xiao et al. 2023, eq. 4) with its default α = 0.5 (no output-side scaling, no search):

    s_j = max|X_j|^α / max|W_j|^(1-α)       (j = input channel; max|W_j| over every output row of every group member)

The scales fold exactly as in quant.smoothing (shared q/k/v and gate/up scales; the attn_output scale is tied per GQA
group by taking the max over the query heads of a KV group, so it folds into attn_v's rows). That is the `original`
form (`quant.baseline_smoothing=original`); the default `npu` gives it EdgeFlow's NPU-aware smoothing (α search, β)
with uniform B bits — the papers' adaptation to the per-tensor constraint — so the comparison isolates the allocation.
"""
from __future__ import annotations

import numpy as np

from quant.methods.base import Method, QuantizedModel, make_qlinear, uniform_bits
from quant.methods.edgeflow import npu_smoothed
from quant.smoothing import SCALE_FLOOR, smoothing_groups, tie_gqa


def smoothquant_scale(names: list[str], weights: dict[str, np.ndarray], in_max: dict[str, np.ndarray], spec,
                      alpha: float) -> np.ndarray:
    """SmoothQuant's s (D,) float32 for a group of linears sharing one input."""
    x_max = np.maximum(in_max[names[0]].astype(np.float64), SCALE_FLOOR)                     # (D,)
    w_max = np.maximum(np.max([np.abs(weights[n]).max(axis=0) for n in names], axis=0).astype(np.float64),
                       SCALE_FLOOR)                                                            # (D,)
    s = np.power(x_max, alpha) / np.power(w_max, 1.0 - alpha)
    if names[0].endswith("attn_output.weight"):
        s = tie_gqa(s, spec)
    return s.astype(np.float32)


class SmoothQuant(Method):
    name = "smoothquant"

    def build(self, weights, spec, calib, bits, budget, progress=None) -> QuantizedModel:
        if self.settings.baseline_smoothing == "npu":
            return npu_smoothed(self.name, weights, spec, calib, self.settings,
                                lambda wp: uniform_bits(wp.shape[0], bits), progress)
        layers = {}
        for i in range(spec.n_layers):
            for names in smoothing_groups(spec, i):
                s_in = smoothquant_scale(names, weights, calib.in_max, spec, self.settings.smoothquant_alpha)
                for n in names:
                    w = weights[n]
                    layers[n] = make_qlinear(w, uniform_bits(w.shape[0], bits), calib.inputs[n], s_in, None)
            if progress:
                progress(i + 1, spec.n_layers)
        return QuantizedModel(layers, self.name)
