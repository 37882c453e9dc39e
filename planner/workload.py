"""Prompt-length workloads of the cold-start study: the schema of `conf/workload/<name>.yaml` (`workload_schema`).

EdgeFlow Table 3 (docs/design.md §4.5) gives each dataset's prompt-length range (with its few-shot count). A cold start
runs one prompt; `length` picks which length stands for the dataset: `mid` (rounded middle of the range, the default),
`min` or `max`. `prompt_tokens > 0` in the app overrides the workload with a fixed length.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class WorkloadSpec:
    name: str = "???"
    min_tokens: int = 0     # tokens, shortest prompt of the dataset (Table 3)
    max_tokens: int = 0     # tokens, longest prompt
    shots: int = 0          # few-shot examples in the prompt (Table 3), informational
    length: str = "mid"     # mid | min | max

    def __post_init__(self) -> None:
        if not 0 < self.min_tokens <= self.max_tokens:
            raise ValueError(f"workload.min_tokens/max_tokens must satisfy 0 < min <= max "
                             f"(got {self.min_tokens}, {self.max_tokens})")
        if self.length not in ("mid", "min", "max"):
            raise ValueError(f"workload.length must be mid, min or max (got {self.length!r})")

    @property
    def prompt_tokens(self) -> int:
        if self.length == "min":
            return self.min_tokens
        if self.length == "max":
            return self.max_tokens
        return (self.min_tokens + self.max_tokens + 1) // 2
