"""Voltron plans on the emulated cluster (docs/cluster.md): three worker processes in their own network namespaces,
links shaped by tc tbf, CPU quotas from the Office cluster's spec sheets; the coordinator drives them over pyzmq.
Greedy tokens must equal the single-process reference for MP, TP and the hybrid plan; a measured profile fits the
planner's latency model; nothing is left behind."""
from __future__ import annotations

import os
import shutil

import numpy as np
import pytest

from hil.cluster.coordinator import Coordinator
from hil.cluster.reference import Reference
from planner.voltron.devices import emulated_cluster, load_cluster
from planner.voltron.shard_map import assign_shards
from quant.gguf_model import encode, gguf_path
from tests.hil_cluster import plans as P

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("ip") or not shutil.which("tc"),
                                reason="the emulated cluster needs root, ip and tc (iproute2)")

PROMPT = "The Eiffel Tower is in Paris, the capital of France. The Colosseum is in"
N_NEW = 4
KV_CAP = 64
LOGIT_TOL = 0.05          # as tests/hil_cluster/test_shard_exec.py: float64 re-association of TP partials only


@pytest.fixture(scope="module")
def cluster():
    from hil.cluster.netns import leftovers
    from hil.cluster.session import start_workers

    cl, cores = emulated_cluster(load_cluster("office_emu"))
    cl = P.cluster((1.0, 1.0, 1.0))                       # budgets: the plans' own (checked per assignment below)
    emu, handles = start_workers(cl, cores, P.MODEL, period_s=0.01, port=5613)
    for k, c in enumerate(emu.clients[1:], start=1):
        emu.set_link(k, rate_bps=200e6, latency_s=0.001)  # a strong Wi-Fi link
    try:
        yield emu, handles
    finally:
        emu.close()
    left = leftovers(os.getpid())
    assert not any(left.values()), f"emulated cluster left resources behind: {left}"


def _run(runner, tokens, n_new):
    toks, logs = [], []
    lg = runner.prefill(tokens)
    for i in range(n_new):
        logs.append(lg)
        toks.append(int(np.argmax(lg)))
        if i < n_new - 1:
            lg = runner.decode(toks[-1])
    return toks, logs


# the fast tier's emulated-cluster run is the hybrid plan (MP and TP calls in one run); MP and TP alone: slow tier
@pytest.mark.parametrize("kind", [pytest.param("mp", marks=pytest.mark.slow),
                                  pytest.param("tp", marks=pytest.mark.slow), "hybrid"])
def test_plans_on_emulated_devices_equal_reference(cluster, kind):
    emu, handles = cluster
    spec = P.spec()
    if kind == "hybrid":
        plans = {"prefill": P.hybrid_plan(), "decode": P.voltron_plans()[1]}
    else:
        plans = dict(zip(("prefill", "decode"), P.planner_plans(kind)))
    maps = {ph: assign_shards(p, P.table()) for ph, p in plans.items()}
    tok = encode(spec, PROMPT)[:12]
    co = Coordinator(plans, maps, handles, kv_capacity=KV_CAP)
    try:
        tc, lc = _run(co, tok, N_NEW)
    finally:
        co.close()
    tr, lr = _run(Reference(str(gguf_path(spec)), spec, plans, maps, kv_capacity=KV_CAP), tok, N_NEW)
    dmax = max(float(np.abs(a - b).max()) for a, b in zip(lc, lr))
    assert tc == tr, f"{kind}: emulated cluster {tc} != reference {tr} (max |Δlogit| {dmax:.3g})"
    assert dmax <= LOGIT_TOL
    used = {s.device for s in co.spans if s.method in ("run_sublayers", "attn", "ffn")}
    assert used == {0, 1, 2}
    msgs = emu.drain_trace()
    assert all(len(v) > 0 for v in msgs.values())                   # every worker was talked to over its link


@pytest.mark.slow      # a calibration: 90 measured variants on the quota-limited workers
def test_measured_profile_fits_latency_model(cluster):
    """A few measured variants per (device, precision, phase) on the quota-limited workers → the planner's regression
    fits, and the slowest device (the watch, smallest quota) is measured slower than the others."""
    from hil.cluster.profiler import profile_cluster
    from planner.voltron.latency import LatencyModel

    emu, handles = cluster
    prof = profile_cluster([h.client for h in handles], P.table(), points=5, seed=1, n_max=32, kv_max=64)
    assert len(prof.time_s) == 3 * 3 * 2 * 5 and (prof.time_s > 0).all()
    model = LatencyModel.fit(prof, ["phone", "tablet", "watch"])
    assert np.isfinite(model.predict(prof)).all()
    dec = prof.phase == 1
    med = [np.median(prof.time_s[dec & (prof.device == d) & (prof.ltype != 5)]) for d in range(3)]
    assert med[2] > max(med[0], med[1]), f"watch (0.1 core) not slower: {med}"
