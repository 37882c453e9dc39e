"""The backbone ops of a Llama layer as the host HIL runner executes them (docs/hil.md "Runner"; EdgeFlow §4.1 W8A8,
§4.3 the operator DAG of planner.pipeline.dag).

Owns the meaning of every op name a plan's compute task lists (`Task.ops`), on one chunk's activations
(`hil.runner_state.ChunkState`) and one layer's weights, with the W8A8 semantics of a file written by quant.export
(golden reference: quant.packed_forward):
  attn_norm / ffn_norm   rmsnorm (native)                     quant_attn / quant_ffn / quant_o / quant_down
  q/k/v_proj, o_proj,    INT8 GEMM -> int32 (native), its N       per-tensor static INT8 (native quantize_i8); a
  gate, up, down         range split over `threads` threads       linear with its own act scale gets its own codes
  dq_*                   dequant int32 -> float32 (native)    rope  adjacent pairs, positions past..past+m-1 (native)
  kv_append              rows past..past+m-1 of the layer's   attention  causal GQA over the KV cache (native)
                         KV cache (native memcpy)             silu  silu(g) (native silu_mul with u = 1)
  mul                    silu(g) * up (NumPy: no native kernel) add_attn / add_ffn  residual add (native)
  final_norm             rmsnorm of the last prompt token     lm_head  dynamic act scale max|h|/127 (native absmax),
                                                                       GEMV with the INT8 embedding rows + row scales
Every kernel call gets `isa` (None: the fastest available).
"""
from __future__ import annotations

import numpy as np

import native
import native.compute as nc
from hil.runner_state import ChunkState, RunState, WeightStore
from planner.pipeline.dag import op_tensor_names
from planner.plan import Task

QMAX = 127
ATTN_IN = ("attn_q", "attn_k", "attn_v")
FFN_IN = ("ffn_gate", "ffn_up")
_MM = {"q_proj": "attn_q", "k_proj": "attn_k", "v_proj": "attn_v", "o_proj": "attn_output", "gate": "ffn_gate",
       "up": "ffn_up", "down": "ffn_down"}
_DQ = {"dq_q": "attn_q", "dq_k": "attn_k", "dq_v": "attn_v", "dq_o": "attn_output", "dq_gate": "ffn_gate",
       "dq_up": "ffn_up", "dq_down": "ffn_down"}
_QUANT = ("quant_attn", "quant_ffn", "quant_o", "quant_down")
LAYER_OPS = ("attn_norm", "quant_attn", *_MM, *_DQ, "rope", "kv_append", "attention", "quant_o", "add_attn",
             "ffn_norm", "quant_ffn", "silu", "mul", "quant_down", "add_ffn")


def _addr(a: np.ndarray) -> int:
    """Address of a C-contiguous array's first element (compile time: the buffers of a run never move)."""
    if not a.flags.c_contiguous:
        raise ValueError("runner buffer is not C-contiguous")
    return a.ctypes.data


def needed_tensors(t: Task) -> list[str]:
    """Container tensors compute task `t` really reads (quantize ops use only metadata act scales)."""
    if t.layer < 0 or any(op in ("final_norm", "lm_head") for op in t.ops):
        return [r.name for r in t.tensors]
    return op_tensor_names([op for op in t.ops if not op.startswith("quant_")], t.layer)


