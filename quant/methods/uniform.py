"""Plain uniform baselines: every output channel at INT8 (or INT4), per-output-channel symmetric scales, static
per-tensor INT8 activations, no smoothing (docs/design.md §4.1 baselines). The `bits` key is ignored: the method
name fixes the width.
"""
from __future__ import annotations

from quant.methods.base import Method, QuantizedModel, make_qlinear, uniform_bits


class Uniform(Method):
    fixed_bits = 8

    def build(self, weights, spec, calib, bits, budget, progress=None) -> QuantizedModel:
        layers = {n: make_qlinear(weights[n], uniform_bits(weights[n].shape[0], self.fixed_bits), x)
                  for n, x in calib.inputs.items()}
        return QuantizedModel(layers, self.name)


class Int8(Uniform):
    name = "int8"
    fixed_bits = 8


class Int4(Uniform):
    name = "int4"
    fixed_bits = 4
