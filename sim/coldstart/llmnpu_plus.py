"""llm.npu+: materialized per-layer graphs, loading + preparing layer l+1 overlaps executing layer l (Fig. 1c)."""
from planner.pipeline.npu_plan import Recipe
from sim.coldstart.llmnpu import LlmNpu


class LlmNpuPlus(LlmNpu):
    name = "llmnpu_plus"
    recipe = Recipe(fmt="int8", graph="materialized", streaming="layer_serial", placement="coarse")
