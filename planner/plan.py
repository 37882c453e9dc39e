"""Cold-start plan objects: the typed, JSON-serialisable contract between the planner, the simulator and the HIL runner.

A `Plan` is a DAG of `Task`s, each bound to a resource (flash loader threads, unpack threads, the CPU compute pool,
the NPU, the graph-control thread) plus the dynamic dispatch rules of EdgeFlow §4.3 (`SchedulePolicy`: position-guided
priority and CPU task stealing with a threshold). Tasks carry *work* (FLOPs, bytes, SIMD instructions), not durations:
the executor (simulator or HIL) turns work into time with its cost model and resources. Only pure device constants
(QNN set-up, graph optimisation) travel as a fixed `duration_s` that the planner computed from the device profile.

Resources (`Task.resource`):
- `load`   : loader threads; `read_bytes` from flash in `request_bytes` requests, then `copy_bytes` into NPU buffers,
             then `duration_s` more (e.g. deserialising a materialized graph).
- `unpack` : CPU unpack threads; `works` of kind `unpack`.
- `cpu`    : the CPU compute pool (one op at a time on `Plan.cpu_threads` threads, ops parallelised inside).
- `npu`    : the NPU queue (one op at a time).
- `graph`  : the thread that sets up / composes / optimises / prepares NPU graphs (fixed durations).
- `join`   : a zero-time barrier (e.g. "layer ready" = weights unpacked and graph restored); uses no resource.

Executable plans (docs/hil.md): a plan names what it moves and computes, so a runner needs no side table.
- `Task.tensors`: load tasks list the container tensors (`TensorRef`: blob name, byte offset, byte count) they read;
  unpack tasks the tensors they unpack; compute tasks the layer tensors their ops use. Builders fill the names;
  `planner.pipeline.bind.bind_plan` fills offsets and sizes from a real packed file (and sets `read_bytes` to them).
- `Task.ops`: the backbone op names a compute task runs, in order (`planner.pipeline.dag`, e.g. `["q_proj"]`, or a
  coarse subgraph `["attn_norm", "quant_attn", ...]`); `embed`, `final_norm`, `lm_head` outside layers.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

RESOURCES = ("load", "unpack", "cpu", "npu", "graph", "join")


@dataclass
class OpWork:
    """What an op computes. Matmul: (m tokens) x (k in) -> (n out). Sizes in elements, bytes in B."""
    kind: str                  # matmul | attention | elementwise | unpack | lm_head
    m: int = 0                 # tokens (rows of the activation)
    k: int = 0                 # input features
    n: int = 0                 # output features
    ctx: int = 0               # attention: mean keys per query (causal)
    heads: int = 0             # attention: query heads
    head_dim: int = 0          # attention: head dimension
    nbytes: int = 0            # elementwise: bytes read + written; unpack: bytes written (INT8 out)
    weights: int = 0           # unpack: weights produced
    simd_instr: float = 0.0    # unpack: SIMD instructions (weightlet/mixed formats)
    cycles: float = 0.0        # unpack: scalar-heavy cycles (K-quant)
    wfmt: str = "int8"         # matmul weight format on the CPU: int8 | kquant | a key of the peer costs'
    #                            (planner.peer_costs) llamacpp_gemm_gops_per_ghz ("Q4_0@576": llama.cpp's measured
    #                            rate for that file type) or mnn_gemm_gops_per_ghz ("b8@576": MNN's for its weight bits)
    fmt: str = ""              # unpack: packed format (weightlet | mixed | kquant)
    bits_weights: list[int] = field(default_factory=list)   # unpack: weights per bit width, index = bits (0..8)
    bits_channels: list[int] = field(default_factory=list)  # unpack: output channels per bit width (a fixed cost
    #                                                         per channel: short rows unpack slower per weight)
    calls: int = 0             # unpack: kernel calls the work is made of (one per packed tensor; 0 = one call)
    op: str = ""               # elementwise: the layer op it is (planner.pipeline.dag name; "" = unnamed)

    @property
    def flops(self) -> float:
        if self.kind in ("matmul", "lm_head"):
            return 2.0 * self.m * self.k * self.n
        if self.kind == "attention":
            return 4.0 * self.m * self.ctx * self.heads * self.head_dim
        return 0.0


@dataclass
class TensorRef:
    """A tensor a task moves or uses: container blob name and, once bound to a file, its byte range."""
    name: str                  # container / GGUF tensor name, e.g. "blk.3.attn_q.weight"
    offset: int = 0            # B, start of the blob in the packed file (0 = unbound)
    nbytes: int = 0            # B, blob size (0 = unbound)


@dataclass
class Task:
    id: int
    name: str                              # e.g. "L3.c1.q_proj"
    resource: str                          # one of RESOURCES
    layer: int = -1                        # transformer layer (-1: none; n_layers: lm_head)
    chunk: int = -1                        # prompt chunk (position-guided priority key)
    topo: int = 0                          # index in the layer's topological order
    order: int = 0                         # position in its unit's static backbone queue (cpu / npu tasks)
    deps: list[int] = field(default_factory=list)
    works: list[OpWork] = field(default_factory=list)  # cpu / npu / unpack: ops run back to back (a subgraph)
    duration_s: float = 0.0                # graph tasks (and extra time of load tasks): fixed, from the device profile
    read_bytes: int = 0                    # load: bytes from flash
    request_bytes: int = 0                 # load: request size (bulk read or mmap readahead)
    copy_bytes: int = 0                    # load: bytes copied into NPU-shared buffers after reading
    random_reads: bool = False             # load: requests at scattered offsets (e.g. embedding rows): no readahead
    stealable: bool = False                # npu task the CPU may steal (INT8 matmul)
    mem_alloc: int = 0                     # B allocated when the task starts
    mem_free: int = 0                      # B freed when the task ends
    phase: str = ""                        # setup | load | unpack | graph | prefill (for the breakdown)
    tensors: list[TensorRef] = field(default_factory=list)   # what the task reads / unpacks / computes with
    ops: list[str] = field(default_factory=list)              # compute tasks: backbone op names, in order

    def __post_init__(self) -> None:
        if self.resource not in RESOURCES:
            raise ValueError(f"task {self.name}: unknown resource {self.resource!r} (one of {RESOURCES})")
        for key in ("duration_s", "read_bytes", "request_bytes", "copy_bytes", "mem_alloc", "mem_free"):
            if getattr(self, key) < 0:
                raise ValueError(f"task {self.name}: {key} must be >= 0 (got {getattr(self, key)})")
        if self.read_bytes > 0 and self.request_bytes <= 0:   # else the flash model would read 1-byte requests
            raise ValueError(f"task {self.name}: read_bytes > 0 needs request_bytes > 0")
        self.works = [w if isinstance(w, OpWork) else OpWork(**w) for w in self.works]
        self.tensors = [r if isinstance(r, TensorRef) else TensorRef(**r) for r in self.tensors]


@dataclass
class SchedulePolicy:
    priority: str = "static"      # static: each unit runs its ops strictly in backbone order (Task.order), waiting
    #                               for the next one to become ready | position: any ready op, earlier chunk first
    steal_threshold: int = 0      # 0: no stealing; else CPU steals the NPU queue head when len(queue) > threshold

    def __post_init__(self) -> None:
        if self.priority not in ("static", "position"):
            raise ValueError(f"schedule.priority must be static or position (got {self.priority!r})")
        if self.steal_threshold < 0:
            raise ValueError(f"schedule.steal_threshold must be >= 0 (got {self.steal_threshold})")


@dataclass
class Plan:
    framework: str
    model: str
    device: str
    prompt_tokens: int
    chunk_tokens: int
    tasks: list[Task]
    loader_threads: int = 1
    unpack_threads: int = 1
    graph_threads: int = 1             # threads restoring/preparing NPU graphs
    cpu_threads: int = 1               # threads of the CPU compute pool
    cpu_first_core: int = 0            # compute pool starts at this core (loaders/unpackers use the first ones)
    schedule: SchedulePolicy = field(default_factory=SchedulePolicy)
    info: dict[str, Any] = field(default_factory=dict)   # planner facts (bytes per format, bits histogram, ...)

    def __post_init__(self) -> None:
        if isinstance(self.schedule, dict):
            self.schedule = SchedulePolicy(**self.schedule)
        self.tasks = [t if isinstance(t, Task) else Task(**t) for t in self.tasks]
        ids = [t.id for t in self.tasks]
        if ids != list(range(len(ids))):
            raise ValueError("plan task ids must be 0..n-1 in order")
        for t in self.tasks:
            for d in t.deps:
                if not 0 <= d < t.id:
                    raise ValueError(f"task {t.name}: dependency {d} must precede it (topological ids)")

    def workers(self, resource: str) -> int:
        return {"load": self.loader_threads, "unpack": self.unpack_threads,
                "graph": self.graph_threads}.get(resource, 1)

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> "Plan":
        return cls(**json.loads(text))


class PlanBuilder:
    """Appends tasks with consecutive ids (so dependencies always point backwards: a topological order)."""

    def __init__(self) -> None:
        self.tasks: list[Task] = []

    def add(self, name: str, resource: str, deps: list[int] | tuple[int, ...] = (), **kw: Any) -> int:
        tid = len(self.tasks)
        self.tasks.append(Task(id=tid, name=name, resource=resource, deps=sorted(set(d for d in deps if d >= 0)),
                               **kw))
        return tid
