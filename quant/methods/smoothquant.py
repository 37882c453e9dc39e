"""SmoothQuant-like baseline under NPU constraints (EdgeFlow §5 baseline; SPEC §3.1): every channel of every tensor at
the same B bits (per-output-channel scales, the NPU's weight granularity), static per-tensor INT8 activations, and
SmoothQuant's input-side migration s = max|X|^α with its default α = 0.5 (no output-side scaling, no search).
The scales fold exactly as in quant.smoothing (shared q/k/v and gate/up scales, GQA-tied attn_output scale).
"""
from __future__ import annotations


from quant.methods.base import Method, QuantizedModel, make_qlinear, uniform_bits
from quant.smoothing import group_in_max, input_scale, smoothing_groups


class SmoothQuant(Method):
    name = "smoothquant"

    def build(self, weights, spec, calib, bits, budget, progress=None) -> QuantizedModel:
        layers = {}
        for i in range(spec.n_layers):
            for names in smoothing_groups(spec, i):
                s_in = input_scale(group_in_max(names, calib.in_max, spec), self.settings.smoothquant_alpha)
                for n in names:
                    w = weights[n]
                    layers[n] = make_qlinear(w, uniform_bits(w.shape[0], bits), calib.inputs[n], s_in, None)
            if progress:
                progress(i + 1, spec.n_layers)
        return QuantizedModel(layers, self.name)
