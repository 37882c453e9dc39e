"""The HIL runner's own costs per task, measured by running the runner (docs/hil.md "Runner overheads").

The cost table times each kernel on its own (hil.calibrate); a task in the runner costs more than its kernel: the
worker loop (lock, `Dispatcher` pop / complete, notifications, span and memory bookkeeping, the input check), the op's
Python path (`hil.runner_ops.OpRunner`'s compiled step: one closure and one raw ctypes call, the weight's address
looked up), a load's buffer mapping (`fresh_empty`, one anonymous mapping per tensor), read syscall and arrival
bookkeeping, an unpack's output mapping and scale copy. A bare task loop with the kernels left out measured 6.4 us
per task. The bare kernel calls
subtracted below go through `native.compute`'s checked wrappers (~5 us of Python each), as the cost table's points
do, so an op's modelled total (table + overhead) is right while ~5 us of it counts as kernel time.

So the calibration runs the real runner (`hil.runner.run_plan`, not evicted: every read is a page-cache hit) on a tiny
model (`hil.tinymodel`, d_model 64: every kernel is a few microseconds) with a sequential plan: one loader reads every
tensor, then one unpacker unpacks every packed tensor, then the CPU worker runs every op of every layer on one chunk,
one op per task. Phases do not overlap (no two Python threads compete for the interpreter lock), so each worker's
cycle — start of one task to the start of its next — is the cost of one task on an otherwise idle machine. Per task
kind, the median cycle minus the median time of the same kernels called bare at the same tiny shapes is the
runner's overhead the simulator adds per task (`RunnerCost`). The bare calls go through the checked wrappers, the
runner's steps through raw ctypes calls, so that overhead is the right total per op but not the runner's Python per
op: the gap between two op spans (the worker loop: finish, pop, notify, under the GIL) is measured apart,
`RunnerCost.op_python` -> `HostRuntime.cpu_op_python_s`, the share of each op the simulator holds the interpreter
lock for (6-7 us here against the ~1 us overhead).
"""
from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hil.calibrate_compute import Kernels
from hil.calibrate_stats import Stat, timed
from hil.packed_index import EMBED, FileIndex, read_index
from hil.runner import run_plan
from hil.tinymodel import tiny_spec, write_tiny
from planner.pipeline.dag import BACKBONE
from planner.plan import Plan, Task, TensorRef
from quant.arch import ModelSpec
from quant.pack.formats import BY_CODE, F32_CODE

INT8_CODE = 1            # container code of the int8 format (quant.pack.formats.Int8): a zero-copy view, no unpack

CAL_LAYERS = 4          # tiny model layers: 4 x 27 compute ops, 4 x 7 packed tensors per run
CAL_PROMPT = 8          # tokens, one chunk


@dataclass
class RunnerCost:
    """Seconds the runner spends per task beyond the task's kernels and bytes (each: median over tasks and runs)."""
    op: Stat                # per compute op (one op per task): worker loop + op path beyond the bare kernel call
    load_tensor: Stat       # per tensor a load task reads: loop, buffer mapping, read syscall, arrival bookkeeping
    unpack_tensor: Stat     # per tensor an unpack task unpacks: loop, output mapping, scale copy, beyond the kernel
    bare_op: Stat           # the bare kernel calls at the tiny shapes (subtracted from the op cycles)
    bare_unpack: Stat       # the bare unpack calls of the tiny tensors (subtracted from the unpack cycles)
    op_python: Stat | None = None   # per compute op: the worker loop between two op spans (Python under the GIL)


