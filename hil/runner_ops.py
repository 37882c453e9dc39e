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

from concurrent.futures import ThreadPoolExecutor

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
LAYER_OPS = ("attn_norm", "quant_attn", *_MM, *_DQ, "rope", "kv_append", "attention", "quant_o", "add_attn",
             "ffn_norm", "quant_ffn", "silu", "mul", "quant_down", "add_ffn")


def needed_tensors(t: Task) -> list[str]:
    """Container tensors compute task `t` really reads (quantize ops use only metadata act scales)."""
    if t.layer < 0 or any(op in ("final_norm", "lm_head") for op in t.ops):
        return [r.name for r in t.tensors]
    return op_tensor_names([op for op in t.ops if not op.startswith("quant_")], t.layer)


class OpRunner:
    """Runs compute tasks. `pool`: `helpers` threads that split a GEMM's N range with the calling thread."""

    def __init__(self, rs: RunState, ws: WeightStore, act: dict[str, float], isa: str | None,
                 pool: ThreadPoolExecutor | None, helpers: int = 0) -> None:
        self.rs, self.ws, self.act, self.isa, self.pool = rs, ws, act, isa, pool
        self.helpers = helpers if pool is not None else 0
        self.spec = rs.spec

    # ---- helpers -------------------------------------------------------------------------------------------------
    def _w(self, layer: int, kind: str, threads: int):
        return self.ws.get(f"blk.{layer}.{kind}.weight", threads)

    def _scale(self, layer: int, kind: str) -> float:
        name = f"blk.{layer}.{kind}.weight"
        if name not in self.act:
            raise ValueError(f"packed file metadata: no act_scales entry for {name!r}")
        return self.act[name]

    def gemm(self, x8: np.ndarray, w: np.ndarray, out: np.ndarray, threads: int) -> None:
        """out (M, N) int32 = x8 (M, K) @ w (N, K)^T, N split over `threads` threads (this one + pool helpers)."""
        N = w.shape[0]
        t = min(threads, N, 1 + self.helpers)
        if t <= 1:
            nc.gemm_i8_i32(x8, w, out=out, isa=self.isa)
            return
        cuts = [N * i // t for i in range(t + 1)]
        futs = [self.pool.submit(nc.gemm_i8_i32, x8, w, out, cuts[i], cuts[i + 1], 1, self.isa)
                for i in range(1, t)]
        nc.gemm_i8_i32(x8, w, out=out, n0=cuts[0], n1=cuts[1], isa=self.isa)
        for f in futs:
            f.result()

    def _quant(self, c: ChunkState, src: np.ndarray, layer: int, kinds: tuple[str, ...]) -> None:
        """Quantize `src` once per distinct act scale of `kinds` (equal scales share one code buffer)."""
        m, K = src.shape
        done: dict[float, np.ndarray] = {}
        for i, kind in enumerate(kinds):
            a = self._scale(layer, kind)
            if a not in done:
                buf = c.x8[len(done)][:m * K].reshape(m, K)
                done[a] = nc.quantize_i8(src, a, out=buf, isa=self.isa)
            c.use[kind] = done[a]

    # ---- ops -----------------------------------------------------------------------------------------------------
    def run(self, t: Task, threads: int) -> None:
        """Run the ops of compute task `t` in order on its chunk (`threads`: GEMM threads of the unit)."""
        for op in t.ops:
            if op == "final_norm":
                self.final_norm()
            elif op == "lm_head":
                self.lm_head(threads)
            elif op in LAYER_OPS:
                self.layer_op(op, self.rs.chunks[t.chunk], t.layer, threads)
            else:
                raise ValueError(f"task {t.name}: unknown op {op!r}")

    def layer_op(self, op: str, c: ChunkState, layer: int, threads: int) -> None:
        sp, isa = self.spec, self.isa
        if op in _MM:
            kind = _MM[op]
            q, _s = self._w(layer, kind, threads)
            if kind not in c.use:
                raise RuntimeError(f"L{layer} {op}: its input was not quantized (quant op missing before it)")
            self.gemm(c.use.pop(kind), q, c.acc[kind], threads)
        elif op in _DQ:
            kind = _DQ[op]
            _q, s = self._w(layer, kind, threads)
            out = {"attn_q": c.q, "attn_k": c.k, "attn_v": c.v, "attn_output": c.y, "ffn_gate": c.g,
                   "ffn_up": c.u, "ffn_down": c.y}[kind]
            nc.dequant_i32(c.acc[kind], self._scale(layer, kind), s, out=out.reshape(c.m, -1), isa=isa)
        elif op == "attn_norm" or op == "ffn_norm":
            g = self.ws.get(f"blk.{layer}.{op}.weight")
            nc.rmsnorm(c.x, g, sp.norm_eps, out=c.h, isa=isa)
        elif op == "quant_attn":
            self._quant(c, c.h, layer, ATTN_IN)
        elif op == "quant_ffn":
            self._quant(c, c.h, layer, FFN_IN)
        elif op == "quant_o":
            self._quant(c, c.o, layer, ("attn_output",))
        elif op == "quant_down":
            a = self._scale(layer, "ffn_down")
            c.use["ffn_down"] = nc.quantize_i8(c.s, a, out=c.x8f, isa=isa)
        elif op == "rope":
            cos, sin = self.rs.cos[c.past:c.past + c.m], self.rs.sin[c.past:c.past + c.m]
            nc.rope(c.q, cos, sin, isa=isa)
            nc.rope(c.k, cos, sin, isa=isa)
        elif op == "kv_append":
            native.memcpy(self.rs.kcache[layer][c.past:c.past + c.m], c.k)
            native.memcpy(self.rs.vcache[layer][c.past:c.past + c.m], c.v)
        elif op == "attention":
            nc.attention(c.q, self.rs.kcache[layer], self.rs.vcache[layer], c.past, out=c.o, isa=isa)
        elif op == "add_attn" or op == "add_ffn":
            nc.add(c.x, c.y, out=c.x, isa=isa)
        elif op == "silu":
            nc.silu_mul(c.g, c.ones, out=c.s, isa=isa)
        elif op == "mul":
            np.multiply(c.s, c.u, out=c.s)
        else:  # pragma: no cover - LAYER_OPS and this dispatch list the same names
            raise ValueError(f"unknown layer op {op!r}")

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
