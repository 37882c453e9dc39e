"""Shared cores: a plan with more runnable threads than cores takes longer (docs/coldstart.md "Shared resources")."""
import dataclasses

import pytest
import simpy

from planner.plan import OpWork, Plan, PlanBuilder
from sim.executor import simulate
from sim.sharing import Cores, SharedRate
from tests.sim.helpers import FakeCost, xiaomi


def unpack_plan(n: int, seconds: float = 1.0) -> Plan:
    b = PlanBuilder()
    for i in range(n):
        b.add(f"unpack{i}", "unpack", works=[OpWork("unpack", n=seconds)])   # type: ignore[arg-type]
    return Plan("t", "m", "d", 1, 0, b.tasks, unpack_threads=n)


def device(cores: int, **kw):
    return dataclasses.replace(xiaomi(), cpu_big_cores=cores, cpu_little_cores=0, **kw)


@pytest.mark.parametrize("threads,cores,want", [(3, 2, 1.5), (3, 4, 1.0), (2, 2, 1.0), (4, 1, 4.0)])
def test_threads_beyond_cores_share_them(threads, cores, want):
    tl = simulate(unpack_plan(threads), device(cores), FakeCost())
    assert tl.end_s == pytest.approx(want)


def test_npu_stand_in_occupies_a_core_only_when_it_is_one():
    b = PlanBuilder()
    b.add("u", "unpack", works=[OpWork("unpack", n=1.0)])                    # type: ignore[arg-type]
    b.add("m", "npu", works=[OpWork("matmul", k=1.0, n=5.0)])                # type: ignore[arg-type]
    plan = Plan("t", "m", "d", 1, 0, b.tasks)
    assert simulate(plan, device(1), FakeCost()).end_s == pytest.approx(1.0)            # a real NPU: in parallel
    assert simulate(plan, device(1, npu_on_cpu_core=True), FakeCost()).end_s == pytest.approx(2.0)   # one core


def test_read_cpu_work_overlaps_the_transfer_and_competes_for_cores():
    b = PlanBuilder()
    b.add("ld", "load", read_bytes=10**9, request_bytes=1 << 23)
    b.add("u", "unpack", works=[OpWork("unpack", n=1.0)])                    # type: ignore[arg-type]
    plan = Plan("t", "m", "d", 1, 0, b.tasks)
    fast = simulate(plan, device(1), FakeCost())
    copy = simulate(plan, device(1, read_cpu_gbps=1.0), FakeCost())   # 1 s of CPU work for 1 GB, one core
    ld = lambda tl: next(s for s in tl.spans if s.task == 0)           # noqa: E731
    assert ld(copy).end - ld(copy).start > ld(fast).end - ld(fast).start
    assert copy.end_s == pytest.approx(2.0, rel=1e-6)                  # 1 s read-copy + 1 s unpack on one core


def test_weighted_water_filling():
    env = simpy.Environment()
    r = SharedRate(env, 10.0)
    done = {}
    for name, amount, cap in (("a", 2.0, 1.0), ("b", 18.0, 100.0)):
        ev = r.use(amount, cap)
        ev.callbacks.append(lambda _e, n=name: done.setdefault(n, env.now))
    env.run()
    assert done["a"] == pytest.approx(2.0)          # capped at 1/s
    assert done["b"] == pytest.approx(2.0)          # 9/s while a runs, then alone: 18 = 9*2
    c = Cores(simpy.Environment(), 2)
    assert c.capacity == 2


def test_overlapping_ops_share_dram_bandwidth():
    b = PlanBuilder()
    for i in range(2):   # each: 1 s alone, 10 GB of DRAM traffic (5 GB written + 5 GB read) -> demand 10 GB/s
        b.add(f"u{i}", "unpack", works=[OpWork("unpack", n=1.0, nbytes=5 * 10**9)])   # type: ignore[arg-type]
    plan = Plan("t", "m", "d", 1, 0, b.tasks, unpack_threads=2)
    assert simulate(plan, device(2), FakeCost()).end_s == pytest.approx(1.0)                   # not modelled
    assert simulate(plan, device(2, dram_gbps=40.0), FakeCost()).end_s == pytest.approx(1.0)   # enough for both
    assert simulate(plan, device(2, dram_gbps=15.0), FakeCost()).end_s == pytest.approx(20 / 15)   # 7.5 GB/s each
