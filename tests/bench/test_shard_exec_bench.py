"""Executable Voltron plans, in process (docs/cluster.md "Executable Voltron plans"): per-token decode wall time of the
Coordinator over three in-process ShardWorkers (TP members called concurrently from a thread pool, and for TP also one
after the other) for the MP, TP and hybrid plans of the real planners, against the single-process Reference with the
same plans, measured in the same run; memory per device (nominal, at the planned precision) against the planner's
budget; bytes moved per token. No network: this isolates the executor's own overhead (per-call dispatch, per-shard
GEMMs) from link costs.

Prints a table and writes outputs/bench/shard_exec.json.
"""
from __future__ import annotations

import os
import time

import numpy as np
import pytest

from hil.cluster.coordinator import Coordinator
from hil.cluster.reference import Reference
from hil.cluster.shard_exec import ShardWorker
from planner.voltron.shard_map import assign_shards
from quant.atomic import atomic_write_json
from quant.gguf_model import encode, gguf_path
from tests.conftest import REPO
from tests.hil_cluster import plans as P

pytestmark = pytest.mark.bench

PROMPT = "The Eiffel Tower is in Paris, the capital of France. The Colosseum is in"
N_DECODE = 8
KV_CAP = 64


def _interleaved(runners, tok, n):
    """Greedy prefill on each runner, then `n` decode steps alternating between the runners (so a change in the host's
    load hits both alike); per runner: per-step wall seconds, tokens, logits per step."""
    out = []
    for r in runners:
        lg = r.prefill(tok)
        out.append(([], [int(np.argmax(lg))], [lg]))
    for _ in range(n):
        for r, (ts, toks, logs) in zip(runners, out):
            t0 = time.perf_counter()
            lg = r.decode(toks[-1])
            ts.append(time.perf_counter() - t0)
            logs.append(lg)
            toks.append(int(np.argmax(lg)))
    return out


def test_shard_exec_benchmark():
    spec = P.spec()
    path = str(gguf_path(spec))
    tok = encode(spec, PROMPT)[:12]
    kinds = {"mp": dict(zip(("prefill", "decode"), P.planner_plans("mp"))),
             "tp": dict(zip(("prefill", "decode"), P.planner_plans("tp"))),
             "hybrid": {"prefill": P.hybrid_plan(), "decode": P.hybrid_plan()}}
    kinds["tp-serial"] = kinds["tp"]          # the same TP plan with the members called one after the other
    rows = {}
    for kind, plans in kinds.items():
        maps = {ph: assign_shards(p, P.table()) for ph, p in plans.items()}
        budgets = plans["decode"].budget_bytes
        workers = [ShardWorker(path, spec, d, b) for d, b in enumerate(budgets)]
        co = Coordinator(plans, maps, workers, kv_capacity=KV_CAP, parallel=kind != "tp-serial")
        ref = Reference(path, spec, plans, maps, kv_capacity=KV_CAP)
        (tc, ktc, lc), (tr, ktr, lr) = _interleaved([co, ref], tok, N_DECODE)
        n_spans = len(co.spans)
        dec = [s for s in co.spans if s.step > 1 and s.method in ("embed", "run_sublayers", "attn", "ffn", "head")]
        mem = [w.memory() for w in workers]
        rows[kind] = {
            "tokens_equal": ktc == ktr, "max_abs_dlogit": float(max(np.abs(a - b).max() for a, b in zip(lc, lr))),
            "decode_ms_p50_coordinator": 1e3 * float(np.median(tc)),
            "decode_ms_p50_reference": 1e3 * float(np.median(tr)),
            "calls_per_token": len(dec) / N_DECODE, "n_spans": n_spans,
            "bytes_per_token": sum(s.bytes_sent + s.bytes_recv for s in dec) / N_DECODE,
            "mem_nominal_mb": [round(m["total_nominal"] / 1e6, 2) for m in mem],
            "mem_host_mb": [round(m["total_host"] / 1e6, 2) for m in mem],
            "budget_mb": [round(b / 1e6, 2) for b in budgets],
            "plan": plans["decode"].summary(),
        }
        co.close()
    print(f"\nexecutable Voltron plans, SmolLM2-135M, 3 in-process workers, {N_DECODE} decode tokens (measured, "
          f"load avg {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores)")
    print(f"{'plan':9s} {'equal':>5s} {'max|dlogit|':>11s} {'coord ms/tok':>12s} {'ref ms/tok':>10s} {'calls/tok':>9s} "
          f"{'KB/tok':>7s}  memory MB nominal / budget per device")
    for k, r in rows.items():
        mem = ", ".join(f"{m:.1f}/{b:.0f}" for m, b in zip(r["mem_nominal_mb"], r["budget_mb"]))
        print(f"{k:9s} {str(r['tokens_equal']):>5s} {r['max_abs_dlogit']:11.3g} "
              f"{r['decode_ms_p50_coordinator']:12.1f} {r['decode_ms_p50_reference']:10.1f} "
              f"{r['calls_per_token']:9.0f} {r['bytes_per_token'] / 1e3:7.1f}  {mem}   [{r['plan']}]")
    atomic_write_json(REPO / "outputs" / "bench" / "shard_exec.json",
                      {"model": spec.name, "decode_tokens": N_DECODE, "host_loadavg_1min": os.getloadavg()[0],
                       "measured": rows})
    for k, r in rows.items():
        assert r["tokens_equal"], k
        assert all(m <= b for m, b in zip(r["mem_nominal_mb"], r["budget_mb"])), k
