"""EdgeFlow cold start: adaptive per-channel bits, weightlet format, synergistic granular pipeline with fine placement,
position-guided priority and CPU task stealing (EdgeFlow §4). The ablation steps subclass this with one mechanism
off."""
from planner.pipeline.npu_plan import Recipe, build_npu_plan
from sim.coldstart.base import ColdStartInputs, ColdStartPolicy, ef_bits


class EdgeFlow(ColdStartPolicy):
    name = "edgeflow"
    recipe = Recipe(fmt="weightlet", graph="materialized", streaming="granular", placement="fine", priority="position",
                    steal=True)

    def build(self, x: ColdStartInputs):
        bits, info = ef_bits(x)
        return build_npu_plan(self.name, self.recipe, x.model, x.device, x.cost, x.framework, x.prompt_tokens, bits,
                              info)
