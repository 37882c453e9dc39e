"""Critical-path attribution on hand-built timelines whose path and attribution are known, ties included, and on a
simulated cold start (every second of the TTFT attributed; the prefill window is the metrics' prefill_s)."""
import pytest

from planner.critical_path import CATEGORIES, critical_path
from planner.plan import Plan, Task
from planner.timeline import Span, Timeline

UNIT = {"load": "io", "unpack": "cpu", "cpu": "cpu", "npu": "npu", "graph": "graph"}


def timeline(tasks, spans, end_s=None, source="modelled"):
    """tasks: (resource, phase, deps); spans: (task, start, end[, worker[, cpu_s[, stolen]]])."""
    plan = Plan("t", "m", "d", 8, 8, [Task(id=i, name=f"t{i}", resource=r, phase=p, deps=list(d))
                                      for i, (r, p, d) in enumerate(tasks)], loader_threads=2)
    out = []
    for sp in spans:
        tid, a, b, w, cpu_s, stolen = (tuple(sp) + (0, 0.0, False)[len(sp) - 3:])[:6]
        res = "cpu" if stolen else plan.tasks[tid].resource
        out.append(Span(tid, res, w, a, b, "cpu" if stolen else UNIT[plan.tasks[tid].resource], stolen, cpu_s))
    end = max(s.end for s in out) if end_s is None else end_s
    return Timeline(plan, out, end, 0, 0, source=source)


def secs(cp, phase):
    return {k: round(v, 9) for k, v in cp.phases[phase].seconds.items() if v}


def test_chain_with_gap_sharing_and_phases():
    tl = timeline([("load", "load", ()), ("unpack", "unpack", (0,)), ("npu", "prefill", (1,))],
                  [(0, 0.0, 2.0), (1, 2.0, 3.0, 0, 0.5), (2, 3.5, 5.0)])
    cp = critical_path(tl)
    assert cp.tasks == [0, 1, 2]
    assert secs(cp, "total") == {"flash": 2.0, "unpack": 0.5, "sharing": 0.5, "idle": 0.5, "npu": 1.5}
    assert secs(cp, "load") == {"flash": 2.0, "unpack": 0.5, "sharing": 0.5, "idle": 0.5}
    assert secs(cp, "prefill") == {"npu": 1.5}
    assert (cp.phases["load"].bound, cp.phases["prefill"].bound, cp.phases["total"].bound) == ("flash", "npu",
                                                                                                "flash")
    assert cp.phases["prefill"].start == 3.5 and cp.phases["prefill"].share["npu"] == 1.0
    segs = cp.segments
    assert segs[0].start == 0.0 and segs[-1].end == 5.0
    assert all(a.end == b.start for a, b in zip(segs, segs[1:]))


def test_worker_predecessor_when_the_worker_was_busy():
    # t2 needs t0's weights (done at 1 s) but the NPU is running t1 until 3 s: t1 is critical, not the load
    tl = timeline([("load", "load", ()), ("npu", "prefill", ()), ("npu", "prefill", (0,))],
                  [(0, 0.0, 1.0), (1, 0.0, 3.0), (2, 3.0, 4.0)])
    cp = critical_path(tl)
    assert cp.tasks == [1, 2] and secs(cp, "total") == {"npu": 4.0}
    assert cp.phases["load"].span_s == 0.0 and cp.phases["load"].bound == ""


def test_dependency_when_it_finished_last():
    tl = timeline([("load", "load", ()), ("npu", "prefill", ()), ("npu", "prefill", (0,))],
                  [(0, 0.0, 3.0), (1, 0.0, 1.0), (2, 3.0, 4.0)])
    cp = critical_path(tl)
    assert cp.tasks == [0, 2] and secs(cp, "total") == {"flash": 3.0, "npu": 1.0}


def test_tie_between_dependency_and_worker_goes_to_the_dependency():
    tl = timeline([("graph", "graph", ()), ("npu", "prefill", ()), ("npu", "prefill", (0,))],
                  [(0, 0.0, 2.0), (1, 0.0, 2.0), (2, 2.0, 3.0)])
    assert critical_path(tl).tasks == [0, 2]


def test_tie_between_dependencies_goes_to_the_later_task():
    tl = timeline([("load", "load", ()), ("load", "load", ()), ("unpack", "unpack", (0, 1))],
                  [(0, 0.0, 2.0 + 1e-12, 0), (1, 0.0, 2.0, 1), (2, 2.0 + 1e-12, 3.0)])
    assert critical_path(tl).tasks == [1, 2]         # t0 ends 1e-12 s later: a tie (float rounding), not a cause
    tl = timeline([("load", "load", ()), ("load", "load", ()), ("unpack", "unpack", (0, 1))],
                  [(0, 0.0, 2.5, 0), (1, 0.0, 2.0, 1), (2, 2.5, 3.0)])
    assert critical_path(tl).tasks == [0, 2]         # not a tie: the later finisher wins whatever its id


