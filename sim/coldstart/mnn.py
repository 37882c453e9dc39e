"""MNN cold start: sequential load of INT8 per-channel weights, then CPU compute with dynamic activation quant."""
from planner.pipeline.cpu_plan import build_mnn_plan
from sim.coldstart.base import ColdStartInputs, ColdStartPolicy


class Mnn(ColdStartPolicy):
    name = "mnn"

    def build(self, x: ColdStartInputs):
        return build_mnn_plan(x.model, x.device, x.framework, x.prompt_tokens, peers=x.peers)
