"""EdgeFlow's NPU-aware adaptive quantization (paper §4.1): smoothing with a per-group α grid search (β = 1), then
greedy per-output-channel bit allocation on the smoothed weights W' (closed-form RE), budget per tensor or global.

Per-tensor scope: each tensor's channels average `budget` bits (Algorithm 1 as printed). Global scope: α is first
searched with per-tensor allocation at the same budget (a proxy: the global allocation depends on all α's at once),
then one allocation over all channels of all tensors with cost = D weights per channel (budget in bits per weight).
"""
from __future__ import annotations

import logging

import numpy as np

from quant.allocate import allocate
from quant.arch import ModelSpec
from quant.calibrate import Calibration
from quant.methods.base import Method, QLinear, QuantizedModel, make_qlinear, relative_output_error
from quant.quantize import fake_quant_act
from quant.relerr import channel_stats, re_exact_table
from quant.settings import BudgetScope, QuantSettings, ReMetric
from quant.smoothing import group_in_max, input_scale, output_scale, smooth_weight, smoothing_groups

log = logging.getLogger(__name__)


def search_group(names: list[str], weights: dict[str, np.ndarray], spec: ModelSpec, calib: Calibration,
                 alphas: np.ndarray, beta: float, bits_fn, settings: QuantSettings) -> tuple[float, dict[str, QLinear]]:
    """Grid-search α for one smoothing group; returns (best α, its quantized layers). Ties -> smaller α.

    With `search_holdout`, S_I and the activation scale are fitted on the first calibration tokens and the error is
    scored on the last `search_tokens` (held out): scoring on the tokens that set the scales rewards α -> 1, which
    normalises exactly the calibration maxima and then saturates on unseen text. The chosen α is finally applied
    with statistics from all calibration tokens.
    """
    x = calib.inputs[names[0]]                                                   # (T, D)
    if settings.search_holdout:
        x_fit, x_err = x[:-settings.search_tokens], x[-settings.search_tokens:]
        in_max = {names[0]: np.abs(x_fit).max(axis=0)}
    else:
        x_fit, x_err = x, x[:settings.search_tokens]
        in_max = calib.in_max
    x_max_fit = np.abs(x_fit).max(axis=0)                                        # (D,) for the static act scale
    y_ref = {n: x_err @ weights[n].T for n in names}                             # (Ts, C)
    den = {n: float(np.sum(y_ref[n].astype(np.float64) ** 2)) for n in names}
    s_max = group_in_max(names, in_max, spec)
    s_out = {n: output_scale(calib.out_max[n], beta) if beta > 0 else None for n in names}
    best: tuple[float, float] | None = None
    for a in alphas:
        s_in = input_scale(s_max, float(a)) if a > 0 else None
        err, xq = 0.0, None
        for n in names:
            wp = smooth_weight(weights[n], s_in, s_out[n])
            layer = make_qlinear(weights[n], bits_fn(wp), None, s_in, s_out[n], wp=wp, x_max=x_max_fit)
            if xq is None:       # members share the input, its smoothing and its act scale: quantize it once
                xq = fake_quant_act(x_err / s_in[None, :] if s_in is not None else x_err, layer.act_scale)
            err += relative_output_error(layer, x_err, y_ref[n], y_hat=xq @ layer.w_hat.T, den=den[n])
        if best is None or err < best[0]:
            best = (err, float(a))
    alpha = best[1]
    s_in = input_scale(group_in_max(names, calib.in_max, spec), alpha) if alpha > 0 else None
    layers = {}
    for n in names:
        wp = smooth_weight(weights[n], s_in, s_out[n])
        layers[n] = make_qlinear(weights[n], bits_fn(wp), x, s_in, s_out[n], wp=wp)
    return alpha, layers


def npu_smoothed(name: str, weights, spec: ModelSpec, calib: Calibration, st: QuantSettings, bits_fn,
                 progress=None, alphas_out: dict[str, float] | None = None) -> QuantizedModel:
    """Any per-channel bit rule (`bits_fn(W') -> (C,) bits`) under EdgeFlow's NPU-aware smoothing (α grid search per
    group, β): EdgeFlow's own allocation, and how the papers adapted the SmoothQuant- and CMPQ-style baselines to the
    per-tensor constraint. `alphas_out` collects the chosen α per group (keyed by its first member)."""
    alphas = np.linspace(0.0, 1.0, st.alpha_steps) if st.smoothing else np.zeros(1)
    layers: dict[str, QLinear] = {}
    for i in range(spec.n_layers):
        for names in smoothing_groups(spec, i):
            a, got = search_group(names, weights, spec, calib, alphas, st.beta, bits_fn, st)
            layers.update(got)
            if alphas_out is not None:
                alphas_out[names[0]] = a
        if progress:
            progress(i + 1, spec.n_layers)
    return QuantizedModel(layers, name)


class EdgeFlow(Method):
    name = "edgeflow"
    adaptive = True

    def allocate_rows(self, wp: np.ndarray, budget: float) -> np.ndarray:
        st = self.settings
        m, s = channel_stats(wp)
        re = re_exact_table(wp, st.min_bits, st.max_bits) if st.metric == ReMetric.exact.value else None
        return allocate(m, s, min(budget, st.max_bits), st.min_bits, st.max_bits, re=re)

    def build(self, weights, spec, calib, bits, budget, progress=None) -> QuantizedModel:
        st = self.settings
        self.alphas: dict[str, float] = {}
        qm = npu_smoothed(self.name, weights, spec, calib, st, lambda wp: self.allocate_rows(wp, budget), progress,
                          self.alphas)
        if st.scope == BudgetScope.glob.value:
            return QuantizedModel(self._global(weights, calib, qm.layers, budget), self.name)
        return qm

    def _global(self, weights, calib, layers: dict[str, QLinear], budget: float) -> dict[str, QLinear]:
        st = self.settings
        names = list(layers)
        wps = [smooth_weight(weights[n], layers[n].s_in, layers[n].s_out) for n in names]
        stats = [channel_stats(wp) for wp in wps]
        m = np.concatenate([s[0] for s in stats])
        s = np.concatenate([s[1] for s in stats])
        cost = np.concatenate([np.full(wp.shape[0], float(wp.shape[1])) for wp in wps])
        re = (np.concatenate([re_exact_table(wp, st.min_bits, st.max_bits) for wp in wps])
              if st.metric == ReMetric.exact.value else None)
        bits = allocate(m, s, min(budget, st.max_bits), st.min_bits, st.max_bits, cost=cost, re=re)
        out, at = {}, 0
        for n, wp in zip(names, wps):
            c = wp.shape[0]
            l = layers[n]
            out[n] = make_qlinear(weights[n], bits[at:at + c], calib.inputs[n], l.s_in, l.s_out)
            at += c
        return out
