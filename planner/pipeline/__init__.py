"""Cold-start pipeline planning: operator DAG, prefill expansion, the EdgeFlow granular scheduler, llm.npu baselines.

Nothing here is compiled: the HIL runner (hil/runner.py) dispatches its tasks with `dispatch.Dispatcher` too, and its
per-task cost is part of what the host calibration measures, so compiling it would change the runtime the stored
profiles describe. The hook still runs the sources of any module an earlier build left compiled
(`planner.use_compiled`)."""
import os

from planner import use_compiled

COMPILED = use_compiled(__name__, os.path.dirname(os.path.abspath(__file__)))
