"""Analytic (roofline-style) cost model for the cold-start ops of a transformer layer (EdgeFlow §3.2, §4.3).

Every term is a device-profile parameter (see `planner/device.py` and `conf/device/*.yaml` for values and sources):
- NPU INT8 matmul: max(2mkn / npu_int8_tops, weight bytes / npu_weight_gbps) + npu_dispatch_s (roofline: compute roof
  vs weight-streaming roof, which dominates for few tokens, e.g. the 1-token lm_head).
- NPU-inefficient ops (norm, SwiGLU, (de)quantize, add): CPU time x npu_inefficient_factor + dispatch (Fig. 5b).
- CPU matmul: 2mkn / (cpu_int8_gemm_gops_per_ghz x effective GHz of the threads) (x K-quant slowdown); a matmul of
  llama.cpp's or MNN's whose `wfmt` names a measured rate (`llamacpp_gemm_gops_per_ghz`, `mnn_gemm_gops_per_ghz`) at
  that rate, without overhead.
- CPU attention (FP16): 4 m ctx h d / (cpu_fp16_gflops_per_ghz x effective GHz).
- CPU elementwise: bytes / (cpu_elementwise_gbps_per_core x effective cores) + cpu_op_overhead_s.
- Unpack (one thread): max(SIMD instructions / (ipc x GHz) + scalar cycles / GHz, bytes written / cpu_copy_gbps).
"""
from __future__ import annotations

from planner.cost.base import CostModel
from planner.device import SocProfile
from planner.plan import OpWork


class AnalyticCostModel(CostModel):
    name = "analytic"

    def __init__(self, device: SocProfile) -> None:
        self.dev = device
        self._ghz: dict[tuple[int, int], float] = {}

    def _eff_ghz(self, threads: int, first_core: int) -> float:
        key = (threads, first_core)
        if key not in self._ghz:
            self._ghz[key] = self.dev.thread_ghz(threads, first_core)
        return self._ghz[key]

    def op_time(self, work: OpWork, unit: str, threads: int = 1, first_core: int = 0) -> float:
        d = self.dev
        if unit == "npu":
            if work.kind in ("matmul", "lm_head"):
                compute = work.flops / (d.npu_int8_tops * 1e12)
                stream = work.k * work.n / (d.npu_weight_gbps * 1e9)   # INT8 weights, 1 B each
                return max(compute, stream) + d.npu_dispatch_s
            return self.op_time(work, "cpu", threads, first_core) * d.npu_inefficient_factor + d.npu_dispatch_s
        if unit != "cpu":
            raise ValueError(f"unknown compute unit {unit!r}")
        ghz = self._eff_ghz(threads, first_core)
        if work.kind in ("matmul", "lm_head"):
            if work.wfmt in d.llamacpp_gemm_gops_per_ghz:     # llama.cpp's measured eval rate for its file type:
                return work.flops / (d.llamacpp_gemm_gops_per_ghz[work.wfmt] * 1e9 * ghz)   # no per-op overhead
            if work.wfmt in d.mnn_gemm_gops_per_ghz:          # MNN's, per weight bits ("b8@576")
                return work.flops / (d.mnn_gemm_gops_per_ghz[work.wfmt] * 1e9 * ghz)
            rate = d.cpu_int8_gemm_gops_per_ghz * 1e9 * ghz
            if work.wfmt == "kquant":
                rate /= d.cpu_kquant_gemm_slowdown
            return work.flops / rate + d.cpu_op_overhead_s
        if work.kind == "attention":
            return work.flops / (d.cpu_fp16_gflops_per_ghz * 1e9 * ghz) + d.cpu_op_overhead_s
        if work.kind == "elementwise":
            cores = ghz / d.cpu_big_ghz
            return work.nbytes / (d.cpu_elementwise_gbps_per_core * 1e9 * cores) + d.cpu_op_overhead_s
        if work.kind == "unpack":
            compute = work.simd_instr / (d.cpu_simd_ipc * ghz * 1e9) + work.cycles / (ghz * 1e9)
            memory = work.nbytes / (d.cpu_copy_gbps * 1e9)
            return max(compute, memory)
        raise ValueError(f"unknown op kind {work.kind!r}")

    def copy_time(self, nbytes: int) -> float:
        return nbytes / (self.dev.cpu_copy_gbps * 1e9)

    def overhead_time(self, work: OpWork, unit: str) -> float:
        if work.kind == "unpack":
            return 0.0
        return self.dev.npu_dispatch_s if unit == "npu" else self.dev.cpu_op_overhead_s
