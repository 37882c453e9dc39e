"""EdgeFlow ablation step: + pipeline = asynchronous load / unpack / restore threads and op-level readiness; llm.npu's
coarse placement, static dispatch, no stealing."""
from planner.pipeline.npu_plan import Recipe
from sim.coldstart.edgeflow import EdgeFlow


class EfPipe(EdgeFlow):
    name = "ef_pipe"
    recipe = Recipe(fmt="weightlet", graph="materialized", streaming="granular", placement="coarse")
