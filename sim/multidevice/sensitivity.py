"""Sensitivity of the multi-device results to every model parameter without a source (docs/multidevice.md,
"Assumptions and sensitivity").

Each parameter is set to ½× and 2× its default (fractions capped at 1, marked "(cap 1)"; a dBm threshold ±5 dB) and
Voltron and the
heterogeneity-aware MP / TP baselines run the same conversation (Office cluster, Qwen2.5-14B, trace `walk_away`,
LMSYS-like lengths, seed 0; the model is fixed, so only the parameter moves the numbers). Where the parameter lives
decides what it moves:
- `truth.*`, `jitter`: the simulated cluster only (the planner's profiles of the devices follow, since it profiles
  them; its communication model does not);
- `device.*` (applied to every device of the cluster), `rssi.*`: the world — simulated devices / links, the planner's
  profiles and its view of the links;
- `workload.*`: the conversation;
- `planner.*`: the planner only (the baselines share `qos_margin`, `kv_bucket`, `ffn_shards`).

`experiments.multidevice_report --only sensitivity` runs it into a run directory; `python -m experiments.report` makes
its section of docs/results/multidevice-report.md.
"""
from __future__ import annotations

import dataclasses
import sys
import time

from planner.voltron.devices import Cluster, load_cluster
from planner.voltron.policy import PlannerConfig
from planner.voltron.registry import make_policy
from planner.voltron.rssi import RssiTable
from quant.arch import model_spec
from sim.multidevice.device_model import TruthAssumptions
from sim.multidevice.runner import build_run_context, run_conversation
from sim.multidevice.workload import WorkloadConfig
from sim.wireless import RssiTrace, TraceConfig

PLANNERS = ("voltron", "mp", "tp")
FRACTIONS = {"device.compute_eff", "device.mem_eff", "device.int4_vs_int8", "device.sustained_clock",
             "rssi.mac_efficiency", "truth.attn_eff", "truth.overlap"}
HALF_DOUBLE = (("×0.5", 0.5), ("×2", 2.0))
# (key, default (None: per-device file value), why it has no source, alternatives: (label, factor | ("=", value)))
# — the table of docs/multidevice.md "Assumptions and sensitivity" is generated from this list
PARAMETERS = [
    ("truth.attn_eff", TruthAssumptions.attn_eff,
     "attention-score ops vs dense GEMM efficiency on phone CPUs: no per-SoC figure", HALF_DOUBLE),
    ("truth.overlap", TruthAssumptions.overlap,
     "overlap of compute and DRAM traffic in llama.cpp kernels on these SoCs: not published", HALF_DOUBLE),
    ("truth.msg_overhead_ms", TruthAssumptions.msg_overhead_ms,
     "software path of one Wi-Fi Direct message (socket, copies, wake-up): not measured here", HALF_DOUBLE),
    ("truth.msg_jitter", TruthAssumptions.msg_jitter, "spread of per-message link latency: no trace of it",
     HALF_DOUBLE),
    ("jitter", 0.03, "per-step compute noise (OS, DVFS governors) of phones: not measured here", HALF_DOUBLE),
    ("device.compute_eff", None, "share of the NEON peak llama.cpp GEMM reaches per SoC (per-device file value)",
     HALF_DOUBLE),
    ("device.mem_eff", None, "share of the LPDDR peak a CPU stream reaches (per-device file value)", HALF_DOUBLE),
    ("device.int4_vs_int8", None, "Q4_K vs Q8_0 compute rate (nibble unpack): per-device file value", HALF_DOUBLE),
    ("device.sustained_clock", None, "sustained share of the peak clock under load (throttling): per-device value",
     HALF_DOUBLE),
    ("device.overhead_ms", None, "fixed cost per sublayer (dispatch, barriers): per-device file value", HALF_DOUBLE),
    ("device.n_half", None, "tokens at which GEMM reaches half its peak utilisation: per-device file value",
     HALF_DOUBLE),
    ("rssi.mac_efficiency", RssiTable.mac_efficiency, "MAC/TCP goodput share of the PHY rate on Wi-Fi Direct",
     HALF_DOUBLE),
    ("rssi.base_latency_ms", RssiTable.base_latency_ms, "one-way latency at the best MCS", HALF_DOUBLE),
    ("rssi.retry_latency_ms", RssiTable.retry_latency_ms, "extra latency at the worst MCS (retries)", HALF_DOUBLE),
    ("rssi.disconnect_dbm", RssiTable.disconnect_dbm, "RSSI at which Wi-Fi Direct drops the link (just below MCS 0)",
     (("−75 dBm", ("=", -75.0)), ("−85 dBm", ("=", -85.0)))),
    ("rssi.reconnect_db", RssiTable.reconnect_db, "hysteresis before a lost link re-joins the group", HALF_DOUBLE),
    ("workload.think_s", 20.0, "user think time between turns (how far the trace moves between turns)",
     HALF_DOUBLE),
    ("planner.qos_margin", PlannerConfig.qos_margin, "headroom Voltron keeps for its own prediction error",
     HALF_DOUBLE),
    ("planner.profile_noise", PlannerConfig.profile_noise, "σ of profiling-run noise the regression is fitted on",
     HALF_DOUBLE),
    ("planner.restore_gain", PlannerConfig.restore_gain, "accuracy gain that justifies a non-required re-plan",
     HALF_DOUBLE),
    ("planner.kv_bucket", PlannerConfig.kv_bucket, "KV tokens per memory reservation / plan-cache bucket",
     HALF_DOUBLE),
    ("planner.ffn_shards", PlannerConfig.ffn_shards, "TP shard count of a dense FFN (granularity)", HALF_DOUBLE),
]


