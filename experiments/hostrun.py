"""Predict a host cold start with the simulator, run the same plan on this host, compare (docs/hil.md).

The library behind `experiments.validate` (plain typed inputs; no Hydra): it is the one place that sees both the
simulator (`sim/`) and the hardware runner (`hil/`), which never import each other.

Flow: the framework's policy builds its plan for the measured host profile (`hil.host.HostProfile`: device profile,
host runtime model, cost table; threads fitted to the cores, `hil.deploy.fit_threads`; unpack work from the real
file's bit widths) -> the plan is bound to the packed file's byte ranges -> the simulator predicts it with the host's
cost table and its runtime model (modelled) -> the runner executes it `repeats` times,
page cache evicted before each run (measured) -> the same metric function (`sim.metrics.coldstart_metrics`) is applied
to the predicted and to every measured timeline, so each phase is defined identically on both sides.
Prediction error = (predicted - measured) / measured, with measured = the median over repeats.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from hil.host import HostProfile
from planner.cost import make_cost_model
from planner.device import SocProfile
from planner.framework import FrameworkSpec
from planner.plan import Plan
from planner.timeline import Timeline
from quant.arch import ModelSpec
from quant.settings import QuantSettings

PHASES = ("ttft_s", "load_s", "unpack_s", "prefill_s", "cpu_bubble_rate", "npu_bubble_rate", "core_busy_pct",
          "thread_waits")
LOGIT_ATOL = 0.02          # max |Δlogit| floor, runner vs NumPy reference on the same packed weights (docs/hil.md)
LOGIT_NOISE_FACTOR = 3.0   # ... or this many times the reference's own 1-ulp noise (static INT8 activations amplify it)
# The native forward (bit-exact with the runner) against the NumPy reference over every position of several prompts
# (docs/hil.md "Logits"). Static INT8 activations make the float32 forward chaotic: a prompt either agrees to ~1e-13
# nats or, after an activation crosses a rounding boundary, drifts; on SmolLM2's 5-bit and INT8 files (4 prompts x 16
# positions) top-1 agreed at 0.89-0.92 of the positions with a mean KL of 0.017-0.067 nats (max 0.66 at one position).
# The reference against itself with every quantized activation nudged by one ulp is as far apart (SmolLM2 INT8: top-1
# 0.875, 0.099 nats; a synthetic Qwen2.5-0.5B shape at 4 bits: 0.89, 0.35 nats, where the native forward gave 0.78,
# 0.51), so the tolerance is the larger of a floor and a multiple of that own noise.
CHECK_PROMPTS = 4          # disjoint prompts of the evaluation text
CHECK_PROMPT_TOKENS = 16   # positions compared per prompt (64 in all)
CHECK_PROMPT_STRIDE = 400  # tokens between the prompts' starts
TOP1_MIN = 0.75            # share of positions whose argmax must agree, at most (lowered by the reference's noise)
KL_MEAN_MAX = 0.25         # nats: mean KL(reference || native) allowed at least (raised by the reference's noise)
NOISE_FACTOR = 3.0         # tolerance = this many times the reference's own 1-ulp disagreement, where that is larger


def _log_softmax(z: np.ndarray) -> np.ndarray:
    z = np.asarray(z, dtype=np.float64)
    z = z - z.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def agreement(ref: np.ndarray, test: np.ndarray, noise: dict[str, Any] | None = None) -> dict[str, Any]:
    """Logits `test` (P, vocab) against `ref` (P, vocab), position by position: top-1 agreement, mean and max
    KL(ref || test) in nats, the tolerances and whether both are within them: top-1 >= min(TOP1_MIN,
    1 - NOISE_FACTOR x (1 - noise top-1)), mean KL <= max(KL_MEAN_MAX, NOISE_FACTOR x noise mean KL), `noise` being
    the reference's agreement with itself under a 1-ulp nudge (None: the fixed TOP1_MIN / KL_MEAN_MAX)."""
    ref, test = np.atleast_2d(ref), np.atleast_2d(test)
    if ref.shape != test.shape or ref.size == 0:
        raise ValueError(f"logits: shapes {ref.shape} and {test.shape} differ or are empty")
    tol_top1, tol_kl = TOP1_MIN, KL_MEAN_MAX
    if noise is not None:
        tol_top1 = min(TOP1_MIN, 1.0 - NOISE_FACTOR * (1.0 - noise["top1"]))
        tol_kl = max(KL_MEAN_MAX, NOISE_FACTOR * noise["kl_mean"])
    out = {"positions": int(ref.shape[0]), "tol_top1": tol_top1, "tol_kl_mean": tol_kl}
    if not np.isfinite(test).all():
        return out | {"top1": 0.0, "kl_mean": float("inf"), "kl_max": float("inf"), "ok": False}
    lr, lt = _log_softmax(ref), _log_softmax(test)
    kl = (np.exp(lr) * (lr - lt)).sum(axis=-1)
    top1 = float((ref.argmax(axis=-1) == test.argmax(axis=-1)).mean())
    return out | {"top1": top1, "kl_mean": float(kl.mean()), "kl_max": float(kl.max()),
                  "ok": bool(top1 >= tol_top1 and kl.mean() <= tol_kl)}


