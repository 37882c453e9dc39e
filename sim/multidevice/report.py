"""Cluster × model family × planner table for docs/multidevice.md (Voltron §5 setting; docs/design.md §5).

For every cluster (car, office, home), model family (gemma-3, Qwen1.5, Qwen2.5) and planner (voltron, single,
heterogeneity-aware mp / tp), the planner runs the *best model of the family it can run*: models are tried in
descending order of their published base score (the accuracy ceiling). Rule `qos` (default; the paper's objective:
maximise accuracy while satisfying QoS): the first model that completes the conversation without OOM, with every TTFT
within QoS and ≤ 5 % of tokens above the TPOT QoS; if none does, the largest model that ran. Rule `largest` (paper:
"the largest model that fits"): the first that completes without OOM. If nothing runs, the smallest model's failed run
is reported. Every run is the same simulated conversation (`turns`, seed) under one RSSI trace.

`ablation`: Voltron's run-time mechanisms, each switched off on the trace built to need it (Office / Qwen2.5-14B;
the Voltron Fig. 11 counterpart, `experiments/figures/voltron_fig11.py`, draws the same cases).

`experiments.multidevice_report` runs these tables into a run directory; `python -m experiments.report <run dir>`
makes the results page docs/results/multidevice-report.md from it (docs/multidevice.md "Results").
"""
from __future__ import annotations

import dataclasses
import sys
import time

from planner.voltron.accuracy import BASE_MMLU, FAMILIES, AccuracyConfig
from planner.voltron.devices import load_cluster
from planner.voltron.feedback import FeedbackConfig
from planner.voltron.policy import PlannerConfig
from planner.voltron.registry import POLICIES, make_policy
from planner.voltron.rssi import RssiTable
from quant.arch import model_spec
from sim.multidevice.runner import build_run_context, run_conversation
from sim.multidevice.squeeze import Squeeze, trace_config
from sim.multidevice.workload import WorkloadConfig
from sim.wireless import RssiTrace, TraceConfig

PLANNERS = tuple(POLICIES)            # the one registry of policy names (planner.voltron.registry)
CLUSTERS = ("car", "office", "home")


def _meets_qos(m: dict, max_violation: float) -> bool:
    return (not m["oom"]) and bool(m["qos_ttft_ok"]) and (m["qos_tpot_violation_rate"] or 0.0) <= max_violation


def table(trace: str, turns: int, seed: int = 0, progress: bool = True, rule: str = "qos",
          max_violation: float = 0.05, planners=PLANNERS, accuracy: AccuracyConfig | None = None,
          energy_mode: bool = False, clusters=CLUSTERS, families=None) -> list[dict]:
    """Rows of the table; `planners` a subset of the registry's names, `accuracy` the accuracy-proxy config (None =
    default), `energy_mode` for the policies that have one (`planner.energy_mode`), `clusters` / `families` subsets
    (None = every family)."""
    acc_cfg = accuracy or AccuracyConfig()
    tr = RssiTrace.load(TraceConfig(name=trace, csv=f"{trace}.csv"))
    rows = []
    ctx_cache: dict = {}
    t0 = time.time()
    for cl in clusters:
        cluster = load_cluster(cl)
        for fam, models in _families(families).items():
            ordered = sorted(models, key=lambda m: -BASE_MMLU[m])
            for pname in planners:
                last, first_running = None, None
                for m in ordered:
                    if (cl, m) not in ctx_cache:
                        ctx_cache[(cl, m)] = build_run_context(model_spec(m), cluster, PlannerConfig(), seed)
                    base, acc = ctx_cache[(cl, m)]
                    ctx = dataclasses.replace(base, cfg=PlannerConfig(name=pname, accuracy=acc_cfg,
                                                                      energy_mode=energy_mode))
                    res = run_conversation(make_policy(ctx), ctx, tr, RssiTable(),
                                           WorkloadConfig(turns=turns, seed=seed), seed=seed)
                    last = dict(res.metrics, cluster=cl, family=fam, planner=pname, model=m,
                                latency_model_accuracy=acc["accuracy"], qos_met=_meets_qos(res.metrics, max_violation))
                    if not res.metrics["oom"] and first_running is None:
                        first_running = last
                        if rule == "largest":
                            break
                    if rule == "qos" and last["qos_met"]:
                        break
                else:
                    last = first_running or last                # nothing met QoS: the largest model that ran
                rows.append(last)
                if progress:
                    r = last
                    print(f"[{time.time() - t0:5.0f} s] {cl:6s} {fam:8s} {pname:8s} {r['model']:18s} "
                          f"TTFT {r['ttft_s']} TPOT p50 {r['tpot_ms_p50']} oom {r['oom']}", file=sys.stderr, flush=True)
    return rows