class OpRunner:
    """Runs compute tasks. `pool`: native helper threads (`native.compute.GemmPool`) that split a GEMM's N range with
    the calling thread.

    Each task's ops are compiled once, before t0 (`prepare`), into steps: closures over the raw kernel entry points
    with every activation address, shape and scale resolved (the buffers of `RunState` never move), so running an op
    costs one closure call and one ctypes call — no argument checks, no dictionary walks (they ran at compile time).
    A weight's address is looked up when the step runs (`WeightStore.ptrs`): the tensor is loaded or unpacked during
    the run. Which quantized-input buffer each linear reads is fixed at compile time too: the quantize ops of a layer
    give each distinct activation scale of their linears one buffer, in the linears' order (`_x8`); the plan's
    dependencies run a layer's quantize op before its linears."""

    def __init__(self, rs: RunState, ws: WeightStore, act: dict[str, float], isa: str | None,
                 pool: nc.GemmPool | None = None) -> None:
        self.rs, self.ws, self.act, self.isa, self.pool = rs, ws, act, isa, pool
        self.spec = rs.spec
        self.lib = nc._lib()
        self.isa_i = nc._isa(isa)
        self.memcpy = native._load().ef_memcpy
        self.steps: dict[tuple[int, int], list] = {}     # (task id, GEMM threads) -> compiled steps

    # ---- helpers -------------------------------------------------------------------------------------------------
    def _scale(self, layer: int, kind: str) -> float:
        name = f"blk.{layer}.{kind}.weight"
        if name not in self.act:
            raise ValueError(f"packed file metadata: no act_scales entry for {name!r}")
        return self.act[name]

    def _x8(self, c: ChunkState, layer: int, kind: str) -> np.ndarray:
        """The (m, K) int8 buffer holding linear `kind`'s quantized input: per distinct act scale of the linears one
        quantize op feeds (ATTN_IN, FFN_IN: one buffer per scale in their order; o_proj: the first; down: x8f)."""
        if kind == "ffn_down":
            return c.x8f
        group = ATTN_IN if kind in ATTN_IN else FFN_IN if kind in FFN_IN else (kind,)
        scales: list[float] = []
        for k in group:
            a = self._scale(layer, k)
            if a not in scales:
                scales.append(a)
        K = self.spec.q_dim if kind == "attn_output" else self.spec.d_model
        return c.x8[scales.index(self._scale(layer, kind))][:c.m * K].reshape(c.m, K)

    def gemm(self, x8: np.ndarray, w: np.ndarray, out: np.ndarray, threads: int) -> None:
        """out (M, N) int32 = x8 (M, K) @ w (N, K)^T, N split over `threads` threads (this one + pool helpers)."""
        if self.pool is not None and threads > 1:
            self.pool.gemm(x8, w, out=out, threads=threads, isa=self.isa)
        else:
            nc.gemm_i8_i32(x8, w, out=out, isa=self.isa)

    def _entry(self, name: str, shape: tuple[int, ...]) -> None:
        """Compile-time check that the file's tensor `name` has the shape the op's buffers assume."""
        e = self.ws.ix.entries.get(name)
        if e is None:
            raise ValueError(f"packed file: no tensor {name!r}")
        got = (e.C * e.D,) if len(shape) == 1 else (e.C, e.D)
        if got != shape and not (len(shape) == 1 and e.C == shape[0]):
            raise ValueError(f"packed file: tensor {name!r} has shape {(e.C, e.D)}, the op needs {shape}")

    # ---- compile / run -------------------------------------------------------------------------------------------
    def prepare(self, tasks, cpu_threads: int) -> None:
        """Compile every compute task before t0: for its own unit's GEMM threads, and for an NPU task with a matmul
        (the CPU may steal it) also for the CPU's."""
        for t in tasks:
            if t.resource == "cpu":
                self.compile(t, cpu_threads)
            elif t.resource == "npu":
                self.compile(t, 1)
                if cpu_threads != 1 and any(op in _MM for op in t.ops):
                    self.compile(t, cpu_threads)

    def compile(self, t: Task, threads: int) -> list:
        key = (t.id, threads)
        steps = self.steps.get(key)
        if steps is None:
            steps = []
            for op in t.ops:
                if op == "final_norm":
                    steps.append(self.final_norm)
                elif op == "lm_head":
                    steps.append(lambda th=threads: self.lm_head(th))
                elif op in LAYER_OPS:
                    steps.append(self.layer_op(op, self.rs.chunks[t.chunk], t.layer, threads))
                else:
                    raise ValueError(f"task {t.name}: unknown op {op!r}")
            self.steps[key] = steps
        return steps

    def run(self, t: Task, threads: int) -> None:
        """Run the ops of compute task `t` in order on its chunk (`threads`: GEMM threads of the unit)."""
        for step in self.steps.get((t.id, threads)) or self.compile(t, threads):
            step()

    def layer_op(self, op: str, c: ChunkState, layer: int, threads: int):
        """The step (a no-argument callable) that runs layer op `op` on chunk `c`."""
        if op in _MM:
            return self._matmul_step(op, c, layer, threads)
        if op in _DQ:
            return self._dequant_step(op, c, layer)
        if op == "attn_norm" or op == "ffn_norm":
            return self._norm_step(op, c, layer)
        if op in _QUANT:
            return self._quant_step(op, c, layer)
        if op == "rope":
            return self._rope_step(c)
        if op == "kv_append":
            return self._kv_append_step(c, layer)
        if op == "attention":
            return self._attention_step(c, layer)
        return self._elementwise_step(op, c)

    def _matmul_step(self, op: str, c: ChunkState, layer: int, threads: int):
        """INT8 GEMM of the chunk's quantized activations with the layer's weights (the native pool for > 1 thread)."""
        L, isa, ck, ptrs = self.lib, self.isa_i, nc._ok, self.ws.ptrs
        kind = _MM[op]
        name = f"blk.{layer}.{kind}.weight"
        x8, acc = self._x8(c, layer, kind), c.acc[kind]
        (_, K), N, m = x8.shape, acc.shape[1], c.m
        self._entry(name, (N, K))
        px, pacc = _addr(x8), _addr(acc)
        if self.pool is not None and threads > 1:
            raw, h = self.pool.raw, self.pool.handle
            return lambda: ck(raw(h, threads, isa, px, ptrs(name, threads)[0], pacc, m, K, N, 0, N), op)
        g = L.ef_gemm_i8_i32
        return lambda: ck(g(isa, px, ptrs(name, threads)[0], pacc, m, K, N, 0, N), op)

    def _dequant_step(self, op: str, c: ChunkState, layer: int):
        """INT32 accumulators -> float32 with the activation scale and the weights' per-channel scales."""
        kind = _DQ[op]
        name = f"blk.{layer}.{kind}.weight"
        out = {"attn_q": c.q, "attn_k": c.k, "attn_v": c.v, "attn_output": c.y, "ffn_gate": c.g,
               "ffn_up": c.u, "ffn_down": c.y}[kind]
        acc, m = c.acc[kind], c.m
        N = acc.shape[1]
        if out.size != m * N:
            raise ValueError(f"L{layer} {op}: output buffer of {out.size} floats, the linear gives {m} x {N}")
        self._entry(name, (N, self.ws.ix.entries[name].D))
        xs, pacc, pout = float(np.float32(self._scale(layer, kind))), _addr(acc), _addr(out)
        g = self.lib.ef_dequant_i32_f32
        isa, ck, ptrs = self.isa_i, nc._ok, self.ws.ptrs
        return lambda: ck(g(isa, pacc, xs, ptrs(name)[1], pout, m, N, 0, m), op)

    def _norm_step(self, op: str, c: ChunkState, layer: int):
        name = f"blk.{layer}.{op}.weight"
        m, d = c.m, self.spec.d_model
        self._entry(name, (d,))
        px, ph, eps, g = _addr(c.x), _addr(c.h), float(self.spec.norm_eps), self.lib.ef_rmsnorm_f32
        isa, ck, ptrs = self.isa_i, nc._ok, self.ws.ptrs
        return lambda: ck(g(isa, px, ptrs(name)[0], eps, ph, m, d, 0, m), op)

    def _quant_step(self, op: str, c: ChunkState, layer: int):
        """float32 -> INT8 at each distinct activation scale of the linears that read the source (one buffer each)."""
        src, kinds = {"quant_attn": (c.h, ATTN_IN), "quant_ffn": (c.h, FFN_IN), "quant_o": (c.o, ("attn_output",)),
                      "quant_down": (c.s, ("ffn_down",))}[op]
        jobs, seen = [], set()
        for kind in kinds:
            buf = self._x8(c, layer, kind)
            if _addr(buf) not in seen:
                seen.add(_addr(buf))
                jobs.append((float(np.float32(self._scale(layer, kind))), _addr(buf)))
        psrc, n, g, isa, ck = _addr(src), src.size, self.lib.ef_quantize_f32_i8, self.isa_i, nc._ok

        def quant() -> None:
            for a, pdst in jobs:
                ck(g(isa, psrc, a, pdst, n), op)
        return quant

    def _rope_step(self, c: ChunkState):
        sp, m = self.spec, c.m
        H, KV, hd = sp.n_heads, sp.n_kv_heads, sp.head_dim
        if self.rs.cos.shape[1] != hd // 2:
            raise ValueError(f"rope tables: {self.rs.cos.shape[1]} columns, head_dim {hd} needs {hd // 2}")
        pcos, psin = _addr(self.rs.cos[c.past:c.past + m]), _addr(self.rs.sin[c.past:c.past + m])
        pq, pk, g, isa, ck = _addr(c.q), _addr(c.k), self.lib.ef_rope_f32, self.isa_i, nc._ok

        def rope() -> None:
            ck(g(isa, pq, pcos, psin, m, H, hd), "rope")
            ck(g(isa, pk, pcos, psin, m, KV, hd), "rope")
        return rope

    def _kv_append_step(self, c: ChunkState, layer: int):
        m = c.m
        kc, vc = self.rs.kcache[layer][c.past:c.past + m], self.rs.vcache[layer][c.past:c.past + m]
        if kc.shape != c.k.shape or vc.shape != c.v.shape:
            raise ValueError(f"L{layer} kv_append: cache rows {kc.shape} != keys {c.k.shape}")
        pkc, pvc, pk, pv, nb, cp = _addr(kc), _addr(vc), _addr(c.k), _addr(c.v), c.k.nbytes, self.memcpy

        def kv_append() -> None:
            cp(pkc, pk, nb)
            cp(pvc, pv, nb)
        return kv_append

    def _attention_step(self, c: ChunkState, layer: int):
        sp, m = self.spec, c.m
        kc, vc = self.rs.kcache[layer], self.rs.vcache[layer]
        cap, past = kc.shape[0], c.past
        if past + m > cap:
            raise ValueError(f"L{layer} attention: {past} + {m} positions exceed the cache ({cap})")
        pq, pk, pv, po, g = _addr(c.q), _addr(kc), _addr(vc), _addr(c.o), self.lib.ef_attention_f32
        H, KV, hd, isa, ck = sp.n_heads, sp.n_kv_heads, sp.head_dim, self.isa_i, nc._ok
        return lambda: ck(g(isa, pq, pk, pv, cap, past, m, H, KV, hd, po, 0, H), "attention")

    def _elementwise_step(self, op: str, c: ChunkState):
        """The residual adds, the fused SiLU(gate) x 1 and the gate x up product."""
        isa, ck = self.isa_i, nc._ok
        if op == "add_attn" or op == "add_ffn":
            px, py, n, g = _addr(c.x), _addr(c.y), c.x.size, self.lib.ef_add_f32
            return lambda: ck(g(isa, px, py, px, n), op)
        if op == "silu":
            pg, p1, ps, n, g = _addr(c.g), _addr(c.ones), _addr(c.s), c.g.size, self.lib.ef_silu_mul_f32
            return lambda: ck(g(isa, pg, p1, ps, n), op)
        if op == "mul":
            s_, u_ = c.s, c.u
            return lambda: np.multiply(s_, u_, out=s_)
        raise ValueError(f"unknown layer op {op!r}")  # pragma: no cover - LAYER_OPS and this list the same names

    def final_norm(self) -> None:
        x = self.rs.chunks[-1].x
        nc.rmsnorm(x[-1:], self.ws.get("output_norm.weight"), self.spec.norm_eps, out=self.rs.hf, isa=self.isa)

    def lm_head(self, threads: int) -> None:
        rs = self.rs
        q, s = self.ws.get("token_embd.weight", threads)
        a = float(np.float32(nc.absmax(rs.hf, isa=self.isa)) / np.float32(QMAX))
        nc.quantize_i8(rs.hf, a, out=rs.head_x8, isa=self.isa)
        self.gemm(rs.head_x8, q, rs.head_acc, threads)
        nc.dequant_i32(rs.head_acc, a, s, out=rs.logits, isa=self.isa)
