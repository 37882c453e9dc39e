"""planner.cost.scaled: a cost model at a measured speed of the host divides each kernel class's time by its speed
and leaves the fixed per-op overhead, other kinds, copies and DRAM traffic as they were."""
from __future__ import annotations

import dataclasses

import pytest

from planner.cost.base import CostModel
from planner.cost.scaled import ScaledCostModel
from planner.plan import OpWork


class _Fixed(CostModel):
    def op_time(self, work, unit, threads=1, first_core=0):
        return 1.0e-3

    def overhead_time(self, work, unit):
        return 1.0e-4

    def copy_time(self, nbytes):
        return nbytes * 1e-9


def test_kernels_take_longer_at_a_lower_speed_overhead_does_not():
    c = ScaledCostModel(_Fixed(), {"gemm": 0.5, "elementwise": 2.0})
    mm, ew, un = OpWork("matmul", m=4, k=8, n=8), OpWork("elementwise", nbytes=64), OpWork("unpack", nbytes=64)
    assert c.op_time(mm, "cpu") == pytest.approx(1e-4 + 9e-4 / 0.5)
    assert c.op_time(ew, "cpu") == pytest.approx(1e-4 + 9e-4 / 2.0)
    assert c.op_time(un, "cpu") == pytest.approx(1e-3)          # no unpack speed given: as calibrated
    assert ScaledCostModel(_Fixed(), {"unpack": 0.8}).op_time(un, "cpu") == pytest.approx(1e-4 + 9e-4 / 0.8)
    assert c.op_time(OpWork("attention", m=1, ctx=4, heads=1, head_dim=8), "cpu") == pytest.approx(1e-4 + 9e-4 / 2)
    assert c.copy_time(1000) == pytest.approx(1e-6) and c.dram_bytes(mm, "cpu") == _Fixed().dram_bytes(mm, "cpu")
    assert ScaledCostModel(_Fixed(), {}).op_time(mm, "cpu") == pytest.approx(1e-3)


@pytest.mark.parametrize("speeds", [{"gemm": 0.0}, {"gemm": -1.0}, {"copy": 1.0}, {"gemm": True},
                                    {"elementwise": float("inf")}])
def test_bad_speeds_are_refused(speeds):
    with pytest.raises(ValueError, match="speed"):
        ScaledCostModel(_Fixed(), speeds)


def test_a_multi_threaded_gemm_takes_the_2_thread_speed_when_one_was_measured():
    mm = OpWork("matmul", m=4, k=8, n=8)
    c = ScaledCostModel(_Fixed(), {"gemm": 1.0, "gemm_mt": 0.5, "elementwise": 2.0})
    assert c.op_time(mm, "cpu", threads=1) == pytest.approx(1e-3)                 # one thread: the 1-thread speed
    assert c.op_time(mm, "cpu", threads=2) == pytest.approx(1e-4 + 9e-4 / 0.5)
    assert c.op_time(OpWork("elementwise", nbytes=64), "cpu", threads=2) == pytest.approx(1e-4 + 9e-4 / 2.0)
    only_1 = ScaledCostModel(_Fixed(), {"gemm": 0.5})                              # no 2-thread probe: gemm's speed
    assert only_1.op_time(mm, "cpu", threads=2) == pytest.approx(1e-4 + 9e-4 / 0.5)


def test_reads_at_a_measured_speed_scale_the_device_rates_not_the_kernels():
    from planner.cost.scaled import at_read_speed
    from planner.device import SocProfile
    from sim.coldstart.sweep import load_conf

    base = dataclasses.replace(load_conf("device", "xiaomi15pro", SocProfile), flash_peak_gbps=4.0,
                               flash_reader_gbps=3.0, read_cpu_gbps=20.0)
    d, rest = at_read_speed(base, {"read": 0.5, "read_cpu": 0.8, "gemm": 0.9})
    assert (d.flash_peak_gbps, d.flash_reader_gbps, d.read_cpu_gbps) == pytest.approx((2.0, 1.5, 16.0))
    assert rest == {"gemm": 0.9}
    assert at_read_speed(base, {"gemm": 1.2}) == (base, {"gemm": 1.2})       # no read speed: the same profile
    with pytest.raises(ValueError, match="speed of read"):
        at_read_speed(base, {"read": 0.0})
