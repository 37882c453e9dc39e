"""Cold-start simulator benchmarks (`make bench`): wall time of one Llama3-8B cold start with a 1086-token prompt per
framework, and of the full sweep (5 frameworks x 5 workloads x 4 bit budgets). Ratios are against a baseline measured
in the same run: a bare SimPy loop with as many timeouts as the plan has tasks (the floor of any SimPy executor).
Bit allocations of the quantizer twin are computed (and cached) before timing: they are an offline step.
Writes outputs/bench/sim_coldstart.json and outputs/bench/coldstart_sweep.{json,md}."""
from __future__ import annotations

import time
from pathlib import Path

import pytest
import simpy

from quant.atomic import atomic_write_json, atomic_write_text

OUT = Path(__file__).resolve().parents[2] / "outputs" / "bench"


def _best(fn, reps=3):
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        r = fn()
        best = min(best, time.perf_counter() - t)
    return best, r


def _bare_simpy(n):
    env = simpy.Environment()

    def p():
        for _ in range(n):
            yield env.timeout(1e-3)
    env.process(p())
    env.run()


@pytest.mark.bench
def test_bench_one_cold_start_1086_tokens():
    from planner.cost import AnalyticCostModel
    from planner.device import SocProfile
    from planner.formats import model_bits
    from planner.framework import FrameworkSpec
    from quant.arch import ModelSpec
    from sim.coldstart import ColdStartInputs, run_coldstart
    from sim.coldstart.sweep import ALL_FRAMEWORKS, load_conf

    spec, dev = load_conf("model", "llama3_8b", ModelSpec), load_conf("device", "xiaomi15pro", SocProfile)
    model_bits(spec, 5.0)                                    # warm the twin-allocation cache (offline step)
    rows = []
    for name in ALL_FRAMEWORKS:
        fw = load_conf("framework", name, FrameworkSpec)
        x = ColdStartInputs(spec, dev, fw, AnalyticCostModel(dev), 1086, 5.0)
        wall, (plan, tl, m) = _best(lambda: run_coldstart(x))
        base, _ = _best(lambda: _bare_simpy(len(plan.tasks)))
        rows.append(dict(framework=name, tasks=len(plan.tasks), wall_s=wall, bare_simpy_s=base,
                         ratio_vs_bare=wall / base, ttft_s=m["ttft_s"]))
    print("\nframework     tasks  wall s  bare-SimPy s  ratio  (simulated TTFT s)")
    for r in rows:
        print(f"{r['framework']:12s} {r['tasks']:6d} {r['wall_s']:7.3f} {r['bare_simpy_s']:12.4f} "
              f"{r['ratio_vs_bare']:6.1f}  ({r['ttft_s']:.2f})")
    atomic_write_json(OUT / "sim_coldstart.json", {"prompt_tokens": 1086, "rows": rows,
                                                   "measured_keys": ["wall_s", "bare_simpy_s", "ratio_vs_bare"],
                                                   "modelled_keys": ["ttft_s"]})
    assert all(r["wall_s"] > 0 for r in rows)


@pytest.mark.bench
def test_bench_full_sweep():
    from planner.formats import model_bits
    from quant.arch import ModelSpec
    from sim.coldstart.sweep import BITS, MAIN_FRAMEWORKS, WORKLOADS, load_conf, markdown_table, sweep

    spec = load_conf("model", "llama3_8b", ModelSpec)
    t = time.perf_counter()
    for b in BITS:
        model_bits(spec, b)
    alloc_s = time.perf_counter() - t
    one, _ = _best(lambda: sweep(frameworks=["edgeflow"], workloads=["hellaswag"], bits=[5.0]), reps=2)
    t = time.perf_counter()
    rows = sweep(frameworks=MAIN_FRAMEWORKS, workloads=WORKLOADS, bits=BITS)
    wall = time.perf_counter() - t
    n = len(rows)
    print(f"\nsweep: {n} runs ({len(MAIN_FRAMEWORKS)} frameworks x {len(WORKLOADS)} workloads x {len(BITS)} bits) "
          f"in {wall:.2f} s = {wall / n * 1e3:.1f} ms/run; one EdgeFlow HellaSwag run {one * 1e3:.1f} ms "
          f"(sweep / (n x one) = {wall / (n * one):.2f}); twin allocations (cached) {alloc_s:.2f} s")
    md = []
    for b in BITS:
        sub = [r for r in rows if r["bits"] == b]
        md.append(f"### bits = {b:g}\n\n" + markdown_table(sub))
    text = "\n\n".join(md)
    print(text)
    atomic_write_text(OUT / "coldstart_sweep.md", text + "\n")
    atomic_write_json(OUT / "coldstart_sweep.json", {"wall_s": wall, "runs": n, "one_run_s": one, "rows": rows,
                                                     "measured_keys": ["wall_s", "one_run_s"],
                                                     "modelled_keys": ["rows (every number: simulated)"]})
    assert n == len(MAIN_FRAMEWORKS) * len(WORKLOADS) * len(BITS)