def _value(default, alt):
    return alt[1] if isinstance(alt, tuple) else default * alt


def _scaled(key: str, default, alt):
    v = _value(default, alt)
    if key in FRACTIONS and v > 1.0:
        return 1.0, True
    return v, False


def _world(key: str, alt, cluster: Cluster):
    """(cluster, rssi table, truth, jitter, workload overrides, planner overrides, capped) with `key` set to
    alternative `alt` (a factor, or ("=", value)); key "defaults" = the defaults."""
    truth, rssi, jitter, wover, pover, capped = TruthAssumptions(), RssiTable(), 0.03, {}, {}, False
    group, _, name = key.partition(".")
    if group == "truth":
        v, capped = _scaled(key, getattr(truth, name), alt)
        truth = dataclasses.replace(truth, **{name: v})
    elif key == "jitter":
        jitter = _value(0.03, alt)
    elif group == "device":
        devs = []
        for d in cluster.devices:
            v, c = _scaled(key, getattr(d, name), alt)
            capped |= c
            devs.append(dataclasses.replace(d, **{name: v}))
        cluster = Cluster(cluster.spec, devs)
    elif group == "rssi":
        v, capped = _scaled(key, getattr(rssi, name), alt)
        rssi = dataclasses.replace(rssi, **{name: v})
    elif group == "workload":
        wover = {name: _value(getattr(WorkloadConfig, name), alt)}
    elif group == "planner":
        v = _value(getattr(PlannerConfig, name), alt)
        pover = {name: int(round(v)) if isinstance(getattr(PlannerConfig, name), int) else v}
    return cluster, rssi, truth, jitter, wover, pover, capped


def run(turns: int = 3, seed: int = 0, cluster: str = "office", model: str = "qwen2_5_14b", trace: str = "walk_away",
        progress: bool = True) -> list[dict]:
    """One row per (parameter, alternative), plus the defaults row: TPOT p50 (ms), mean TTFT (s), Voltron's share of
    tokens over the TPOT QoS, for each planner."""
    tr = RssiTrace.load(TraceConfig(name=trace, csv=f"{trace}.csv"))
    spec = model_spec(model)
    base_cluster = load_cluster(cluster)
    rows = []
    t0 = time.time()
    cases = [("defaults", "—", None)] + [(k, lab, alt) for k, _, _, alts in PARAMETERS for lab, alt in alts]
    for key, label, alt in cases:
        if alt is None:
            cl, rssi, truth, jitter, wover, pover, capped = base_cluster, RssiTable(), TruthAssumptions(), 0.03, {}, \
                {}, False
        else:
            cl, rssi, truth, jitter, wover, pover, capped = _world(key, alt, base_cluster)
        cfg = PlannerConfig(**pover)
        base, _ = build_run_context(spec, cl, cfg, seed, truth)
        row = {"parameter": key, "alternative": label, "capped": capped}
        for pname in PLANNERS:
            ctx = dataclasses.replace(base, cfg=dataclasses.replace(cfg, name=pname))
            wl = WorkloadConfig(turns=turns, seed=seed, **wover)
            m = run_conversation(make_policy(ctx), ctx, tr, rssi, wl, seed=seed, jitter=jitter, truth=truth).metrics
            row[pname] = {k: m[k] for k in ("tpot_ms_p50", "ttft_s", "qos_tpot_violation_rate", "oom", "precision",
                                           "pred_err_tpot_bias")}
        rows.append(row)
        if progress:
            print(f"[{time.time() - t0:5.0f} s] {key} {label}", file=sys.stderr, flush=True)
    return rows


def _cell(m: dict) -> str:
    if m["oom"] or m["tpot_ms_p50"] is None:
        return "OOM"
    return f"{m['tpot_ms_p50']:.0f} / {m['ttft_s']:.2f}"


def markdown(rows: list[dict], turns: int) -> str:
    defaults = {k: d for k, d, _, _ in PARAMETERS}
    out = [f"Office / qwen2_5_14b / `walk_away`, {turns} turns, seed 0. Cells: TPOT p50 ms / mean TTFT s "
           "(modelled); last columns: Voltron's share of tokens over 400 ms and its TPOT prediction bias.", "",
           "| parameter | default | value | Voltron | MP (hetero) | TP (hetero) | Voltron TPOT > 400 ms | "
           "Voltron TPOT bias |",
           "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        d = defaults.get(r["parameter"])
        dflt = "" if r["parameter"] == "defaults" else ("per device" if d is None else f"{d:g}")
        alt = r["alternative"] + (" (cap 1)" if r["capped"] else "")
        v = r["voltron"]
        viol = "—" if v["qos_tpot_violation_rate"] is None else f"{100 * v['qos_tpot_violation_rate']:.1f} %"
        bias = "—" if v["pred_err_tpot_bias"] is None else f"{100 * v['pred_err_tpot_bias']:+.1f} %"
        out.append(f"| {r['parameter']} | {dflt} | {alt} | {_cell(v)} | {_cell(r['mp'])} | {_cell(r['tp'])} | {viol} | "
                   f"{bias} |")
    return "\n".join(out) + "\n"

