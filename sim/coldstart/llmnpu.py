"""llm.npu cold start with online graph construction: setup, load weights, compose, optimize, execute (Fig. 1a).
INT8 weights (per-tensor + shadow outliers in the original; the bit budget does not apply), coarse CPU/NPU partition."""
from planner.pipeline.npu_plan import Recipe, build_npu_plan
from sim.coldstart.base import ColdStartInputs, ColdStartPolicy


class LlmNpu(ColdStartPolicy):
    name = "llmnpu"
    recipe = Recipe(fmt="int8", graph="online", streaming="sequential", placement="coarse")

    def build(self, x: ColdStartInputs):
        return build_npu_plan(self.name, self.recipe, x.model, x.device, x.cost, x.framework, x.prompt_tokens, None)
