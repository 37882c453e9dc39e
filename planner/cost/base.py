"""The cost-model contract (vidur-style execution-time predictor): op work + unit + threads -> seconds.

The planner uses it to derive schedule parameters (the stealing threshold), the simulator to advance time, the HIL
to compare predictions with measured timelines. Back-ends: `analytic` (roofline with named efficiency factors, device
profile parameters) and `table` (regression on measured per-op profiles, e.g. this host's from the HIL calibration).
"""
from __future__ import annotations

from abc import ABC, abstractmethod

from planner.plan import OpWork


class CostModel(ABC):
    name = "base"

    @abstractmethod
    def op_time(self, work: OpWork, unit: str, threads: int = 1, first_core: int = 0) -> float:
        """Seconds to run `work` on `unit` ("cpu" or "npu"); CPU ops run on `threads` threads from `first_core`."""

    @abstractmethod
    def copy_time(self, nbytes: int) -> float:
        """Seconds one thread needs to copy `nbytes` into NPU-shared buffers."""

    def overhead_time(self, work: OpWork, unit: str) -> float:
        """The part of `op_time` that is the runtime's fixed per-op dispatch cost (not the kernel): what a Python
        runtime spends holding its interpreter lock (`HostRuntime.interpreter_lock`). Default: none."""
        return 0.0

    def dram_bytes(self, work: OpWork, unit: str) -> float:
        """B of DRAM traffic of one op (streaming count, no cache reuse assumed: the conservative side). The simulator
        shares DRAM bandwidth among concurrent ops with it (docs/coldstart.md "Shared resources")."""
        if work.kind in ("matmul", "lm_head"):
            return float(work.k * work.n + work.m * work.k + 4 * work.m * work.n)  # INT8 W, INT8 x, INT32/FP out
        if work.kind == "attention":
            return float(4 * work.ctx * work.heads * work.head_dim + 4 * work.m * work.heads * work.head_dim)
        if work.kind == "unpack":
            bw = work.bits_weights
            packed = sum(b * n for b, n in enumerate(bw)) / 8 if bw else work.nbytes
            return float(work.nbytes + packed)                                       # write INT8 + read packed
        return float(work.nbytes)