def check_prompts(spec: ModelSpec, n: int = CHECK_PROMPTS, tokens: int = CHECK_PROMPT_TOKENS) -> list[np.ndarray]:
    from quant.evaluate import eval_text_tokens

    return [eval_text_tokens(spec, tokens, k * CHECK_PROMPT_STRIDE) for k in range(n)]


def correctness(path: Path, spec: ModelSpec, pm=None, native_pm=None, prompts: list[np.ndarray] | None = None
                ) -> dict[str, Any]:
    """The native forward (hil.native_forward, bit-exact with the runner) against the NumPy reference on the same
    packed file over every position of `prompts` (default `check_prompts`; measured): correct_positions,
    correct_top1, correct_kl_mean / _max (nats), the reference's own 1-ulp noise (correct_noise_top1 / _kl_mean),
    the tolerances it sets (correct_tol_top1 / _kl_mean; `agreement`) and correct_ok. `pm`: the file already read;
    `native_pm`: other weights for the native side (a test's wrong weights; default `pm`)."""
    from hil.native_forward import native_last_logits
    from quant.packed_forward import forward_last_logits, read_model

    pm = read_model(path) if pm is None else pm
    ref, nudged, nat = [], [], []
    for t in check_prompts(spec) if prompts is None else prompts:
        ref.append(forward_last_logits(pm, spec, t, all_positions=True))
        nudged.append(forward_last_logits(pm, spec, t, nudge=True, all_positions=True))
        nat.append(native_last_logits(pm if native_pm is None else native_pm, spec, t, all_positions=True))
    ref = np.concatenate(ref)
    noise = agreement(ref, np.concatenate(nudged))
    a = agreement(ref, np.concatenate(nat), noise)
    return ({f"correct_{k}": v for k, v in a.items()}
            | {"correct_noise_top1": noise["top1"], "correct_noise_kl_mean": noise["kl_mean"]})


def native_check(pm, spec: ModelSpec, tokens: np.ndarray, logits: np.ndarray) -> dict[str, Any]:
    """The runner's last-token logits against the same forward op by op with its native kernels (hil.native_forward;
    must be bit-exact whatever the plan)."""
    from hil.native_forward import native_last_logits

    nat = native_last_logits(pm, spec, tokens)
    return {"logits_native_max_abs_diff": float(np.abs(nat - logits).max()),
            "logits_native_exact": bool(np.array_equal(nat, logits))}


def logits_check(path: Path, spec: ModelSpec, tokens: np.ndarray, logits: np.ndarray, token: int,
                 reference: bool = True) -> dict[str, Any]:
    """Runner logits vs the same forward computed op by op with the runner's native kernels (native_check: always)
    and, with `reference`, vs the NumPy reference on the same packed file (all measured): max |Δ|, the reference's
    own noise (its logits with every quantized activation nudged by one float32 ulp), the tolerance, top-1 agreement
    and whether the reference's top-1 survives its own noise (when it does not, top-1 is not decidable in float32),
    and the positions check (`correctness`)."""
    from quant.packed_forward import forward_last_logits, read_model

    pm = read_model(path)
    out = native_check(pm, spec, tokens, logits)
    if not reference:
        return out
    ref = forward_last_logits(pm, spec, tokens)
    nudged = forward_last_logits(pm, spec, tokens, nudge=True)
    noise = float(np.abs(nudged - ref).max())
    diff = float(np.abs(ref - logits).max())
    tol = max(LOGIT_ATOL, LOGIT_NOISE_FACTOR * noise)
    out |= {"logits_max_abs_diff": diff, "logits_ref_noise": noise, "logits_tolerance": tol,
            "logits_within_tolerance": bool(diff <= tol), "logits_top1_match": bool(int(ref.argmax()) == token),
            "logits_ref_top1_stable": bool(int(ref.argmax()) == int(nudged.argmax()))}
    return out | correctness(path, spec, pm)


