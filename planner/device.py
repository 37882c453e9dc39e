"""Single-SoC device profile: the schema of `conf/device/<soc>.yaml` (Hydra group `device`, schema name `soc_schema`).

Holds what a device *is* (EdgeFlow §3; docs/design.md §6.1 and §7): flash (bandwidth as a function of request size and
concurrent readers, per-request latency, random reads), memory (capacity, shared DRAM bandwidth, the CPU cost of
read() copies and of copies into NPU buffers), CPU cores (big/little, per-op-type throughput), NPU (INT8 matmul
roofline, NPU-inefficient op factor, dispatch overhead, QNN graph set-up / compose / optimize / prepare costs) and
power. The mechanics of a measured host's OS and of the project's Python runner (readahead, page faults, thread
wake-ups, the interpreter lock, co-run slowdowns) are not a device's: they are `planner.host_runtime.HostRuntime`,
which only a measured host has; nor are what other frameworks' own code costs there (llama.cpp's, MNN's):
`planner.peer_costs.PeerCosts`. Values live in the YAML with unit and source (a measured host profile: `hil.host`,
docs/hil.md); this class only names and validates them. Units: seconds (`_s`), bytes (`_bytes`), GB/s = 1e9 B/s
(`_gbps`), GHz, watts (`_w`), nJ per byte (`_nj_per_byte`).

Design: a flat dataclass (one level, so a typo in a Hydra override fails with the key name) plus a few derived
quantities (flash rate per reader, CPU thread speed) that the cost models and the flash resource share.
"""
from __future__ import annotations

from dataclasses import dataclass, fields


