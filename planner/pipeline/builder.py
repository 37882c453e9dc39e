"""Expands the per-layer operator DAG into the prefill part of a cold-start plan (chunked prefill, EdgeFlow §4.3).

Tasks are emitted chunk-major, layer-minor, in the topological backbone order. Cross-chunk and cross-layer edges:
- chunk c, layer l starts from chunk c's output of layer l-1 (`add_ffn`);
- KV cache appends happen in chunk order (`kv_append(c-1)` -> `kv_append(c)`), so chunk c's attention sees every
  earlier chunk's keys/values (causal attention);
- every task holding a matmul or a norm of layer l waits for `layer_ready[l]` (weights loaded+unpacked, or graph
  ready): an executor never touches weights a plan has not loaded (the HIL runner relies on it).
`group=True` merges consecutive same-unit ops of the backbone into one subgraph task (llm.npu's coarse partition).
The LM head (final norm + vocab projection for the last token) follows the last layer; it waits for
`layer_ready[n_layers]` (the LM-head weights).
`add_prefill` composes `group_backbone` (ops -> tasks), `add_layer_chunk` (one layer of one chunk), `add_lm_head` and
`set_static_order` (each unit's static dispatch order).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import networkx as nx

from planner.pipeline.dag import BACKBONE, MATMULS, NORMS, head_tensor_names, layer_dag, op_tensor_names
from planner.plan import OpWork, PlanBuilder, TensorRef
from quant.arch import ModelSpec


def chunks(prompt_tokens: int, chunk_tokens: int) -> list[int]:
    """Chunk sizes of a prompt (chunk_tokens <= 0: one chunk)."""
    if prompt_tokens <= 0:
        raise ValueError(f"prompt_tokens must be > 0 (got {prompt_tokens})")
    if chunk_tokens <= 0 or chunk_tokens >= prompt_tokens:
        return [prompt_tokens]
    n, r = divmod(prompt_tokens, chunk_tokens)
    return [chunk_tokens] * n + ([r] if r else [])


def add_prefill(b: PlanBuilder, spec: ModelSpec, prompt_tokens: int, chunk_tokens: int,
                place: Callable[[str], str], layer_ready: list[int] | Callable[[int, int], int], start: int = -1,
                group: bool = False,
                cpu_wfmt: str = "int8", layer_serial: bool = False) -> int:
    """Append the prefill tasks; returns the id of the last task (the LM head).

    place: op name -> "cpu" | "npu". layer_ready: n_layers+1 task ids (-1 = no wait), or a callback
    (layer, id of the task producing that layer's input in chunk 0) -> ready id, which emits on-demand loads right
    where the first chunk reaches the layer (mmap paging). start: task every first op
    waits for (e.g. graph set-up). layer_serial: chunk c of layer l also waits for chunk c-1 of layer l to finish
    (a CPU framework that runs one ubatch through all layers before the next).
    """
    on_demand = layer_ready if callable(layer_ready) else None
    ready: list[int] = [-1] * (spec.n_layers + 1) if on_demand else list(layer_ready)
    if len(ready) != spec.n_layers + 1:
        raise ValueError(f"layer_ready needs n_layers+1 = {spec.n_layers + 1} entries (got {len(layer_ready)})")
    bb = group_backbone(place, group)
    first_id = len(b.tasks)
    sizes = chunks(prompt_tokens, chunk_tokens)
    prev_out: list[int] = [start] * len(sizes)        # chunk c's output of the previous layer
    past = 0
    last_chunk_end = start
    kv_ids: list[int] = [-1] * spec.n_layers          # the previous chunk's KV-append task per layer
    for c, m in enumerate(sizes):
        dag = layer_dag(spec, m, past)
        preds = {op: list(dag.predecessors(op)) for op in BACKBONE}
        kv_prev, kv_ids = kv_ids, [-1] * spec.n_layers
        chunk_end = -1
        for layer in range(spec.n_layers):
            if on_demand is not None and c == 0:
                ready[layer] = on_demand(layer, prev_out[c])
            first_deps = [prev_out[c]] + ([last_chunk_end] if layer_serial and c > 0 else [])
            prev_out[c], kv_ids[layer] = add_layer_chunk(b, spec, bb, place, dag, preds, layer, c, m, first_deps,
                                                         kv_prev[layer], ready[layer], cpu_wfmt)
            chunk_end = prev_out[c]
        last_chunk_end = chunk_end
        past += m
    if on_demand is not None:                 # the final norm's weights fault in with the head's
        ready[spec.n_layers] = on_demand(spec.n_layers, prev_out[-1])
    last = add_lm_head(b, spec, place, prev_out[-1], ready[spec.n_layers], len(sizes) - 1, cpu_wfmt)
    set_static_order(b, first_id, layer_serial)
    return last


@dataclass(frozen=True)
class BackboneGroups:
    """One layer's backbone ops cut into tasks: `groups[g]` the ops of task g in backbone order, `owner[op]` = g."""
    groups: list[list[str]]
    owner: dict[str, int]


def group_backbone(place: Callable[[str], str], group: bool) -> BackboneGroups:
    """One task per backbone op, or (`group`) consecutive ops on the same unit merged into one subgraph task."""
    groups: list[list[str]] = []
    for op in BACKBONE:
        if group and groups and place(groups[-1][-1]) == place(op):
            groups[-1].append(op)
        else:
            groups.append([op])
    return BackboneGroups(groups, {op: gi for gi, g in enumerate(groups) for op in g})


def add_layer_chunk(b: PlanBuilder, spec: ModelSpec, bb: BackboneGroups, place: Callable[[str], str],
                    dag: nx.DiGraph, preds: dict[str, list[str]], layer: int, c: int, m: int, first_deps: list[int],
                    kv_prev: int, ready: int, cpu_wfmt: str) -> tuple[int, int]:
    """Append the tasks of one layer for chunk c (m tokens); returns (id of its output task, id of its KV-append task
    or -1).

    dag / preds: the chunk's operator DAG (`layer_dag`) and each backbone op's predecessors. first_deps: what the
    layer's first task waits for (the chunk's previous-layer output, and for layer-serial frameworks the previous
    chunk's end). kv_prev: the previous chunk's KV append of this layer (-1: none). ready: the task the ops reading
    the layer's weights wait for (-1: none).
    """
    ids: dict[int, int] = {}
    kv_id = -1
    for gi, g in enumerate(bb.groups):
        deps = set()
        for op in g:
            for p in preds[op]:
                if bb.owner[p] != gi:
                    deps.add(ids[bb.owner[p]])
        if gi == 0:
            deps.update(first_deps)
        if "kv_append" in g:
            deps.add(kv_prev)
        if any(op in MATMULS or op in NORMS for op in g):    # ops reading the layer's weights
            deps.add(ready)
        unit = place(g[0])
        works = [dag.nodes[op]["work"] for op in g]
        if unit == "cpu":
            works = [_with_fmt(w, cpu_wfmt) for w in works]
        kv_bytes = 2 * m * spec.kv_dim * 2 if "kv_append" in g else 0   # B, FP16 K and V of the chunk
        ids[gi] = b.add(f"L{layer}.c{c}.{'+'.join(g) if len(g) < 4 else g[0] + '..' + g[-1]}", unit,
                        sorted(deps), layer=layer, chunk=c, topo=gi, works=works,
                        stealable=(unit == "npu" and len(g) == 1 and g[0] in MATMULS), mem_alloc=kv_bytes,
                        phase="prefill", ops=list(g),
                        tensors=[TensorRef(n) for n in op_tensor_names(g, layer)])
        if "kv_append" in g:
            kv_id = ids[gi]
    return ids[len(bb.groups) - 1], kv_id


def add_lm_head(b: PlanBuilder, spec: ModelSpec, place: Callable[[str], str], last_out: int, head_ready: int,
                last_chunk: int, cpu_wfmt: str) -> int:
    """Final norm (CPU) and the vocabulary projection of the last token, on the unit of the projections; both wait
    for the last layer's output `last_out` and the LM-head weights `head_ready`. Returns the LM head's id."""
    d = spec.d_model
    norm_name, head_name = head_tensor_names(spec)
    norm = b.add("final_norm", "cpu", [last_out, head_ready], layer=spec.n_layers, chunk=last_chunk, topo=0,
                 works=[OpWork("elementwise", m=1, nbytes=4 * d)], phase="prefill", ops=["final_norm"],
                 tensors=[TensorRef(norm_name)])
    head = OpWork("lm_head", m=1, k=d, n=spec.vocab, wfmt=cpu_wfmt)
    return b.add("lm_head", place("q_proj"), [norm, head_ready], layer=spec.n_layers, topo=1, chunk=last_chunk,
                 works=[head], phase="prefill", ops=["lm_head"], tensors=[TensorRef(head_name)])


def set_static_order(b: PlanBuilder, first_id: int, layer_serial: bool) -> None:
    """Number each unit's tasks from `first_id` on in their static dispatch order (`Task.order`).

    Static backbone order: layer-major, backbone position, then chunk (llm.npu / EdgeFlow §4.3); a framework that
    runs one chunk (ubatch) through all layers before the next keeps emission order (chunk-major)."""
    key = (lambda t: t.id) if layer_serial else (lambda t: (t.layer, t.topo, t.chunk, t.id))
    for unit in ("cpu", "npu"):
        mine = [t for t in b.tasks[first_id:] if t.resource == unit]
        for i, t in enumerate(sorted(mine, key=key)):
            t.order = i


def _with_fmt(w: OpWork, fmt: str) -> OpWork:
    """`w` with weight format `fmt` when it is a matmul / LM head in another format (a CPU kernel's format)."""
    if w.kind in ("matmul", "lm_head") and w.wfmt != fmt:
        return OpWork(**{**vars(w), "wfmt": fmt})
    return w
