"""The golden host profile (tests/sim/golden/host_profile.json) with some fields replaced, for peer tests: device
fields go to its SocProfile, llama.cpp's and MNN's costs (planner.peer_costs) to its PeerCosts."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from hil.host import HostProfile
from planner.device import SocProfile
from planner.host_runtime import HostRuntime
from planner.peer_costs import PEER_FIELDS, PeerCosts

GOLDEN = Path(__file__).resolve().parents[1] / "sim" / "golden" / "host_profile.json"


def golden_host(tmp_path: Path, **fields) -> HostProfile:
    doc = json.loads(GOLDEN.read_text())
    dev = dataclasses.replace(SocProfile(**doc["device"]), **{k: v for k, v in fields.items() if k not in PEER_FIELDS})
    peers = PeerCosts(**{k: v for k, v in fields.items() if k in PEER_FIELDS})
    table = tmp_path / "cost_table.json"
    table.write_text(json.dumps({"points": [{"unit": "cpu", "kind": "elementwise", "work": 1e6, "seconds": 1e-4}]}))
    return HostProfile(dev, HostRuntime(**doc["runtime"]), table, peers)
