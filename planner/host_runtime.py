"""The runtime model of a measured host: mechanics of its OS, its virtual machine and the project's own Python runner
(`hil.runner`) that the simulator needs to predict a cold start *on that host* (docs/design.md §6.1; docs/hil.md
"Host profile").

A device profile (`planner.device.SocProfile`) says what a device is: its flash, memory, CPU, NPU and power. This
dataclass holds what the host adds on top: the page-cache readahead a sequential pread stream sees, the CPU side of a
read and of first-touching fresh memory (page faults, interrupts), how long a woken thread takes to run and where the
guest kernel puts it, the runner's per-tensor and per-op Python code under its interpreter lock, its GEMM pool, its NPU
stand-in on a CPU core, and the slowdown of each class of work while the other cores are busy. A phone profile has
none of it: the simulator takes `runtime=None` there (`sim.executor.simulate`), which is `NO_RUNTIME`, every
mechanic off. Only `hil` calibration measures a `HostRuntime` (`hil.host`, stored as `runtime.json` beside the
profile's `device.json`); each value's source is stored with it.

Every default means "not modelled": 0 for a time or a rate, 1 for a slowdown factor, False for a flag, -1 for
`read_cpu_overlap_multi` ("same as read_cpu_overlap"). Units: seconds (`_s`), bytes (`_bytes`), GB/s = 1e9 B/s
(`_gbps`), 1 = a share or a factor.
"""
from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

# classes of work with a co-run slowdown (HostRuntime.corun_<class>): INT8 GEMM; float32 elementwise ops and attention;
# unpack kernels; first touch and copies into fresh memory; the CPU side of reads; the runtime's own per-task code
CORUN_CLASSES = ("gemm", "elementwise", "unpack", "touch", "read", "runtime")
# the classes whose work stresses the memory system (page-cache pages, page faults, copies into fresh memory): beside a
# thread doing them, a job is slowed by HostRuntime.corun_<class>_mem instead of corun_<class>
MEMORY_CLASSES = ("touch", "read")
SENTINEL_FIELDS = ("read_cpu_overlap_multi",)      # -1 = "same as the single-reader field", range checked below


