"""Cold-start pipeline planning: operator DAG, prefill expansion, the EdgeFlow granular scheduler, llm.npu baselines.
`dispatch` runs compiled where setup.py built it and it matches its sources (`planner.use_compiled`)."""
import os

from planner import use_compiled

COMPILED = use_compiled(__name__, os.path.dirname(os.path.abspath(__file__)))
