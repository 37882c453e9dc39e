"""The cold-start policy contract (one framework per file, vidur-style): inputs -> `Plan`.

A policy decides *how* a framework cold-starts (weight format, graph construction, overlap, placement, dynamic
scheduling); numbers a user may tune come from `FrameworkSpec`. `ColdStartInputs` bundles the typed inputs.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import numpy as np

from planner.cost.base import CostModel
from planner.device import SocProfile
from planner.formats import bits_histogram, model_bits
from planner.framework import FrameworkSpec
from planner.peer_costs import NO_PEER_COSTS, PeerCosts
from planner.plan import Plan
from quant.arch import ModelSpec


@dataclass
class ColdStartInputs:
    model: ModelSpec
    device: SocProfile
    framework: FrameworkSpec
    cost: CostModel
    prompt_tokens: int
    bits: float                 # average bit budget (EdgeFlow allocation; llama.cpp picks its nearest K-quant type)
    seed: int = 0
    bits_source: str = "auto"   # auto | real | twin | uniform (see planner.formats.model_bits)
    preloaded_bytes: int = 0    # B of weights already in memory before the cold start (Fig. 2)
    bits_override: dict[str, np.ndarray] | None = None   # per kind (n_layers, C) bits of a real packed file (HIL)
    peers: PeerCosts = NO_PEER_COSTS   # llama.cpp's and MNN's own costs measured on a host, for the llama.cpp and MNN
    #                                    policies predicting those frameworks themselves (a phone: none); `cost` must
    #                                    have been built with the same (planner.cost.make_cost_model)

    def __post_init__(self) -> None:
        if self.model.is_moe:
            raise ValueError(f"model: {self.model.name} is MoE; the cold-start study models dense FFN layers only")
        if self.prompt_tokens <= 0:
            raise ValueError(f"prompt_tokens must be > 0 (got {self.prompt_tokens})")


class ColdStartPolicy(ABC):
    name = "base"

    @abstractmethod
    def build(self, x: ColdStartInputs) -> Plan:
        ...


def ef_bits(x: ColdStartInputs):
    """EdgeFlow's per-channel allocation at the budget, with its provenance and histogram for the metrics."""
    if x.bits_override is not None:
        bits, source = x.bits_override, "file"
    else:
        bits, source = model_bits(x.model, x.bits, x.seed, x.bits_source)
    hist = bits_histogram(bits, x.model)
    return bits, {"bits_source": source, "bits_hist": {str(k): round(v, 5) for k, v in hist.items()}}
