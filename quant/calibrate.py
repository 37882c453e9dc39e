"""Activation calibration on the real model (EdgeFlow §4.1 "calibration dataset"; docs/design.md §4.1 static
activations).

Owns: running the reference forward over a calibration slice of the text (disjoint from the evaluation slice) and
recording, for every linear layer, its input activations X (T, D) and the per-channel statistics derived from them:
S_I = max_t |X[t, d]| (D,) and S_O = max_t |(X W^T)[t, c]| (C,) — the paper's per-channel "variance" (max |·|).

Design: a `LinearHook` subclass that stores a reference to each input (q/k/v and gate/up share one array), so memory
is one copy per distinct input: 256 tokens of SmolLM2 ≈ 100 MB.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from quant.arch import ModelSpec
from quant.llama import LinearHook, forward_logits


class _Recorder(LinearHook):
    def __init__(self) -> None:
        self.inputs: dict[str, np.ndarray] = {}
        self.out_max: dict[str, np.ndarray] = {}

    def __call__(self, name: str, x: np.ndarray, w: np.ndarray) -> np.ndarray:
        self.inputs[name] = x
        y = x @ w.T
        self.out_max[name] = np.abs(y).max(axis=0)          # S_O from the forward's own output (no second matmul)
        return y


@dataclass
class Calibration:
    inputs: dict[str, np.ndarray]     # linear name -> X (T, D) float32 reference input activations
    in_max: dict[str, np.ndarray]     # linear name -> S_I (D,) max |X| per input channel
    out_max: dict[str, np.ndarray]    # linear name -> S_O (C,) max |X W^T| per output channel
    tokens: np.ndarray                # (T,) calibration token ids


def calibrate(weights: dict[str, np.ndarray], spec: ModelSpec, tokens: np.ndarray) -> Calibration:
    rec = _Recorder()
    forward_logits(weights, spec, tokens, rec)
    in_max = {name: np.abs(x).max(axis=0) for name, x in rec.inputs.items()}
    return Calibration(rec.inputs, in_max, rec.out_max, np.asarray(tokens))
