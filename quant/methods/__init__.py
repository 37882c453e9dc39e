"""Quantization methods (EdgeFlow §4.1, §5; docs/quantization.md): EdgeFlow and the NPU-constrained baselines, one
policy per module."""
from __future__ import annotations

from quant.methods.base import Method, QLinear, QuantizedModel
from quant.methods.cmpq import CMPQ
from quant.methods.edgeflow import EdgeFlow
from quant.methods.shadow_outlier import ShadowOutlier
from quant.methods.smoothquant import SmoothQuant
from quant.methods.uniform import Int4, Int8

METHODS: dict[str, type[Method]] = {m.name: m for m in (EdgeFlow, SmoothQuant, ShadowOutlier, CMPQ, Int8, Int4)}

__all__ = ["METHODS", "Method", "QLinear", "QuantizedModel"]
