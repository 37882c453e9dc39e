"""The stage helpers of the NPU cold-start plan (`planner.pipeline.npu_plan`) and of the prefill expansion
(`planner.pipeline.builder`): which graph x streaming modes exist, what each stage makes a layer wait for, how the
backbone is cut into tasks, and the static dispatch order."""
from dataclasses import replace

import pytest

from planner.cost import AnalyticCostModel
from planner.formats import model_bits
from planner.framework import FrameworkSpec
from planner.pipeline.builder import add_lm_head, add_prefill, chunks, group_backbone, set_static_order
from planner.pipeline.dag import BACKBONE, place_coarse, place_cpu, place_fine
from planner.pipeline.granular import steal_threshold
from planner.pipeline.npu_plan import Recipe, add_layer_unpack, add_weight_stages, build_npu_plan
from planner.pipeline.weights import layer_weights
from planner.plan import PlanBuilder
from quant.arch import ModelSpec
from sim.coldstart.sweep import load_conf
from tests.sim.helpers import xiaomi


@pytest.fixture(scope="module")
def smol() -> ModelSpec:
    return load_conf("model", "smollm2_135m", ModelSpec)


def stages(spec: ModelSpec, recipe: Recipe):
    dev = xiaomi()
    bits = None if recipe.fmt == "int8" else model_bits(spec, 5.0, 0, "uniform")[0]
    b = PlanBuilder()
    setup = b.add("qnn_setup", "graph")
    lw = layer_weights(spec, dev, bits, recipe.fmt)          # n_layers + 1 entries: the last is the LM head
    ready, first = add_weight_stages(b, recipe, spec, dev, lw, 16, setup)
    return b, setup, ready, first, lw


@pytest.mark.parametrize("graph,streaming,needle", [
    ("online", "granular", "online graph construction needs sequential streaming"),
    ("online", "layer_serial", "online graph construction needs sequential streaming"),
    ("materialized", "granular", "granular pipeline restores weight-less graphs"),
    ("restore", "layer_serial", "unsupported recipe"),
])
def test_rejected_graph_streaming_modes(smol, graph, streaming, needle):
    with pytest.raises(ValueError, match=needle):
        stages(smol, Recipe(graph=graph, streaming=streaming))


@pytest.mark.parametrize("graph", ["online", "materialized"])
def test_whole_graph_modes_make_every_layer_wait_for_the_graph(smol, graph):
    b, setup, ready, first, lw = stages(smol, Recipe(graph=graph, streaming="sequential"))
    last = b.tasks[first]
    assert last.name == ("optimize_graph" if graph == "online" else "prepare_graph")
    assert ready == [first] * (smol.n_layers + 1)
    loads = [t for t in b.tasks if t.resource == "load" and t.layer >= 0]
    assert len(loads) == smol.n_layers + 1 and all(t.deps == [setup] for t in loads)
    assert not any(t.resource == "unpack" for t in b.tasks)


@pytest.mark.parametrize("fmt", ["int8", "weightlet", "mixed"])
def test_layer_serial_is_one_chain(smol, fmt):
    b, setup, ready, first, lw = stages(smol, Recipe(fmt=fmt, graph="materialized", streaming="layer_serial"))
    assert first == setup and len(ready) == smol.n_layers + 1     # the last entry: the LM-head weights
    for i in range(1, smol.n_layers + 1):            # layer i's first task waits for layer i-1's prepare
        head = min(t.id for t in b.tasks if t.layer == i)
        assert b.tasks[head].deps == [ready[i - 1]] and b.tasks[ready[i]].name == f"prepare.L{i}"
    assert any(t.resource == "unpack" for t in b.tasks) == any(w.unpack is not None for w in lw) == (fmt != "int8")
    # INT8 weights are deserialized with the context binary; packed ones are loaded apart from a weight-less graph
    assert all(t.name.startswith("load_graph.") == (fmt == "int8") for t in b.tasks if t.resource == "load"
               and t.layer >= 0)


def test_granular_layer_ready_joins_unpack_and_restore(smol):
    b, setup, ready, first, lw = stages(smol, Recipe(fmt="weightlet", graph="materialized", streaming="granular"))
    assert b.tasks[first].name == "start" and [b.tasks[d].name for d in b.tasks[first].deps] == [
        "qnn_setup", "embed_rows"]
    for i in range(smol.n_layers + 1):
        names = sorted(b.tasks[d].name for d in b.tasks[ready[i]].deps)
        assert names == sorted([f"restore.L{i}", f"{'load' if lw[i].unpack is None else 'unpack'}.L{i}"])
    assert all(t.deps == [] for t in b.tasks if t.name.startswith("load.L"))     # loaders run ahead freely