@dataclass
class SocProfile:
    name: str = "???"                         # id, equals the conf/device file name
    soc: str = ""                             # marketing name of the SoC
    source: str = ""                          # where the figures come from
    # ---- flash (UFS) -------------------------------------------------------------------------------------------
    flash_peak_gbps: float = 0.0              # GB/s, aggregate read bandwidth with several readers
    flash_reader_gbps: float = 0.0            # GB/s, one reader's streaming cap at large requests
    flash_request_latency_s: float = 0.0      # s, fixed cost of one read request (command + FTL lookup)
    flash_random_read_s: float = 0.0          # s per read at a random offset (no readahead; 0 = the sequential model)
    flash_random_read_busy_s: float = 0.0     # s per random read while sequential reads stream (queued behind their
    #                                           readahead; 0 = as flash_random_read_s)
    flash_multi_gbps: float = 0.0             # GB/s, aggregate read bandwidth while two or more sequential readers
    #                                           stream at once, taking one file's pieces in turn as a plan's loaders
    #                                           do (below flash_peak_gbps where their readahead windows interfere;
    #                                           0 = flash_peak_gbps)
    flash_bulk_request_bytes: int = 0         # B, request size of explicit read() loaders
    mmap_readahead_bytes: int = 0             # B, request size of on-demand paging (mmap page-fault readahead)
    # ---- memory -------------------------------------------------------------------------------------------------
    mem_capacity_bytes: int = 0               # B, DRAM
    cpu_copy_gbps: float = 0.0                # GB/s per thread, writing weights into NPU-shared buffers (copy/unpack)
    read_cpu_gbps: float = 0.0                # GB/s per thread of CPU work moving read data from the page cache into
    #                                           a user buffer (read() syscall copy); 0 = not modelled
    dram_gbps: float = 0.0                    # GB/s, shared DRAM bandwidth of all cores together; 0 = not modelled
    # ---- CPU ----------------------------------------------------------------------------------------------------
    cpu_big_cores: int = 0                    # cores of the fastest cluster
    cpu_big_ghz: float = 0.0                  # GHz
    cpu_little_cores: int = 0                 # cores of the slower cluster(s)
    cpu_little_ghz: float = 0.0               # GHz
    cpu_parallel_eff: float = 1.0             # 1, efficiency of each extra thread inside one parallel op
    cpu_simd_ipc: float = 0.0                 # SIMD instructions per cycle per core (unpack kernels)
    cpu_int8_gemm_gops_per_ghz: float = 0.0   # GOP/s per core per GHz, INT8 GEMM (i8mm) incl. dynamic act. quant
    cpu_kquant_gemm_slowdown: float = 1.0     # x, K-quant dot products (dequant in kernel) vs INT8 GEMM
    cpu_fp16_gflops_per_ghz: float = 0.0      # GFLOP/s per core per GHz, FP16 attention (QK^T, PV)
    cpu_elementwise_gbps_per_core: float = 0.0  # GB/s per core, memory-bound FP16 elementwise ops
    cpu_op_overhead_s: float = 0.0            # s, fixed cost of launching one CPU op on the thread pool
    kquant_unpack_cycles_per_weight: float = 0.0  # cycles per weight, K-quant bit-split -> INT8 (scalar-heavy)
    # ---- NPU ----------------------------------------------------------------------------------------------------
    npu_int8_tops: float = 0.0                # TOP/s, statically optimized INT8 matmul (HMX), compute roof
    npu_weight_gbps: float = 0.0              # GB/s, weight streaming roof of one NPU matmul (small-m bound)
    npu_inefficient_factor: float = 1.0       # x, NPU time / CPU time of norm, SwiGLU, (de)quantize, add
    npu_dispatch_s: float = 0.0               # s, per NPU op (graph execute call) overhead
    npu_setup_s: float = 0.0                  # s, QNN environment set-up
    npu_compose_s_per_gb: float = 0.0         # s per GB of INT8 weights, online graph composition
    npu_optimize_s_per_gb: float = 0.0        # s per GB of INT8 weights, online graph optimization (compile)
    npu_ctx_deserialize_gbps: float = 0.0     # GB/s, deserializing a materialized context binary
    npu_prepare_s_per_gb: float = 0.0         # s per GB of INT8 weights, preparing a materialized graph
    npu_driver_slots: int = 1                 # graph set-up / restore / prepare calls the NPU driver runs at once
    #                                           (1 = serialized: no source shows QNN context work running in parallel)
    # ---- power --------------------------------------------------------------------------------------------------
    power_idle_w: float = 0.0                 # W, SoC + DRAM baseline during the whole cold start
    power_big_core_w: float = 0.0             # W per busy big core
    power_little_core_w: float = 0.0          # W per busy little core
    power_npu_w: float = 0.0                  # W, NPU busy
    flash_nj_per_byte: float = 0.0            # nJ per byte read from flash

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, (int, float)) and not isinstance(v, bool) and v < 0:
                raise ValueError(f"device.{f.name} must be >= 0 (got {v})")
        for key in ("flash_peak_gbps", "flash_reader_gbps", "flash_bulk_request_bytes", "mmap_readahead_bytes",
                    "mem_capacity_bytes", "cpu_copy_gbps", "cpu_big_cores", "cpu_big_ghz", "cpu_simd_ipc",
                    "cpu_int8_gemm_gops_per_ghz", "cpu_fp16_gflops_per_ghz", "cpu_elementwise_gbps_per_core",
                    "kquant_unpack_cycles_per_weight", "npu_int8_tops", "npu_weight_gbps",
                    "npu_ctx_deserialize_gbps"):
            if getattr(self, key) <= 0:
                raise ValueError(f"device.{key} must be > 0 (got {getattr(self, key)})")
        if not 0 < self.cpu_parallel_eff <= 1:
            raise ValueError(f"device.cpu_parallel_eff must be in (0, 1] (got {self.cpu_parallel_eff})")
        if self.flash_reader_gbps > self.flash_peak_gbps:
            raise ValueError("device.flash_reader_gbps must be <= device.flash_peak_gbps")

    # ---- derived ------------------------------------------------------------------------------------------------
    @property
    def cpu_cores(self) -> int:
        return self.cpu_big_cores + self.cpu_little_cores

    def core_ghz(self, threads: int, first_core: int = 0) -> list[float]:
        """Clock (GHz) of the cores that `threads` threads run on, big cores first, starting at core `first_core`."""
        ghz = [self.cpu_big_ghz] * self.cpu_big_cores + [self.cpu_little_ghz] * self.cpu_little_cores
        sel = ghz[first_core:first_core + threads]
        if len(sel) < threads:
            raise ValueError(f"{threads} threads from core {first_core} exceed the {self.cpu_cores} CPU cores")
        return sel

    def thread_ghz(self, threads: int, first_core: int = 0) -> float:
        """Effective GHz of a parallel op on `threads` threads: core clocks summed, extra threads at parallel_eff."""
        sel = self.core_ghz(threads, first_core)
        return sel[0] + self.cpu_parallel_eff * sum(sel[1:]) if sel else 0.0

    def reader_rate(self, request_bytes: int, random: bool = False, busy: bool = False,
                    wait_s: float = 0.0) -> float:
        """B/s one reader achieves with requests of `request_bytes` (latency + transfer at the per-reader cap); random
        requests pay `flash_random_read_s` each where it is known (readahead cannot hide it), or
        `flash_random_read_busy_s` when sequential reads are streaming at the same time (`busy`); sequential requests
        pay `wait_s` more each (a host's wait for a time slice, `HostRuntime.flash_request_busy_s`)."""
        lat = self.flash_request_latency_s
        if random and self.flash_random_read_s > 0:
            lat = self.flash_random_read_busy_s if busy and self.flash_random_read_busy_s > 0 else \
                self.flash_random_read_s
        elif wait_s > 0:
            lat += wait_s
        return request_bytes / (lat + request_bytes / (self.flash_reader_gbps * 1e9))
