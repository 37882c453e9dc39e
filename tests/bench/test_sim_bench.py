"""Cold-start simulator benchmarks (`make bench`): wall time of one Llama3-8B cold start with a 1086-token prompt per
framework, and of the full sweep (5 frameworks x 5 workloads x 4 bit budgets). Ratios are against a baseline measured
in the same run: a bare SimPy loop with as many timeouts as the plan has tasks (the floor of any SimPy executor); the
same loop on the simulator's own event core (`sim.engine`, SimPy's event order) is printed beside it.
Bit allocations of the quantizer twin are computed (and cached) before timing: they are an offline step.
`test_bench_against_the_baseline_simulator` times the simulator of a recorded commit (BASELINE, before its hot path
was made lean) against this tree's (compiled where setup.py built its hot modules: docs/coldstart.md "Benchmarks"),
interleaved in one run.
Writes outputs/bench/sim_coldstart.json, sim_vs_baseline.json and coldstart_sweep.{json,md}."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import pytest
import simpy

from quant.atomic import atomic_write_json, atomic_write_text

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "outputs" / "bench"
# the simulator before its hot path was made lean (no per-event closures or condition values, sorts only where the
# order can change): same events, same results, the reference for the speed-up
BASELINE = "8bf73cdba50b73ca4d817b4e27701074440213e5"


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


def _bare_engine(n):
    from sim.engine import Environment

    env = Environment()

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
        core, _ = _best(lambda: _bare_engine(len(plan.tasks)))
        rows.append(dict(framework=name, tasks=len(plan.tasks), wall_s=wall, bare_simpy_s=base, bare_engine_s=core,
                         ratio_vs_bare=wall / base, ttft_s=m["ttft_s"]))
    print("\nframework     tasks  wall s  bare-SimPy s  bare-engine s  ratio  (simulated TTFT s)")
    for r in rows:
        print(f"{r['framework']:12s} {r['tasks']:6d} {r['wall_s']:7.3f} {r['bare_simpy_s']:12.4f} "
              f"{r['bare_engine_s']:13.4f} {r['ratio_vs_bare']:6.1f}  ({r['ttft_s']:.2f})")
    atomic_write_json(OUT / "sim_coldstart.json", {"prompt_tokens": 1086, "rows": rows,
                                                   "measured_keys": ["wall_s", "bare_simpy_s", "bare_engine_s",
                                                                     "ratio_vs_bare"],
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


# One simulator in its own process (its source tree first on sys.path): builds the EdgeFlow 1086-token plan once, then
# times one `simulate` per "run" line read from stdin and answers with a JSON line.
_TIMER = r"""
import json, sys, time
sys.path.insert(0, sys.argv[1])
from planner.cost import AnalyticCostModel
from planner.device import SocProfile
from planner.framework import FrameworkSpec
from quant.arch import ModelSpec
from sim.coldstart import POLICIES, ColdStartInputs
from sim.coldstart.sweep import load_conf
import sim, sim.executor
spec, dev = load_conf("model", "llama3_8b", ModelSpec), load_conf("device", "xiaomi15pro", SocProfile)
fw = load_conf("framework", "edgeflow", FrameworkSpec)
x = ColdStartInputs(spec, dev, fw, AnalyticCostModel(dev), 1086, 5.0)
plan = POLICIES[fw.policy]().build(x)
print(json.dumps({"ready": sim.executor.__file__, "compiled": getattr(sim, "COMPILED", False)}), flush=True)
for line in sys.stdin:
    if line.strip() != "run":
        break
    t = time.perf_counter()
    tl = sim.executor.simulate(plan, dev, x.cost)
    wall = time.perf_counter() - t
    print(json.dumps({"wall_s": wall, "end_s": repr(tl.end_s), "tasks": len(plan.tasks)}), flush=True)
"""


class _Timer:
    """A `_TIMER` process over the source tree `root`."""

    def __init__(self, root: Path) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", _TIMER, str(root)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, cwd=root)
        ready = json.loads(self.proc.stdout.readline() or "{}")
        assert Path(ready.get("ready", "")).is_relative_to(root), f"the simulator of {root} did not load: {ready}"
        self.compiled = ready["compiled"]          # its hot modules run compiled (setup.py, planner.use_compiled)

    def run(self) -> dict:
        self.proc.stdin.write("run\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _export(commit: str, dest: Path) -> None:
    """The tree of `commit` (committed files only) into `dest`."""
    data = subprocess.run(["git", "archive", "--format=tar", commit], cwd=ROOT, check=True,
                          capture_output=True).stdout
    with tempfile.TemporaryFile() as f:
        f.write(data)
        f.seek(0)
        with tarfile.open(fileobj=f) as tar:
            tar.extractall(dest, filter="data")


@pytest.mark.bench
def test_bench_against_the_baseline_simulator():
    """EdgeFlow, Llama3-8B, 1086-token prompt, xiaomi15pro (shared cores and DRAM modelled): wall time of `simulate`
    for the BASELINE commit's simulator and this tree's, one run each in turn (interleaved, so both see the same load
    on a shared machine), best of REPS each; both must simulate the same TTFT to the last bit."""
    reps = int(os.environ.get("EDGELLM_BENCH_REPS", "7"))
    if subprocess.run(["git", "cat-file", "-e", f"{BASELINE}^{{commit}}"], cwd=ROOT, capture_output=True).returncode:
        pytest.skip(f"baseline commit {BASELINE[:10]} is not in this clone (a shallow clone?)")
    with tempfile.TemporaryDirectory(prefix="edgellm-baseline-") as tmp:      # removed on every exit path
        base_root = Path(tmp)
        _export(BASELINE, base_root)
        timers = {"baseline": _Timer(base_root)}
        try:
            timers["current"] = _Timer(ROOT)
            walls: dict[str, list[float]] = {k: [] for k in timers}
            ends = {}
            load = [os.getloadavg()]
            for _ in range(reps):
                for name, tm in timers.items():
                    r = tm.run()
                    walls[name].append(r["wall_s"])
                    ends[name] = r["end_s"]
                    tasks = r["tasks"]
            load.append(os.getloadavg())
        finally:
            for tm in timers.values():
                tm.close()
    best = {k: min(v) for k, v in walls.items()}
    ratio = best["baseline"] / best["current"]
    compiled = timers["current"].compiled
    print(f"\nEdgeFlow 1086-token cold start ({tasks} tasks), best of {reps} interleaved: baseline {BASELINE[:10]} "
          f"{best['baseline']:.3f} s, current ({'compiled' if compiled else 'Python sources'}) "
          f"{best['current']:.3f} s, speed-up x{ratio:.2f}; "
          f"load average (1/5/15 min) before {load[0][0]:.2f}/{load[0][1]:.2f}/{load[0][2]:.2f}, "
          f"after {load[1][0]:.2f}/{load[1][1]:.2f}/{load[1][2]:.2f}; simulated TTFT {ends['current']} s")
    atomic_write_json(OUT / "sim_vs_baseline.json", {
        "baseline": BASELINE, "tasks": tasks, "reps": reps, "compiled": compiled, "walls_s": walls, "best_s": best,
        "speedup": ratio, "loadavg_before": load[0], "loadavg_after": load[1], "ttft_s": float(ends["current"]),
        "measured_keys": ["walls_s", "best_s", "speedup", "loadavg_before", "loadavg_after"],
        "modelled_keys": ["ttft_s"]})
    assert ends["baseline"] == ends["current"], "the simulators disagree on the TTFT"
