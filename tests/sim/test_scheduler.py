"""Plan executor / granular pipeline scheduler on tiny DAGs: priority order, stealing only above the threshold,
dependency order, no resource double-booked, determinism, deadlock detection; and on Llama3-8B that each pipeline
mechanism shrinks what it targets."""
from collections import defaultdict

import pytest

from planner.plan import Plan, PlanBuilder, SchedulePolicy
from sim.executor import simulate
from tests.sim.helpers import FakeCost, w, xiaomi


def _plan(b, priority="static", thr=0, cpu_threads=1):
    return Plan(framework="t", model="m", device="d", prompt_tokens=1, chunk_tokens=1, tasks=b.tasks,
                cpu_threads=cpu_threads, schedule=SchedulePolicy(priority=priority, steal_threshold=thr))


def _order(tl, resource):
    return [tl.plan.tasks[s.task].name for s in sorted(tl.spans, key=lambda s: s.start) if s.resource == resource]


def _two_chunk_plan():
    """Gate holds the NPU until t=1; then both chunks' matmuls are ready. Static order: layer-major (chunk 1's
    layer-0 op first); position priority: chunk 0's layer-1 op first."""
    b = PlanBuilder()
    g = b.add("gate", "graph", duration_s=1.0)
    b.add("c1.L0", "npu", [g], layer=0, chunk=1, order=0, works=w(1, 5))
    b.add("c0.L1", "npu", [g], layer=1, chunk=0, order=1, works=w(1, 5))
    return b


def test_static_backbone_follows_order():
    tl = simulate(_plan(_two_chunk_plan(), "static"), xiaomi(), FakeCost())
    assert _order(tl, "npu") == ["c1.L0", "c0.L1"]


def test_position_priority_runs_earlier_chunk_first():
    tl = simulate(_plan(_two_chunk_plan(), "position"), xiaomi(), FakeCost())
    assert _order(tl, "npu") == ["c0.L1", "c1.L0"]


def test_static_unit_waits_for_its_next_op():
    # NPU op with order 0 becomes ready late; order 1 is ready at once but must wait (in-order backbone).
    b = PlanBuilder()
    g = b.add("slow", "graph", duration_s=2.0)
    b.add("first", "npu", [g], order=0, works=w(1, 1))
    b.add("second", "npu", [], order=1, works=w(1, 1))
    tl = simulate(_plan(b, "static"), xiaomi(), FakeCost())
    start = {tl.plan.tasks[s.task].name: s.start for s in tl.spans}
    assert start["second"] == pytest.approx(3.0)
    tl = simulate(_plan(b, "position"), xiaomi(), FakeCost())
    start = {tl.plan.tasks[s.task].name: s.start for s in tl.spans}
    assert start["second"] == pytest.approx(0.0)


def _queue_plan(n):
    """n stealable NPU matmuls ready at once after a CPU op; CPU is idle afterwards."""
    b = PlanBuilder()
    g = b.add("gate", "graph", duration_s=0.5)
    for i in range(n):
        b.add(f"mm{i}", "npu", [g], chunk=0, layer=i, order=i, works=w(1, 2), stealable=True)
    return b


@pytest.mark.parametrize("priority", ["static", "position"])
def test_steal_only_above_threshold(priority):
    n = 6      # the NPU takes mm0 at once, so at most n-1 ops wait in its queue
    at = simulate(_plan(_queue_plan(n), priority, thr=n - 1), xiaomi(), FakeCost())
    assert not any(s.stolen for s in at.spans)                     # n-1 waiting is not > n-1
    above = simulate(_plan(_queue_plan(n), priority, thr=n - 2), xiaomi(), FakeCost())
    stolen = [s for s in above.spans if s.stolen]
    assert stolen and all(s.resource == "cpu" for s in stolen)
    # the CPU takes the *head* of the NPU queue: the NPU starts with mm0, the CPU with mm1
    first = {s.resource: above.plan.tasks[s.task].name for s in sorted(above.spans, key=lambda s: -s.start)}
    assert first["cpu"] == "mm1" and first["npu"] == "mm0"
    assert above.end_s < at.end_s


def test_non_stealable_ops_stay_on_the_npu():
    b = PlanBuilder()
    for i in range(6):
        b.add(f"norm{i}", "npu", [], order=i, works=w(1, 1), stealable=False)
    tl = simulate(_plan(b, "position", thr=1), xiaomi(), FakeCost())
    assert not any(s.stolen for s in tl.spans)


def _check_schedule(tl):
    end = {s.task: s.end for s in tl.spans}
    start = {s.task: s.start for s in tl.spans}
    assert len(end) == len([t for t in tl.plan.tasks if t.resource != "join"])
    for t in tl.plan.tasks:                        # dependency order (joins are instantaneous)
        if t.id in start:
            for d in t.deps:
                if d in end:
                    assert start[t.id] >= end[d] - 1e-12, (t.name, tl.plan.tasks[d].name)
    busy = defaultdict(list)                       # no worker double-booked (stolen ops book the CPU)
    for s in tl.spans:
        busy[(s.resource, s.worker)].append((s.start, s.end))
    for key, iv in busy.items():
        iv.sort()
        for (a0, a1), (b0, b1) in zip(iv, iv[1:]):
            assert b0 >= a1 - 1e-12, key


