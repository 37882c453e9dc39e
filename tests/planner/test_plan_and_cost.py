"""Plan objects (JSON round trip, validation), cost-model back-ends, weight formats, operator DAG, prefill expansion
and the stealing-threshold derivation."""
import json
from dataclasses import replace

import networkx as nx
import numpy as np
import pytest

from planner.cost import AnalyticCostModel, TableCostModel, make_cost_model
from planner.formats import (
    GGML_BPW,
    bits_histogram,
    ggml_type_for_budget,
    tensor_nbytes,
    uniform_bits,
    unpack_work,
    weightlets,
)
from planner.framework import FrameworkSpec
from planner.pipeline.builder import add_prefill, chunks
from planner.pipeline.dag import MATMULS, layer_dag, place_coarse, place_fine
from planner.pipeline.granular import matmul_time_ratio, steal_threshold
from planner.plan import OpWork, Plan, PlanBuilder, SchedulePolicy, Task
from planner.workload import WorkloadSpec
from tests.sim.helpers import llama, xiaomi


def test_plan_json_round_trip():
    from sim.coldstart import POLICIES, ColdStartInputs

    dev = xiaomi()
    fw = FrameworkSpec(name="edgeflow", policy="edgeflow")
    plan = POLICIES["edgeflow"]().build(ColdStartInputs(llama(), dev, fw, AnalyticCostModel(dev), 200, 5.0,
                                                        bits_source="uniform"))
    text = plan.to_json()
    back = Plan.from_json(text)
    assert back == plan and json.loads(text)["schedule"]["steal_threshold"] == plan.schedule.steal_threshold >= 1


def test_plan_validation():
    with pytest.raises(ValueError, match="unknown resource"):
        Task(id=0, name="x", resource="gpu")
    with pytest.raises(ValueError, match="read_bytes > 0 needs request_bytes > 0"):   # else 1-byte flash requests
        Task(id=0, name="x", resource="load", read_bytes=1 << 20)
    with pytest.raises(ValueError, match="duration_s must be >= 0"):
        Task(id=0, name="x", resource="graph", duration_s=-1.0)
    with pytest.raises(ValueError, match="must precede"):
        Plan("f", "m", "d", 1, 1, [Task(id=0, name="a", resource="cpu", deps=[1]),
                                    Task(id=1, name="b", resource="cpu")])
    with pytest.raises(ValueError, match="schedule.priority"):
        SchedulePolicy(priority="lifo")
    with pytest.raises(ValueError, match="workload.length"):
        WorkloadSpec(name="w", min_tokens=1, max_tokens=2, length="avg")
    with pytest.raises(ValueError, match="device.flash_reader_gbps"):
        replace(xiaomi(), flash_reader_gbps=99.0)


def test_workload_lengths():
    w = WorkloadSpec(name="hellaswag", min_tokens=883, max_tokens=1086)
    assert w.prompt_tokens == 985 and replace(w, length="max").prompt_tokens == 1086


# ---- cost models -------------------------------------------------------------------------------------------------
def test_analytic_npu_roofline_and_inefficient_ops():
    dev = xiaomi()
    c = AnalyticCostModel(dev)
    big = OpWork("matmul", m=512, k=4096, n=14336)
    assert c.op_time(big, "npu") == pytest.approx(big.flops / (dev.npu_int8_tops * 1e12) + dev.npu_dispatch_s)
    head = OpWork("lm_head", m=1, k=4096, n=128256)     # one token: weight streaming bound
    assert c.op_time(head, "npu") == pytest.approx(4096 * 128256 / (dev.npu_weight_gbps * 1e9) + dev.npu_dispatch_s)
    norm = OpWork("elementwise", m=128, nbytes=4 * 128 * 4096)
    assert c.op_time(norm, "npu") == pytest.approx(c.op_time(norm, "cpu") * 2.1 + dev.npu_dispatch_s)


def test_analytic_cpu_threads_and_formats():
    c = AnalyticCostModel(xiaomi())
    mm = OpWork("matmul", m=128, k=4096, n=4096)
    assert c.op_time(mm, "cpu", 4) < c.op_time(mm, "cpu", 1) / 3
    kq = OpWork(**{**vars(mm), "wfmt": "kquant"})
    assert c.op_time(kq, "cpu", 4) > c.op_time(mm, "cpu", 4)
    with pytest.raises(ValueError, match="exceed"):
        c.op_time(mm, "cpu", 9)


