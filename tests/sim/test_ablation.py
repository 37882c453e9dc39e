"""EdgeFlow's ablation: each step differs from the previous one by exactly the technique it names (recipe fields and
framework knobs), and the first step keeps llm.npu+'s load / prefill overlap (EdgeFlow §3.2, Fig. 1c)."""
from dataclasses import asdict, fields

import pytest

from planner.framework import FrameworkSpec
from planner.pipeline.npu_plan import Recipe
from sim.coldstart import POLICIES
from sim.coldstart.sweep import load_conf

# (previous, step, the recipe fields the step's technique owns)
STEPS = (
    # EF bits in the INT4/INT8 mixed format (§3.2): the same materialized per-layer graphs, now weight-less, binding
    # separately loaded and INT4 -> INT8 converted weights (npu_plan: where the weights live follows the format)
    ("llmnpu_plus", "ef_mixed", {"fmt"}),
    ("ef_mixed", "ef_pack", {"fmt"}),             # + weightlet packing, SIMD unpack (§4.2)
    ("ef_pack", "ef_pipe", {"streaming"}),         # + asynchronous load / unpack / restore threads (Fig. 6)
    ("ef_pipe", "ef_place", {"placement"}),        # + fine-grained operator placement (§4.3)
    ("ef_place", "ef_priority", {"priority"}),     # + position-guided priority (§4.3)
    ("ef_priority", "edgeflow", {"steal"}),        # + CPU task stealing (§4.3)
)
OVERLAP = ("graph", "streaming", "placement", "priority", "steal")   # llm.npu+'s execution, kept by the first EF step


def recipe(name: str) -> dict:
    return asdict(POLICIES[name].recipe)


def knobs(name: str) -> dict:
    spec = load_conf("framework", name, FrameworkSpec)
    return {f.name: getattr(spec, f.name) for f in fields(spec) if f.name not in ("name", "policy", "source")}


@pytest.mark.parametrize("prev,step,owned", STEPS, ids=[s for _, s, _ in STEPS])
def test_step_changes_only_its_technique(prev, step, owned):
    a, b = recipe(prev), recipe(step)
    assert {k for k in a if a[k] != b[k]} == owned


@pytest.mark.parametrize("prev,step", [(p, s) for p, s, _ in STEPS[1:]], ids=[s for _, s, _ in STEPS[1:]])
def test_steps_share_framework_knobs(prev, step):
    assert knobs(prev) == knobs(step)


def test_base_keeps_llmnpu_plus_overlap():
    base, plus = recipe("ef_mixed"), recipe("llmnpu_plus")
    assert {k: base[k] for k in OVERLAP} == {k: plus[k] for k in OVERLAP}
    assert plus["graph"] == "materialized" and plus["streaming"] == "layer_serial"


def test_steps_cover_every_recipe_field_but_the_graph():
    owned = set().union(*(o for _, _, o in STEPS))
    assert owned | {"graph"} == {f.name for f in fields(Recipe)}      # the graph is materialized from the base on


def test_threshold_sensitivity(monkeypatch):
    """EdgeFlow at HellaSwag length with the threshold fixed (docs/coldstart.md, "Calibration"): with the profile's
    sourced CPU GEMM rate, a lower threshold steals more matmuls and costs more time; none beats no stealing."""
    import planner.pipeline.npu_plan as npu
    from sim.coldstart.sweep import sweep

    def ttft(fw: str, thr: int | None = None) -> tuple[float, int]:
        if thr is not None:
            monkeypatch.setattr(npu, "steal_threshold", lambda *a, **k: thr)
        r = sweep(model="llama3_8b", device="xiaomi15pro", frameworks=(fw,), workloads=("hellaswag",), bits=(5.0,))[0]
        assert thr is None or r["steal_threshold"] == thr
        return r["ttft_s"], r["stolen_ops"]

    base, _ = ttft("ef_priority")
    runs = [ttft("edgeflow", t) for t in (3, 5, 8)]
    assert runs[0][1] > runs[1][1] > runs[2][1] > 0
    assert runs[0][0] > runs[1][0] > runs[2][0] > base
    assert [round(t, 2) for t, _ in runs] == [10.31, 9.53, 8.78] and round(base, 2) == 7.91