COLD_RESIDENT_MAX = 0.001  # fraction of the packed file in the page cache at t0 above which a run is not cold
RERUN_TRIES = 3            # runs of one slot until one starts cold (each run evicts up to EVICT_TRIES times first)


@dataclass
class HostRun:
    plan: Plan
    predicted: Timeline
    measured: list[Timeline]
    pred_metrics: dict[str, Any]
    meas_metrics: list[dict[str, Any]]     # counted runs; each also has "run" (its index) and "resident_before"
    packed_path: Path
    logits: np.ndarray | None = None
    token: int = -1
    info: dict[str, Any] = field(default_factory=dict)
    warm: list[dict[str, Any]] = field(default_factory=list)    # measured slots that never started cold: not counted
    reruns: int = 0                        # runs repeated because they found the file cached


def cold_run(plan: Plan, path: Path, tokens: np.ndarray, spec: ModelSpec, dev: SocProfile, tries: int = RERUN_TRIES
             ) -> list[tuple[Any, dict[str, Any]]]:
    """Runs of one slot until one starts cold: [(RunResult, metrics with resident_before)] of every attempt, the last
    one cold unless all `tries` found more than COLD_RESIDENT_MAX of the file cached (docs/hil.md "Validation
    protocol": a warm run is rerun or left out, never counted)."""
    from hil.runner import run_plan

    out = []
    for _ in range(tries):
        res = run_plan(plan, path, tokens, spec=spec)
        m = {**_metrics(res.timeline, dev), "resident_before": float(res.resident_before)}
        m["open_to_t0_s"] = float(res.info["open_to_t0_s"])             # file open -> t0 (hil.runner)
        m["ttft_from_open_s"] = m["open_to_t0_s"] + m["ttft_s"]         # the clock a peer's is compared with
        out.append((res, m))
        if res.resident_before <= COLD_RESIDENT_MAX:
            break
    return out


def host_weight_file(fw: FrameworkSpec) -> tuple[str, str]:
    """(quantization method, packed format) of the weight file `fw`'s plan reads on this host
    (hil.deploy.weight_file_kind of its policy's recipe)."""
    from hil.deploy import weight_file_kind
    from sim.coldstart import POLICIES

    recipe = getattr(POLICIES[fw.policy](), "recipe", None)
    return weight_file_kind(fw.policy, getattr(recipe, "fmt", None))


def build_host_plan(spec: ModelSpec, host: HostProfile, fw: FrameworkSpec, bits: int, tokens: int,
                    qs: QuantSettings) -> tuple[Plan, Path]:
    """The framework's plan for this host, bound to its packed weight file (made and cached on first use)."""
    from hil.deploy import fit_threads, packed_model
    from hil.packed_index import bind_to_file, file_bits, read_index
    from sim.coldstart import POLICIES, ColdStartInputs

    policy = POLICIES[fw.policy]()
    method, fmt = host_weight_file(fw)
    path = packed_model(spec, method, bits, fmt, qs)
    dev = host.device
    cost = make_cost_model("table", dev, str(host.cost_table))
    # no peer costs (host.peers): the runner runs a llama.cpp- or MNN-style schedule with its own kernels, not
    # llama.cpp's or MNN's code (no vocabulary parse, no repack, its INT8 GEMMs)
    x = ColdStartInputs(spec, dev, fit_threads(fw, dev, host.runtime), cost, tokens, float(bits),
                        bits_override=file_bits(path, spec))       # the plan's unpack work is the file's
    return bind_to_file(policy.build(x), read_index(path)), path


