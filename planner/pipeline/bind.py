"""Bind a cold-start plan to a real packed model file: every tensor reference gets its byte range (docs/hil.md).

Plan builders name tensors (`Task.tensors`, `planner.pipeline.dag` names); the sizes they plan with come from the
format model (`planner.formats`). Before a plan runs on hardware (and before the simulator predicts that run), it is
bound to the file the runner will read: load tasks get the blobs' (offset, size) ranges and `read_bytes` = what they
will really read, so the prediction and the measurement talk about the same bytes. Several load tasks of one layer
(llama.cpp's page faults, split over reader threads) share the layer's byte range in order, in proportion to their
planned bytes. The embedding load reads only the prompt's rows (`embed_row_bytes` each).
"""
from __future__ import annotations

import copy
from collections.abc import Mapping

from planner.plan import Plan, TensorRef


def _split(ranges: list[TensorRef], weights: list[int]) -> list[list[TensorRef]]:
    """Cut a list of byte ranges into len(weights) consecutive pieces with sizes in proportion to `weights`."""
    total = sum(r.nbytes for r in ranges)
    wsum = sum(weights) or len(weights)
    bounds, acc = [], 0
    for w in weights:
        acc += w if sum(weights) else 1
        bounds.append(total * acc // wsum)
    out: list[list[TensorRef]] = [[] for _ in weights]
    pos, k = 0, 0                              # pos: bytes of `ranges` consumed so far
    for r in ranges:
        at = 0
        while at < r.nbytes:
            while bounds[k] <= pos:
                k += 1
            take = min(r.nbytes - at, bounds[k] - pos)
            out[k].append(TensorRef(r.name, r.offset + at, take))
            at += take
            pos += take
    return out


def bind_plan(plan: Plan, entries: Mapping[str, tuple[int, int]], embed_row_bytes: int) -> Plan:
    """A copy of `plan` with every TensorRef bound to `entries` (name -> (offset B, size B)) of one packed file.

    Raises ValueError naming the first tensor the file does not hold."""
    p = copy.deepcopy(plan)

    def ref(name: str, task: str) -> TensorRef:
        if name not in entries:
            raise ValueError(f"plan task {task}: tensor {name!r} is not in the packed file")
        off, size = entries[name]
        return TensorRef(name, int(off), int(size))

    loads: dict[int, list] = {}
    for t in p.tasks:
        if t.resource == "load" and t.layer >= 0 and t.tensors:
            loads.setdefault(t.layer, []).append(t)
        elif t.tensors:
            t.tensors = [ref(r.name, t.name) for r in t.tensors]
            if t.resource == "load":                      # embedding rows of the prompt: one read per row
                t.read_bytes = p.prompt_tokens * embed_row_bytes
                t.request_bytes = embed_row_bytes
    for layer, tasks in loads.items():
        ranges = [ref(r.name, tasks[0].name) for r in tasks[0].tensors]
        for t, piece in zip(tasks, _split(ranges, [t.read_bytes for t in tasks])):
            t.tensors = piece
            had_copy = t.copy_bytes > 0
            t.read_bytes = sum(r.nbytes for r in piece)
            if had_copy:
                t.copy_bytes = t.read_bytes
            if t.mem_alloc:
                t.mem_alloc = t.read_bytes
    p.info = {**p.info, "bound": True}
    return p
