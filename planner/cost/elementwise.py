"""Which measured kernel each layer op of the DAG runs as, and how many of that kernel's bytes it moves.

The operator DAG (`planner.pipeline.dag`) counts an elementwise op's traffic in its own convention (`OpWork.nbytes`,
e.g. 4 B per element of an RMSNorm). The host calibration times the native kernels the HIL runner calls
(`hil.runner_ops`) and records each kernel's work in bytes it reads and writes in float32 / int32 / int8
(`hil.calibrate` `elementwise_calls`: RMSNorm 8 B per element, quantize 5, dequantize 8, RoPE 8 per rotated
element, silu_mul 12, add 12). A table cost model that fits one line over every kernel's points and applies it to
the DAG's bytes under-predicts these ops by 1.7-3x at 128 tokens on the host (measured 20.3 ms of CPU for
llama.cpp-style SmolLM2's elementwise ops against 10.9 predicted; docs/hil.md "What the simulator models on this
host"). `HOST_KERNELS[op] = (kernel, ratio)`: the op runs as `kernel`, and moves `ratio` x `OpWork.nbytes` of
that kernel's bytes. A cost table with per-kernel points (`planner.cost.table`) predicts the op from that kernel's
own fit.
"""
from __future__ import annotations

# op -> (kernel the host runner calls, that kernel's bytes per DAG byte)
HOST_KERNELS: dict[str, tuple[str, float]] = {
    "attn_norm": ("rmsnorm", 8 / 4),      # read x, write h (float32) / DAG 4 B per element
    "ffn_norm": ("rmsnorm", 8 / 4),
    "quant_attn": ("quantize", 5 / 3),    # read float32, write int8 (one call per distinct activation scale: one
    "quant_ffn": ("quantize", 5 / 3),     # in the packed files here) / DAG 3 B per element
    "quant_o": ("quantize", 5 / 3),
    "quant_down": ("quantize", 5 / 3),
    "dq_q": ("dequant", 8 / 3),           # read int32, write float32 / DAG 3 B per element
    "dq_k": ("dequant", 8 / 3),
    "dq_v": ("dequant", 8 / 3),
    "dq_o": ("dequant", 8 / 3),
    "dq_gate": ("dequant", 8 / 3),
    "dq_up": ("dequant", 8 / 3),
    "dq_down": ("dequant", 8 / 3),
    "rope": ("rope", 8 / 4),              # q and k rotated in place (read + write float32) / DAG 4 B per element
    "silu": ("silu_mul", 12 / 4),         # silu(g) through the fused silu_mul kernel with u = 1 / DAG 4 B
    "mul": ("add", 12 / 6),               # s *= u (NumPy; the same three float32 streams as add) / DAG 6 B
    "add_attn": ("add", 12 / 6),          # x += y / DAG 6 B per element
    "add_ffn": ("add", 12 / 6),
    "kv_append": ("add", 16 / 4),         # k and v memcpy'd into the cache (read + write each; add's rate per byte
}                                         # stands in for memcpy's) / DAG 4 B per key element
