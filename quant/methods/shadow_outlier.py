"""llm.npu's shadow outlier execution as a baseline (docs/quantization.md): weights per-output-channel INT-B,
activations static per-tensor INT8 whose range is calibrated WITHOUT the outlier channels; activation values beyond that
range are handled by a "shadow" path on the CPU in FP16 (outlier part of the input × FP16 weight columns), added to the
NPU result. Outlier channels = input channels whose calibrated max |x| exceeds the `shadow_quantile` quantile of the
per-channel maxima; their FP16 weight columns are counted in `model_bytes`. Values beyond the clip in other channels
saturate (they have no shadow weights).
"""
from __future__ import annotations

import numpy as np

from quant.methods.base import Method, QLinear, QuantizedModel, uniform_bits
from quant.quantize import ACT_QMAX, quantize_rows


class ShadowOutlier(Method):
    name = "shadow_outlier"

    def build(self, weights, spec, calib, bits, budget, progress=None) -> QuantizedModel:
        layers = {}
        for k, (n, x) in enumerate(calib.inputs.items()):
            w = weights[n]
            s_max = calib.in_max[n]                                                   # (D,)
            clip = float(np.quantile(s_max, self.settings.shadow_quantile))
            idx = np.flatnonzero(s_max > clip)
            q, scale = quantize_rows(w, bits)
            layers[n] = QLinear(bits=uniform_bits(w.shape[0], bits), q=q, scale=scale,
                                act_scale=clip / ACT_QMAX if clip > 0 else 0.0,
                                shadow_idx=idx, shadow_w=w[:, idx].astype(np.float16).astype(np.float32),
                                shadow_clip=clip)
            if progress and (k + 1) % len(spec.linear_shapes()) == 0:
                progress((k + 1) // len(spec.linear_shapes()), spec.n_layers)
        return QuantizedModel(layers, self.name)
