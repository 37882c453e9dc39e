"""Shared helpers for the simulator tests: real configs as typed objects, and a fake cost model for tiny DAGs."""
from __future__ import annotations

from planner.cost.base import CostModel
from planner.device import SocProfile
from planner.plan import OpWork
from quant.arch import ModelSpec
from sim.coldstart.sweep import load_conf


def llama() -> ModelSpec:
    return load_conf("model", "llama3_8b", ModelSpec)


def xiaomi() -> SocProfile:
    return load_conf("device", "xiaomi15pro", SocProfile)


class FakeCost(CostModel):
    """Durations written into the work: NPU time = work.k seconds, CPU time = work.n seconds."""
    name = "fake"

    def op_time(self, work: OpWork, unit: str, threads: int = 1, first_core: int = 0) -> float:
        return float(work.k if unit == "npu" else work.n)

    def copy_time(self, nbytes: int) -> float:
        return 0.0


def w(npu: float, cpu: float) -> list[OpWork]:
    return [OpWork("matmul", k=npu, n=cpu)]   # type: ignore[arg-type]