def _llama_run(policy, tokens, dev=None):
    from planner.cost import AnalyticCostModel
    from planner.framework import FrameworkSpec
    from sim.coldstart import ColdStartInputs, run_coldstart
    from sim.coldstart.sweep import load_conf
    from tests.sim.helpers import llama

    fw = load_conf("framework", policy, FrameworkSpec)
    dev = dev or xiaomi()
    return run_coldstart(ColdStartInputs(llama(), dev, fw, AnalyticCostModel(dev), tokens, 5.0,
                                         bits_source="uniform"))


@pytest.mark.parametrize("policy", ["llmnpu_plus", "ef_pack", "ef_place", "edgeflow", "llamacpp"])
def test_real_plans_respect_dependencies_and_resources(policy):
    plan, tl, _m = _llama_run(policy, 300)
    _check_schedule(tl)
    # cores: unpack thread i runs on core i, the compute pool on [cpu_first_core, +cpu_threads): disjoint, all real
    unpack = {s.worker for s in tl.spans if s.resource == "unpack"}
    pool = set(range(plan.cpu_first_core, plan.cpu_first_core + plan.cpu_threads))
    assert not unpack & pool and max(pool | unpack) < xiaomi().cpu_cores


def test_deterministic():
    a = _llama_run("edgeflow", 300)[1]
    b = _llama_run("edgeflow", 300)[1]
    assert [(s.task, s.start, s.end, s.stolen) for s in a.spans] == [(s.task, s.start, s.end, s.stolen)
                                                                     for s in b.spans]


def test_deadlock_is_reported():
    b = PlanBuilder()
    x = b.add("x", "cpu", order=1, works=w(1, 1))
    b.add("y", "cpu", [x], order=0, works=w(1, 1))   # static order contradicts the dependency
    with pytest.raises(RuntimeError, match="deadlocked"):
        simulate(_plan(b, "static"), xiaomi(), FakeCost())


def test_each_pipeline_mechanism_shrinks_its_target():
    """HellaSwag-length prompt on Llama3-8B: + pipeline hides loading behind compute; + place shortens the NPU's
    busy time (NPU-inefficient ops move to the CPU); + priority cuts NPU bubbles; + steal cuts CPU bubbles; prefill
    time falls at every step up to priority. Stealing shortens prefill too when the CPU matmuls are as fast as the
    paper's threshold of 5 implies; with the profile's sourced (lower-bound) CPU GEMM rate the derived threshold is 10
    and stealing does not pay (docs/coldstart.md "Calibration"), so that step is checked at the paper's rate."""
    from dataclasses import replace

    from planner.cost import AnalyticCostModel
    from planner.pipeline.granular import matmul_time_ratio
    from tests.sim.helpers import llama

    m = {p: _llama_run(p, 1086)[2] for p in ("ef_pack", "ef_pipe", "ef_place", "ef_priority", "edgeflow")}
    assert m["ef_pipe"]["ttft_s"] < m["ef_pack"]["ttft_s"]
    assert m["ef_place"]["npu_busy_s"] < m["ef_pipe"]["npu_busy_s"]
    assert m["ef_priority"]["npu_bubble_rate"] < m["ef_place"]["npu_bubble_rate"]
    assert m["edgeflow"]["cpu_bubble_rate"] < m["ef_priority"]["cpu_bubble_rate"]
    pre = [m[p]["prefill_s"] for p in ("ef_pipe", "ef_place", "ef_priority")]
    assert pre == sorted(pre, reverse=True) and len(set(pre)) == 3
    assert m["edgeflow"]["stolen_ops"] > 0 and m["ef_priority"]["stolen_ops"] == 0
    dev = xiaomi()                  # CPU GEMM rate at which EdgeFlow's 3-thread pool derives the paper's threshold 5
    ratio = matmul_time_ratio(AnalyticCostModel(dev), llama(), 128, 3, 2)
    paper = replace(dev, cpu_int8_gemm_gops_per_ghz=dev.cpu_int8_gemm_gops_per_ghz * ratio / 5)
    prio = _llama_run("ef_priority", 1086, paper)[2]
    plan, _tl, steal = _llama_run("edgeflow", 1086, paper)
    assert plan.schedule.steal_threshold == 5 and steal["stolen_ops"] > 0
    assert steal["prefill_s"] < prio["prefill_s"] and steal["cpu_bubble_rate"] < prio["cpu_bubble_rate"]


def test_trace_has_one_track_per_worker_without_overlaps():
    from sim.trace import timeline_trace

    _p, tl, _m = _llama_run("edgeflow", 200)
    doc = timeline_trace(tl)
    names = {e["tid"]: e["args"]["name"] for e in doc["traceEvents"] if e.get("name") == "thread_name"}
    assert {"load-0", "load-1", "unpack-0", "unpack-1", "graph", "cpu", "npu", "flash GB/s",
            "memory GB"} <= set(
        names.values())
    by_track = defaultdict(list)
    for e in doc["traceEvents"]:
        if e["ph"] == "X":
            by_track[e["tid"]].append((e["ts"], e["ts"] + e["dur"]))
    for tid, iv in by_track.items():
        iv.sort()
        assert all(b0 >= a1 - 1e-3 for (a0, a1), (b0, b1) in zip(iv, iv[1:])), names[tid]
