"""Emulated-cluster validation app (docs/cluster.md): a Voltron conversation on worker processes, predicted vs measured.

    python -m experiments.validate cluster=office_emu model=smollm2_135m planner=voltron \
        trace=walk_away_disconnect turns=3
    (`experiments.validate` hands any command line with `cluster=` to this app; `python -m experiments.validate_cluster`
    is the same.)

Starts one worker per device of the cluster's `emulation` block (network namespace, tc tbf link, cgroup CPU quota;
needs root), measures the devices' layer profiles (stored per machine, `profile_points` per device × precision ×
phase) and fits the planner's latency regression on them (held-out accuracy reported), then plays the conversation:
the policy plans every step on the links of that instant, the workers run it, the trace re-shapes and drops links.

Writes `metrics.json` (measured: TTFT / TPOT from wall times, TPOT p99 against the QoS, re-plans, stalls; modelled:
the planner's predictions, the closed loop's final corrections; errors = (predicted − measured) / measured),
`steps.csv` (one row per prefill / decode step, predicted and measured side by side, the measured compute per device
and messages per link the closed loop observed, its corrections and margin after the step), `replans.json`,
`links.csv` (every link change applied), `tokens.json`, `profile_accuracy.json`, and `trace.json` (one track per
device worker and per link).
"""
from __future__ import annotations

import json
import sys
from dataclasses import dataclass

import hydra
import numpy as np
from omegaconf import DictConfig

from experiments.common import (
    ConfigError,
    Estimate,
    int_in,
    one_line_errors,
    precheck,
    prepare_run_dir,
    run_dir,
    strict_bool,
    typed,
    watch_parent,
    write_run_outputs,
)
from experiments.multidevice import check_trace_links, register
from experiments.resume import resumable
from hil.timing import timing_lock

OUTPUTS = ["steps.csv", "replans.json", "links.csv", "tokens.json", "profile_accuracy.json", "trace.json",
           "config.yaml"]
MEASURED_KEYS = ["measured_ttft_s", "measured_ttft_s_min", "measured_ttft_s_max", "measured_tpot_ms_p50",
                 "measured_tpot_ms_p90", "measured_ttft_compute_s", "measured_tpot_compute_ms_p50", "replans",
                 "replan_steps_after_disconnect", "stall_s_total", "recomputes", "tokens_generated", "disconnects",
                 "rejoins", "profile_points_total", "latency_model_accuracy", "latency_model_mape", "profile_s",
                 "cluster_start_s", "oom", "warm_up_load_s", "rpc_call_ms", "measured_tpot_ms_p99",
                 "measured_tpot_compute_ms_p99", "tpot_over_qos_share", "qos_violations", "switch_steps",
                 "kv_rebuilds_measured", "idle_switches", "idle_switch_s_total"]
MODELLED_KEYS = ["predicted_ttft_s", "predicted_tpot_ms_p50", "ttft_error_pct", "tpot_error_pct",
                 "tpot_step_mape_pct", "accuracy_proxy_min", "corrections_final", "errors", "predicted_tpot_ms_p99",
                 "predicted_switch_s_total", "kv_holds"]
TUNED_ON = ("office_emu", "walk_away_disconnect")   # cluster and trace the emulation was tuned with (docs/cluster.md)
SWITCH_S = 1e-3          # s: a step whose measured plan switch took longer than this contains a switch


@dataclass
class Inputs:
    spec: object
    cluster: object
    pcfg: object
    tcfg: object
    rssi: object
    live: object
    turns: int
    prompt_tokens: int
    new_tokens: int
    seed: int
    points: int
    remeasure: bool
    port: int
    profile_dir: str | None


