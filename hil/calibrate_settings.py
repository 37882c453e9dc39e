"""What a host calibration measures (docs/hil.md "Host profile"): file sizes, grids, repeats and rounds, the full
and the quick (< 30 s) variant. The calibration steps (`hil.calibrate`, `hil.calibrate_reads`,
`hil.calibrate_compute`, `hil.calibrate_runner`) take it; it imports none of them.
"""
from __future__ import annotations

from dataclasses import dataclass

from hil.calibrate_stats import KIB, MIB


@dataclass
class CalibrationSettings:
    """What to measure. `quick()` is the < 30 s variant the tests use (smaller files, fewer sizes and shapes)."""
    quick: bool = False
    rounds: int = 3                                                     # full passes of every measurement, merged
    #                                                                     figure by figure (hil.calibrate_merge)
    reps: int = 5                                                       # repeats per figure (median, spread)
    reps_noisy: int = 9                                                 # repeats of the first-touch and cold-read
    #                                                                     CPU figures (they move most between runs)
    scratch_bytes: int = 256 * MIB                                      # B, cold-read scratch file
    request_sizes: tuple[int, ...] = (64 * KIB, 256 * KIB, MIB, 4 * MIB, 16 * MIB)   # B per read request
    reader_threads: tuple[int, ...] = (1, 2, 4)
    copy_bytes: int = 64 * MIB                                          # B per memcpy measurement
    unpack_shape: tuple[int, int] = (2048, 8192)     # (C out channels, D weights per channel): a 1B-Llama FFN tensor
    unpack_short_shape: tuple[int, int] = (1536, 576)  # short rows (SmolLM2's FFN): the per-channel cost
    unpack_formats: tuple[str, ...] = ("weightlet", "mixed", "kquant")
    unpack_bits: tuple[int, ...] = (1, 2, 3, 4, 5, 6, 7, 8)
    threads: tuple[int, ...] = (1, 2)                                   # threads of unpack / GEMM / elementwise
    gemm_m: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256)
    # (K in, N out): SmolLM2-135M q/o, k/v, gate/up, down, LM head; 1B Llama q/o, k/v, gate/up, down, LM head
    gemm_kn: tuple[tuple[int, int], ...] = ((576, 576), (576, 192), (576, 1536), (1536, 576), (576, 49152),
                                           (2048, 2048), (2048, 512), (2048, 8192), (8192, 2048), (2048, 49152))
    elem_rows: tuple[int, ...] = (1, 16, 128)                           # M tokens of the elementwise ops
    elem_dims: tuple[int, ...] = (576, 2048)                            # d_model (silu_mul: 8/3 d_model)
    elem_context_reps: int = 25                                         # calls per elementwise / attention point
    # attention: (m new tokens, past tokens, heads, kv heads, head_dim)
    attn_shapes: tuple[tuple[int, int, int, int, int], ...] = (
        (1, 128, 9, 3, 64), (16, 0, 9, 3, 64), (128, 0, 9, 3, 64), (128, 128, 9, 3, 64),
        (1, 128, 32, 8, 64), (16, 0, 32, 8, 64), (128, 0, 32, 8, 64), (128, 128, 32, 8, 64))
    dispatch_tasks: int = 2000                                          # hand-offs per dispatch measurement
    runner_runs: int = 9                                                # runs of the runner on the tiny model
    overlap_blob_bytes: int = 2 * MIB                                   # tensor buffer size of the read-overlap run
    cold_set_bytes: int = 64 * MIB                                      # B cycled through by GEMM / unpack timings
    #                                                                     (> last-level cache: operands come from DRAM)
    gemm_budget_s: float = 0.1                                          # s of timed calls per GEMM point (>= reps):
    #                                                                     5 cold calls of a 16 x 576 x 1536 GEMM
    #                                                                     measured 152 us in one calibration, 230-260
    #                                                                     in loops of 50-400 calls

    def __post_init__(self) -> None:
        if not isinstance(self.rounds, int) or isinstance(self.rounds, bool) or self.rounds < 1:
            raise ValueError(f"calibrate.rounds must be an integer >= 1 (got {self.rounds!r})")
        if self.reps < 3:
            raise ValueError(f"calibrate.reps must be >= 3 (median of >= 3 repeats; got {self.reps})")
        if self.scratch_bytes < 16 * MIB:
            raise ValueError(f"calibrate.scratch_bytes must be >= 16 MiB (got {self.scratch_bytes})")

    @classmethod
    def make(cls, quick: bool, rounds: int | None = None) -> "CalibrationSettings":
        """The full or the quick settings; `rounds` None: 3 rounds for a full calibration, 1 for a quick one."""
        if not quick:
            return cls() if rounds is None else cls(rounds=rounds)
        return cls(quick=True, rounds=1 if rounds is None else rounds, reps=3, reps_noisy=3, scratch_bytes=32 * MIB,
                   request_sizes=(64 * KIB, MIB, 8 * MIB),
                   reader_threads=(1, 2),
                   copy_bytes=16 * MIB, unpack_shape=(256, 2048), unpack_short_shape=(256, 576), threads=(1,),
                   gemm_m=(1, 16, 128),
                   gemm_kn=((576, 576), (576, 1536)), elem_rows=(1, 64), elem_dims=(576,),
                   attn_shapes=((1, 64, 9, 3, 64), (64, 0, 9, 3, 64)), dispatch_tasks=300, runner_runs=3,
                   cold_set_bytes=8 * MIB,
                   gemm_budget_s=0.01)
