"""The quantizer contract: a method turns the reference weights + calibration into a `QuantizedModel` (EdgeFlow §4.1;
docs/quantization.md).

A `QuantizedModel` is a `LinearHook` for the reference forward (quant.llama) that replays exactly what the NPU would
compute for every linear layer: the (folded) smoothing scale on the input, static per-tensor symmetric INT8 activation
quantization, per-output-channel integer weights (bits B_i, scale S_i, quant.quantize convention) dequantized by the
per-channel scale (times the output-side smoothing scale), and, for the shadow-outlier baseline, the FP16 CPU path.

Each method lives in its own module behind `Method`; `quant.methods.METHODS` maps config names to them.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field

import numpy as np

from quant.arch import ModelSpec
from quant.calibrate import Calibration
from quant.llama import LinearHook
from quant.quantize import ACT_QMAX, act_scale, dequantize_rows, fake_quant_act, quantize_rows
from quant.settings import QuantSettings
from quant.smoothing import smooth_weight

EMBED_BYTES_PER_WEIGHT = 1            # token embedding (= tied head) stored as per-row INT8 (quant.export) ...
EMBED_SCALE_BYTES = 4                 # ... plus one float32 scale per vocabulary row
SCALE_BYTES = 4                       # float32 per-channel weight scale
WIDTH_BITS = 3                        # per-channel bit width, packed 3-bit array (EdgeFlow §4.2)
NORM_BYTES = 4                        # float32 norm weights (smoothing scales are folded into them)
SHADOW_WEIGHT_BYTES = 2               # FP16 weight columns kept on the CPU for shadow outlier channels (llm.npu)


@dataclass
class QLinear:
    """One quantized linear layer as the NPU (+ CPU shadow path) executes it."""
    bits: np.ndarray                  # (C,) int8 bit width per output channel
    q: np.ndarray                     # (C, D) int8 codes of the smoothed weight W'
    scale: np.ndarray                 # (C,) float32 per-channel scale of W'
    act_scale: float                  # per-tensor INT8 scale of the (smoothed) input
    s_in: np.ndarray | None = None    # (D,) input smoothing scale (folded into the previous op)
    s_out: np.ndarray | None = None   # (C,) output smoothing scale (folded into dequantization)
    shadow_idx: np.ndarray | None = None   # (k,) input channels with an FP16 CPU path (shadow outliers)
    shadow_w: np.ndarray | None = None     # (C, k) float32 (FP16-rounded) weight columns for those channels
    shadow_clip: float = 0.0          # |x| above this goes to the shadow path (= act_scale·127)
    w_hat: np.ndarray = field(init=False, repr=False)   # (C, D) float32 effective weight seen by the smoothed input

    def __post_init__(self) -> None:
        w = dequantize_rows(self.q, self.scale)
        self.w_hat = w * self.s_out[:, None] if self.s_out is not None else w

    def __call__(self, x: np.ndarray) -> np.ndarray:
        xs = x / self.s_in[None, :] if self.s_in is not None else x            # (T, D)
        if self.shadow_idx is None:
            return fake_quant_act(xs, self.act_scale) @ self.w_hat.T            # (T, C)
        clipped = np.clip(xs, -self.shadow_clip, self.shadow_clip)
        resid = (xs - clipped)[:, self.shadow_idx]                              # (T, k) outliers beyond the clip
        return fake_quant_act(clipped, self.act_scale) @ self.w_hat.T + resid @ self.shadow_w.T

    def weight_bytes(self) -> float:
        C, D = self.q.shape
        b = float(np.sum(self.bits.astype(np.int64))) * D / 8 + C * SCALE_BYTES + C * WIDTH_BITS / 8 + 4
        if self.shadow_idx is not None:
            b += self.shadow_idx.size * C * SHADOW_WEIGHT_BYTES
        return b


class QuantizedModel(LinearHook):
    """LinearHook applying the quantized layers; layers not in the dict stay at reference precision."""

    def __init__(self, layers: dict[str, QLinear], method: str) -> None:
        self.layers = layers
        self.method = method

    def __call__(self, name: str, x: np.ndarray, w: np.ndarray) -> np.ndarray:
        layer = self.layers.get(name)
        return layer(x) if layer is not None else x @ w.T

    def all_bits(self) -> tuple[np.ndarray, np.ndarray]:
        """(bits of every channel, its number of weights D) concatenated over layers."""
        bits = np.concatenate([l.bits for l in self.layers.values()]).astype(np.int64)
        d = np.concatenate([np.full(l.bits.size, l.q.shape[1]) for l in self.layers.values()])
        return bits, d

    def model_bytes(self, spec: ModelSpec) -> float:
        """Packed size estimate: weight bits + per-channel scale & 3-bit width + act scale + norms + INT8 embeddings.

        Excludes the packed format's group/section padding (quant.pack.packed_nbytes gives the exact blob size)."""
        lin = sum(l.weight_bytes() for l in self.layers.values())
        norms = (2 * spec.n_layers + 1) * spec.d_model * NORM_BYTES
        emb = (spec.vocab * (spec.d_model * EMBED_BYTES_PER_WEIGHT + EMBED_SCALE_BYTES)
               * (1 if spec.tied_embeddings else 2))
        return lin + norms + emb


