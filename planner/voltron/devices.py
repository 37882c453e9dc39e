"""Edge device and cluster profiles for Voltron (Voltron Table 1/2; docs/design.md §5) and the roofline device model.

Owns:
- `EdgeDevice`: the typed schema of `conf/device/<name>.yaml` (registered as `edge_device_schema` in group `device`):
  memory budget, per-precision compute throughput, memory / storage bandwidth, per-sublayer overhead, DVFS levels.
  Every field is a public SoC figure (cores, clocks, SIMD width, LPDDR generation) times a named efficiency factor;
  the derivation is written next to each value in the YAML file.
- `ClusterSpec`: `conf/cluster/<name>.yaml` — device names in cluster order (index 0 = the main device, the Wi-Fi Direct
  group owner held by the user) plus the link names that connect device k (k ≥ 1) to the main device.
- `device_time`: the planner's own spec-derived roofline time of one piece of work on one device (compute-bound vs
  memory-bound, with a small-batch utilisation curve). It is what the planner profiles when it has no device
  (`latency.simulate_profiles`, planner-only use); the planner itself predicts with the fitted latency regression.
  The simulator does not use it: it executes its own device model (`sim/multidevice/device_model.py`), which the
  planner profiles in a simulated run.

Design: no phones here, so the profiles are derived from public specs; decode is memory-bandwidth-bound and prefill
compute-bound, which is what the roofline captures. DVFS scales compute throughput and per-op overhead by the frequency
fraction f (memory bandwidth is set by the DRAM controller and kept fixed); power follows P = P_idle + P_dyn·f³.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from quant.arch import conf_yaml

PRECISIONS = ("fp16", "int8", "int4")            # weight precisions, index = precision id (0 = highest)
# Bytes per weight by precision id: FP16 = 2; INT8 = llama.cpp Q8_0 (8.5 bits/weight: 32 int8 + 1 fp16 scale);
# INT4 = llama.cpp Q4_K (4.5 bits/weight: 256-weight super-blocks with 6-bit sub-block scales). Source: ggml k-quants.
BYTES_PER_WEIGHT = np.array([2.0, 8.5 / 8, 4.5 / 8])   # (P,) bytes / weight
ACT_BYTES = np.array([2.0, 1.0 + 2 / 32, 0.5 + 2 / 32])  # (P,) wire bytes / activation (FP16 / Q8 / Q4 + scales)


@dataclass
class EdgeDevice:
    """One device profile (conf/device/<name>.yaml). Throughputs are *effective* (peak × efficiency)."""
    name: str = "???"
    soc: str = ""                                     # SoC marketing name (paper Table 1)
    perf_level: str = "high"                          # high | mid | low (paper Table 1)
    dram_gb: float = 0.0                              # GB installed DRAM (Table 1)
    mem_budget_gb: float = 0.0                        # GB available to the LLM (Table 1 "available")
    peak_gflops_fp16: float = 0.0                     # GFLOP/s NEON peak of the big cores used (fp16 FMA, else fp32)
    peak_gops_int8: float = 0.0                       # GOP/s NEON int8 peak (sdot with DotProd, else widening MLA)
    int4_vs_int8: float = 0.8                         # × int8 rate for Q4_K (nibble unpack before int8 dot); assumed
    compute_eff: float = 0.45                         # fraction of peak reached by llama.cpp GEMM (assumed, see docs)
    sustained_clock: float = 1.0                      # fraction of the peak clock sustained under load (throttling)
    mem_bw_peak_gbps: float = 0.0                     # GB/s LPDDR peak (data rate × bus width)
    mem_eff: float = 0.6                              # fraction of peak DRAM bandwidth a CPU stream reaches (assumed)
    storage_gbps: float = 1.0                         # GB/s sequential flash read (UFS/eMMC), for shard reloads
    overhead_ms: float = 0.1                          # ms fixed cost per sublayer (graph dispatch + thread barriers)
    n_half: float = 1.0                               # tokens at half-peak GEMM utilisation (GEMV = 1 token: 50 %)
    dvfs_levels: list[float] = field(default_factory=lambda: [1.0, 0.85, 0.7, 0.55, 0.4])  # CPU frequency fractions
    p_idle_w: float = 0.5                             # W device idle power with the radio on (assumption)
    p_dyn_w: float = 5.0                              # W CPU dynamic power at f = 1 with the big cores busy

    def __post_init__(self) -> None:
        for key in ("dram_gb", "mem_budget_gb", "peak_gflops_fp16", "peak_gops_int8", "mem_bw_peak_gbps",
                    "storage_gbps"):
            if getattr(self, key) <= 0:
                raise ValueError(f"device.{key} must be > 0 (got {getattr(self, key)})")
        if self.mem_budget_gb > self.dram_gb:
            raise ValueError(f"device.mem_budget_gb ({self.mem_budget_gb}) exceeds device.dram_gb ({self.dram_gb})")
        for key in ("int4_vs_int8", "compute_eff", "sustained_clock", "mem_eff"):
            if not 0 < getattr(self, key) <= 1:
                raise ValueError(f"device.{key} must be in (0, 1] (got {getattr(self, key)})")
        if self.perf_level not in ("high", "mid", "low"):
            raise ValueError(f"device.perf_level must be high|mid|low (got {self.perf_level!r})")
        if not self.dvfs_levels or any(not 0 < f <= 1 for f in self.dvfs_levels) or max(self.dvfs_levels) != 1.0:
            raise ValueError("device.dvfs_levels must be frequency fractions in (0, 1] including 1.0")
        if self.overhead_ms < 0 or self.n_half < 0:
            raise ValueError("device.overhead_ms and device.n_half must be >= 0")

    # ---- effective rates ----------------------------------------------------------------------------------------
    @property
    def mem_budget_bytes(self) -> float:
        return self.mem_budget_gb * 1e9

    def ops_per_s(self) -> np.ndarray:
        """(P,) effective ops/s at f = 1 for fp16 / int8 / int4 weights."""
        base = self.compute_eff * self.sustained_clock * 1e9
        return np.array([self.peak_gflops_fp16, self.peak_gops_int8, self.peak_gops_int8 * self.int4_vs_int8]) * base

    @property
    def mem_bytes_per_s(self) -> float:
        return self.mem_bw_peak_gbps * self.mem_eff * 1e9

    def power_w(self, f: float | np.ndarray) -> float | np.ndarray:
        return self.p_idle_w + self.p_dyn_w * np.asarray(f) ** 3


def device_time(dev: EdgeDevice, prec: np.ndarray, n_tokens: np.ndarray, flops: np.ndarray, bytes_read: np.ndarray,
                freq: float = 1.0) -> np.ndarray:
    """Roofline time (s) of work items on `dev` (all arrays broadcast together).

    prec: precision id; n_tokens: tokens processed together (batching → GEMM utilisation n/(n + n_half));
    flops: arithmetic ops; bytes_read: DRAM bytes (weights + KV cache).
    """
    util = n_tokens / (n_tokens + dev.n_half) if dev.n_half > 0 else 1.0
    ops = dev.ops_per_s()[prec] * freq * np.maximum(util, 1e-3)
    t_compute = flops / ops
    t_memory = bytes_read / dev.mem_bytes_per_s
    return np.maximum(t_compute, t_memory) + dev.overhead_ms * 1e-3 / freq


@dataclass
class EmulationSpec:
    """How a cluster is emulated by worker processes on one host (docs/cluster.md): each device's CPU speed becomes a
    CPU quota on this host, proportional to its spec-sheet sustained INT8 rate (`EdgeDevice.ops_per_s`), the fastest
    device getting `max_cores`; its memory budget is scaled down so that the small models we can run here need more
    than one device (the emulated budget, enforced by the worker)."""
    max_cores: float = 0.6                            # host cores of the fastest device's worker (cgroup CPU quota)
    min_cores: float = 0.1                            # floor of any device's quota (a quota below ~0.1 core starves)
    cfs_period_ms: float = 10.0                       # CFS period: short, so a throttled worker stalls ≤ ~period
    mem_budget_mb: list[float] = field(default_factory=list)   # MB per device (cluster order); [] = the devices' own

    def __post_init__(self) -> None:
        if not 0.05 <= self.min_cores <= self.max_cores <= 1.0:
            raise ValueError(f"cluster.emulation: need 0.05 <= min_cores <= max_cores <= 1 core "
                             f"(got {self.min_cores}, {self.max_cores})")
        if not 1.0 <= self.cfs_period_ms <= 1000.0:
            raise ValueError(f"cluster.emulation.cfs_period_ms must be in [1, 1000] (got {self.cfs_period_ms})")
        if any(m <= 0 for m in self.mem_budget_mb):
            raise ValueError(f"cluster.emulation.mem_budget_mb must be > 0 (got {self.mem_budget_mb})")


@dataclass
class ClusterSpec:
    """conf/cluster/<name>.yaml: devices in order (index 0 = main device) and their links to the main device;
    optionally how to emulate it on this host (`emulation`, used by `hil.cluster`)."""
    name: str = "???"
    devices: list[str] = field(default_factory=list)   # conf/device names; devices[0] is the main device
    links: list[str] = field(default_factory=list)     # trace link name of device k+1 ↔ main (len = len(devices) - 1)
    description: str = ""
    emulation: EmulationSpec | None = None

    def __post_init__(self) -> None:
        if len(self.devices) < 1:
            raise ValueError("cluster.devices must list at least one device")
        if len(set(self.devices)) != len(self.devices):
            raise ValueError(f"cluster.devices has duplicates: {self.devices}")
        if len(self.links) != len(self.devices) - 1:
            raise ValueError(f"cluster.links must name one link per non-main device "
                             f"({len(self.devices) - 1}), got {len(self.links)}")
        if isinstance(self.emulation, dict):
            self.emulation = EmulationSpec(**self.emulation)
        if self.emulation is not None and self.emulation.mem_budget_mb and \
                len(self.emulation.mem_budget_mb) != len(self.devices):
            raise ValueError(f"cluster.emulation.mem_budget_mb must give one budget per device ({len(self.devices)}), "
                             f"got {len(self.emulation.mem_budget_mb)}")


@dataclass
class Cluster:
    """Resolved cluster: the spec plus the device profiles (what planners take)."""
    spec: ClusterSpec
    devices: list[EdgeDevice]

    @property
    def n(self) -> int:
        return len(self.devices)

    def budgets(self) -> np.ndarray:
        return np.array([d.mem_budget_bytes for d in self.devices])          # (D,) bytes


def _load_yaml(group: str, name: str, conf_dir=None) -> dict:
    """conf/<group>/<name>.yaml as a plain dict without its `defaults` list (outside Hydra: tests, reports)."""
    return conf_yaml(group, name, conf_dir)


def load_device(name: str, conf_dir=None) -> EdgeDevice:
    """Read conf/device/<name>.yaml outside Hydra (tests, reports); unknown keys fail."""
    doc = _load_yaml("device", name, conf_dir)
    try:
        return EdgeDevice(**doc)
    except TypeError as e:
        raise ValueError(f"device {name}: {e}") from e


def load_cluster(name: str, conf_dir=None) -> Cluster:
    spec = ClusterSpec(**_load_yaml("cluster", name, conf_dir))
    return Cluster(spec, [load_device(d, conf_dir) for d in spec.devices])


def emulated_cluster(cluster: Cluster) -> tuple[Cluster, np.ndarray]:
    """The cluster as emulated on this host: devices with their emulated memory budgets, and (D,) CPU quotas in host
    cores (fastest device = `max_cores`, the others in proportion to their sustained INT8 rate, floored at
    `min_cores`). Raises when the cluster has no `emulation` block."""
    from dataclasses import replace

    emu = cluster.spec.emulation
    if emu is None:
        raise ValueError(f"cluster {cluster.spec.name} has no `emulation` block (see conf/cluster/office_emu.yaml)")
    rate = np.array([d.ops_per_s()[1] for d in cluster.devices])              # (D,) sustained INT8 op/s
    cores = np.maximum(emu.max_cores * rate / rate.max(), emu.min_cores)     # (D,) host cores per worker
    devices = list(cluster.devices)
    if emu.mem_budget_mb:
        devices = [replace(d, mem_budget_gb=mb / 1e3) for d, mb in zip(devices, emu.mem_budget_mb)]
    return Cluster(cluster.spec, devices), cores
