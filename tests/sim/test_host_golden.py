"""Golden predictions of a measured host with its runtime model (planner.host_runtime): every framework's plan of
SmolLM2-135M (64-token prompt, uniform 5-bit weights) and the calibration's cold read with one and two readers,
simulated with the host profile of `golden/host_profile.json` (the device part and the runtime part, every runtime
mechanic on). The goldens are the simulator's outputs from before the device profile and the runtime model were
split; regenerate them deliberately (docs/design.md §10), never to make a change pass."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from hil.deploy import fit_threads
from planner.cost import AnalyticCostModel
from planner.device import SocProfile
from planner.framework import FrameworkSpec
from planner.host_runtime import HostRuntime
from planner.plan import Plan, PlanBuilder, TensorRef
from quant.arch import ModelSpec
from sim.coldstart import POLICIES, ColdStartInputs
from sim.coldstart.sweep import load_conf
from sim.executor import simulate
from sim.metrics import coldstart_metrics

GOLDEN = Path(__file__).parent / "golden"
WANT = json.loads((GOLDEN / "host_predictions.json").read_text())
REL = 1e-9              # the simulation is deterministic; this only absorbs float formatting


def _host() -> tuple[SocProfile, HostRuntime]:
    doc = json.loads((GOLDEN / "host_profile.json").read_text())
    return SocProfile(**doc["device"]), HostRuntime(**doc["runtime"])


def _check(key: str, tl, dev: SocProfile) -> None:
    got = coldstart_metrics(tl, dev)
    want = WANT[key]
    for k, v in want.items():
        if k == "waits":
            assert tl.waits == v, key
        elif k == "packed_wakes":
            assert tl.packed_wakes == v, key
        else:
            assert got[k] == pytest.approx(v, rel=REL), (key, k)


@pytest.mark.parametrize("fw", sorted(k.split("/")[2] for k in WANT if k.startswith("host/smollm2/")))
def test_every_framework_on_the_host_matches_its_golden(fw):
    dev, rt = _host()
    f = fit_threads(load_conf("framework", fw, FrameworkSpec), dev, rt)
    x = ColdStartInputs(load_conf("model", "smollm2_135m", ModelSpec), dev, f, AnalyticCostModel(dev), 64, 5.0,
                        bits_source="uniform")
    plan = POLICIES[f.policy]().build(x)
    _check(f"host/smollm2/{fw}/64", simulate(plan, dev, x.cost, runtime=rt), dev)


@pytest.mark.parametrize("readers", [1, 2])
def test_the_calibration_read_matches_its_golden(readers):
    dev, rt = _host()
    size, blob, req = 256 << 20, 2 << 20, 16 << 20
    b = PlanBuilder()
    for k, off in enumerate(range(0, size, blob)):
        b.add(f"read{k}", "load", read_bytes=blob, request_bytes=req, mem_alloc=blob,
              tensors=[TensorRef(f"scratch{k}", off, blob)])
    plan = Plan("read", "scratch", dev.name, 1, 0, b.tasks, loader_threads=readers)
    _check(f"host/calread/{readers}", simulate(plan, dev, AnalyticCostModel(dev), runtime=rt), dev)


def test_without_a_runtime_the_mechanics_are_off():
    """runtime=None is a device without host mechanics: the same as a HostRuntime with every default, and faster
    than the host's own runtime for the same plan (wake-ups, page faults and the interpreter lock cost time)."""
    dev, rt = _host()
    f = fit_threads(load_conf("framework", "edgeflow", FrameworkSpec), dev, rt)
    x = ColdStartInputs(load_conf("model", "smollm2_135m", ModelSpec), dev, f, AnalyticCostModel(dev), 64, 5.0,
                        bits_source="uniform")
    plan = POLICIES[f.policy]().build(x)
    bare = simulate(plan, dev, x.cost)
    assert bare.end_s == simulate(plan, dev, x.cost, runtime=HostRuntime()).end_s
    assert bare.end_s < simulate(plan, dev, x.cost, runtime=rt).end_s
