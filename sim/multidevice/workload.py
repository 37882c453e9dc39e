"""LMSYS-Chat-1M-like multi-turn conversation workload (Voltron §3.2.3, Fig. 7; docs/design.md §5).

Input / output lengths per turn are log-normal with the dataset's means (LMSYS-Chat-1M paper, Zheng et al. 2023,
Table 1: 69.5 prompt tokens and 214.5 response tokens per turn on average) and the per-user standard deviations the
Voltron paper reports (160.1 / 381.7 tokens), clipped to [min, max]. Every turn's prompt and response stay in the KV
cache (the conversation context grows turn after turn). Deterministic for a seed.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class WorkloadConfig:
    turns: int = 5                   # conversation turns
    mean_in: float = 69.5            # tokens, LMSYS-Chat-1M mean prompt length
    std_in: float = 160.1            # tokens, per-user std (Voltron §3.2.3)
    mean_out: float = 214.5          # tokens, LMSYS-Chat-1M mean response length
    std_out: float = 381.7           # tokens, per-user std (Voltron §3.2.3)
    min_tokens: int = 4              # clip
    max_in: int = 1024               # clip (prompt)
    max_out: int = 1024              # clip (response)
    think_s: float = 20.0            # s user think/typing time between a response and the next prompt
    seed: int = 0

    def __post_init__(self) -> None:
        if self.turns < 1:
            raise ValueError(f"workload.turns must be >= 1 (got {self.turns})")
        for k in ("mean_in", "std_in", "mean_out", "std_out"):
            if getattr(self, k) <= 0:
                raise ValueError(f"workload.{k} must be > 0 (got {getattr(self, k)})")
        if not 1 <= self.min_tokens <= min(self.max_in, self.max_out):
            raise ValueError("workload.min_tokens must be in 1..min(max_in, max_out)")
        if self.think_s < 0:
            raise ValueError(f"workload.think_s must be >= 0 (got {self.think_s})")


def _lognormal(rng, mean: float, std: float, n: int) -> np.ndarray:
    s2 = np.log(1 + (std / mean) ** 2)
    return rng.lognormal(np.log(mean) - s2 / 2, np.sqrt(s2), n)


def conversation(cfg: WorkloadConfig) -> list[tuple[int, int]]:
    """[(input tokens, output tokens)] per turn."""
    rng = np.random.default_rng(cfg.seed)
    n_in = np.clip(np.rint(_lognormal(rng, cfg.mean_in, cfg.std_in, cfg.turns)), cfg.min_tokens, cfg.max_in)
    n_out = np.clip(np.rint(_lognormal(rng, cfg.mean_out, cfg.std_out, cfg.turns)), cfg.min_tokens, cfg.max_out)
    return [(int(a), int(b)) for a, b in zip(n_in, n_out)]
