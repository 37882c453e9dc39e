"""Cold-start framework knobs: the schema of `conf/framework/<name>.yaml` (Hydra group `framework`, `framework_schema`).

The behaviour of a framework (weight format, graph construction, overlap, placement, priority, stealing) is its
policy's code (`sim/coldstart/<policy>.py`, one per file); the YAML holds only the numbers a user may tune.
"""
from __future__ import annotations

from dataclasses import dataclass

POLICIES = ("llamacpp", "mnn", "llmnpu", "llmnpu_mat", "llmnpu_plus", "ef_mixed", "ef_pack", "ef_pipe", "ef_place",
            "ef_priority", "edgeflow")


@dataclass
class FrameworkSpec:
    name: str = "???"              # id, equals the conf/framework file name
    policy: str = "???"            # one of POLICIES
    chunk_tokens: int = 128        # tokens per prefill chunk (0 = whole prompt at once)
    loader_threads: int = 1        # threads reading weights from flash
    unpack_threads: int = 1        # threads unpacking weights to INT8
    compute_threads: int = 4       # threads of the CPU compute pool
    graph_threads: int = 1         # threads restoring per-layer NPU graphs (granular pipeline only)
    source: str = ""               # where the knob values come from

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"framework.policy must be one of {', '.join(POLICIES)} (got {self.policy!r})")
        if self.chunk_tokens < 0:
            raise ValueError(f"framework.chunk_tokens must be >= 0 (got {self.chunk_tokens})")
        for key in ("loader_threads", "unpack_threads", "compute_threads", "graph_threads"):
            if getattr(self, key) < 1:
                raise ValueError(f"framework.{key} must be >= 1 (got {getattr(self, key)})")