def test_unpack_only_when_the_format_needs_it(smol):
    dev = xiaomi()
    b = PlanBuilder()
    ld = b.add("load", "join")
    int8 = layer_weights(smol, dev, None, "int8")[0]
    assert add_layer_unpack(b, smol, 0, int8, ld) == ld and len(b.tasks) == 1
    wl = layer_weights(smol, dev, model_bits(smol, 5.0, 0, "uniform")[0], "weightlet")[0]
    up = add_layer_unpack(b, smol, 0, wl, ld)
    assert b.tasks[up].resource == "unpack" and b.tasks[up].deps == [ld] and b.tasks[up].mem_free == wl.flash_bytes


def test_steal_threshold_only_with_stealing(smol):
    dev, fw = xiaomi(), FrameworkSpec(name="edgeflow", policy="edgeflow")
    bits = model_bits(smol, 5.0, 0, "uniform")[0]
    r = Recipe(fmt="weightlet", graph="materialized", streaming="granular", placement="fine")
    cost = AnalyticCostModel(dev)
    off = build_npu_plan("x", r, smol, dev, cost, fw, 64, bits)
    assert off.schedule.steal_threshold == 0 == off.info["steal_threshold"]
    assert off.cpu_first_core == fw.unpack_threads and off.graph_threads == fw.graph_threads
    on = build_npu_plan("x", replace(r, steal=True), smol, dev, cost, fw, 64, bits)
    want = steal_threshold(cost, smol, chunks(64, fw.chunk_tokens)[0], fw.compute_threads, fw.unpack_threads)
    assert on.schedule.steal_threshold == want == on.info["steal_threshold"] >= 1
    assert [t.name for t in on.tasks] == [t.name for t in off.tasks]        # stealing changes the schedule only


@pytest.mark.parametrize("place", [place_fine, place_coarse, place_cpu])
def test_group_backbone(place):
    one = group_backbone(place, group=False)
    assert one.groups == [[op] for op in BACKBONE]
    merged = group_backbone(place, group=True)
    assert [op for g in merged.groups for op in g] == list(BACKBONE)
    for a, b in zip(merged.groups, merged.groups[1:]):       # maximal runs: neighbours are on different units
        assert place(a[-1]) != place(b[0])
    assert all(len({place(op) for op in g}) == 1 for g in merged.groups)
    assert all(merged.owner[op] == gi for gi, g in enumerate(merged.groups) for op in g)


def test_lm_head_waits_for_last_layer_and_head_weights(smol):
    b = PlanBuilder()
    out, w = b.add("out", "join"), b.add("head weights", "join")
    last = add_lm_head(b, smol, place_fine, out, w, 2, "int8")
    norm = b.tasks[last - 1]
    assert norm.name == "final_norm" and norm.deps == [out, w] and norm.chunk == 2
    assert b.tasks[last].deps == sorted([norm.id, w]) and b.tasks[last].resource == place_fine("q_proj")


@pytest.mark.parametrize("layer_serial", [False, True])
def test_static_order_numbers_each_unit_from_the_first_new_task(smol, layer_serial):
    b = PlanBuilder()
    pre = b.add("earlier", "cpu", order=99)
    add_prefill(b, smol, 40, 16, place_fine, [-1] * (smol.n_layers + 1), layer_serial=layer_serial)
    assert b.tasks[pre].order == 99                  # tasks before the prefill keep their order
    for unit in ("cpu", "npu"):
        seq = sorted((t for t in b.tasks[1:] if t.resource == unit), key=lambda t: t.order)
        assert [t.order for t in seq] == list(range(len(seq)))
        if layer_serial:
            assert [t.id for t in seq] == sorted(t.id for t in seq)
        else:
            keys = [(t.layer, t.topo, t.chunk) for t in seq]
            assert keys == sorted(keys)
    set_static_order(b, 1, True)           # re-numbering in emission order
    cpu = [t for t in b.tasks[1:] if t.resource == "cpu"]
    assert [t.order for t in cpu] == list(range(len(cpu)))
