"""EdgeFlow ablation step: EF bits stored in the INT4/INT8 mixed format, executed llm.npu+-style (layer-serial
streaming, coarse partition)."""
from planner.pipeline.npu_plan import Recipe
from sim.coldstart.edgeflow import EdgeFlow


class EfMixed(EdgeFlow):
    name = "ef_mixed"
    recipe = Recipe(fmt="mixed", graph="materialized", streaming="layer_serial", placement="coarse")