def test_table_regression_recovers_linear_profile_and_falls_back(tmp_path):
    pts = [{"unit": "cpu", "kind": "matmul", "work": f, "seconds": 1e-4 + f / 5e10} for f in (1e8, 1e9, 4e9)]
    pts.append({"unit": "cpu", "kind": "copy", "work": 1e9, "seconds": 0.2})
    p = tmp_path / "prof.json"
    p.write_text(json.dumps({"points": pts}))
    dev = xiaomi()
    t = make_cost_model("table", dev, str(p))
    mm = OpWork("matmul", m=100, k=1000, n=1000)
    assert t.op_time(mm, "cpu") == pytest.approx(1e-4 + mm.flops / 5e10)
    assert t.fitted_kinds() == [("cpu", "copy"), ("cpu", "matmul")]
    assert t.copy_time(2e9) == pytest.approx(0.4)
    att = OpWork("attention", m=10, ctx=10, heads=2, head_dim=8)
    assert t.op_time(att, "cpu", 2) == AnalyticCostModel(dev).op_time(att, "cpu", 2)
    with pytest.raises(KeyError, match="no measured profile"):
        TableCostModel(pts).op_time(att, "cpu")
    with pytest.raises(ValueError, match="point 0"):
        TableCostModel([{"unit": "cpu"}])
    # a fit belongs to the thread count it was measured with (1 by default): the 4-thread pool falls back
    assert t.op_time(mm, "cpu", 4) == AnalyticCostModel(dev).op_time(mm, "cpu", 4)
    t4 = TableCostModel([{**q, "threads": 4, "seconds": q["seconds"] / 3} for q in pts[:3]])
    assert t4.op_time(mm, "cpu", 4) == pytest.approx((1e-4 + mm.flops / 5e10) / 3)
    p.write_text(json.dumps([1, 2]))
    with pytest.raises(ValueError, match="expected"):
        make_cost_model("table", dev, str(p))
    with pytest.raises(FileNotFoundError):
        make_cost_model("table", dev, str(tmp_path / "missing.json"))


# elementwise points of a host calibration (native.compute rmsnorm / quantize / dequant / rope /
# silu_mul / add at M in {1, 16, 128}, d in {576, 2048}): (bytes, microseconds)
ELEMENTWISE_US = [(6912, 9.6), (2880, 6.7), (6912, 8.8), (4864, 7.7), (18432, 8.1), (6912, 7.5), (76032, 10.4),
                  (46080, 7.8), (76032, 10.4), (77824, 8.7), (294912, 17.7), (110592, 8.3), (592128, 21.7),
                  (368640, 14.6), (592128, 15.2), (622592, 14.5), (2359296, 93.7), (884736, 18.7), (24576, 8.4),
                  (10240, 6.6), (24576, 8.8), (16640, 7.7), (66048, 9.4), (24576, 7.4), (270336, 13.5),
                  (163840, 10.2), (270336, 11.0), (266240, 10.5), (1056768, 46.4), (393216, 11.1), (2105344, 50.7),
                  (1310720, 39.1), (2105344, 37.4), (2129920, 35.4), (8454144, 300.1), (3145728, 42.3)]


def test_table_fit_keeps_the_fixed_cost_of_small_ops():
    """Measured sizes over three decades: the relative-error fit keeps the ~7 us call cost that every small op pays;
    an unweighted least-squares line lets the largest sizes set the intercept (2.2 us here)."""
    pts = [{"unit": "cpu", "kind": "elementwise", "work": w, "seconds": us * 1e-6} for w, us in ELEMENTWISE_US]
    a, b = TableCostModel(pts).fits[("cpu", "elementwise", 1)]
    small = [us * 1e-6 for w, us in ELEMENTWISE_US if w < 30000]
    assert a == pytest.approx(np.median(small), rel=0.2) and b > 0
    pred = TableCostModel(pts).op_time(OpWork("elementwise", nbytes=6912), "cpu")
    assert pred == pytest.approx(np.median(small), rel=0.25)
    x, y = np.array(ELEMENTWISE_US, dtype=float).T
    assert np.polyfit(x, y * 1e-6, 1)[1] < 0.5 * a                         # what the unweighted fit made of it


def test_an_elementwise_op_is_predicted_from_its_own_kernel_in_that_kernels_bytes():
    """Points that name their kernel are fitted per kernel; a DAG op mapped to a kernel (planner.cost.elementwise)
    costs that kernel's line at ratio x its DAG bytes. silu runs as silu_mul (12 B per element against the DAG's 4):
    a kernel 3x dearer per byte than add is not predicted at the mixed line's rate."""
    from planner.cost.elementwise import HOST_KERNELS

    pts = [{"unit": "cpu", "kind": "elementwise", "op": op, "work": w, "seconds": 5e-6 + w * per}
           for op, per in (("add", 1e-11), ("silu_mul", 3e-11)) for w in (1e4, 1e5, 1e6)]
    t = TableCostModel(pts)
    kernel, ratio = HOST_KERNELS["silu"]
    assert (kernel, ratio) == ("silu_mul", 3.0)
    silu = OpWork("elementwise", m=16, nbytes=100_000, op="silu")
    assert t.op_time(silu, "cpu") == pytest.approx(5e-6 + 3e-11 * 300_000, rel=1e-6)
    add = OpWork("elementwise", m=16, nbytes=100_000, op="add_ffn")
    assert t.op_time(add, "cpu") == pytest.approx(5e-6 + 1e-11 * 200_000, rel=1e-6)
    unnamed = OpWork("elementwise", m=16, nbytes=100_000)                     # no op: the line over every point
    a, b = t.fits[("cpu", "elementwise", 1)]
    assert t.op_time(unnamed, "cpu") == pytest.approx(a + b * 100_000)
    assert TableCostModel([{**p, "op": ""} for p in pts]).op_time(silu, "cpu") == pytest.approx(a + b * 100_000)