def make_qlinear(w: np.ndarray, bits: np.ndarray, x_calib: np.ndarray | None, s_in: np.ndarray | None = None,
                 s_out: np.ndarray | None = None, *, wp: np.ndarray | None = None,
                 x_max: np.ndarray | None = None) -> QLinear:
    """Quantize W' = W·s_in/s_out with per-channel `bits`; static act scale from max |x/s_in| on calibration data.

    Shortcuts for callers that already have them (results are bit-identical): `wp` = smooth_weight(w, s_in, s_out);
    `x_max` (D,) float32 = max_t |x_calib[t]| (then x_calib is not read: s_in > 0 and correctly rounded division is
    monotone, so max_t |x/s| == max_t|x| / s exactly)."""
    if wp is None:
        wp = smooth_weight(w, s_in, s_out)
    q, scale = quantize_rows(wp, bits)
    if x_max is None:
        xs = x_calib / s_in[None, :] if s_in is not None else x_calib
        a_max = float(np.abs(xs).max())
    else:
        a_max = float((x_max / s_in).max() if s_in is not None else x_max.max())
    return QLinear(bits=np.asarray(bits, dtype=np.int8).copy(), q=q, scale=scale,
                   act_scale=act_scale(a_max), s_in=s_in, s_out=s_out)


def relative_output_error(layer: QLinear, x: np.ndarray, y_ref: np.ndarray, y_hat: np.ndarray | None = None,
                          den: float | None = None) -> float:
    """||Y - Ŷ||² / ||Y||² of one layer on calibration inputs (`y_hat` = layer(x) and `den` = ||Y||² if known)."""
    d = (layer(x) if y_hat is None else y_hat) - y_ref
    if den is None:
        den = float(np.sum(y_ref.astype(np.float64) ** 2))
    return float(np.sum(d.astype(np.float64) ** 2)) / den if den > 0 else 0.0


class Method(ABC):
    """One quantization policy. `build` sees the reference weights and the calibration, never a DictConfig."""

    name: str = ""
    adaptive: bool = False            # per-channel bit widths differ

    def __init__(self, settings: QuantSettings) -> None:
        self.settings = settings

    @abstractmethod
    def build(self, weights: dict[str, np.ndarray], spec: ModelSpec, calib: Calibration, bits: int,
              budget: float, progress=None) -> QuantizedModel:
        """Quantize every linear layer of `spec` at `bits` (uniform methods) or average `budget` (adaptive ones)."""


def uniform_bits(c: int, bits: int) -> np.ndarray:
    return np.full(c, bits, dtype=np.int8)


__all__ = ["ACT_QMAX", "Method", "QLinear", "QuantizedModel", "make_qlinear", "relative_output_error",
           "uniform_bits"]
