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
"""
from __future__ import annotations

from typing import Callable

from planner.pipeline.dag import _BACKBONE, MATMULS, NORMS, head_tensor_names, layer_dag, op_tensor_names
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
    order = _BACKBONE
    groups: list[list[str]] = []
    for op in order:
        if group and groups and place(groups[-1][-1]) == place(op):
            groups[-1].append(op)
        else:
            groups.append([op])
    owner = {op: gi for gi, g in enumerate(groups) for op in g}
    first_id = len(b.tasks)
    sizes = chunks(prompt_tokens, chunk_tokens)
    prev_out: list[int] = [start] * len(sizes)        # chunk c's output of the previous layer
    past = 0
    last_chunk_end = start
    kv_ids: list[int] = [-1] * spec.n_layers          # the previous chunk's KV-append task per layer
    for c, m in enumerate(sizes):
        dag = layer_dag(spec, m, past)
        preds = {op: list(dag.predecessors(op)) for op in order}
        kv_prev, kv_ids = kv_ids, [-1] * spec.n_layers
        chunk_end = -1
        for layer in range(spec.n_layers):
            if on_demand is not None and c == 0:
                ready[layer] = on_demand(layer, prev_out[c])
            ids: dict[int, int] = {}
            for gi, g in enumerate(groups):
                deps = set()
                for op in g:
                    for p in preds[op]:
                        if owner[p] != gi:
                            deps.add(ids[owner[p]])
                if gi == 0:
                    deps.add(prev_out[c])
                    if layer_serial and c > 0:
                        deps.add(last_chunk_end)
                if "kv_append" in g:
                    deps.add(kv_prev[layer])
                if any(op in MATMULS or op in NORMS for op in g):    # ops reading the layer's weights
                    deps.add(ready[layer])
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
                    kv_ids[layer] = ids[gi]
            prev_out[c] = ids[len(groups) - 1]
            chunk_end = prev_out[c]
        last_chunk_end = chunk_end
        past += m
    d = spec.d_model
    norm_name, head_name = head_tensor_names(spec)
    if on_demand is not None:                 # the final norm's weights fault in with the head's
        ready[spec.n_layers] = on_demand(spec.n_layers, prev_out[-1])
    norm = b.add("final_norm", "cpu", [prev_out[-1], ready[spec.n_layers]], layer=spec.n_layers,
                 chunk=len(sizes) - 1, topo=0,
                 works=[OpWork("elementwise", m=1, nbytes=4 * d)], phase="prefill", ops=["final_norm"],
                 tensors=[TensorRef(norm_name)])
    head_unit = place("q_proj")
    head = OpWork("lm_head", m=1, k=d, n=spec.vocab, wfmt=cpu_wfmt)
    last = b.add("lm_head", head_unit, [norm, ready[spec.n_layers]], layer=spec.n_layers, topo=1,
                 chunk=len(sizes) - 1, works=[head], phase="prefill", ops=["lm_head"],
                 tensors=[TensorRef(head_name)])
    # static backbone order: layer-major, backbone position, then chunk (llm.npu / EdgeFlow §4.3); a framework that
    # runs one chunk (ubatch) through all layers before the next keeps emission order (chunk-major)
    key = (lambda t: t.id) if layer_serial else (lambda t: (t.layer, t.topo, t.chunk, t.id))
    for unit in ("cpu", "npu"):
        mine = [t for t in b.tasks[first_id:] if t.resource == unit]
        for i, t in enumerate(sorted(mine, key=key)):
            t.order = i
    return last


def _with_fmt(w: OpWork, fmt: str) -> OpWork:
    if w.kind in ("matmul", "lm_head") and w.wfmt != fmt:
        return OpWork(**{**vars(w), "wfmt": fmt})
    return w