def core_metrics(tl: Timeline, dev: SocProfile) -> dict[str, Any]:
    """How busy the cores were until the first token and how often a thread blocked and was woken: modelled (the
    simulator's core occupancy; idle workers woken + interpreter-lock hand-offs) or measured (the process's CPU time
    and voluntary context switches over the run) — where the time of a run goes that per-phase errors do not show
    (docs/hil.md "Limits")."""
    busy = None
    if tl.core_busy_s is not None and tl.end_s > 0:
        busy = 100.0 * tl.core_busy_s / (dev.cpu_cores * tl.end_s)
    return {"core_busy_pct": busy, "thread_waits": tl.waits, "waits_by_thread": tl.waits_by_thread,
            "packed_wakes": tl.packed_wakes}


def _metrics(tl: Timeline, dev: SocProfile) -> dict[str, Any]:
    from sim.metrics import coldstart_metrics

    return {**coldstart_metrics(tl, dev), **core_metrics(tl, dev)}


def predict(plan: Plan, host: HostProfile, speeds: dict[str, float] | None = None) -> tuple[Timeline, dict[str, Any]]:
    """The simulator's timeline and metrics for `plan` with the host's cost table and runtime model; `speeds` (per
    kernel class, e.g.
    {"gemm": 0.8}, and the read classes "read" / "read_cpu"): the kernels and reads at that measured speed of the
    host instead of the calibrated one (`planner.cost.scaled`; docs/hil.md "Prediction at the run-time host
    speed")."""
    from planner.cost.scaled import ScaledCostModel, at_read_speed
    from sim.executor import simulate

    dev = host.device
    cost = make_cost_model("table", dev, str(host.cost_table))
    if speeds:                          # reads are rates of the device profile, the kernels the cost model's
        dev, speeds = at_read_speed(dev, speeds)
    tl = simulate(plan, dev, ScaledCostModel(cost, speeds) if speeds else cost, runtime=host.runtime)
    return tl, _metrics(tl, dev)


def compare_at_speed(run: HostRun, m_pred: dict[str, Any], tag: str = "at_host_speed") -> dict[str, Any]:
    """predicted_<tag>_<phase> (modelled under a condition measured around the runs: the host speed, the wake-up
    placement) and <phase>_error_<tag>_pct against the measured medians of `run` (TTFT and the three phases)."""
    out: dict[str, Any] = {}
    for ph in ("ttft_s", "load_s", "unpack_s", "prefill_s"):
        name = ph[:-2]
        vals = [m[ph] for m in run.meas_metrics if m.get(ph) is not None]
        p = m_pred.get(ph)
        out[f"predicted_{tag}_{name}_s"] = p
        out[f"{name}_error_{tag}_pct"] = _err(p, statistics.median(vals) if vals else None)
    return out


def compare_per_run(run: HostRun, host: HostProfile, speeds: list[dict[str, float]],
                    tag: str = "at_run_speed") -> tuple[dict[str, Any], list[float | None]]:
    """Each measured run against the plan re-simulated at the kernel speeds measured right before that run
    (`speeds[k]`, hil.diagnostics.drift.speeds_before; modelled, conditioned on a measurement taken before the run,
    so still a prediction). predicted_<tag>_<phase>_s: median over runs of the per-run predictions;
    <phase>_error_<tag>_pct: median over runs of each run's (predicted - measured) / measured;
    ttft_error_<tag>_min_pct / _max_pct. Also the per-run predicted TTFTs (None where a run has no speeds)."""
    cache: dict[tuple, dict[str, Any]] = {}
    preds: list[dict[str, Any] | None] = []
    for k in range(len(run.meas_metrics)):
        slot = run.meas_metrics[k].get("run", k)              # a warm slot left out shifts the counted runs
        sp = speeds[slot] if slot < len(speeds) else {}
        if not sp:
            preds.append(None)
            continue
        key = tuple(sorted(sp.items()))
        if key not in cache:
            cache[key] = predict(run.plan, host, dict(key))[1]
        preds.append(cache[key])
    out: dict[str, Any] = {}
    for ph in ("ttft_s", "load_s", "unpack_s", "prefill_s"):
        name = ph[:-2]
        pairs = [(p[ph], m[ph]) for p, m in zip(preds, run.meas_metrics)
                 if p is not None and p.get(ph) is not None and m.get(ph)]
        errs = [e for p, m in pairs if (e := _err(p, m)) is not None]
        out[f"predicted_{tag}_{name}_s"] = statistics.median(p for p, _ in pairs) if pairs else None
        out[f"{name}_error_{tag}_pct"] = statistics.median(errs) if errs else None
        if ph == "ttft_s":
            out[f"ttft_error_{tag}_min_pct"] = min(errs) if errs else None
            out[f"ttft_error_{tag}_max_pct"] = max(errs) if errs else None
    return out, [p["ttft_s"] if p else None for p in preds]


