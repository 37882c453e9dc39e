"""NPU cold-start plans: llm.npu's online / materialized graphs and EdgeFlow's granular pipeline
(EdgeFlow §3.1, §4.3).

A `Recipe` names the mechanisms; one builder composes them, so each ablation step differs from the previous one by
exactly one field:
- graph: `online` (load weights -> compose -> optimize, Fig. 1a) or `materialized` (graphs built offline, Fig. 1b).
  Where a materialized graph's weights live follows from the format: INT8 weights sit inside the context binary and
  are deserialized with it; packed formats (mixed, weightlet) keep a weight-less binary, their weights are loaded and
  unpacked apart and bound when the layer's graph is prepared (layer-serial) or restored on the graph thread (granular,
  EdgeFlow's "Async Restore", Fig. 6).
- streaming: `sequential` (everything loaded before compute), `layer_serial` (one thread: load -> unpack -> prepare
  layer by layer, compute of layer l overlaps streaming of l+1, Fig. 1c), `granular` (loader threads, unpack threads and
  graph thread run asynchronously; a layer's ops become ready when its weights are unpacked and its graph restored).
- fmt: weight format on flash; placement: coarse (llm.npu) | fine (EdgeFlow); priority static | position; steal on/off.
`build_npu_plan` appends the QNN set-up, one weight / graph stage function per graph x streaming mode
(`add_weight_stages` picks it; they share the per-layer load / unpack task helpers), then the chunked prefill
(`planner.pipeline.builder.add_prefill`).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from planner.cost.base import CostModel
from planner.device import SocProfile
from planner.framework import FrameworkSpec
from planner.pipeline.builder import add_prefill, chunks
from planner.pipeline.dag import PLACEMENTS
from planner.pipeline.granular import steal_threshold
from planner.pipeline.weights import LayerWeights, layer_refs, layer_weights
from planner.plan import Plan, PlanBuilder, SchedulePolicy, TensorRef
from quant.arch import ModelSpec

GB = 1e9
PAGE_BYTES = 4096   # B, embedding rows are fetched by page through mmap


@dataclass(frozen=True)
class Recipe:
    fmt: str = "int8"
    graph: str = "online"          # online | materialized
    streaming: str = "sequential"  # sequential | layer_serial | granular
    placement: str = "coarse"      # coarse | fine
    priority: str = "static"       # static | position
    steal: bool = False


def add_embedding(b: PlanBuilder, spec: ModelSpec, tokens: int, deps: list[int] | None = None) -> int:
    """Embedding rows of the prompt, read at scattered offsets (FP16 rows, one page request each)."""
    nbytes = tokens * spec.d_model * 2
    return b.add("embed_rows", "load", deps or [], read_bytes=nbytes, request_bytes=PAGE_BYTES, mem_alloc=nbytes,
                 phase="load", tensors=[TensorRef("token_embd.weight")], ops=["embed"], random_reads=True)


def build_npu_plan(name: str, recipe: Recipe, spec: ModelSpec, dev: SocProfile, cost: CostModel,
                   fw: FrameworkSpec, tokens: int, bits: dict[str, np.ndarray] | None, info: dict | None = None
                   ) -> Plan:
    """The cold-start plan of `recipe`: QNN set-up, the weight / graph stages of its graph x streaming mode, then the
    chunked prefill (`add_prefill`) placed by `recipe.placement`. bits: per kind (n_layers, C) bits of a
    mixed-precision format (None: uniform). info: extra entries of `Plan.info`."""
    lw = layer_weights(spec, dev, bits, recipe.fmt)
    b = PlanBuilder()
    setup = b.add("qnn_setup", "graph", duration_s=dev.npu_setup_s, phase="setup")
    ready, first = add_weight_stages(b, recipe, spec, dev, lw, tokens, setup)
    # the compute pool runs on the cores after the unpack threads' (unpack thread i is pinned to core i)
    has_unpack = any(t.resource == "unpack" for t in b.tasks)
    cpu_first = fw.unpack_threads if has_unpack else 0
    add_prefill(b, spec, tokens, fw.chunk_tokens, PLACEMENTS[recipe.placement], ready, start=first,
                group=recipe.placement == "coarse")
    thr = recipe_steal_threshold(recipe, cost, spec, fw, tokens, cpu_first)
    doc = dict(info or {})
    doc.update(recipe=vars(recipe), flash_bytes=sum(w.flash_bytes for w in lw),
               int8_bytes=sum(w.int8_bytes for w in lw), steal_threshold=thr)
    return Plan(framework=name, model=spec.name, device=dev.name, prompt_tokens=tokens, chunk_tokens=fw.chunk_tokens,
                tasks=b.tasks, loader_threads=fw.loader_threads, unpack_threads=fw.unpack_threads,
                graph_threads=fw.graph_threads if recipe.streaming == "granular" else 1,
                cpu_threads=fw.compute_threads, cpu_first_core=cpu_first,
                schedule=SchedulePolicy(priority=recipe.priority, steal_threshold=thr), info=doc)


def recipe_steal_threshold(recipe: Recipe, cost: CostModel, spec: ModelSpec, fw: FrameworkSpec, tokens: int,
                           cpu_first: int) -> int:
    """Work-stealing threshold of the plan's schedule: 0 without stealing, else `steal_threshold` at the first
    chunk's size on the compute pool that starts at core `cpu_first`."""
    if not recipe.steal:
        return 0
    m = chunks(tokens, fw.chunk_tokens)[0]
    return steal_threshold(cost, spec, m, fw.compute_threads, cpu_first)