def inputs(cfg: DictConfig) -> Inputs:
    from experiments.calibrate_cluster import inputs as cluster_inputs
    from hil.cluster.conversation import LiveConfig
    from planner.voltron.rssi import RssiTable
    from sim.wireless import RssiTrace, TraceConfig

    for k in ("turns", "prompt_tokens", "new_tokens", "live", "rssi", "write_trace"):
        if k not in cfg:
            raise ConfigError(f"{k}: missing top-level key")
    turns = int_in(cfg.turns, "turns", 1, 50)
    prompt = int_in(cfg.prompt_tokens, "prompt_tokens", 1, 256)
    new = int_in(cfg.new_tokens, "new_tokens", 1, 256)
    strict_bool(cfg.write_trace, "write_trace")
    spec, cluster, pcfg, points, seed, remeasure, port, pdir = cluster_inputs(cfg)
    tcfg = typed(cfg.trace, TraceConfig, "trace")
    rssi = typed(cfg.rssi, RssiTable, "rssi")
    live = typed(cfg.live, LiveConfig, "live")
    try:
        trace = RssiTrace.load(tcfg)
    except (ValueError, OSError) as e:
        raise ConfigError(str(e) if str(e).startswith("trace") else f"trace.csv: {e}") from None
    check_trace_links(trace, cluster, tcfg.name)
    from experiments.calibrate_cluster import real_weights

    context = real_weights(spec)
    if turns * (prompt + new) > context:
        raise ConfigError(f"prompt_tokens: turns × (prompt_tokens + new_tokens) = {turns} × ({prompt} + {new}) = "
                          f"{turns * (prompt + new)} tokens, more than {spec.name}'s context of {context} tokens")
    return Inputs(spec, cluster, pcfg, tcfg, rssi, live, turns, prompt, new, seed, points, remeasure, port, pdir)


def validate(cfg: DictConfig) -> Estimate:
    """Every check before any work, including the ones that need this machine (root, tc, cgroups)."""
    from experiments.calibrate_cluster import check_machine

    inp = inputs(cfg)
    check_machine()
    steps = inp.turns * inp.new_tokens
    return Estimate(30.0 + 0.2 * steps + 0.3 * inp.points * 6, 1.5e9, "turns",
                    f"turns={inp.turns}, profile_points={inp.points}")


def _prompts(spec, inp: Inputs) -> list[np.ndarray]:
    from quant.evaluate import eval_text_tokens

    toks = eval_text_tokens(spec, inp.turns * inp.prompt_tokens)
    return [toks[i * inp.prompt_tokens:(i + 1) * inp.prompt_tokens] for i in range(inp.turns)]


def run(inp: Inputs, out) -> dict:
    import time

    from hil.cluster.conversation import LiveConversation, Turn
    from hil.cluster.profiler import measure_calls, profile_cluster
    from hil.cluster.session import ProfileStore, start_workers
    from hil.cluster.trace import chrome_trace
    from planner.voltron.devices import Cluster, emulated_cluster, load_device
    from planner.voltron.layers import layer_table
    from planner.voltron.registry import context_from_profile, make_policy
    from quant.atomic import atomic_write_json, atomic_write_text
    from sim.wireless import LinkTracker, RssiTrace

    spec = inp.spec
    cluster, cores = emulated_cluster(Cluster(inp.cluster, [load_device(d) for d in inp.cluster.devices]))
    period_s = inp.cluster.emulation.cfs_period_ms / 1e3
    store = ProfileStore(cluster, cores, spec.name, inp.profile_dir)
    prompts = _prompts(spec, inp)
    t0 = time.monotonic()
    emu, handles = start_workers(cluster, cores, spec.name, period_s, port=inp.port)
    try:
        start_s = time.monotonic() - t0
        table = layer_table(spec, inp.pcfg.ffn_shards)
        prof = None if inp.remeasure else store.load(inp.points)
        t1 = time.monotonic()
        if prof is None:
            prof = profile_cluster([h.client for h in handles], table, points=inp.points, seed=inp.seed)
            store.save(prof, inp.points, inp.seed, {"cores": cores.tolist()})
        profile_s = time.monotonic() - t1
        ctx, acc = context_from_profile(spec, cluster, inp.pcfg, prof, inp.seed)
        call_s = measure_calls([h.client for h in handles], period_s)
        policy = make_policy(ctx)
        tracker = LinkTracker(RssiTrace.load(inp.tcfg), inp.rssi, inp.cluster.links)
        conv = LiveConversation(policy, ctx, handles, emu.clients, emu, tracker.state,
                                [Turn(p, inp.new_tokens) for p in prompts], inp.live, call_s=call_s)
        res = conv.run()
        spans = [s.to_dict() for s in conv.coord.spans] if conv.coord is not None else []
        spans_base = conv.coord._t0 if conv.coord is not None else 0.0
        messages = emu.drain_trace()
    finally:
        emu.close()
    rows = res["rows"]
    import pandas as pd

    atomic_write_text(out / "steps.csv", pd.DataFrame(rows).to_csv(index=False))
    atomic_write_text(out / "links.csv", pd.DataFrame(res["links"]).to_csv(index=False))
    atomic_write_json(out / "replans.json", res["replans"])
    atomic_write_json(out / "tokens.json", res["tokens"])
    atomic_write_json(out / "profile_accuracy.json", {**acc, "measured_profile": str(store.dir), "points": inp.points,
                                                      "cores": cores.tolist()})
    atomic_write_json(out / "trace.json", chrome_trace(spans, messages, [d.name for d in cluster.devices], spans_base))
    m = summarize(rows, res, acc, prof, start_s, profile_s, policy)
    m.update(cluster=inp.cluster.name, trace=inp.tcfg.name, model=spec.name,
             held_out_cluster=inp.cluster.name != TUNED_ON[0], held_out_trace=inp.tcfg.name != TUNED_ON[1])
    m["rpc_call_ms"] = [round(float(c) * 1e3, 4) for c in call_s]        # per device, measured
    return m


