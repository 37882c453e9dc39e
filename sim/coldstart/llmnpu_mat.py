"""llm.npu with a materialized graph: setup, load the context binary, prepare, execute (Fig. 1b), no overlap."""
from planner.pipeline.npu_plan import Recipe
from sim.coldstart.llmnpu import LlmNpu


class LlmNpuMat(LlmNpu):
    name = "llmnpu_mat"
    recipe = Recipe(fmt="int8", graph="materialized", streaming="sequential", placement="coarse")