# ================================================ weight / graph stages ==============================================
# Each stage appends its tasks after the QNN set-up task `setup` and returns (ready, first): `ready[l]` is the task
# layer l's weight-reading ops wait for (n_layers+1 entries, the last for the LM head; -1 = no wait) and `first` the
# task every first op of the prefill waits for.
def add_weight_stages(b: PlanBuilder, recipe: Recipe, spec: ModelSpec, dev: SocProfile, lw: list[LayerWeights],
                      tokens: int, setup: int) -> tuple[list[int], int]:
    """Dispatch on the recipe's graph x streaming mode (ValueError for a combination no framework uses)."""
    if recipe.graph == "online":
        if recipe.streaming != "sequential":
            raise ValueError("online graph construction needs sequential streaming")
        return add_online_graph(b, spec, dev, lw, tokens, setup)
    if recipe.graph == "materialized" and recipe.streaming == "sequential":
        return add_materialized_graph(b, spec, dev, lw, tokens, setup)
    if recipe.graph != "materialized":
        raise ValueError(f"unsupported recipe {recipe}")
    in_binary = all(w.unpack is None for w in lw)     # INT8: the weights are part of the context binary
    if recipe.streaming == "layer_serial":
        return add_layer_serial(b, spec, dev, lw, tokens, setup, materialized=in_binary)
    if recipe.streaming == "granular":
        if in_binary:
            raise ValueError("the granular pipeline restores weight-less graphs (a packed weight format)")
        return add_granular(b, spec, dev, lw, tokens, setup)
    raise ValueError(f"unsupported recipe {recipe}")


def add_online_graph(b: PlanBuilder, spec: ModelSpec, dev: SocProfile, lw: list[LayerWeights], tokens: int,
                     setup: int) -> tuple[list[int], int]:
    """llm.npu online (Fig. 1a): load every layer's weights, then compose and optimize the whole graph."""
    total_i8_gb = sum(w.int8_bytes for w in lw) / GB
    emb = add_embedding(b, spec, tokens, [setup])
    loads = [add_layer_load(b, spec, dev, i, w, [setup]) for i, w in enumerate(lw)]
    compose = b.add("compose_graph", "graph", loads + [emb], duration_s=dev.npu_compose_s_per_gb * total_i8_gb,
                    phase="graph")
    optimize = b.add("optimize_graph", "graph", [compose], duration_s=dev.npu_optimize_s_per_gb * total_i8_gb,
                     phase="graph")
    return [optimize] * (spec.n_layers + 1), optimize


def add_materialized_graph(b: PlanBuilder, spec: ModelSpec, dev: SocProfile, lw: list[LayerWeights], tokens: int,
                           setup: int) -> tuple[list[int], int]:
    """llm.npu materialized (Fig. 1b): load the whole context binary, then prepare the graph."""
    total_i8_gb = sum(w.int8_bytes for w in lw) / GB
    emb = add_embedding(b, spec, tokens, [setup])
    loads = [add_context_load(b, spec, dev, i, w, [setup]) for i, w in enumerate(lw)]
    prep = b.add("prepare_graph", "graph", loads + [emb], duration_s=dev.npu_prepare_s_per_gb * total_i8_gb,
                 phase="graph")
    return [prep] * (spec.n_layers + 1), prep