def summarize(rows: list[dict], res: dict, acc: dict, prof, start_s: float, profile_s: float, policy) -> dict:
    """Measured TTFT / TPOT as the user sees them (plan switches, reloads, KV re-prefills and link-drop retries
    included) and without the switches (`*_compute`: what the planner's step estimate predicts); errors are against
    the latter, the switches are reported as stalls."""
    pre = [r for r in rows if r["phase"] == "prefill"]
    dec = [r for r in rows if r["phase"] == "decode"]
    m: dict = {"planner": policy.label(), "oom": bool(res["oom"])}
    if pre:
        meas = np.array([r["measured_s"] for r in pre])
        comp = np.array([r["measured_step_s"] for r in pre])
        pred = np.array([r["predicted_s"] for r in pre])
        m.update(measured_ttft_s=float(np.median(meas)), measured_ttft_s_min=float(meas.min()),
                 measured_ttft_s_max=float(meas.max()), measured_ttft_compute_s=float(np.median(comp)),
                 predicted_ttft_s=float(np.median(pred)))
        m["ttft_error_pct"] = 100.0 * (m["predicted_ttft_s"] - m["measured_ttft_compute_s"]) / m[
            "measured_ttft_compute_s"]
    if dec:
        meas = np.array([r["measured_s"] for r in dec])
        comp = np.array([r["measured_step_s"] for r in dec])
        pred = np.array([r["predicted_s"] for r in dec])
        m.update(measured_tpot_ms_p50=1e3 * float(np.median(meas)), measured_tpot_ms_p90=1e3 * float(
            np.percentile(meas, 90)), measured_tpot_compute_ms_p50=1e3 * float(np.median(comp)),
            predicted_tpot_ms_p50=1e3 * float(np.median(pred)))
        qos = policy.ctx.cfg.qos_tpot_s
        m.update(measured_tpot_ms_p99=1e3 * float(np.percentile(meas, 99)),
                 measured_tpot_compute_ms_p99=1e3 * float(np.percentile(comp, 99)), qos_tpot_ms=1e3 * qos,
                 tpot_over_qos_share=float(np.mean(meas > qos)))
        mt = m["measured_tpot_compute_ms_p50"]
        m["tpot_error_pct"] = 100.0 * (m["predicted_tpot_ms_p50"] - mt) / mt
        m["tpot_step_mape_pct"] = 100.0 * float(np.mean(np.abs(pred - comp) / comp))
        # as the user sees it: the step estimate plus the planner's estimate of the switch it decided
        m["predicted_tpot_ms_p99"] = 1e3 * float(np.percentile(
            pred + np.array([r.get("predicted_switch_s", 0.0) for r in dec]), 99))
    m["errors"] = prediction_errors(rows)
    m["switch_steps"] = int(sum(_switched(r) for r in rows))
    m["kv_rebuilds_measured"] = int(sum(bool(r.get("recompute", False)) for r in rows))
    m["predicted_switch_s_total"] = float(sum(r.get("predicted_switch_s", 0.0) for r in rows))
    m["kv_holds"] = int(getattr(policy, "kv_holds", 0))
    idle = [r for r in res["replans"] if r.get("phase") == "idle"]
    m["idle_switches"], m["idle_switch_s_total"] = len(idle), float(sum(r["switch_s"] for r in idle))
    m["disconnects"], m["rejoins"] = _transitions(res["links"])
    m["replans"] = len(res["replans"])
    m["replan_steps_after_disconnect"] = _replan_lag(rows, len(policy.ctx.cluster.devices))
    m["stall_s_total"] = float(sum(r["switch_s"] for r in rows))
    m["recomputes"] = int(rows[-1]["recomputes"]) if rows else 0
    m["tokens_generated"] = int(sum(len(t) for t in res["tokens"]))
    m["profile_points_total"] = int(len(prof.time_s))
    m["latency_model_accuracy"], m["latency_model_mape"] = acc["accuracy"], acc["mape"]
    m["profile_s"], m["cluster_start_s"], m["warm_up_load_s"] = profile_s, start_s, float(res["warm_up_s"])
    m["accuracy_proxy_min"] = float(min((r["accuracy_proxy"] for r in rows), default=float("nan")))
    # the closed loop (planner.voltron.feedback) after the last step: per-step values are in steps.csv
    fb = getattr(policy, "fb", None)
    if fb is not None:
        m["qos_violations"] = int(fb.violations)
        m["corrections_final"] = {k: v for k, v in rows[-1].items()
                                  if k.startswith(("corr_", "margin_", "target_"))} if rows else {}
    from planner.voltron.accuracy import score_basis

    m["accuracy_basis"] = score_basis(policy.ctx.table.spec.name)
    return m


