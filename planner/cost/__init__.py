"""Per-op cost models behind one interface (`CostModel`): analytic roofline and table/regression back-ends."""
from planner.cost.analytic import AnalyticCostModel
from planner.cost.base import CostModel
from planner.cost.table import TableCostModel
from planner.peer_costs import NO_PEER_COSTS, PeerCosts

__all__ = ["CostModel", "AnalyticCostModel", "TableCostModel", "make_cost_model"]


def make_cost_model(kind: str, device, table_path: str = "", peers: PeerCosts = NO_PEER_COSTS) -> CostModel:
    """`analytic` or `table` (measured profile JSON at `table_path`, analytic fallback for unmeasured op kinds);
    `peers`: the measured rates of llama.cpp's and MNN's evals a plan built with them names (the analytic model's)."""
    if kind == "analytic":
        return AnalyticCostModel(device, peers)
    if kind == "table":
        return TableCostModel.from_json_file(table_path, fallback=AnalyticCostModel(device, peers))
    raise ValueError(f"cost_model must be analytic or table (got {kind!r})")