def add_layer_serial(b: PlanBuilder, spec: ModelSpec, dev: SocProfile, lw: list[LayerWeights], tokens: int,
                     setup: int, materialized: bool) -> tuple[list[int], int]:
    """One streaming thread does load -> (unpack) -> prepare per layer, in order (Fig. 1c "Load & Prepare Graph")."""
    ready = [-1] * (spec.n_layers + 1)
    prev = add_embedding(b, spec, tokens, [setup])
    for i, w in enumerate(lw):
        if materialized:
            ld = add_context_load(b, spec, dev, i, w, [prev])
        else:
            ld = add_layer_unpack(b, spec, i, w, add_layer_load(b, spec, dev, i, w, [prev]))
        prev = b.add(f"prepare.L{i}", "graph", [ld], layer=i,
                     duration_s=dev.npu_prepare_s_per_gb * w.int8_bytes / GB, phase="graph")
        ready[i] = prev
    return ready, setup


def add_granular(b: PlanBuilder, spec: ModelSpec, dev: SocProfile, lw: list[LayerWeights], tokens: int,
                 setup: int) -> tuple[list[int], int]:
    """EdgeFlow's granular pipeline (§4.3): loader, unpack and graph threads run asynchronously; layer l is ready when
    its weights are unpacked and its weight-less graph restored."""
    ready = [-1] * (spec.n_layers + 1)
    emb = add_embedding(b, spec, tokens)
    first = b.add("start", "join", [setup, emb])      # the first ops need the prompt's embedding rows
    for i, w in enumerate(lw):
        ld = add_layer_unpack(b, spec, i, w, add_layer_load(b, spec, dev, i, w, []))
        # weight-less per-layer graphs restored asynchronously on the graph thread(s) (Fig. 6 "Async Restore");
        # cost per byte of the weights the graph binds, as Fig. 1b's prepare step (no separate figure exists)
        rs = b.add(f"restore.L{i}", "graph", [setup], layer=i,
                   duration_s=dev.npu_prepare_s_per_gb * w.int8_bytes / GB, phase="graph")
        ready[i] = b.add(f"ready.L{i}", "join", [ld, rs], layer=i)
    return ready, first


# ================================================ per-layer tasks ====================================================
def add_layer_load(b: PlanBuilder, spec: ModelSpec, dev: SocProfile, i: int, w: LayerWeights, deps: list[int]) -> int:
    """Read layer i's packed weights from flash in bulk requests (the direct part is copied into NPU buffers)."""
    return b.add(f"load.L{i}", "load", deps, layer=i, read_bytes=w.flash_bytes, copy_bytes=w.direct_bytes,
                 request_bytes=dev.flash_bulk_request_bytes, mem_alloc=w.flash_bytes, phase="load",
                 tensors=layer_refs(spec, i))


def add_context_load(b: PlanBuilder, spec: ModelSpec, dev: SocProfile, i: int, w: LayerWeights, deps: list[int]
                     ) -> int:
    """Read and deserialize layer i's part of a context binary (materialized graph, Fig. 1b)."""
    return b.add(f"load_graph.L{i}", "load", deps, layer=i, read_bytes=w.flash_bytes,
                 request_bytes=dev.flash_bulk_request_bytes, mem_alloc=w.flash_bytes,
                 duration_s=w.flash_bytes / (dev.npu_ctx_deserialize_gbps * GB), phase="load",
                 tensors=layer_refs(spec, i))


def add_layer_unpack(b: PlanBuilder, spec: ModelSpec, i: int, w: LayerWeights, load: int) -> int:
    """Unpack layer i's weights to INT8 after task `load` (returns `load` when the format needs no unpacking)."""
    if w.unpack is None:
        return load
    return b.add(f"unpack.L{i}", "unpack", [load], layer=i, works=[w.unpack], mem_alloc=w.int8_bytes,
                 mem_free=w.flash_bytes, phase="unpack", tensors=layer_refs(spec, i))