def _switched(r: dict) -> bool:
    """The step contains a plan switch: the coordinator spent time switching (loads, KV moves, a history
    re-prefill) or retried after a link fell (a re-plan whose load is deferred or loads nothing switches nothing)."""
    return r["switch_s"] > SWITCH_S or r["retries"] > 0


def prediction_errors(rows: list[dict]) -> dict:
    """Errors of both planner estimates, per phase, over all steps and without the steps that contain a plan switch:
    `recosted` = the plan that ran re-costed for the step's links and KV (`predicted_s`), `plan` = the planner's own
    estimate when it made the plan (`predicted_plan_s`), both against the measured step without the switch
    (`measured_step_s`). p50 error = (median predicted − median measured) / median measured, in %; MAPE = mean of
    |predicted − measured| / measured per step, in %; n = steps."""
    out: dict = {}
    for phase in ("prefill", "decode"):
        for subset in ("all", "no_switch"):
            rs = [r for r in rows if r["phase"] == phase and (subset == "all" or not _switched(r))]
            out[f"{phase}_{subset}_n"] = len(rs)
            if not rs:
                continue
            meas = np.array([r["measured_step_s"] for r in rs])
            for name, key in (("recosted", "predicted_s"), ("plan", "predicted_plan_s")):
                pred = np.array([r[key] for r in rs])
                mm = float(np.median(meas))
                out[f"{phase}_{subset}_{name}_p50_error_pct"] = 100.0 * (float(np.median(pred)) - mm) / mm
                out[f"{phase}_{subset}_{name}_mape_pct"] = 100.0 * float(np.mean(np.abs(pred - meas) / meas))
    return out


def _transitions(links: list[dict]) -> tuple[int, int]:
    """(disconnects, rejoins): up → down and down → up transitions of the links applied."""
    state: dict[int, bool] = {}
    downs = ups = 0
    for e in links:
        was = state.get(e["device"], True)
        downs += was and not e["up"]
        ups += (not was) and e["up"]
        state[e["device"]] = e["up"]
    return int(downs), int(ups)


