"""llama.cpp cold start: mmap + on-demand paging, CPU compute on K-quant / Q8_0 weights (docs/design.md §4.4)."""
from planner.pipeline.cpu_plan import build_llamacpp_plan
from sim.coldstart.base import ColdStartInputs, ColdStartPolicy


class LlamaCpp(ColdStartPolicy):
    name = "llamacpp"

    def build(self, x: ColdStartInputs):
        return build_llamacpp_plan(x.model, x.device, x.framework, x.prompt_tokens, x.bits, peers=x.peers)
