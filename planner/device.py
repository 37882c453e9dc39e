"""Single-SoC device profile: the schema of `conf/device/<soc>.yaml` (Hydra group `device`, schema name `soc_schema`).

Owns every hardware parameter the cold-start planner and simulator use (EdgeFlow §3; docs/design.md §7): flash
(bandwidth as a function of request size and concurrent readers, per-request latency), CPU cores (big/little,
per-op-type throughput), NPU (INT8 matmul roofline, NPU-inefficient op factor, dispatch overhead, QNN graph set-up /
compose / optimize / prepare costs), memory capacity, shared DRAM bandwidth and the CPU cost of read() copies
(`dram_gbps`, `read_cpu_gbps`: 0 = not modelled; inputs of the simulator's contention model) and power. Values live in
the YAML with unit and source (a measured host profile: `hil/host.py`, docs/hil.md); this class only names and validates
them. Units: seconds (`_s`), bytes (`_bytes`), GB/s = 1e9 B/s (`_gbps`), GHz, watts (`_w`), nJ per byte
(`_nj_per_byte`).

Design: a flat dataclass (one level, so a typo in a Hydra override fails with the key name) plus a few derived
quantities (flash rate per reader, CPU thread speed) that the cost models and the flash resource share.
"""
from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

# classes of work with a co-run slowdown (SocProfile.corun_<class>): INT8 GEMM; float32 elementwise ops and attention;
# unpack kernels; first touch and copies into fresh memory; the CPU side of reads; the runtime's own per-task code
CORUN_CLASSES = ("gemm", "elementwise", "unpack", "touch", "read", "runtime")
# the classes whose work stresses the memory system (page-cache pages, page faults, copies into fresh memory): beside a
# thread doing them, a job is slowed by SocProfile.corun_<class>_mem instead of corun_<class>
MEMORY_CLASSES = ("touch", "read")
SENTINEL_FIELDS = ("read_cpu_overlap_multi",)      # -1 = "same as the single-reader field", range checked below