def _replan_lag(rows: list[dict], n_devices: int) -> int | None:
    """Worst case over the steps that ran with fewer devices than the step before (a link went down before or
    during them): steps until one was re-planned (0 = that very step was re-planned, after a retry if the link fell
    mid-step); None if no device left while steps ran."""
    worst, prev = None, n_devices
    for i, r in enumerate(rows):
        if r["connected"] < prev:
            k = next((k for k in range(i, len(rows)) if rows[k]["replanned"]), None)
            lag = None if k is None else k - i
            worst = lag if worst is None or (lag is not None and lag > worst) else worst
        prev = r["connected"]
    return worst


def profile_files(cfg: DictConfig) -> list:
    """The stored measured profile this run uses (an input `experiments.resume` digests besides the config)."""
    from hil.cluster.session import ProfileStore
    from planner.voltron.devices import Cluster, emulated_cluster, load_device

    inp = inputs(cfg)
    cluster, cores = emulated_cluster(Cluster(inp.cluster, [load_device(d) for d in inp.cluster.devices]))
    d = ProfileStore(cluster, cores, inp.spec.name, inp.profile_dir).dir
    return [p for p in (d / "profile.npz", d / "meta.json") if p.is_file()]


register()
GROUPS = {"cluster": None, "model": None, "planner": None, "trace": None}


def timed_run(inp: Inputs, out) -> dict:
    """`run` under the machine's timing lock: the workers' measured steps must not share the cores with another
    timing run (validate, calibrate, llama.cpp; hil.timing)."""
    with timing_lock(f"validate cluster={inp.cluster.name} {out}"):
        return run(inp, out)


@hydra.main(config_path="../conf", config_name="validate_cluster", version_base="1.3")
@resumable(expected=("measured_ttft_s",), files=profile_files)
@one_line_errors
def main(cfg: DictConfig) -> None:
    watch_parent()
    inp = inputs(cfg)
    out = run_dir()
    prepare_run_dir(out, OUTPUTS)
    from hil.cluster.transport import LinkDown

    try:
        m = timed_run(inp, out)
    except LinkDown as e:                       # retries exhausted: the trace and settings leave no working plan
        raise ConfigError(f"live.max_retries: a step failed {inp.live.max_retries + 1} times, its links falling "
                          f"during it each time ({' '.join(str(e).split())[:120]}); raise live.max_retries or lower "
                          f"live.trace_speed") from None
    write_run_outputs(out, cfg, m, measured=MEASURED_KEYS, modelled=MODELLED_KEYS,
                      inputs=["qos_tpot_ms", "held_out_cluster", "held_out_trace"])

    def g(key: str) -> float:
        return m.get(key, float("nan"))

    print(f"{inp.cluster.name}/{inp.spec.name}/{m['planner']}/{inp.tcfg.name}: TTFT measured "
          f"{g('measured_ttft_s'):.3f} s, its steps {g('measured_ttft_compute_s'):.3f} s vs predicted "
          f"{g('predicted_ttft_s'):.3f} s ({g('ttft_error_pct'):+.1f} % of the steps); TPOT p50 measured "
          f"{g('measured_tpot_ms_p50'):.1f} ms, its steps {g('measured_tpot_compute_ms_p50'):.1f} ms vs predicted "
          f"{g('predicted_tpot_ms_p50'):.1f} ms ({g('tpot_error_pct'):+.1f} % of the steps); "
          f"re-plans {m['replans']}, disconnects {m['disconnects']}, rejoins {m['rejoins']}; TPOT p99 measured "
          f"{g('measured_tpot_ms_p99'):.1f} ms (QoS {g('qos_tpot_ms'):.0f} ms) "
          f"-> {out / 'metrics.json'}")
    print(json.dumps({k: m[k] for k in ("latency_model_accuracy", "stall_s_total", "tokens_generated")}))


if __name__ == "__main__":
    precheck("validate_cluster", sys.argv[1:], validate, GROUPS)
    main()
