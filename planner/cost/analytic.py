"""Analytic (roofline-style) cost model for the cold-start ops of a transformer layer (EdgeFlow §3.2, §4.3).

Every term is a device-profile parameter (see `planner/device.py` and `conf/device/*.yaml` for values and sources):
- NPU INT8 matmul: max(2mkn / npu_int8_tops, weight bytes / npu_weight_gbps) + npu_dispatch_s (roofline: compute roof
  vs weight-streaming roof, which dominates for few tokens, e.g. the 1-token lm_head).
- NPU-inefficient ops (norm, SwiGLU, (de)quantize, add): CPU time x npu_inefficient_factor + dispatch (Fig. 5b).
- CPU matmul: 2mkn / (cpu_int8_gemm_gops_per_ghz x effective GHz of the threads) (x K-quant slowdown); a matmul of
  llama.cpp's or MNN's whose `wfmt` names a measured rate of the peer costs the model was given
  (`planner.peer_costs.PeerCosts`: `llamacpp_gemm_gops_per_ghz`, `mnn_gemm_gops_per_ghz`) at that rate, without
  overhead; a `wfmt` that names none of them is an error (a plan built with peer costs, costed without them).
- CPU attention (FP16): 4 m ctx h d / (cpu_fp16_gflops_per_ghz x effective GHz).
- CPU elementwise: bytes / (cpu_elementwise_gbps_per_core x effective cores) + cpu_op_overhead_s.
- Unpack (one thread): max(SIMD instructions / (ipc x GHz) + scalar cycles / GHz, bytes written / cpu_copy_gbps).
"""
from __future__ import annotations

from planner.cost.base import CostModel
from planner.device import SocProfile
from planner.peer_costs import NO_PEER_COSTS, PeerCosts
from planner.plan import OpWork

DEVICE_WFMTS = ("int8", "kquant")       # the matmul weight formats costed at the device's own rates


class AnalyticCostModel(CostModel):
    name = "analytic"

    def __init__(self, device: SocProfile, peers: PeerCosts = NO_PEER_COSTS) -> None:
        self.dev = device
        self.peers = peers
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
            if work.wfmt not in DEVICE_WFMTS:
                return work.flops / (self._peer_rate(work.wfmt) * 1e9 * ghz)    # no per-op overhead
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

    def _peer_rate(self, wfmt: str) -> float:
        """GOP/s per core-GHz of a peer's measured eval: llama.cpp's for its file type ("Q4_0@576") or MNN's for its
        weight bits ("b8@576")."""
        p = self.peers
        if wfmt in p.llamacpp_gemm_gops_per_ghz:
            return p.llamacpp_gemm_gops_per_ghz[wfmt]
        if wfmt in p.mnn_gemm_gops_per_ghz:
            return p.mnn_gemm_gops_per_ghz[wfmt]
        raise ValueError(f"matmul weight format {wfmt!r}: not {' or '.join(DEVICE_WFMTS)} and not a measured rate of "
                         f"the peer costs this cost model was given (build it with the PeerCosts the plan was "
                         f"built with)")

    def copy_time(self, nbytes: int) -> float:
        return nbytes / (self.dev.cpu_copy_gbps * 1e9)

    def overhead_time(self, work: OpWork, unit: str) -> float:
        if work.kind == "unpack":
            return 0.0
        return self.dev.npu_dispatch_s if unit == "npu" else self.dev.cpu_op_overhead_s