# (trace, turns, think s (None: the workload's), ((variant, PlannerConfig overrides), ...)): every lever of Voltron's
# controller off on the trace built for it (conf/trace, sim/multidevice/squeeze.py) — the closed loop, overlapped
# reloads and KV pruning on the walk-away trace with a disconnect, communication scaling on `weak_link` (the tablet's
# link at 3 % of its goodput), compute pruning on `compute_squeeze` (the main device at 45 % speed)
ABLATION = (("walk_away_disconnect", 5, 60.0, (("voltron", {}), ("no closed loop", {"feedback": FeedbackConfig(False)}),
                                              ("no reload overlap", {"overlap_reload": False}),
                                              ("KV recompute on disconnect", {"disconnect_kv": "recompute"}))),
            ("weak_link", 3, None, (("voltron", {}), ("no comm scaling", {"comm_scaling": False}))),
            ("compute_squeeze", 3, None, (("voltron", {}), ("no compute pruning", {"compute_pruning": False}))))


def ablation(cluster: str = "office", model: str = "qwen2_5_14b", seed: int = 0, progress: bool = True) -> list[dict]:
    """One row per `ABLATION` case: Voltron with one mechanism off (or none), the simulated run's metrics."""
    base, _ = build_run_context(model_spec(model), load_cluster(cluster), PlannerConfig(), seed)
    rows, t0 = [], time.time()
    for trace, turns, think_s, variants in ABLATION:
        tc = trace_config(trace)
        tr, sq = RssiTrace.load(tc), Squeeze.load(tc)
        wl = WorkloadConfig(turns=turns, seed=seed, **({} if think_s is None else {"think_s": think_s}))
        for variant, kw in variants:
            ctx = dataclasses.replace(base, cfg=PlannerConfig(name="voltron", **kw))
            res = run_conversation(make_policy(ctx), ctx, tr, RssiTable(), wl, seed=seed, squeeze=sq)
            rows.append(dict(res.metrics, cluster=cluster, model=model, planner="voltron", trace=trace, turns=turns,
                             think_s=wl.think_s, variant=variant))
            if progress:
                print(f"[{time.time() - t0:5.0f} s] {trace:22s} {variant:28s} p99 {res.metrics['tpot_ms_p99']}",
                      file=sys.stderr, flush=True)
    return rows


def ablation_markdown(rows: list[dict]) -> str:
    """The ablation's table: per trace and variant, TTFT, TPOT, tokens over 400 ms, accuracy and the stalls."""
    out = ["| trace (turns, think s) | variant | TTFT max s | TPOT p50 / p99 ms | TPOT > 400 ms | accuracy proxy | "
           "stall total s | KV recompute s | KV rebuild s |", "|---|---|---|---|---|---|---|---|---|"]
    last = None
    for r in rows:
        case = (r["trace"], r["turns"], r["think_s"])
        head = f"{r['trace']} ({r['turns']}, {r['think_s']:g})" if case != last else ""
        last = case
        out.append(f"| {head} | {r['variant']} | {_f(r['ttft_s_max'])} | {_f(r['tpot_ms_p50'], 0)} / "
                   f"{_f(r['tpot_ms_p99'], 0)} | {_f(_pct(r['qos_tpot_violation_rate']), 1)} % | "
                   f"{_f(r['accuracy_proxy'])} | {_f(r['stall_s_total'], 1)} | {_f(r['kv_recompute_s_total'], 1)} | "
                   f"{_f(r['kv_rebuild_s_total'], 1)} |")
    return "\n".join(out) + "\n"


