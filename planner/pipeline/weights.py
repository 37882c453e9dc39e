"""Per-layer weight streams of a cold start: bytes on flash, INT8 bytes in NPU memory and unpack work per layer.

Inputs are the per-channel bit allocation (`planner.formats.model_bits`) and a format; the LM head is stored INT8 for
NPU frameworks (it runs on the NPU as an INT8 matmul) and counted as layer `n_layers`.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from planner.device import SocProfile
from planner.formats import tensor_nbytes, unpack_work
from planner.pipeline.dag import head_tensor_names, layer_tensor_names
from planner.plan import OpWork, TensorRef
from quant.arch import ModelSpec

SCALE_BYTES = 2      # B, one FP16 scale per output channel (INT8 LM head; MNN's INT8 per-channel weights)
NORM_BYTES = 4       # B per weight of the two F32 RMSNorm vectors of a GGUF layer


@dataclass
class LayerWeights:
    flash_bytes: int        # B read from flash
    int8_bytes: int         # B of INT8 weights after unpacking (NPU-native)
    direct_bytes: int       # B that land straight in NPU buffers (copied by the loader)
    unpack: OpWork | None   # unpack work on one CPU thread (None: nothing to unpack)


def layer_weights(spec: ModelSpec, dev: SocProfile, bits: dict[str, np.ndarray] | None, fmt: str
                  ) -> list[LayerWeights]:
    """n_layers + 1 entries (last = LM head, INT8). `bits` (L, C) per tensor kind; ignored for fmt int8."""
    shapes = spec.linear_shapes()
    out = []
    for layer in range(spec.n_layers):
        fb = i8 = direct = 0
        instr = 0.0
        unpack_bytes = 0
        per_kind: list[np.ndarray] = []
        for kind, (c, d) in shapes.items():
            b = np.full(c, 8, dtype=np.int8) if fmt == "int8" or bits is None else bits[kind][layer]
            per_kind.append(b)
            fb += tensor_nbytes(b, d, fmt)
            i8 += c * d
            ins, wr = unpack_work(b, d, fmt)
            instr += ins
            unpack_bytes += wr
        weights = spec.layer_params() - 2 * spec.d_model
        if fmt in ("int8", "mixed"):
            direct = fb
        if fmt == "int8":
            work = None
        elif fmt == "kquant":
            work = OpWork("unpack", weights=weights, nbytes=unpack_bytes,
                          cycles=dev.kquant_unpack_cycles_per_weight * weights, fmt=fmt,
                          bits_weights=bits_weights(per_kind, [d for _c, d in shapes.values()]),
                          bits_channels=bits_weights(per_kind, [1] * len(per_kind)), calls=len(shapes))
        else:
            work = OpWork("unpack", weights=weights, nbytes=unpack_bytes, simd_instr=instr, fmt=fmt,
                          bits_weights=bits_weights(per_kind, [d for _c, d in shapes.values()]),
                          bits_channels=bits_weights(per_kind, [1] * len(per_kind)), calls=len(shapes))
        out.append(LayerWeights(fb, i8, direct, work))
    head = spec.vocab * spec.d_model
    out.append(LayerWeights(head + SCALE_BYTES * spec.vocab, head, head + SCALE_BYTES * spec.vocab, None))
    return out


def layer_refs(spec: ModelSpec, layer: int) -> list[TensorRef]:
    """Tensors a layer's load / unpack tasks move (layer == n_layers: final norm + LM head), unbound."""
    names = head_tensor_names(spec) if layer == spec.n_layers else layer_tensor_names(layer)
    return [TensorRef(n) for n in names]


def bits_weights(bits_per_kind: list[np.ndarray], d_ins: list[int]) -> list[int]:
    """Weights per bit width (index 0..8) of a layer's tensors: what unpack cost depends on."""
    out = np.zeros(9, dtype=np.int64)
    for b, d in zip(bits_per_kind, d_ins):
        out += np.bincount(np.asarray(b, dtype=np.int64), minlength=9)[:9] * d
    return [int(v) for v in out]