def sequential_plan(ix: FileIndex, spec: ModelSpec, prompt: int) -> Plan:
    """Load every tensor (one loader, file order), then unpack every packed tensor (one unpacker), then run every
    layer op, the final norm and the LM head on one chunk (one CPU thread, one op per task): a bound plan whose phases
    do not overlap."""
    ents = sorted(ix.entries.items(), key=lambda kv: kv[1].offset)
    ref = {n: TensorRef(n, e.offset, e.size) for n, e in ents}
    e = ix.entries[EMBED]
    tasks = [Task(0, "embed_rows", "load", ops=["embed"], tensors=[ref[EMBED]], read_bytes=prompt * ix.embed_row_bytes,
                  request_bytes=ix.embed_row_bytes, random_reads=True, phase="load")]
    loads = []
    for n, e in ents:
        loads.append(len(tasks))
        tasks.append(Task(len(tasks), f"load.{n}", "load", tensors=[ref[n]], read_bytes=e.size, request_bytes=1 << 20,
                          mem_alloc=e.size, phase="load"))
    unpacks = []
    for n, e in ents:
        if e.fmt not in (F32_CODE, INT8_CODE):
            unpacks.append(len(tasks))
            tasks.append(Task(len(tasks), f"unpack.{n}", "unpack", tensors=[ref[n]], deps=list(loads),
                              mem_alloc=e.C * e.D, phase="unpack"))
    prev = [0, *loads, *unpacks]
    order = 0
    for layer in range(spec.n_layers):
        for op in BACKBONE:
            tasks.append(Task(len(tasks), f"L{layer}.c0.{op}", "cpu", layer=layer, chunk=0, order=order, deps=prev,
                              ops=[op], phase="prefill"))
            prev, order = [len(tasks) - 1], order + 1
    head = ref[EMBED] if spec.tied_embeddings else ref["output.weight"]
    for op, tensors in (("final_norm", [ref["output_norm.weight"]]), ("lm_head", [head])):
        tasks.append(Task(len(tasks), op, "cpu", layer=spec.n_layers, chunk=0, order=order, deps=prev, ops=[op],
                          tensors=tensors, phase="prefill"))
        prev, order = [len(tasks) - 1], order + 1
    return Plan("runner_calibration", spec.name, "host", prompt, prompt, tasks, info={"bound": True})


def _cycles(spans, keep) -> list[tuple[int, float]]:
    """(task id, start-to-next-start s) of consecutive spans of one worker that `keep` accepts."""
    sp = sorted((s for s in spans if keep(s)), key=lambda s: s.start)
    return [(a.task, b.start - a.start) for a, b in zip(sp, sp[1:])]


def _bare_ops(prompt: int, spec: ModelSpec, reps: int) -> list[float]:
    """Median s of each bare kernel call the tiny model's ops make (elementwise kinds and one GEMM)."""
    k = Kernels()
    rng = np.random.default_rng(5)
    calls = [c for c, _ in k.elementwise_calls(prompt, spec.d_model, rng).values()]
    calls.append(k.gemm_call(prompt, spec.d_model, spec.d_ffn, 1, rng))
    return [timed(c, reps, budget_s=0.02).median for c in calls]