def _families(names=None) -> dict[str, list[str]]:
    """FAMILIES, or the named subset of it (in FAMILIES' order); an unknown name is a one-line error."""
    if names is None:
        return dict(FAMILIES)
    bad = sorted(set(names) - set(FAMILIES))
    if bad:
        raise ValueError(f"families: unknown {', '.join(bad)} (known: {', '.join(FAMILIES)})")
    return {f: m for f, m in FAMILIES.items() if f in names}


def gains(rows: list[dict]) -> dict[tuple[str, str], float]:
    """(cluster, family) → Voltron's accuracy proxy minus the single device's (MMLU points), each with the model the
    table's rule chose for it."""
    acc = {(r["cluster"], r["family"], r["planner"]): r["accuracy_proxy"] for r in rows}
    return {(c, f): acc[c, f, "voltron"] - acc[c, f, "single"] for (c, f, p) in acc
            if p == "voltron" and (c, f, "single") in acc and acc[c, f, p] is not None
            and acc[c, f, "single"] is not None}


def gain_markdown(by_scale: dict[float, list[dict]]) -> str:
    """Voltron − single accuracy per cluster and family, one column per `accuracy.int4_scale`."""
    scales = sorted(by_scale)
    g = {s: gains(rows) for s, rows in by_scale.items()}
    model = {s: {(r["cluster"], r["family"], r["planner"]): r["model"] for r in rows} for s, rows in by_scale.items()}
    out = ["| cluster | family | " + " | ".join(f"int4_scale {s:g}: gain (voltron / single model)" for s in scales)
           + " |", "|---|---|" + "---|" * len(scales)]
    for c, f in sorted(g[scales[0]]):
        cells = [f"{g[s][c, f]:+.2f} ({model[s][c, f, 'voltron']} / {model[s][c, f, 'single']})" for s in scales]
        out.append(f"| {c} | {f} | " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


def energy_markdown(normal: list[dict], energy: list[dict], max_violation: float = 0.01) -> str:
    """Voltron's decode energy per token, with energy mode off and on, against the single device running the model
    it can run (the table's rule), each with its QoS outcome: a saving is reported only where Voltron meets QoS (every
    TTFT within QoS, ≤ `max_violation` of tokens above the TPOT QoS); a configuration that misses QoS saves nothing."""
    def idx(rows):
        return {(r["cluster"], r["family"], r["planner"]): r for r in rows}

    a, b = idx(normal), idx(energy)
    out = ["| cluster | family | single: model, mJ/token, QoS | Voltron: model, mJ/token, QoS, accuracy | "
           "Voltron energy mode: model, mJ/token, QoS, accuracy | energy mode vs single |",
           "|---|---|---|---|---|---|"]

    def cell(r, acc=False):
        ok = _meets_qos(r, max_violation)
        e = r["energy_mj_per_token"]
        tail = f", {r['accuracy_proxy']:.2f}" if acc else ""
        return f"{r['model']}, {'—' if e is None else f'{e:.0f}'}, {'met' if ok else '**missed**'}{tail}", ok, e

    for (c, f, p) in sorted(a):
        if p != "single" or (c, f, "voltron") not in a or (c, f, "voltron") not in b:
            continue
        s_cell, s_ok, s_e = cell(a[c, f, "single"])
        v_cell, _, _ = cell(a[c, f, "voltron"], True)
        e_cell, e_ok, e_e = cell(b[c, f, "voltron"], True)
        if not e_ok:
            verdict = "no saving (misses QoS)"
        elif s_e and e_e is not None:
            verdict = f"{100 * (e_e / s_e - 1):+.0f} %" + ("" if s_ok else " (single misses QoS)")
        else:
            verdict = "—"
        out.append(f"| {c} | {f} | {s_cell} | {v_cell} | {e_cell} | {verdict} |")
    return "\n".join(out) + "\n"


def equal_split(trace: str, turns: int, cluster: str = "office", seed: int = 0, families=None) -> list[dict]:
    """Paper Fig. 4b: the naive equal MP / TP split vs Voltron, for the largest model of every family (or of
    `families`)."""
    tr = RssiTrace.load(TraceConfig(name=trace, csv=f"{trace}.csv"))
    cl = load_cluster(cluster)
    rows = []
    for fam, models in _families(families).items():
        m = max(models, key=lambda x: BASE_MMLU[x])
        base, _ = build_run_context(model_spec(m), cl, PlannerConfig(), seed)
        for pname, bal in (("mp", "equal"), ("tp", "equal"), ("mp", "hetero"), ("tp", "hetero"), ("voltron", "hetero")):
            ctx = dataclasses.replace(base, cfg=PlannerConfig(name=pname, balance=bal))
            pol = make_policy(ctx)
            res = run_conversation(pol, ctx, tr, RssiTable(), WorkloadConfig(turns=turns, seed=seed), seed=seed)
            rows.append(dict(res.metrics, cluster=cluster, family=fam, model=m, planner=pol.label()))
    return rows


def _f(x, nd=2):
    return "—" if x is None else f"{x:.{nd}f}"


def _pct(x):
    return None if x is None else 100 * x


def _prec(r: dict) -> str:
    """Chosen precision: the uniform one(s), or Voltron's mix as FP16/INT8/INT4 shares of sublayer-steps."""
    lab = r.get("precision")
    if lab is None:
        return "—"
    if lab != "mixed":
        return lab
    return "mixed " + "/".join(f"{100 * r[f'precision_share_{k}']:.0f}" for k in ("fp16", "int8", "int4")) + " %"


def markdown(rows: list[dict], trace: str, turns: int) -> str:
    out = [f"Trace `{trace}`, {turns} turns (LMSYS-like lengths, seed 0). QoS: TTFT ≤ 10 s, TPOT ≤ 400 ms. "
           "All numbers are modelled (simulation), except plan time (measured on this host).", "",
           "| cluster | family | planner | model run | precision | TTFT mean / max s | TTFT ok | TPOT p50 / p99 ms | "
           "TPOT > 400 ms | accuracy proxy (MMLU pts) | OOM | QoS met | search ms p50 (measured) |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['cluster']} | {r['family']} | {r['planner']} | {r['model']} | {_prec(r)} | "
                   f"{_f(r['ttft_s'])} / "
                   f"{_f(r['ttft_s_max'])} | {'yes' if r['qos_ttft_ok'] else 'no'} | {_f(r['tpot_ms_p50'], 0)} / "
                   f"{_f(r['tpot_ms_p99'], 0)} | {_f(_pct(r['qos_tpot_violation_rate']), 1)} % | "
                   f"{_f(r['accuracy_proxy'])} | {'**OOM**' if r['oom'] else 'no'} | "
                   f"{'yes' if r.get('qos_met', _meets_qos(r, 0.05)) else 'no'} | "
                   f"{_f(r['plan_ms_p50_search'], 2)} |")
    return "\n".join(out) + "\n"


def pred_err_markdown(rows: list[dict]) -> str:
    """The planner's prediction error against the simulated cluster, per run of a table (metrics `pred_err_*`)."""
    out = ["Planner estimate vs simulated cluster, per run: relative error (estimate − simulated) / simulated; mean "
           "signed (bias, < 0 = optimistic) and mean absolute (MAPE). Prefill steps exclude reload / KV stalls.", "",
           "| cluster | family | planner | model run | TTFT bias | TTFT MAPE | TPOT bias | TPOT MAPE |",
           "|---|---|---|---|---|---|---|---|"]

    def pct(x):
        return "—" if x is None else f"{100 * x:+.1f} %"

    def mape(x):
        return "—" if x is None else f"{100 * x:.1f} %"

    for r in rows:
        out.append(f"| {r['cluster']} | {r['family']} | {r['planner']} | {r['model']} | "
                   f"{pct(r.get('pred_err_ttft_bias'))} | {mape(r.get('pred_err_ttft_mape'))} | "
                   f"{pct(r.get('pred_err_tpot_bias'))} | {mape(r.get('pred_err_tpot_mape'))} |")
    return "\n".join(out) + "\n"


LATENCY_KEYS = ("n_points", "mape", "r2", "accuracy", "mape_prefill", "mape_decode")


def latency_rows(seed: int = 0, clusters=CLUSTERS, families=None) -> list[dict]:
    """Held-out accuracy of the planner's latency regression, fitted on profiling runs of the simulated devices: one
    row per model (by family, ascending published score) and cluster."""
    rows = []
    for fam, models in _families(families).items():
        for m in sorted(models, key=lambda x: BASE_MMLU[x]):
            for cl in clusters:
                _, a = build_run_context(model_spec(m), load_cluster(cl), PlannerConfig(), seed)
                rows.append({"model": m, "cluster": cl, **{k: a[k] for k in LATENCY_KEYS}})
    return rows


def latency_markdown(rows: list[dict]) -> str:
    """The latency-regression accuracy table of `latency_rows`."""
    out = ["| model | cluster | held-out points | MAPE | R² | accuracy (1 − MAPE) | MAPE prefill | MAPE decode |",
           "|---|---|---|---|---|---|---|---|"]
    for a in rows:
        out.append(f"| {a['model']} | {a['cluster']} | {a['n_points']} | {100 * a['mape']:.1f} % | {a['r2']:.4f} | "
                   f"{100 * a['accuracy']:.1f} % | {100 * a['mape_prefill']:.1f} % | "
                   f"{100 * a['mape_decode']:.1f} % |")
    return "\n".join(out) + "\n"


def figure(trace: str, cluster: str, model: str, turns: int, out, seed: int = 0, think_s: float | None = None) -> dict:
    """TPOT over time for every planner under one trace, with the RSSI of each link (PNG) — paper Fig. 8 style.
    `think_s` overrides the workload's pause between turns (longer pauses stretch the run over more of the trace)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pandas as pd

    tr = RssiTrace.load(TraceConfig(name=trace, csv=f"{trace}.csv"))
    cl = load_cluster(cluster)
    base, _ = build_run_context(model_spec(model), cl, PlannerConfig(), seed)
    fig, (ax, ax2) = plt.subplots(2, 1, figsize=(9, 6), sharex=True, gridspec_kw={"height_ratios": [3, 1]})
    summary = {}
    for pname, style in (("voltron", "-"), ("mp", "--"), ("tp", ":")):
        ctx = dataclasses.replace(base, cfg=PlannerConfig(name=pname))
        extra = {} if think_s is None else {"think_s": think_s}
        res = run_conversation(make_policy(ctx), ctx, tr, RssiTable(), WorkloadConfig(turns=turns, seed=seed, **extra),
                               seed=seed)
        df = pd.DataFrame(res.timeline)
        summary[pname] = res.metrics
        if len(df):
            d = df[df.phase == "decode"]
            ax.plot(d.time_s, 1e3 * d.step_s, style, lw=0.8, label=f"{pname} (viol. "
                    f"{100 * (res.metrics['qos_tpot_violation_rate'] or 0):.0f} %, oom {res.metrics['oom']})")
            if style == "-":                                   # the links once (first planner's run)
                for c in [c for c in df.columns if c.startswith("rssi_")]:
                    ax2.plot(df.time_s, df[c], lw=0.8, label=c[5:])
    ax.axhline(400, color="k", lw=0.8)
    ax.set_ylabel("TPOT (ms, simulated)")
    ax.set_ylim(0, 1200)
    ax.legend(fontsize=8)
    ax.set_title(f"{model} on {cluster}, trace {trace}")
    ax2.axhline(RssiTable().disconnect_dbm, color="r", lw=0.6)
    ax2.set_ylabel("RSSI (dBm)")
    ax2.set_xlabel("time (s)")
    ax2.legend(fontsize=8)
    fig.tight_layout()
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"timeline_{cluster}_{model}_{trace}.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return {"figure": str(path), **{k: v for k, v in summary.items()}}