def run_host(spec: ModelSpec, host: HostProfile, fw: FrameworkSpec, bits: int, tokens: np.ndarray,
             qs: QuantSettings, repeats: int, warmup: int = 1, progress=None, between=None) -> HostRun:
    """Predict the plan, then run it `warmup` + `repeats` times cold (the first `warmup` runs not counted; a run that
    finds the file cached is rerun, `cold_run`, and left out if it stays warm). `between(k)`: called after run k
    (0-based), e.g. one run of a peer, so both see the same host conditions."""
    plan, path = build_host_plan(spec, host, fw, bits, int(tokens.size), qs)
    pred_tl, pred_m = predict(plan, host)
    measured, meas_m, warm, reruns = [], [], [], 0
    res = None
    for k in range(warmup + repeats):
        attempts = cold_run(plan, path, tokens, spec, host.device)
        res, m = attempts[-1]
        reruns += len(attempts) - 1
        if k >= warmup:
            m["run"] = k - warmup
            if res.resident_before <= COLD_RESIDENT_MAX:
                measured.append(res.timeline)
                meas_m.append(m)
            else:
                warm.append(m)
        if progress:
            progress(k + 1, warmup + repeats)
        if between is not None:
            between(k)
    if repeats and not measured:
        raise RuntimeError(f"{path.name}: every run found more than {COLD_RESIDENT_MAX:g} of the file in the page "
                           f"cache after {RERUN_TRIES} tries (another process is reading it); no cold run to count")
    return HostRun(plan, pred_tl, measured, pred_m, meas_m, path, res.logits if res else None,
                   res.token if res else -1, warm=warm, reruns=reruns)


def speedup_pairs(rows: list[dict[str, Any]]) -> list[tuple[dict[str, Any], float, float]]:
    """(baseline row, predicted, measured EdgeFlow speed-up over it) for every validate row of a baseline plan: from
    the row's own interleaved EdgeFlow runs when it has them (`versus=edgeflow`), else against the EdgeFlow row of the
    same model, bits and prompt (a separate job of the sweep)."""
    ef = {(r["model"], r["bits"], r["prompt_tokens"]): r for r in rows if r.get("framework") == "edgeflow"}
    out = []
    for r in rows:
        if r.get("versus_framework") == "edgeflow" and r.get("measured_versus_speedup"):
            out.append((r, r["predicted_versus_speedup"], r["measured_versus_speedup"]))
            continue
        e = ef.get((r["model"], r["bits"], r["prompt_tokens"]))
        if e is None or r is e or not r.get("measured_ttft_s") or not e.get("measured_ttft_s"):
            continue
        out.append((r, r["predicted_ttft_s"] / e["predicted_ttft_s"], r["measured_ttft_s"] / e["measured_ttft_s"]))
    return out


def _err(pred: float | None, meas: float | None) -> float | None:
    if pred is None or meas is None or meas == 0:
        return None
    return 100.0 * (pred - meas) / meas


def compare(run: HostRun) -> dict[str, Any]:
    """Flat metrics: predicted_<phase> (modelled), measured_<phase> median/min/max (measured), <phase>_error_pct."""
    out: dict[str, Any] = {}
    for ph in PHASES:
        name = ph[:-2] if ph.endswith("_s") else ph
        unit = "_s" if ph.endswith("_s") else ""
        p = run.pred_metrics.get(ph)
        vals = [m[ph] for m in run.meas_metrics if m.get(ph) is not None]
        med = statistics.median(vals) if vals else None
        out[f"predicted_{name}{unit}"] = p
        out[f"measured_{name}{unit}"] = med
        out[f"measured_{name}_min{unit}"] = min(vals) if vals else None
        out[f"measured_{name}_max{unit}"] = max(vals) if vals else None
        out[f"{name}_error_pct"] = _err(p, med)
    out["predicted_waits_by_thread"] = run.pred_metrics.get("waits_by_thread")
    out["predicted_packed_wakes"] = run.pred_metrics.get("packed_wakes")     # sched trace: measured_sched_packed_*
    out["measured_waits_by_thread"] = _median_by_key([m.get("waits_by_thread") for m in run.meas_metrics])
    resident = [m["resident_before"] for m in run.meas_metrics + run.warm if "resident_before" in m]
    out["measured_resident_before_max"] = max(resident) if resident else None   # page-cache fraction at t0
    for ph in ("open_to_t0_s", "ttft_from_open_s"):    # from the file's open (hil.runner): the peer comparison's
        vals = [m[ph] for m in run.meas_metrics if m.get(ph) is not None]
        out[f"measured_{ph}"] = statistics.median(vals) if vals else None     # clock
    out["runs_excluded_warm"] = len(run.warm)          # slots still warm after RERUN_TRIES runs: not in the medians
    out["runs_rerun_warm"] = run.reruns
    return out


