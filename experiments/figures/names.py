"""Display names of the identifiers the figures' CSVs carry (framework, planner, model, dataset, cluster, layer
variant, metric …): the one mapping every figure's axes, ticks, legends and tables use. The CSVs keep the
identifiers (they are what the configs and the golden files name); only what a reader sees goes through `label`.
"""
from __future__ import annotations

from typing import Iterable

NAMES: dict[str, str] = {
    # EdgeFlow frameworks and ablation steps (conf/framework/, sim/coldstart/)
    "llamacpp": "llama.cpp",
    "mnn": "MNN",
    "llmnpu": "llm.npu",
    "llmnpu_mat": "llm.npu (materialized)",
    "llmnpu_plus": "llm.npu+",
    "edgeflow": "EdgeFlow",
    "ef_mixed": "EF bits, INT4/INT8 mixed",
    "ef_pack": "EF +Packing",
    "ef_pipe": "EF +Pipeline",
    "ef_place": "EF +Placement",
    "ef_priority": "EF +Priority",
    # quantization methods (quant/methods)
    "smoothquant": "SmoothQuant",
    "shadow_outlier": "Shadow outlier",
    "cmpq": "CMPQ",
    "int8": "INT8",
    "int4": "INT4",
    "fp16": "FP16",
    "mixed int8/int4": "mixed INT8/INT4",
    # weight packings (EdgeFlow Fig. 4b)
    "mixed": "INT4/INT8 mixed",
    "kquant": "K-quant",
    "weightlet": "weightlet (EdgeFlow)",
    # datasets (conf/workload/)
    "lambada": "LAMBADA",
    "winogrande": "WinoGrande",
    "obqa": "OBQA",
    "mmlu": "MMLU",
    "hellaswag": "HellaSwag",
    # models (conf/model/)
    "llama3_8b": "Llama3-8B",
    "mistral_7b": "Mistral-7B",
    "phi3_3_8b": "Phi3-3.8B",
    "qwen1_5_1_8b": "Qwen1.5-1.8B",
    "qwen1_5_4b": "Qwen1.5-4B",
    "qwen1_5_7b": "Qwen1.5-7B",
    "qwen1_5_14b": "Qwen1.5-14B",
    "qwen1_5_moe_a2_7b": "Qwen1.5-MoE-A2.7B",
    "qwen2_5_3b": "Qwen2.5-3B",
    "qwen2_5_7b": "Qwen2.5-7B",
    "qwen2_5_14b": "Qwen2.5-14B",
    "gemma3_4b": "Gemma3-4B",
    "gemma3_12b": "Gemma3-12B",
    "smollm2_135m": "SmolLM2-135M",
    # model families (planner/voltron/accuracy.py)
    "qwen1_5": "Qwen1.5",
    "qwen2_5": "Qwen2.5",
    "gemma3": "Gemma3",
    # Voltron planners (planner/voltron/registry.py) and their splits
    "voltron": "Voltron",
    "single": "single device",
    "voltron + energy mode": "Voltron + energy mode",
    "mp": "MP",
    "tp": "TP",
    "mp-equal": "MP, equal split",
    "tp-equal": "TP, equal split",
    "mp-hetero": "MP, heterogeneity-aware",
    "tp-hetero": "TP, heterogeneity-aware",
    # clusters (conf/cluster/)
    "car": "Car",
    "office": "Office",
    "home": "Home",
    # RSSI / squeeze traces (conf/trace/)
    "steady_strong": "steady strong link",
    "walk_away": "walk-away",
    "walk_away_disconnect": "walk-away + disconnect",
    "weak_link": "weak link",
    "compute_squeeze": "compute squeeze",
    # layer variants (planner/voltron/layers.py)
    "attn_mha": "MHA attention",
    "attn_gqa": "GQA attention",
    "attn_swa": "SWA attention",
    "ffn_dense": "dense FFN",
    "ffn_moe": "MoE FFN",
    # assumed phone-profile values varied by the sensitivity figure (conf/device/xiaomi15pro.yaml keys)
    "flash_request_latency_s": "flash request latency",
    "flash_bulk_request_bytes": "flash bulk request size",
    "cpu_parallel_eff": "CPU parallel efficiency",
    "cpu_kquant_gemm_slowdown": "CPU K-quant GEMM slowdown",
    "cpu_fp16_gflops_per_ghz": "CPU FP16 GFLOPS per GHz",
    "cpu_elementwise_gbps_per_core": "CPU element-wise GB/s per core",
    "cpu_op_overhead_s": "CPU per-operator overhead",
    "npu_weight_gbps": "NPU weight bandwidth",
    "npu_dispatch_s": "NPU dispatch time",
    "npu_driver_slots": "NPU driver slots",
    "npu_prepare_s_per_gb (restore cost)": "NPU graph restore cost per GB",
    # llama.cpp's own costs, measured on the project's host and transferred to the phone (sim/coldstart/sensitivity.py)
    "llamacpp_fixed_s (host, clock-scaled)": "llama.cpp fixed part (host, clock-scaled)",
    "llamacpp_repack_gbps": "llama.cpp repack rate",
    # cold-start phases and metrics
    "setup_s": "set-up",
    "load_s": "load weights",
    "graph_s": "graph",
    "prefill_s": "execute (prefill)",
    "unpack_s": "unpack",
    "ttft": "TTFT",
    "load": "load",
    "unpack": "unpack",
    "prefill": "prefill",
    "total": "whole cold start",
    # resources of a critical path (planner.critical_path.CATEGORIES)
    "flash": "flash read",
    "sharing": "core / DRAM wait",
    "npu": "NPU",
    "cpu": "CPU",
    "graph": "graph set-up / restore",
    "idle": "idle (dispatch)",
}


def label(key) -> str:
    """The display name of an identifier (unknown identifiers are shown as they are, so a new one stays visible)."""
    return NAMES.get(str(key), str(key))


def labels(keys: Iterable) -> list[str]:
    return [label(k) for k in keys]
