"""NPU cold-start plans: llm.npu's online / materialized graphs and EdgeFlow's granular pipeline
(EdgeFlow §3.1, §4.3).

A `Recipe` names the mechanisms; one builder composes them, so each ablation step differs from the previous one by
exactly one field:
- graph: `online` (load weights -> compose -> optimize, Fig. 1a), `materialized` (load the context binary ->
  prepare, Fig. 1b), `restore` (EdgeFlow: weight-less graphs restored per layer on the graph thread, asynchronously).
- streaming: `sequential` (everything loaded before compute), `layer_serial` (one thread: load -> unpack -> prepare
  layer by layer, compute of layer l overlaps streaming of l+1, Fig. 1c), `granular` (loader threads, unpack threads and
  graph thread run asynchronously; a layer's ops become ready when its weights are unpacked and its graph restored).
- fmt: weight format on flash; placement: coarse (llm.npu) | fine (EdgeFlow); priority static | position; steal on/off.
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
from planner.pipeline.weights import layer_refs, layer_weights
from planner.plan import Plan, PlanBuilder, SchedulePolicy, TensorRef
from quant.arch import ModelSpec

GB = 1e9
PAGE_BYTES = 4096   # B, embedding rows are fetched by page through mmap


@dataclass(frozen=True)
class Recipe:
    fmt: str = "int8"
    graph: str = "online"          # online | materialized | restore
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
    lw = layer_weights(spec, dev, bits, recipe.fmt)
    n = spec.n_layers
    b = PlanBuilder()
    setup = b.add("qnn_setup", "graph", duration_s=dev.npu_setup_s, phase="setup")
    total_i8_gb = sum(w.int8_bytes for w in lw) / GB
    ready: list[int] = [-1] * (n + 1)
    first = setup
    if recipe.graph == "online":
        if recipe.streaming != "sequential":
            raise ValueError("online graph construction needs sequential streaming")
        emb = add_embedding(b, spec, tokens, [setup])
        loads = [b.add(f"load.L{i}", "load", [setup], layer=i, read_bytes=w.flash_bytes, copy_bytes=w.direct_bytes,
                       request_bytes=dev.flash_bulk_request_bytes, mem_alloc=w.flash_bytes, phase="load",
                       tensors=layer_refs(spec, i))
                 for i, w in enumerate(lw)]
        compose = b.add("compose_graph", "graph", loads + [emb], duration_s=dev.npu_compose_s_per_gb * total_i8_gb,
                        phase="graph")
        optimize = b.add("optimize_graph", "graph", [compose], duration_s=dev.npu_optimize_s_per_gb * total_i8_gb,
                         phase="graph")
        ready = [optimize] * (n + 1)
        first = optimize
    elif recipe.graph == "materialized" and recipe.streaming == "sequential":
        emb = add_embedding(b, spec, tokens, [setup])
        loads = [b.add(f"load_graph.L{i}", "load", [setup], layer=i, read_bytes=w.flash_bytes,
                       request_bytes=dev.flash_bulk_request_bytes, mem_alloc=w.flash_bytes,
                       duration_s=w.flash_bytes / (dev.npu_ctx_deserialize_gbps * GB), phase="load",
                       tensors=layer_refs(spec, i))
                 for i, w in enumerate(lw)]
        prep = b.add("prepare_graph", "graph", loads + [emb], duration_s=dev.npu_prepare_s_per_gb * total_i8_gb,
                     phase="graph")
        ready = [prep] * (n + 1)
        first = prep
    elif recipe.streaming == "layer_serial":
        # One streaming thread does load -> (unpack) -> prepare per layer, in order (Fig. 1c "Load & Prepare Graph").
        prev = add_embedding(b, spec, tokens, [setup])
        for i, w in enumerate(lw):
            if recipe.graph == "materialized":
                ld = b.add(f"load_graph.L{i}", "load", [prev], layer=i, read_bytes=w.flash_bytes,
                           request_bytes=dev.flash_bulk_request_bytes, mem_alloc=w.flash_bytes,
                           duration_s=w.flash_bytes / (dev.npu_ctx_deserialize_gbps * GB), phase="load",
                           tensors=layer_refs(spec, i))
            else:
                ld = b.add(f"load.L{i}", "load", [prev], layer=i, read_bytes=w.flash_bytes,
                           copy_bytes=w.direct_bytes, request_bytes=dev.flash_bulk_request_bytes,
                           mem_alloc=w.flash_bytes, phase="load", tensors=layer_refs(spec, i))
                if w.unpack is not None:
                    ld = b.add(f"unpack.L{i}", "unpack", [ld], layer=i, works=[w.unpack], mem_alloc=w.int8_bytes,
                               mem_free=w.flash_bytes, phase="unpack", tensors=layer_refs(spec, i))
            prev = b.add(f"prepare.L{i}", "graph", [ld], layer=i,
                         duration_s=dev.npu_prepare_s_per_gb * w.int8_bytes / GB, phase="graph")
            ready[i] = prev
    elif recipe.streaming == "granular":
        if recipe.graph != "restore":
            raise ValueError("the granular pipeline restores weight-less graphs (graph=restore)")
        emb = add_embedding(b, spec, tokens)
        first = b.add("start", "join", [setup, emb])      # the first ops need the prompt's embedding rows
        for i, w in enumerate(lw):
            ld = b.add(f"load.L{i}", "load", [], layer=i, read_bytes=w.flash_bytes, copy_bytes=w.direct_bytes,
                       request_bytes=dev.flash_bulk_request_bytes, mem_alloc=w.flash_bytes, phase="load",
                       tensors=layer_refs(spec, i))
            if w.unpack is not None:
                ld = b.add(f"unpack.L{i}", "unpack", [ld], layer=i, works=[w.unpack], mem_alloc=w.int8_bytes,
                           mem_free=w.flash_bytes, phase="unpack", tensors=layer_refs(spec, i))
            # weight-less per-layer graphs restored asynchronously on the graph thread(s) (Fig. 6 "Async Restore");
            # cost per byte of the weights the graph binds, as Fig. 1b's prepare step (no separate figure exists)
            rs = b.add(f"restore.L{i}", "graph", [setup], layer=i,
                       duration_s=dev.npu_prepare_s_per_gb * w.int8_bytes / GB, phase="graph")
            ready[i] = b.add(f"ready.L{i}", "join", [ld, rs], layer=i)
    else:
        raise ValueError(f"unsupported recipe {recipe}")

    place = PLACEMENTS[recipe.placement]
    # the compute pool runs on the cores after the unpack threads' (unpack thread i is pinned to core i)
    has_unpack = any(t.resource == "unpack" for t in b.tasks)
    cpu_first = fw.unpack_threads if has_unpack else 0
    add_prefill(b, spec, tokens, fw.chunk_tokens, place, ready, start=first,
                group=recipe.placement == "coarse")
    thr = 0
    if recipe.steal:
        m = chunks(tokens, fw.chunk_tokens)[0]
        thr = steal_threshold(cost, spec, m, fw.compute_threads, cpu_first)
    doc = dict(info or {})
    doc.update(recipe=vars(recipe), flash_bytes=sum(w.flash_bytes for w in lw),
               int8_bytes=sum(w.int8_bytes for w in lw), steal_threshold=thr)
    return Plan(framework=name, model=spec.name, device=dev.name, prompt_tokens=tokens, chunk_tokens=fw.chunk_tokens,
                tasks=b.tasks, loader_threads=fw.loader_threads, unpack_threads=fw.unpack_threads,
                graph_threads=fw.graph_threads if recipe.streaming == "granular" else 1,
                cpu_threads=fw.compute_threads, cpu_first_core=cpu_first,
                schedule=SchedulePolicy(priority=recipe.priority, steal_threshold=thr), info=doc)