@dataclass(frozen=True)
class HostRuntime:
    # ---- reads: the kernel's page cache and the CPU side of a read ----------------------------------------------
    flash_stream_start_s: float = 0.0         # s a reader waits once when it starts a sequential stream on a cold
    #                                           file (its first request is read synchronously, the kernel's readahead
    #                                           window ramps up) beyond its steady rate
    flash_request_busy_s: float = 0.0         # s added to each sequential read request while other threads occupy
    #                                           every core (the reader waits for a time slice before it can issue the
    #                                           next request and the kernel's next readahead)
    flash_random_read_cpu_s: float = 0.0      # s of the reader's core time per random read (syscall, page allocation,
    #                                           I/O submission and completion, copy; 0 = read_cpu_gbps per byte)
    read_ahead_bytes: int = 0                 # B the kernel reads ahead of a sequential pread stream into the page
    #                                           cache while the device has nothing else to do
    read_cpu_overlap: float = 0.0             # 1, share of the shorter of a sequential read's device transfer and
    #                                           its CPU side (copy + first touch) that runs concurrently with the other
    #                                           (kernel readahead keeps the device busy while the thread copies);
    #                                           0 = one after the other; fitted (experiments.calibrate_fit)
    read_cpu_overlap_multi: float = -1.0      # 1, the same while another sequential reader reads at the same time;
    #                                           -1 = read_cpu_overlap
    read_cpu_multi: float = 1.0               # x, CPU side of a sequential read (copy + first touch) while another
    #                                           sequential reader streams too: two readers' CPU per byte / one's
    #                                           (threads of one address space fault pages in at once)
    read_irq_gbps: float = 0.0                # GB/s, core time of a cold read's interrupt and block-completion work,
    #                                           charged to whichever thread runs
    read_fault_gbps: float = 0.0              # GB/s per thread, first touch of a fresh buffer by a read() into it
    #                                           (the kernel faults the pages in inside its copy; 0 = mem_fault_gbps)
    # ---- first touch of fresh memory (page faults + zeroing) ----------------------------------------------------
    mem_fault_gbps: float = 0.0               # GB/s per thread of first touch of newly allocated memory (charged on
    #                                           load / unpack tasks' mem_alloc), allocations up to mem_fault_small_bytes
    mem_fault_small_bytes: int = 1 << 20      # B, allocation size mem_fault_gbps was measured at
    mem_fault_large_gbps: float = 0.0         # GB/s, first touch of allocations of mem_fault_large_bytes and more
    #                                           (0 = mem_fault_gbps at every size); log-interpolated in between
    mem_fault_large_bytes: int = 0            # B
    unpack_fault_gbps: float = 0.0            # GB/s per thread, first touch of a fresh unpack output by the unpack
    #                                           kernel writing it, allocations up to mem_fault_small_bytes
    #                                           (0 = mem_fault_gbps)
    unpack_fault_large_gbps: float = 0.0      # GB/s, the same for allocations of mem_fault_large_bytes and more
    #                                           (0 = unpack_fault_gbps at every size); log-interpolated in between
    # ---- thread hand-offs and the guest kernel's placement ------------------------------------------------------
    thread_wake_s: float = 0.0                # s, an idle worker thread woken by another's completion starts this
    #                                           much later (a thread hand-off)
    thread_wake_cpu_s: float = 0.0            # s of core time a woken worker spends besides its task (wake-up,
    #                                           re-taking its lock)
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
    thread_wake_pack_share: float = 0.0       # 1, share of those wake-ups packed (expected value; 0 = none)
    sched_balance_s: float = 0.0              # s between the kernel's load-balancing ticks (1 / CONFIG_HZ): a packed
    #                                           pair is split at the next one (0 = when the woken thread's task ends)
    # ---- the runner's own code ----------------------------------------------------------------------------------
    interpreter_lock: bool = False            # the runtime's per-task code (the cost model's overhead_time,
    #                                           load_tensor_s, unpack_tensor_s) holds one process-wide lock: a Python
    #                                           runtime's GIL (the host runner)
    load_tensor_s: float = 0.0                # s of core time per tensor a load task reads, beyond its bytes (buffer
    #                                           set-up, read call, bookkeeping)
    unpack_tensor_s: float = 0.0              # s of core time per tensor an unpack task unpacks, beyond the kernel's
    #                                           per-weight work and first touch (output set-up, call)
    cpu_op_python_s: float = 0.0              # s of each compute op's cost that the runtime's own code spends under
    #                                           its interpreter lock (the runner's loop between two ops: a share of
    #                                           the op's cost, not added to it; 0 = the cost model's overhead_time)
    npu_on_cpu_core: bool = False             # the "NPU" queue runs on a CPU core (this host's NPU stand-in): its ops
    #                                           occupy a core in the simulator's processor sharing
    cpu_split_gemm_only: bool = False         # the runtime splits only GEMMs over the CPU unit's threads; its other
    #                                           ops run on the worker's own thread (the host runner)
    gemm_pool_spin_s: float = 0.0             # s a GEMM helper thread keeps polling its core for the next GEMM after
    #                                           its part before it sleeps (the core is occupied)
    gemm_pool_wake_s: float = 0.0             # s a multi-threaded GEMM takes longer when its helpers sleep (their
    #                                           wake-up)
    # ---- co-running: x CPU time of a class of work while the other cores are busy, relative to alone -----------
    corun_gemm: float = 1.0                   # x beside compute on the other cores, per class (INT8 GEMM; float32
    corun_elementwise: float = 1.0            #   elementwise ops and attention; unpack kernels; first touch and
    corun_unpack: float = 1.0                 #   copies into fresh memory; the CPU side of reads; the runtime's own
    corun_touch: float = 1.0                  #   per-task code)
    corun_read: float = 1.0
    corun_runtime: float = 1.0
    corun_gemm_mem: float = 1.0               # x, the same while the other cores run memory-system work (cold reads
    corun_elementwise_mem: float = 1.0        #   into fresh buffers, first touch: MEMORY_CLASSES) instead of
    corun_unpack_mem: float = 1.0             #   compute, per busy core
    corun_touch_mem: float = 1.0
    corun_read_mem: float = 1.0
    corun_runtime_mem: float = 1.0

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, (int, float)) and not isinstance(v, bool) and v < 0 and f.name not in SENTINEL_FIELDS:
                raise ValueError(f"runtime.{f.name} must be >= 0 (got {v})")
        for c in CORUN_CLASSES:
            for key in (f"corun_{c}", f"corun_{c}_mem"):
                if getattr(self, key) < 1:
                    raise ValueError(f"runtime.{key} must be >= 1 (x CPU time beside busy cores; got "
                                     f"{getattr(self, key)})")
        if not 0 <= self.read_cpu_overlap <= 1:
            raise ValueError(f"runtime.read_cpu_overlap must be in [0, 1] (got {self.read_cpu_overlap})")
        if not (0 <= self.read_cpu_overlap_multi <= 1 or self.read_cpu_overlap_multi == -1):
            raise ValueError(f"runtime.read_cpu_overlap_multi must be in [0, 1], or -1 for read_cpu_overlap (got "
                             f"{self.read_cpu_overlap_multi})")
        if self.read_cpu_multi < 1:
            raise ValueError(f"runtime.read_cpu_multi must be >= 1 (x CPU per byte with another reader; got "
                             f"{self.read_cpu_multi})")
        if not 0 <= self.thread_wake_pack_share <= 1:
            raise ValueError(f"runtime.thread_wake_pack_share must be in [0, 1] (got {self.thread_wake_pack_share})")

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


NO_RUNTIME = HostRuntime()        # a device with none of these mechanics (every phone profile)