def _bare_unpacks(ix: FileIndex, reps: int) -> list[float]:
    """Per packed tensor of the file: median s of unpacking it into an already touched output minus that of
    unpacking its first channel only — the kernel's per-weight / per-channel work, which the cost table models; the
    fixed cost of a call (argument checks, ctypes) is not in the table and stays in the runner's per-tensor cost."""
    raw = np.fromfile(ix.path, dtype=np.uint8)
    out = []
    for e in ix.entries.values():
        if e.fmt in (F32_CODE, INT8_CODE):
            continue
        blob = raw[e.offset:e.offset + e.size]
        payload, bits3 = blob[e.payload_off:e.payload_off + e.payload_size], blob[:(3 * e.C + 7) // 8]
        dst = np.ones((e.C, e.D), dtype=np.int8)
        fmt = BY_CODE[e.fmt]
        full = timed(lambda: fmt.unpack_native(payload, bits3, e.C, e.D, e.group, out=dst), reps, budget_s=0.01)
        one = timed(lambda: fmt.unpack_native(payload, bits3, e.C, e.D, e.group, out=dst, c1=1), reps, budget_s=0.01)
        out.append(max(0.0, full.median - one.median))
    return out


class TinyRun:
    """The tiny model written once (under `scratch_dir`, removed on exit) and its sequential plan, run on demand."""

    def __init__(self, scratch_dir: Path | None = None) -> None:
        self.scratch_dir = scratch_dir
        self.spec = tiny_spec(CAL_LAYERS)
        self.toks = np.random.default_rng(3).integers(0, self.spec.vocab, CAL_PROMPT)

    def __enter__(self) -> "TinyRun":
        self._tmp = tempfile.TemporaryDirectory(prefix="runner-cal-", dir=self.scratch_dir)
        try:
            self.path = write_tiny(Path(self._tmp.name), self.spec, "weightlet")
            self.ix = read_index(self.path)
            self.plan = sequential_plan(self.ix, self.spec, CAL_PROMPT)
            self.run()                                              # warm-up: code paths, page cache
        except BaseException:
            self._tmp.cleanup()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self._tmp.cleanup()

    def run(self):
        return run_plan(self.plan, self.path, self.toks, spec=self.spec, evict=False).timeline

    def cycle(self) -> float:
        """Median start-to-start cycle (s) over every task of one run: the runner's per-task time, kernels included
        (the `runtime` probe of hil.calibrate_corun)."""
        tl = self.run()
        cyc = [c for r in ("load", "unpack", "cpu") for _, c in _cycles(tl.spans, lambda s, r=r: s.resource == r)]
        return float(np.median(cyc))


def measure_runner_cost(tiny: TinyRun, runs: int, reps: int, read_s_per_byte: float, touch_s_per_byte: float
                        ) -> RunnerCost:
    """Run the tiny model's sequential plan `runs` times and derive `RunnerCost`.

    What the simulator already charges per byte is taken out of each cycle: a load's bytes at `read_s_per_byte`
    (a read into fresh buffers, CPU), an unpack's fresh INT8 output at `touch_s_per_byte` (the unpack kernel's first
    touch)."""
    plan, spec = tiny.plan, tiny.spec
    is_op = {t.id for t in plan.tasks if t.resource == "cpu" and t.layer < spec.n_layers}
    size = {t.id: t.read_bytes for t in plan.tasks if t.resource == "load"}
    out = {t.id: t.mem_alloc for t in plan.tasks if t.resource == "unpack"}
    ops: list[list[float]] = []                # per run: the cycles of that run
    loads: list[list[float]] = []
    unpacks: list[list[float]] = []
    gaps: list[list[float]] = []               # per run: end of one op's span to the start of the next
    for _ in range(max(1, runs)):
        tl = tiny.run()
        ops.append([c for _, c in _cycles(tl.spans, lambda s: s.task in is_op)])
        sp = sorted((s for s in tl.spans if s.task in is_op), key=lambda s: s.start)
        gaps.append([b.start - a.end for a, b in zip(sp, sp[1:])])
        loads.append([c - size[t] * read_s_per_byte
                      for t, c in _cycles(tl.spans, lambda s: s.resource == "load" and s.task != 0)])
        unpacks.append([c - out[t] * touch_s_per_byte
                        for t, c in _cycles(tl.spans, lambda s: s.resource == "unpack")])
    bare_op = Stat.of(_bare_ops(CAL_PROMPT, spec, reps))
    bare_unpack = Stat.of(_bare_unpacks(tiny.ix, reps))

    def less(per_run: list[list[float]], bare: float) -> Stat:
        """Median of the per-run median cycles minus `bare` (a run disturbed by other work on the host moves it
        only when it is the majority); spread of the per-run medians; n = cycles."""
        runs_med = [float(np.median(r)) - bare for r in per_run if r]
        med = float(np.median(runs_med))
        spread = float(np.ptp(runs_med) / med) if med > 0 and len(runs_med) > 1 else 0.0
        return Stat(max(0.0, med), spread, sum(len(r) for r in per_run))

    return RunnerCost(less(ops, bare_op.median), less(loads, 0.0), less(unpacks, bare_unpack.median), bare_op,
                      bare_unpack, less(gaps, 0.0))