def _median_by_key(dicts: list[dict[str, int] | None]) -> dict[str, float] | None:
    """Per key, the median over the dicts that have it (None when none is given)."""
    have = [d for d in dicts if d]
    if not have:
        return None
    keys = sorted({k for d in have for k in d})
    return {k: float(statistics.median([d[k] for d in have if k in d])) for k in keys}


def _op_key(plan: Plan, tid: int, stolen: bool) -> str:
    t = plan.tasks[tid]
    if t.resource in ("cpu", "npu"):
        what = t.ops[0] if len(t.ops) == 1 else f"{t.ops[0]}..{t.ops[-1]}"
        return f"{'cpu(stolen)' if stolen else t.resource}:{what}"
    return f"{t.resource}:{t.phase or t.name.split('.')[0]}"


def per_op(run: HostRun) -> list[dict[str, Any]]:
    """Prediction error per op kind: summed span time per (unit, op) in the prediction (modelled) and in each measured
    run (measured; median over runs), with (predicted - measured) / measured, and the summed CPU time of the spans
    (`Span.cpu_s`; predicted: the modelled core-seconds of the op, all its threads; measured: the CPU time of the
    worker's own thread, a GEMM's helper threads not included). Rows sorted by measured time."""
    def sums(tl: Timeline) -> dict[str, tuple[float, int, float]]:
        acc: dict[str, list] = {}
        for sp in tl.spans:
            a = acc.setdefault(_op_key(run.plan, sp.task, sp.stolen), [0.0, 0, 0.0])
            a[0] += sp.end - sp.start
            a[1] += 1
            a[2] += sp.cpu_s
        return {k: (v[0], v[1], v[2]) for k, v in acc.items()}

    pred = sums(run.predicted)
    meas = [sums(t) for t in run.measured]
    rows = []
    for k in sorted(set(pred) | {k for m in meas for k in m}):
        p = pred.get(k, (0.0, 0, 0.0))
        ms = statistics.median(m.get(k, (0.0, 0, 0.0))[0] for m in meas)
        n = statistics.median(m.get(k, (0.0, 0, 0.0))[1] for m in meas)
        mc = statistics.median(m.get(k, (0.0, 0, 0.0))[2] for m in meas)
        rows.append({"op": k, "predicted_s": p[0], "predicted_n": p[1], "measured_s": ms, "measured_n": n,
                     "error_pct": _err(p[0], ms), "predicted_cpu_s": p[2], "measured_cpu_s": mc,
                     "cpu_error_pct": _err(p[2], mc)})
    return sorted(rows, key=lambda r: -r["measured_s"])


def merged_trace(run: HostRun) -> dict[str, Any]:
    """One Chrome trace: the prediction (process 1, modelled) and the median measured run (process 2)."""
    from sim.trace import timeline_trace

    med = sorted(run.measured, key=lambda t: t.end_s)[len(run.measured) // 2]
    a = timeline_trace(run.predicted)
    b = timeline_trace(med)
    for ev in a["traceEvents"]:
        if ev.get("name") == "process_name":
            ev["args"]["name"] = f"predicted (modelled): {run.plan.framework} {run.plan.model}"
    for ev in b["traceEvents"]:
        ev["pid"] = 2
        if ev.get("name") == "process_name":
            ev["args"]["name"] = (f"measured on this host (median of {len(run.measured)} cold runs; 'npu' = the NPU "
                                  f"stand-in, a CPU core): {run.plan.framework} {run.plan.model}")
    return {"traceEvents": a["traceEvents"] + b["traceEvents"], "displayTimeUnit": "ms"}
