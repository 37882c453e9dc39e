"""EdgeFlow ablation step: + packing = EF bits in the weightlet format with SIMD unpack, still llm.npu+-style
execution."""
from planner.pipeline.npu_plan import Recipe
from sim.coldstart.edgeflow import EdgeFlow


class EfPack(EdgeFlow):
    name = "ef_pack"
    recipe = Recipe(fmt="weightlet", graph="materialized", streaming="layer_serial", placement="coarse")