# ---- formats -------------------------------------------------------------------------------------------------
FIG4A = {4: 0.1154, 5: 0.7767, 6: 0.0991, 7: 0.0079, 8: 0.0004}


def test_weightlet_unpack_cost_matches_paper_figure():
    """0.48 SIMD instructions per weight for the Fig. 4a allocation (EdgeFlow §4.2)."""
    n = 100_000
    bits = np.concatenate([np.full(int(round(f * n)), b) for b, f in FIG4A.items()])
    instr, nbytes = unpack_work(bits, 4096, "weightlet")
    assert instr / (bits.size * 4096) == pytest.approx(0.48, abs=0.01)
    assert nbytes == bits.size * 4096
    assert list(weightlets(np.arange(1, 9))) == [1, 1, 2, 1, 2, 2, 3, 1]   # 8 bits: plain bytes, one block


def test_format_sizes_order():
    b = np.array([4] * 10 + [5] * 80 + [6] * 10)
    sizes = {f: tensor_nbytes(b, 4096, f) for f in ("int8", "mixed", "weightlet", "kquant")}
    assert sizes["weightlet"] < sizes["mixed"] < sizes["int8"]
    assert sizes["kquant"] == pytest.approx(sizes["weightlet"], rel=0.05)
    assert sizes["weightlet"] == pytest.approx(b.mean() / 8 * 100 * 4096, rel=0.02)


def test_ggml_types():
    assert [ggml_type_for_budget(b) for b in (4, 5, 6, 8)] == ["Q4_K", "Q5_K", "Q6_K", "Q8_0"]
    assert GGML_BPW["Q4_K"] == 4.5


def test_uniform_bits_mean_is_the_budget():
    spec = llama()
    bits = uniform_bits(spec, 4.25)
    hist = bits_histogram(bits, spec)
    assert sum(b * f for b, f in hist.items()) == pytest.approx(4.25, abs=1e-3)


# ---- DAG, prefill, threshold -------------------------------------------------------------------------------------
def test_layer_dag_shape_and_placement():
    spec = llama()
    g = layer_dag(spec, 128, 0)
    assert nx.is_directed_acyclic_graph(g) and g.number_of_nodes() == 27
    mm_flops = sum(g.nodes[n]["work"].flops for n in MATMULS)
    assert mm_flops == 2 * 128 * (spec.layer_params() - 2 * spec.d_model)
    assert [n for n in g if place_fine(n) == "npu"] == list(MATMULS)
    assert {n for n in g if place_coarse(n) == "cpu"} == {"rope", "kv_append", "attention"}


def test_chunks():
    assert chunks(300, 128) == [128, 128, 44] and chunks(100, 128) == [100] and chunks(50, 0) == [50]
    with pytest.raises(ValueError):
        chunks(0, 128)


def test_prefill_expansion_static_order_is_topological():
    spec = llama()
    b = PlanBuilder()
    add_prefill(b, spec, 300, 128, place_fine, [-1] * (spec.n_layers + 1))
    tasks = b.tasks
    assert len(tasks) == 3 * spec.n_layers * 27 + 2
    for unit in ("cpu", "npu"):
        seq = sorted((t for t in tasks if t.resource == unit), key=lambda t: t.order)
        assert [t.order for t in seq] == list(range(len(seq)))
        pos = {t.id: i for i, t in enumerate(seq)}
        for t in seq:                      # same-unit dependencies come earlier in the unit's backbone order
            assert all(pos[d] < pos[t.id] for d in t.deps if d in pos)
    att = [t for t in tasks if t.name.endswith("attention") and t.layer == 0]
    assert [t.works[0].ctx for t in att] == [64, 128 + 64, 256 + 22]


def test_steal_threshold_derivation():
    spec, dev = llama(), xiaomi()
    c = AnalyticCostModel(dev)
    ratio = matmul_time_ratio(c, spec, 128, 4, 2)       # an outcome of the profile's rates (docs/coldstart.md)
    assert steal_threshold(c, spec, 128, 4, 2) == round(ratio) >= 1
    fast_cpu = AnalyticCostModel(replace(dev, cpu_int8_gemm_gops_per_ghz=dev.cpu_int8_gemm_gops_per_ghz * 2.5))
    assert steal_threshold(fast_cpu, spec, 128, 4, 2) == max(1, round(ratio / 2.5)) < round(ratio)
