"""The HIL runner's tiny test model (hil.tinymodel) and the plans of every framework policy bound to it."""
from __future__ import annotations

import dataclasses
from pathlib import Path

from hil.packed_index import bind_to_file, file_bits, read_index
from hil.tinymodel import tiny_spec, tiny_weights, write_tiny  # noqa: F401 - the test model, re-exported
from planner.cost import AnalyticCostModel
from planner.device import SocProfile
from planner.framework import FrameworkSpec
from planner.plan import Plan
from quant.arch import ModelSpec
from sim.coldstart import POLICIES, ColdStartInputs
from sim.coldstart.sweep import load_conf

GRAPH_FIELDS = ("npu_setup_s", "npu_compose_s_per_gb", "npu_optimize_s_per_gb", "npu_prepare_s_per_gb")


def device(name: str = "xiaomi15pro") -> SocProfile:
    """A device profile whose NPU graph steps take no time (this host has no NPU graph)."""
    dev = load_conf("device", name, SocProfile)
    return dataclasses.replace(dev, **{k: 0.0 for k in GRAPH_FIELDS})


def bound_plan(fw: str, spec: ModelSpec, path: Path, tokens: int, chunk: int | None = None,
               dev: SocProfile | None = None, bits: float = 5.0) -> Plan:
    dev = dev or device()
    f = load_conf("framework", fw, FrameworkSpec)
    if chunk is not None:
        f = dataclasses.replace(f, chunk_tokens=chunk)
    x = ColdStartInputs(spec, dev, f, AnalyticCostModel(dev), tokens, bits, bits_override=file_bits(path, spec))
    return bind_to_file(POLICIES[f.policy]().build(x), read_index(path))
