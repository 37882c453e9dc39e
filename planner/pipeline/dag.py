"""Operator-level DAG of one transformer layer for one prompt chunk (EdgeFlow appendix B, Fig. 17), as a networkx graph.

Nodes are ops with their work for a chunk of `m` tokens after `past` earlier tokens; edges are data dependencies.
Placement (`place_fine`): INT8 matmuls (Q/K/V/O, gate/up/down) on the NPU, everything else (norms, RoPE, KV append,
attention, SwiGLU, residual adds, (de)quantize) on the CPU in FP16 (§4.3 "fine-grained operator placement").
llm.npu's coarse static partition (`place_coarse`): only RoPE / KV append / attention on the CPU, all other ops on
the NPU (Fig. 5), scheduled as subgraphs of consecutive same-unit ops.

Byte counts of elementwise ops (per element): FP16 = 2 B, INT8 = 1 B. norm 2+2, quantize 2+1, dequantize 1+2,
RoPE 2+2, KV append 2 (write), SiLU 2+2, mul / add 2+2+2.
"""
from __future__ import annotations

import networkx as nx

from planner.plan import OpWork
from quant.arch import ModelSpec

MATMULS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate", "up", "down")
NORMS = ("attn_norm", "ffn_norm")        # ops that read a layer's norm weights
CPU_IN_COARSE = ("rope", "kv_append", "attention")


def layer_dag(spec: ModelSpec, m: int, past: int) -> nx.DiGraph:
    """DAG of one layer for a chunk of `m` tokens preceded by `past` tokens. Node attr `work`: OpWork."""
    d, q, kv, f = spec.d_model, spec.q_dim, spec.kv_dim, spec.d_ffn
    g = nx.DiGraph()

    def ew(name: str, nbytes: int, *deps: str) -> None:
        g.add_node(name, work=OpWork("elementwise", m=m, nbytes=nbytes, op=name))
        g.add_edges_from((x, name) for x in deps)

    def mm(name: str, k: int, n: int, *deps: str) -> None:
        g.add_node(name, work=OpWork("matmul", m=m, k=k, n=n))
        g.add_edges_from((x, name) for x in deps)

    ew("attn_norm", 4 * m * d)
    ew("quant_attn", 3 * m * d, "attn_norm")
    mm("q_proj", d, q, "quant_attn")
    mm("k_proj", d, kv, "quant_attn")
    mm("v_proj", d, kv, "quant_attn")
    ew("dq_q", 3 * m * q, "q_proj")
    ew("dq_k", 3 * m * kv, "k_proj")
    ew("dq_v", 3 * m * kv, "v_proj")
    ew("rope", 4 * m * (q + kv), "dq_q", "dq_k")
    ew("kv_append", 4 * m * kv, "rope", "dq_v")
    g.add_node("attention", work=OpWork("attention", m=m, ctx=past + (m + 1) // 2, heads=spec.n_heads,
                                        head_dim=spec.head_dim))
    g.add_edge("kv_append", "attention")
    ew("quant_o", 3 * m * q, "attention")
    mm("o_proj", q, d, "quant_o")
    ew("dq_o", 3 * m * d, "o_proj")
    ew("add_attn", 6 * m * d, "dq_o")
    ew("ffn_norm", 4 * m * d, "add_attn")
    ew("quant_ffn", 3 * m * d, "ffn_norm")
    mm("gate", d, f, "quant_ffn")
    mm("up", d, f, "quant_ffn")
    ew("dq_gate", 3 * m * f, "gate")
    ew("dq_up", 3 * m * f, "up")
    ew("silu", 4 * m * f, "dq_gate")
    ew("mul", 6 * m * f, "silu", "dq_up")
    ew("quant_down", 3 * m * f, "mul")
    mm("down", f, d, "quant_down")
    ew("dq_down", 3 * m * d, "down")
    ew("add_ffn", 6 * m * d, "dq_down")
    return g


# the static backbone: one topological order of the DAG above (identical for every layer and chunk)
BACKBONE = ["attn_norm", "quant_attn", "q_proj", "k_proj", "v_proj", "dq_q", "dq_k", "dq_v", "rope", "kv_append",
             "attention", "quant_o", "o_proj", "dq_o", "add_attn", "ffn_norm", "quant_ffn", "gate", "up", "dq_gate",
             "dq_up", "silu", "mul", "quant_down", "down", "dq_down", "add_ffn"]


# tensors each op uses (GGUF / container names; quantize and dequantize ops use the scales of their matmul's weight)
_OP_TENSOR = {"attn_norm": "attn_norm", "quant_attn": "attn_q", "q_proj": "attn_q", "k_proj": "attn_k",
              "v_proj": "attn_v", "dq_q": "attn_q", "dq_k": "attn_k", "dq_v": "attn_v", "quant_o": "attn_output",
              "o_proj": "attn_output", "dq_o": "attn_output", "ffn_norm": "ffn_norm", "quant_ffn": "ffn_gate",
              "gate": "ffn_gate", "up": "ffn_up", "dq_gate": "ffn_gate", "dq_up": "ffn_up", "quant_down": "ffn_down",
              "down": "ffn_down", "dq_down": "ffn_down"}
LAYER_TENSORS = ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm", "ffn_gate", "ffn_up",
                 "ffn_down")   # in container (load) order


def layer_tensor_names(layer: int) -> list[str]:
    """Container names of one transformer layer's tensors, in load order."""
    return [f"blk.{layer}.{t}.weight" for t in LAYER_TENSORS]


def head_tensor_names(spec: ModelSpec) -> list[str]:
    """Container names of the final norm and the LM head (the tied embedding when embeddings are tied)."""
    return ["output_norm.weight", "token_embd.weight" if spec.tied_embeddings else "output.weight"]


def op_tensor_names(ops: list[str], layer: int) -> list[str]:
    """Distinct container names of the tensors a list of layer ops uses, in first-use order."""
    names = [f"blk.{layer}.{_OP_TENSOR[op]}.weight" for op in ops if op in _OP_TENSOR]
    return list(dict.fromkeys(names))


def place_fine(op: str) -> str:
    return "npu" if op in MATMULS else "cpu"


def place_coarse(op: str) -> str:
    return "cpu" if op in CPU_IN_COARSE else "npu"


def place_cpu(op: str) -> str:
    return "cpu"


PLACEMENTS = {"fine": place_fine, "coarse": place_coarse, "cpu": place_cpu}