def test_joins_are_walked_through_and_stolen_ops_count_as_cpu():
    # restore (graph, 0-2) and load (0-1) join into "layer ready"; the stolen NPU op waits for it
    tl = timeline([("load", "load", ()), ("graph", "graph", ()), ("join", "", (0, 1)), ("npu", "prefill", (2,))],
                  [(0, 0.0, 1.0), (1, 0.0, 2.0), (3, 2.25, 3.0, 0, 0.0, True)])
    cp = critical_path(tl)
    assert cp.tasks == [1, 3]
    assert secs(cp, "total") == {"graph": 2.0, "idle": 0.25, "cpu": 0.75}
    assert cp.phases["prefill"].start == 2.25


def test_idle_before_the_first_task_and_after_the_last():
    tl = timeline([("npu", "prefill", ())], [(0, 1.0, 2.0)], end_s=2.5, source="measured")
    cp = critical_path(tl)
    assert secs(cp, "total") == {"idle": 1.5, "npu": 1.0}
    assert sum(cp.phases["total"].seconds.values()) == pytest.approx(2.5)
    assert set(cp.phases["total"].seconds) == set(CATEGORIES)


def test_a_dependency_overlapping_its_successor_is_cut_not_counted_twice():
    # measured clocks: the dependency's recorded end is 1 ms after the successor's start
    tl = timeline([("load", "load", ()), ("npu", "prefill", (0,))], [(0, 0.0, 1.001), (1, 1.0, 2.0)])
    cp = critical_path(tl)
    assert secs(cp, "total") == {"flash": 1.0, "npu": 1.0}


def test_bad_records_fail_with_one_line():
    tl = timeline([("npu", "prefill", ())], [(0, 0.0, 1.0), (0, 1.0, 2.0)])
    with pytest.raises(ValueError, match="more than one span"):
        critical_path(tl)
    tl.spans = []
    with pytest.raises(ValueError, match="no spans"):
        critical_path(tl)


@pytest.mark.parametrize("fw", ["llamacpp", "edgeflow"])
def test_simulated_cold_start_is_fully_attributed(fw):
    from planner.cost import make_cost_model
    from planner.framework import FrameworkSpec
    from quant.arch import ModelSpec
    from sim.coldstart import ColdStartInputs, run_coldstart
    from sim.coldstart.sweep import load_conf
    from tests.sim.helpers import xiaomi

    dev = xiaomi()
    x = ColdStartInputs(load_conf("model", "smollm2_135m", ModelSpec), dev, load_conf("framework", fw, FrameworkSpec),
                        make_cost_model("analytic", dev, ""), 40, 5.0, 0, "uniform", 0)
    _plan, tl, m = run_coldstart(x)
    cp = critical_path(tl)
    assert sum(cp.phases["total"].seconds.values()) == pytest.approx(m["ttft_s"], rel=1e-9)
    assert cp.phases["prefill"].span_s == pytest.approx(m["prefill_s"], rel=1e-9)
    for p in ("load", "prefill"):
        assert sum(cp.phases[p].seconds.values()) == pytest.approx(cp.phases[p].span_s, abs=1e-9)
    assert tl.plan.tasks[cp.tasks[-1]].name == "lm_head"
    doc = cp.to_json()
    assert doc["total"]["bound"] in CATEGORIES and doc["path_tasks"] == len(cp.tasks)


def test_measured_cold_start_is_fully_attributed(tmp_path):
    """The HIL runner's record of a real cold start (tiny model on this host) reads the same way."""
    import numpy as np

    from hil.runner import run_plan
    from tests.hil.tinymodel import bound_plan, tiny_spec, write_tiny

    spec = tiny_spec()
    path = write_tiny(tmp_path, spec, "weightlet")
    plan = bound_plan("edgeflow", spec, path, 20, chunk=8)
    tl = run_plan(plan, path, np.random.default_rng(3).integers(0, spec.vocab, 20), spec=spec).timeline
    assert tl.source == "measured"
    cp = critical_path(tl)
    assert sum(cp.phases["total"].seconds.values()) == pytest.approx(tl.end_s, rel=1e-9)
    assert plan.tasks[cp.tasks[-1]].name == "lm_head"
    assert all(a.end <= b.start + 1e-12 for a, b in zip(cp.segments, cp.segments[1:]))
