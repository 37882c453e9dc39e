"""EdgeFlow's synergistic granular pipeline: the dynamic scheduling parameters (EdgeFlow §4.3).

The static backbone (fine placement: INT8 matmuls on the NPU, the rest on the CPU; topological order per layer; one
queue per unit) is built by `planner.pipeline.builder` with `dag.place_fine`. The dynamic part is carried by the plan's
`SchedulePolicy` and executed identically by the simulator and the HIL runner:
- position-guided priority: ready ops are dispatched earliest chunk first (then layer, then backbone position);
- CPU task stealing: an idle CPU takes the head of the NPU queue when the queue holds more than `threshold` ops.

Threshold derivation (the paper sets 5 "according to the ratio between the execution time of CPU and NPU matmul
operators"): stealing one matmul pays off only if the NPU would otherwise need at least as long to drain the ops
queued ahead of it, i.e. queue length > t_cpu / t_npu. We take the ratio of the summed CPU and NPU times of one layer's
matmuls at the chunk size, rounded to the nearest integer (at least 1).
"""
from __future__ import annotations

from planner.cost.base import CostModel
from planner.pipeline.dag import MATMULS, layer_dag
from quant.arch import ModelSpec


def matmul_time_ratio(cost: CostModel, spec: ModelSpec, m: int, cpu_threads: int, first_core: int = 0) -> float:
    dag = layer_dag(spec, m, 0)
    works = [dag.nodes[op]["work"] for op in MATMULS]
    t_cpu = sum(cost.op_time(w, "cpu", cpu_threads, first_core) for w in works)
    t_npu = sum(cost.op_time(w, "npu") for w in works)
    return t_cpu / t_npu


def steal_threshold(cost: CostModel, spec: ModelSpec, m: int, cpu_threads: int, first_core: int = 0) -> int:
    return max(1, round(matmul_time_ratio(cost, spec, m, cpu_threads, first_core)))
