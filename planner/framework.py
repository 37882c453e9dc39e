"""Cold-start framework knobs: the schema of `conf/framework/<name>.yaml` (Hydra group `framework`, `framework_schema`).

The behaviour of a framework (weight format, graph construction, overlap, placement, priority, stealing) is its
policy's code (`sim/coldstart/<policy>.py`, one per file); the YAML holds only the numbers a user may tune.
"""
from __future__ import annotations

from dataclasses import dataclass

from quant.arch import check_name

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
    weight_type: str = ""          # llama.cpp only: GGUF weight type (Q8_0 as in the papers' set-up; Q2_K..Q6_K
    #                                selectable; "budget" = the K-quant nearest EdgeFlow's `bits`); "" for the others
    use_mmap: bool = True          # llama.cpp only: map the file (its default; weights paged in as compute first
    #                                touches them) or read it into its buffers before the first eval (use_mmap=false)
    source: str = ""               # where the knob values come from

    def __post_init__(self) -> None:
        check_name(self.name, "framework.name")      # it names run directories (conf/coldstart.yaml)
        for key in ("chunk_tokens", "loader_threads", "unpack_threads", "compute_threads", "graph_threads"):
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, int):
                raise ValueError(f"framework.{key} must be an integer (got {v!r})")
        if self.policy not in POLICIES:
            raise ValueError(f"framework.policy must be one of {', '.join(POLICIES)} (got {self.policy!r})")
        from planner.formats import GGML_FTYPES

        if self.weight_type not in ("", "budget", *GGML_FTYPES):
            raise ValueError(f"framework.weight_type must be budget or one of {', '.join(GGML_FTYPES)} "
                             f"(got {self.weight_type!r})")
        if not 0 <= self.chunk_tokens <= 32_768:
            raise ValueError(f"framework.chunk_tokens must be in 0..32768 (got {self.chunk_tokens})")
        for key in ("loader_threads", "unpack_threads", "compute_threads", "graph_threads"):
            if not 1 <= getattr(self, key) <= 64:
                raise ValueError(f"framework.{key} must be in 1..64 (got {getattr(self, key)})")
