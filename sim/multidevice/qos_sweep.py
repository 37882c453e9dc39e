"""Voltron's QoS outcome over every cluster × model × trace (modelled; docs/multidevice.md "Closed-loop QoS").

Runs Voltron (closed loop, `planner/voltron/feedback.py`) on the simulated cluster for every cluster (car, office,
home), every model of the three families and every trace given, and reports per run the TTFT max, TPOT p50 / p99,
the share of decode tokens above the TPOT QoS, the accuracy proxy and whether a plan exists (no OOM). Other planners
can be added with `--planners` (reported as they are: open loop).

    python -m sim.multidevice.qos_sweep --turns 3 --planners voltron,single,mp,tp \
        --out outputs/multidevice/qos_sweep.csv
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
import time

import pandas as pd

from planner.voltron.accuracy import FAMILIES
from planner.voltron.devices import load_cluster
from planner.voltron.policy import PlannerConfig
from planner.voltron.registry import make_policy
from planner.voltron.rssi import RssiTable
from quant.arch import model_spec
from sim.multidevice.runner import build_run_context, run_conversation
from sim.multidevice.squeeze import Squeeze, trace_config
from sim.multidevice.workload import WorkloadConfig
from sim.wireless import RssiTrace

CLUSTERS = ("car", "office", "home")
TRACES = ("steady_strong", "walk_away", "walk_away_disconnect", "weak_link", "compute_squeeze")
KEYS = ("ttft_s_max", "tpot_ms_p50", "tpot_ms_p99", "qos_tpot_violation_rate", "accuracy_proxy", "oom",
        "tokens_generated", "pred_err_tpot_bias", "energy_mj_per_token")


def sweep(traces=TRACES, turns: int = 3, seed: int = 0, planners=("voltron",), clusters=CLUSTERS,
          models=None, progress: bool = True, **planner_cfg) -> list[dict]:
    rows, t0 = [], time.time()
    models = models or [m for fam in FAMILIES.values() for m in fam]
    family = {m: f for f, ms in FAMILIES.items() for m in ms}
    for cl in clusters:
        cluster = load_cluster(cl)
        for m in models:
            base, _ = build_run_context(model_spec(m), cluster, PlannerConfig(), seed)
            for tname in traces:
                tcfg = trace_config(tname)
                tr, sq = RssiTrace.load(tcfg), Squeeze.load(tcfg)
                for p in planners:
                    ctx = dataclasses.replace(base, cfg=PlannerConfig(name=p, **planner_cfg))
                    res = run_conversation(make_policy(ctx), ctx, tr, RssiTable(),
                                           WorkloadConfig(turns=turns, seed=seed), seed=seed, squeeze=sq)
                    r = {"cluster": cl, "family": family[m], "model": m, "trace": tname, "planner": p,
                         **{k: res.metrics.get(k) for k in KEYS}}
                    rows.append(r)
                    if progress:
                        print(f"[{time.time() - t0:5.0f} s] {cl:6s} {m:18s} {tname:22s} {p:8s} "
                              f"p99 {r['tpot_ms_p99']} viol {r['qos_tpot_violation_rate']} oom {r['oom']}",
                              file=sys.stderr, flush=True)
    return rows


def summarize(df: pd.DataFrame, qos_tpot_ms: float = 400.0, qos_ttft_s: float = 10.0,
              max_violation: float = 0.01) -> pd.DataFrame:
    """Per planner: runs with a plan, and of those how many keep TPOT p99 ≤ QoS, TTFT ≤ QoS and ≤ 1 % of tokens over."""
    ok = df[~df.oom.astype(bool)]
    out = []
    for p, d in ok.groupby("planner", sort=False):
        out.append({"planner": p, "runs with a plan": len(d), "runs (all)": int((df.planner == p).sum()),
                    "TPOT p99 ≤ QoS": int((d.tpot_ms_p99 <= qos_tpot_ms).sum()),
                    "TTFT ≤ QoS": int((d.ttft_s_max <= qos_ttft_s).sum()),
                    "violations ≤ 1 %": int((d.qos_tpot_violation_rate <= max_violation).sum()),
                    "worst TPOT p99 ms": float(d.tpot_ms_p99.max()), "worst violation rate": float(
                        d.qos_tpot_violation_rate.max()), "worst TTFT s": float(d.ttft_s_max.max())})
    return pd.DataFrame(out)


def markdown(df: pd.DataFrame) -> str:
    head = ("| cluster | model | trace | planner | TTFT max s | TPOT p50 / p99 ms | TPOT > 400 ms | accuracy proxy | "
            "OOM |\n|---|---|---|---|---|---|---|---|---|")
    lines = [head]
    for r in df.itertuples():
        if r.oom:
            lines.append(f"| {r.cluster} | {r.model} | {r.trace} | {r.planner} | — | — | — | — | OOM |")
            continue
        lines.append(f"| {r.cluster} | {r.model} | {r.trace} | {r.planner} | {r.ttft_s_max:.2f} | "
                     f"{r.tpot_ms_p50:.0f} / {r.tpot_ms_p99:.0f} | {100 * r.qos_tpot_violation_rate:.1f} % | "
                     f"{r.accuracy_proxy:.2f} | no |")
    return "\n".join(lines)


def pivot_markdown(df: pd.DataFrame, planner: str = "voltron") -> str:
    """One row per cluster × model, one column per trace: `TPOT p99 ms / share over QoS / TTFT max s` of `planner`
    (OOM: no plan)."""
    d = df[df.planner == planner]
    traces = list(dict.fromkeys(d.trace))
    lines = ["| cluster | model | " + " | ".join(traces) + " |", "|---|---|" + "---|" * len(traces)]
    for (c, m), g in d.groupby(["cluster", "model"], sort=False):
        cells = []
        for t in traces:
            r = g[g.trace == t]
            if r.empty:
                cells.append("—")
            elif bool(r.oom.iloc[0]):
                cells.append("OOM")
            else:
                r = r.iloc[0]
                bad = r.tpot_ms_p99 > 400 or r.qos_tpot_violation_rate > 0.01 or r.ttft_s_max > 10
                cell = f"{r.tpot_ms_p99:.0f} / {100 * r.qos_tpot_violation_rate:.1f} % / {r.ttft_s_max:.1f}"
                cells.append(f"**{cell}**" if bad else cell)
        lines.append(f"| {c} | {m} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def summary_markdown(df: pd.DataFrame) -> str:
    sm = summarize(df)
    lines = ["| " + " | ".join(sm.columns) + " |", "|" + "---|" * len(sm.columns)]
    for r in sm.itertuples(index=False):
        lines.append("| " + " | ".join(f"{v:.3g}" if isinstance(v, float) else str(v) for v in r) + " |")
    return "\n".join(lines)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--traces", default=",".join(TRACES))
    ap.add_argument("--planners", default="voltron")
    ap.add_argument("--clusters", default=",".join(CLUSTERS))
    ap.add_argument("--models", default="")
    ap.add_argument("--out", default="")
    a = ap.parse_args(argv)
    if a.turns < 1:
        ap.error("--turns must be >= 1")
    df = pd.DataFrame(sweep(a.traces.split(","), a.turns, a.seed, a.planners.split(","), a.clusters.split(","),
                            [m for m in a.models.split(",") if m] or None))
    if a.out:
        from quant.atomic import atomic_write_text

        atomic_write_text(a.out, df.to_csv(index=False))
    print(summary_markdown(df))
    print()
    print(pivot_markdown(df))


if __name__ == "__main__":
    main()
