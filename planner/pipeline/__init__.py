"""Cold-start pipeline planning: operator DAG, prefill expansion, the EdgeFlow granular scheduler, llm.npu baselines."""
