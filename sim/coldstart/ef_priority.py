"""EdgeFlow ablation step: + priority = position-guided priority (earlier chunk first), no stealing."""
from planner.pipeline.npu_plan import Recipe
from sim.coldstart.edgeflow import EdgeFlow


class EfPriority(EdgeFlow):
    name = "ef_priority"
    recipe = Recipe(fmt="weightlet", graph="materialized", streaming="granular", placement="fine", priority="position")