@dataclass
class SocProfile:
    name: str = "???"                         # id, equals the conf/device file name
    soc: str = ""                             # marketing name of the SoC
    source: str = ""                          # where the figures come from
    # ---- flash (UFS) -------------------------------------------------------------------------------------------
    flash_peak_gbps: float = 0.0              # GB/s, aggregate read bandwidth with several readers
    flash_reader_gbps: float = 0.0            # GB/s, one reader's streaming cap at large requests
    flash_request_latency_s: float = 0.0      # s, fixed cost of one read request (command + FTL lookup)
    flash_stream_start_s: float = 0.0         # s a reader waits once when it starts a sequential stream on a cold
    #                                           file (its first request is read synchronously, the kernel's readahead
    #                                           window ramps up) beyond its steady rate; 0 = folded into the rate
    flash_random_read_s: float = 0.0          # s per read at a random offset (no readahead; 0 = the sequential model)
    flash_random_read_cpu_s: float = 0.0      # s of the reader's core time per random read (syscall, page allocation,
    #                                           I/O submission and completion, copy; 0 = read_cpu_gbps per byte)
    flash_random_read_busy_s: float = 0.0     # s per random read while sequential reads stream (queued behind their
    #                                           readahead; 0 = as flash_random_read_s)
    flash_request_busy_s: float = 0.0         # s added to each sequential read request while other threads occupy
    #                                           every core (the reader waits for a time slice before it can issue the
    #                                           next request and the kernel's next readahead; 0 = not modelled)
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
    read_cpu_overlap: float = 0.0             # 1, share of the shorter of a sequential read's device transfer and
    #                                           its CPU side (copy + first touch) that runs concurrently with the other
    #                                           (kernel readahead keeps the device busy while the thread copies);
    #                                           0 = one after the other
    read_cpu_overlap_multi: float = -1.0      # 1, the same while another sequential reader reads at the same time
    #                                           (measured lower on the host); -1 = read_cpu_overlap
    read_cpu_multi: float = 1.0               # x, CPU side of a sequential read (copy + first touch) while another
    #                                           sequential reader streams too: two readers' CPU per byte / one's
    #                                           (threads of one address space fault pages in at once; docs/hil.md
    #                                           "Host profile"); 1 = the same
    read_ahead_bytes: int = 0                 # B the kernel reads ahead of a sequential pread stream into the page
    #                                           cache while the device has nothing else to do (0 = not modelled)
    dram_gbps: float = 0.0                    # GB/s, shared DRAM bandwidth of all cores together; 0 = not modelled
    mem_fault_gbps: float = 0.0               # GB/s per thread of first touch of newly allocated memory (page faults
    #                                           + zeroing, charged on load / unpack tasks' mem_alloc; 0 = not modelled),
    #                                           allocations up to mem_fault_small_bytes
    mem_fault_small_bytes: int = 1 << 20      # B, allocation size mem_fault_gbps was measured at
    mem_fault_large_gbps: float = 0.0         # GB/s, first touch of allocations of mem_fault_large_bytes and more
    #                                           (0 = mem_fault_gbps at every size); log-interpolated in between
    mem_fault_large_bytes: int = 0            # B
    unpack_fault_gbps: float = 0.0            # GB/s per thread, first touch of a fresh unpack output by the unpack
    #                                           kernel writing it, allocations up to mem_fault_small_bytes (its stores
    #                                           fault the pages in; 0 = mem_fault_gbps)
    unpack_fault_large_gbps: float = 0.0      # GB/s, the same for allocations of mem_fault_large_bytes and more
    #                                           (0 = unpack_fault_gbps at every size); log-interpolated in between
    read_irq_gbps: float = 0.0                # GB/s, core time of a cold read's interrupt and block-completion work,
    #                                           charged to whichever thread runs (0 = not modelled)
    read_fault_gbps: float = 0.0              # GB/s per thread, first touch of a fresh buffer by a read() into it
    #                                           (the kernel faults the pages in inside its copy; 0 = mem_fault_gbps)
    thread_wake_s: float = 0.0                # s, an idle worker thread woken by another's completion starts this
    #                                           much later (a thread hand-off; 0 = not modelled)
    thread_wake_cpu_s: float = 0.0            # s of core time a woken worker spends besides its task (wake-up,
    #                                           re-taking its lock; 0 = not modelled)
    thread_wake_busy_s: float = 0.0           # s, the same while other threads occupy every core (a time slice and,
    #                                           for a Python runner, the interpreter lock; 0 = thread_wake_s)
    thread_wake_idle_core_s: float = 0.0      # s, the same when its waker keeps running and another core is idle:
    #                                           the woken thread starts on that core (a halted vCPU is woken by an
    #                                           interrupt first); thread_wake_s is a ping-pong's, whose waker sleeps
    #                                           at once and leaves it its own core (0 = thread_wake_s)
    thread_wake_pack_idle_s: float = 0.0      # s, a thread woken while its waker runs and another core idles is put
    #                                           on its waker's busy core instead, once that idle core has been idle
    #                                           this long (a guest kernel's placement: docs/hil.md "Wake-up packing");
    #                                           it preempts its waker until its task ends or the next balance tick
    #                                           (0 = not modelled: it takes the idle core)
    thread_wake_pack_share: float = 0.0       # 1, share of those wake-ups packed (expected value; 0 = none)
    sched_balance_s: float = 0.0              # s between the kernel's load-balancing ticks (1 / CONFIG_HZ): a packed
    #                                           pair is split at the next one (0 = when the woken thread's task ends)
    load_tensor_s: float = 0.0                # s of core time per tensor a load task reads, beyond its bytes (a
    #                                           runtime's buffer set-up, read call, bookkeeping; 0 = not modelled)
    unpack_tensor_s: float = 0.0              # s of core time per tensor an unpack task unpacks, beyond the kernel's
    #                                           per-weight work and first touch (output set-up, call; 0 = not modelled)
    corun_gemm: float = 1.0                   # x, CPU time of work while the other cores run other threads, per
    corun_elementwise: float = 1.0            #   class (INT8 GEMM; float32 elementwise ops and attention; unpack
    corun_unpack: float = 1.0                 #   kernels; first touch and copies into fresh memory; the CPU side of
    corun_touch: float = 1.0                  #   reads; the runtime's own per-task code), relative to alone
    corun_read: float = 1.0                   #   (measured on the host, hil.calibrate_corun; 1 = not modelled)
    corun_runtime: float = 1.0
    corun_gemm_mem: float = 1.0               # x, the same while the other cores run memory-system work (cold reads
    corun_elementwise_mem: float = 1.0        #   into fresh buffers, first touch: MEMORY_CLASSES) instead of
    corun_unpack_mem: float = 1.0             #   compute, per busy core (measured on the host, hil.calibrate_corun;
    corun_touch_mem: float = 1.0              #   1 = not modelled)
    corun_read_mem: float = 1.0
    corun_runtime_mem: float = 1.0
    interpreter_lock: bool = False            # the runtime's per-task code (cpu_op_overhead_s, npu_dispatch_s,
    #                                           load_tensor_s, unpack_tensor_s) holds one process-wide lock: a Python
    #                                           runtime's GIL (the host runner); False for native runtimes
    npu_on_cpu_core: bool = False             # the "NPU" queue runs on a CPU core (this host's NPU stand-in): its ops
    #                                           occupy a core in the simulator's processor sharing
    cpu_split_gemm_only: bool = False         # the runtime splits only GEMMs over the CPU unit's threads; its other
    #                                           ops run on the worker's own thread (the host runner; False: all ops)
    gemm_pool_spin_s: float = 0.0             # s a GEMM helper thread keeps polling its core for the next GEMM after
    #                                           its part before it sleeps (the core is occupied; 0 = not modelled)
    gemm_pool_wake_s: float = 0.0             # s a multi-threaded GEMM takes longer when its helpers sleep (their
    #                                           wake-up; 0 = not modelled)
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
    cpu_op_python_s: float = 0.0              # s of each compute op's cost that the runtime's own code spends under
    #                                           its interpreter lock (interpreter_lock; the HIL runner's loop between
    #                                           two ops: a share of the op's cost, not added to it; 0 = the cost
    #                                           model's overhead_time)
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
            if isinstance(v, (int, float)) and not isinstance(v, bool) and v < 0 and f.name not in SENTINEL_FIELDS:
                raise ValueError(f"device.{f.name} must be >= 0 (got {v})")
        for key in ("flash_peak_gbps", "flash_reader_gbps", "flash_bulk_request_bytes", "mmap_readahead_bytes",
                    "mem_capacity_bytes", "cpu_copy_gbps", "cpu_big_cores", "cpu_big_ghz", "cpu_simd_ipc",
                    "cpu_int8_gemm_gops_per_ghz", "cpu_fp16_gflops_per_ghz", "cpu_elementwise_gbps_per_core",
                    "kquant_unpack_cycles_per_weight", "npu_int8_tops", "npu_weight_gbps",
                    "npu_ctx_deserialize_gbps"):
            if getattr(self, key) <= 0:
                raise ValueError(f"device.{key} must be > 0 (got {getattr(self, key)})")
        for c in CORUN_CLASSES:
            for key in (f"corun_{c}", f"corun_{c}_mem"):
                if getattr(self, key) < 1:
                    raise ValueError(f"device.{key} must be >= 1 (x CPU time beside busy cores; got "
                                     f"{getattr(self, key)})")
        if not 0 <= self.read_cpu_overlap <= 1:
            raise ValueError(f"device.read_cpu_overlap must be in [0, 1] (got {self.read_cpu_overlap})")
        if not (0 <= self.read_cpu_overlap_multi <= 1 or self.read_cpu_overlap_multi == -1):
            raise ValueError(f"device.read_cpu_overlap_multi must be in [0, 1], or -1 for read_cpu_overlap (got "
                             f"{self.read_cpu_overlap_multi})")
        if self.read_cpu_multi < 1:
            raise ValueError(f"device.read_cpu_multi must be >= 1 (x CPU per byte with another reader; got "
                             f"{self.read_cpu_multi})")
        if not 0 <= self.thread_wake_pack_share <= 1:
            raise ValueError(f"device.thread_wake_pack_share must be in [0, 1] (got {self.thread_wake_pack_share})")
        if not 0 < self.cpu_parallel_eff <= 1:
            raise ValueError(f"device.cpu_parallel_eff must be in (0, 1] (got {self.cpu_parallel_eff})")
        if self.flash_reader_gbps > self.flash_peak_gbps:
            raise ValueError("device.flash_reader_gbps must be <= device.flash_peak_gbps")

    # ---- derived ------------------------------------------------------------------------------------------------
    def fault_s_per_byte(self, alloc_bytes: float) -> float:
        """s per byte of first-touching an allocation of `alloc_bytes` (0 when first touch is not modelled)."""
        return self._fault_curve(self.mem_fault_gbps, self.mem_fault_large_gbps, alloc_bytes)

    def unpack_fault_s_per_byte(self, alloc_bytes: float) -> float:
        """s per byte of an unpack kernel's first touch of its fresh `alloc_bytes` output (`fault_s_per_byte` when
        `unpack_fault_gbps` is 0)."""
        if self.unpack_fault_gbps <= 0:
            return self.fault_s_per_byte(alloc_bytes)
        return self._fault_curve(self.unpack_fault_gbps, self.unpack_fault_large_gbps, alloc_bytes)

    def _fault_curve(self, small_gbps: float, large_gbps: float, alloc_bytes: float) -> float:
        """s per byte at `alloc_bytes` on the curve through `small_gbps` (at mem_fault_small_bytes and below) and
        `large_gbps` (at mem_fault_large_bytes and above), log-interpolated in between."""
        if small_gbps <= 0:
            return 0.0
        small = 1.0 / (small_gbps * 1e9)
        lo, hi = float(self.mem_fault_small_bytes), float(self.mem_fault_large_bytes)
        if large_gbps <= 0 or hi <= lo or alloc_bytes <= lo:
            return small
        large = 1.0 / (large_gbps * 1e9)
        if alloc_bytes >= hi:
            return large
        f = (np.log(alloc_bytes) - np.log(lo)) / (np.log(hi) - np.log(lo))
        return float(np.exp((1 - f) * np.log(small) + f * np.log(large)))

    def read_fault_s_per_byte(self, alloc_bytes: float) -> float:
        """s per byte of a read() filling a fresh allocation of `alloc_bytes` for the first time."""
        if self.read_fault_gbps > 0:
            return 1.0 / (self.read_fault_gbps * 1e9)
        return self.fault_s_per_byte(alloc_bytes)

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

    def read_overlap(self, readers: int) -> float:
        """Share of a sequential read's CPU side hidden under its transfer with `readers` reading at once."""
        if readers > 1 and self.read_cpu_overlap_multi >= 0:
            return self.read_cpu_overlap_multi
        return self.read_cpu_overlap

    def corun(self, cls: str) -> tuple[float, float]:
        """(x CPU time beside compute, x CPU time beside memory-system work) of a class of work ((1, 1): none)."""
        if cls not in CORUN_CLASSES:
            return 1.0, 1.0
        return getattr(self, f"corun_{cls}"), getattr(self, f"corun_{cls}_mem")

    def reader_rate(self, request_bytes: int, random: bool = False, busy: bool = False,
                    cores_busy: bool = False) -> float:
        """B/s one reader achieves with requests of `request_bytes` (latency + transfer at the per-reader cap); random
        requests pay `flash_random_read_s` each where it is known (readahead cannot hide it), or
        `flash_random_read_busy_s` when sequential reads are streaming at the same time (`busy`); sequential requests
        pay `flash_request_busy_s` more while other threads occupy every core (`cores_busy`)."""
        lat = self.flash_request_latency_s
        if random and self.flash_random_read_s > 0:
            lat = self.flash_random_read_busy_s if busy and self.flash_random_read_busy_s > 0 else \
                self.flash_random_read_s
        elif cores_busy:
            lat += self.flash_request_busy_s
        return request_bytes / (lat + request_bytes / (self.flash_reader_gbps * 1e9))
