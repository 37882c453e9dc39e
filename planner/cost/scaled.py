"""A cost model at another speed of the same machine: each class of kernel work divided by a measured speed factor.

Why (docs/hil.md "Prediction at the run-time host speed"): a shared VM's cores do not keep the speed its calibration
caught — the same INT8 GEMM probe took 0.74x to 1.2x its calibrated CPU time in the minutes after a calibration. A
prediction from the calibrated table then carries the host's drift as well as the model's error. The validate app
measures the host's speed right around every cold run on request (`diagnostics=true`, `hil.diagnostics.drift`: the
calibration's GEMM and elementwise probes, thread CPU time) and re-simulates the plan with the kernels at that speed:
the gap between the two predictions is the host's part of the error, the rest is the model's. The plain (calibrated)
prediction stays the one the app is judged on; this one is labelled as conditioned on the measured speed.

`speeds[cls]` = calibrated probe time / probe time now (1.0: as calibrated; 0.8: kernels take 1.25x). Classes are
those the probes measure: `gemm` (matmul, lm_head on one thread), `gemm_mt` (the same split over several threads:
the two vCPUs of the host VM do not keep one speed together, so the 2-thread probe is its own class; without it a
multi-threaded GEMM takes the `gemm` speed), `elementwise` (the elementwise ops and attention, the elementwise
probe's class in `sim.executor.KIND_CLASS`) and `unpack` (the unpack kernels). Reads are not kernels of the cost
model but rates of the device profile: `at_read_speed` divides the storage's transfer rates by the read probe's
wall-time speed (`read`) and the CPU side of a read by its thread-CPU speed (`read_cpu`). Copies, reads and first
touch are left as calibrated: no probe measures them around the runs. The runtime's fixed per-op cost
(`overhead_time`) is not a kernel and is left as well.
"""
from __future__ import annotations

import dataclasses
import math

from planner.cost.base import CostModel
from planner.device import SocProfile
from planner.plan import OpWork

CLASS_OF_KIND = {"matmul": "gemm", "lm_head": "gemm", "elementwise": "elementwise", "attention": "elementwise",
                 "unpack": "unpack"}
SPEED_CLASSES = ("gemm", "gemm_mt", "elementwise", "unpack")
READ_CLASSES = ("read", "read_cpu")


def _check(cls: str, v: object) -> None:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < math.inf:
        raise ValueError(f"speed of {cls} must be a number > 0 (got {v!r})")


def at_read_speed(dev: SocProfile, speeds: dict[str, float]) -> tuple[SocProfile, dict[str, float]]:
    """`dev` with its reads at the measured speeds (`read`: the storage's aggregate and per-reader transfer rates x
    it; `read_cpu`: the CPU side of a read, `read_cpu_gbps`, x it; absent: as calibrated) and the remaining (kernel)
    speeds for `ScaledCostModel`."""
    rest = {k: v for k, v in speeds.items() if k not in READ_CLASSES}
    for k in READ_CLASSES:
        if k in speeds:
            _check(k, speeds[k])
    r, c = float(speeds.get("read", 1.0)), float(speeds.get("read_cpu", 1.0))
    if r == 1.0 and c == 1.0:
        return dev, rest
    return dataclasses.replace(dev, flash_peak_gbps=dev.flash_peak_gbps * r,
                               flash_reader_gbps=dev.flash_reader_gbps * r, read_cpu_gbps=dev.read_cpu_gbps * c), rest


class ScaledCostModel(CostModel):
    """`base` with each op's kernel time (its time minus the fixed per-op overhead) divided by `speeds[class]`."""

    name = "scaled"

    def __init__(self, base: CostModel, speeds: dict[str, float]) -> None:
        for cls, v in speeds.items():
            if cls not in SPEED_CLASSES:
                raise ValueError(f"speed class must be one of {', '.join(SPEED_CLASSES)} (got {cls!r})")
            _check(cls, v)
        self.base = base
        self.speeds = {k: float(v) for k, v in speeds.items()}

    def _speed(self, work: OpWork, threads: int) -> float:
        cls = CLASS_OF_KIND.get(work.kind, "")
        if cls == "gemm" and threads > 1 and "gemm_mt" in self.speeds:
            cls = "gemm_mt"
        return self.speeds.get(cls, 1.0)

    def op_time(self, work: OpWork, unit: str, threads: int = 1, first_core: int = 0) -> float:
        t = self.base.op_time(work, unit, threads, first_core)
        over = min(t, self.base.overhead_time(work, unit))
        return over + (t - over) / self._speed(work, threads)

    def overhead_time(self, work: OpWork, unit: str) -> float:
        return self.base.overhead_time(work, unit)

    def copy_time(self, nbytes: int) -> float:
        return self.base.copy_time(nbytes)

    def dram_bytes(self, work: OpWork, unit: str) -> float:
        return self.base.dram_bytes(work, unit)
