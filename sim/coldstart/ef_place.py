"""EdgeFlow ablation step: + place = fine-grained placement (INT8 matmuls on the NPU, the rest on the CPU), static
dispatch, no stealing."""
from planner.pipeline.npu_plan import Recipe
from sim.coldstart.edgeflow import EdgeFlow


class EfPlace(EdgeFlow):
    name = "ef_place"
    recipe = Recipe(fmt="weightlet", graph="materialized", streaming="granular", placement="fine")
