"""Typed knobs of the quantizers: the schema of the Hydra `quant` config group (conf/quant/*.yaml), EdgeFlow §4.1.

Every value is validated in `__post_init__`, so a bad value fails before any work with a message naming the key.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, fields
from enum import Enum

MAX_TOKENS = 4096          # documented maximum of quant.calib_tokens / eval_tokens / search_tokens (logits: T x vocab)
MAX_ALPHA_STEPS = 101      # documented maximum of quant.alpha_steps (one quantization per grid point per tensor)
MAX_OFFSET = 10_000_000    # tokens; the evaluation text is far shorter (the app checks the real length)
MAX_EVAL_SLICES = 64       # documented maximum of quant.eval_slices (one reference + one quantized forward each)


class BudgetScope(str, Enum):
    tensor = "tensor"    # `budget` = average bits per channel within every weight tensor (paper's Algorithm 1 form)
    glob = "global"      # one `budget` in bits per weight across all linear layers (cost of a channel = its D weights)


class ReMetric(str, Enum):
    closed_form = "closed_form"   # paper §4.1 closed form from max|W_i| and E[W_i²]
    exact = "exact"               # exact cosine distance (validation; 8 quantizations per tensor)


@dataclass
class QuantSettings:
    scope: str = "tensor"             # BudgetScope value: "tensor" | "global"
    metric: str = "closed_form"       # ReMetric value: "closed_form" | "exact"
    min_bits: int = 1                 # bits; allocator lower bound (paper: 1)
    max_bits: int = 8                 # bits; allocator upper bound (paper: 8, INT8 NPU-native)
    smoothing: bool = True            # EdgeFlow NPU-aware smoothing on/off
    alpha_steps: int = 11             # α grid = linspace(0, 1, alpha_steps) (paper: grid search in [0, 1])
    beta: float = 1.0                 # output-side smoothing exponent (paper: β = 1)
    search_tokens: int = 128          # calibration tokens used for the α search error (subset of calib_tokens)
    search_holdout: bool = True       # score the α search on the last search_tokens, fit scales on the others
    smoothquant_alpha: float = 0.5    # SmoothQuant's default migration strength (Xiao et al. 2023)
    baseline_smoothing: str = "npu"   # SmoothQuant / CMPQ: "npu" = EdgeFlow's NPU-aware smoothing (α search, β), as the
    #                                   papers adapted them to the per-tensor constraint | "original" = their own forms
    shadow_quantile: float = 0.99     # llm.npu shadow outliers: input channels with calibrated max above this
                                      # quantile of per-channel maxima run on the CPU in FP16 (the rest clip at it)
    cmpq_high_frac: float = 0.25      # CMPQ adapted: share of output channels at B+1 (highest RE at B)
    cmpq_low_frac: float = 0.25       # CMPQ adapted: share at B-1 (lowest RE at B); equal shares keep the average B
    calib_tokens: int = 256           # tokens of the calibration slice (activation scales, S_I, S_O)
    calib_offset: int = 100_000       # token offset of the calibration slice (disjoint from the evaluation slice)
    eval_tokens: int = 512            # tokens of each evaluation slice (check figure: slice 0, 512 -> ppl 17.83)
    eval_offset: int = 0              # token offset of the first evaluation slice
    eval_slices: int = 4              # K disjoint evaluation slices; metrics are mean ± sd over them
    eval_stride: int = 20_000         # tokens between the starts of consecutive evaluation slices (>= eval_tokens)

    def __post_init__(self) -> None:
        for f in fields(self):                   # types first (NaN / inf rejected for every float)
            v, want = getattr(self, f.name), type(f.default)
            if want is float and isinstance(v, int) and not isinstance(v, bool):
                v = float(v)
                setattr(self, f.name, v)
            if not isinstance(v, want) or (want is int and isinstance(v, bool)):
                raise ValueError(f"quant.{f.name} must be {'a number' if want is float else want.__name__} "
                                 f"(got {v!r})")
            if want is float and not math.isfinite(v):
                raise ValueError(f"quant.{f.name} must be a finite number (got {v!r})")
        for key, enum in (("scope", BudgetScope), ("metric", ReMetric)):
            allowed = [e.value for e in enum]
            if getattr(self, key) not in allowed:
                raise ValueError(f"quant.{key} must be one of {allowed} (got {getattr(self, key)!r})")
        if not (1 <= self.min_bits <= self.max_bits <= 8):
            raise ValueError(f"quant.min_bits/max_bits must satisfy 1 <= min <= max <= 8 "
                             f"(got {self.min_bits}, {self.max_bits})")
        if not 1 <= self.alpha_steps <= MAX_ALPHA_STEPS:
            raise ValueError(f"quant.alpha_steps must be in 1..{MAX_ALPHA_STEPS} (got {self.alpha_steps})")
        if not 0 <= self.beta <= 10:
            raise ValueError(f"quant.beta must be in [0, 10] (got {self.beta})")
        if self.baseline_smoothing not in ("npu", "original"):
            raise ValueError(f"quant.baseline_smoothing must be npu or original (got {self.baseline_smoothing!r})")
        if not 0 <= self.smoothquant_alpha <= 1:
            raise ValueError(f"quant.smoothquant_alpha must be in [0, 1] (got {self.smoothquant_alpha})")
        if not 0 < self.shadow_quantile <= 1:
            raise ValueError(f"quant.shadow_quantile must be in (0, 1] (got {self.shadow_quantile})")
        for key in ("cmpq_high_frac", "cmpq_low_frac"):
            if not 0 <= getattr(self, key) <= 0.5:
                raise ValueError(f"quant.{key} must be in [0, 0.5] (got {getattr(self, key)})")
        for key in ("calib_tokens", "eval_tokens", "search_tokens"):
            if not 2 <= getattr(self, key) <= MAX_TOKENS:
                raise ValueError(f"quant.{key} must be in 2..{MAX_TOKENS} (got {getattr(self, key)})")
        if self.search_holdout and self.search_tokens > self.calib_tokens - 2:
            raise ValueError(f"quant.search_tokens ({self.search_tokens}) must leave >= 2 of quant.calib_tokens "
                             f"({self.calib_tokens}) to fit scales when quant.search_holdout=true")
        for key in ("calib_offset", "eval_offset"):
            if not 0 <= getattr(self, key) <= MAX_OFFSET:
                raise ValueError(f"quant.{key} must be in 0..{MAX_OFFSET} (got {getattr(self, key)})")
        if not 1 <= self.eval_slices <= MAX_EVAL_SLICES:
            raise ValueError(f"quant.eval_slices must be in 1..{MAX_EVAL_SLICES} (got {self.eval_slices})")
        if not self.eval_tokens <= self.eval_stride <= MAX_OFFSET:
            raise ValueError(f"quant.eval_stride must be in quant.eval_tokens..{MAX_OFFSET} = {self.eval_tokens}.."
                             f"{MAX_OFFSET} so the evaluation slices are disjoint (got {self.eval_stride})")
        c0, c1 = self.calib_offset, self.calib_offset + self.calib_tokens
        for k in range(self.eval_slices):
            a0 = self.eval_offset + k * self.eval_stride
            a1 = a0 + self.eval_tokens
            if a0 < c1 and c0 < a1:
                raise ValueError(f"quant.calib_offset: the calibration slice [{c0}, {c1}) overlaps evaluation slice "
                                 f"{k} [{a0}, {a1}) (quant.eval_offset, quant.eval_tokens, quant.eval_slices, "
                                 f"quant.eval_stride)")
