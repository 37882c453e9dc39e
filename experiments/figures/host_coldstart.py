"""This host as a device: cold-start TTFT and phases predicted by the simulator (with the measured host profile)
beside the same plan run for real by the native runner — the results of `python -m experiments.validate`
(docs/hil.md) found on disk under `outputs/validate/` and `multirun/validate/` (newest run per framework, bits and
prompt length). Nothing is run here: without validate results there is no figure (`unavailable` says why;
`figure=all` leaves it out).

The EdgeFlow paper's figures are of a phone; this is the measured counterpart on the hardware at hand (§5 of the
framework's design: predict, run, report the error)."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from experiments.figures.base import FigureSpec, fig_legend, note
from experiments.figures.data import ROOT, metrics_files
from experiments.figures.names import label
from experiments.hostrun import speedup_pairs

RESULT_ROOTS = [ROOT / "outputs" / "validate", ROOT / "multirun" / "validate"]   # where validate runs are read
PHASES = ("ttft", "load", "unpack", "prefill")

SPEC = FigureSpec(
    name="host_coldstart", paper="This host", figure="",
    topic="Cold start on this host: predicted vs measured",
    title="simulator with the measured host profile vs the same plan run by the native runner",
    claim="The simulator that predicts the phone's cold start must also predict a device we can measure: its "
          "error on this host is what the phone figures' modelled numbers are worth.",
    simulated="each validate run's prediction with the measured host profile (predicted_*)",
    measured="the same plan executed by the native runner, page cache evicted (measured_*: median, min, max)",
    tolerances={"value": (1e-6, 1e-12)},
    requires="results of `python -m experiments.validate` under outputs/validate/ or multirun/validate/")


def runs(roots: list[Path] | None = None) -> list[dict]:
    """Newest validate metrics per (framework, model, bits, prompt_tokens)."""
    newest: dict[tuple, tuple[float, dict]] = {}
    for path, m in metrics_files(RESULT_ROOTS if roots is None else roots):
        if "predicted_ttft_s" not in m or "measured_ttft_s" not in m:
            continue
        key = (m.get("framework"), m.get("model"), m.get("bits"), m.get("prompt_tokens"))
        t = path.stat().st_mtime
        if key not in newest or t > newest[key][0]:
            newest[key] = (t, m)
    return [newest[k][1] for k in sorted(newest, key=str)]


def unavailable() -> str | None:
    """Why the figure cannot be drawn now (no validate results on disk), or None."""
    if runs():
        return None
    where = [str(r.relative_to(ROOT)) if r.is_relative_to(ROOT) else str(r) for r in map(Path, RESULT_ROOTS)]
    return ("no validate results under " + ", ".join(where)
            + " (run: python -m experiments.validate -m framework=edgeflow,llamacpp,mnn,llmnpu_plus)")


def data(size: str) -> pd.DataFrame:
    reason = unavailable()
    if reason:
        raise ValueError(f"figure host_coldstart: {reason}")
    rows = []
    for m in runs():
        base = {"framework": m["framework"], "model": m["model"], "bits": m["bits"],
                "prompt_tokens": m["prompt_tokens"], "repeats": m.get("repeats")}
        for ph in PHASES:
            rows.append({**base, "phase": ph, "stat": "predicted", "value": m.get(f"predicted_{ph}_s"),
                         "source": "modelled"})
            for stat, suffix in (("median", ""), ("min", "_min"), ("max", "_max")):
                rows.append({**base, "phase": ph, "stat": stat, "value": m.get(f"measured_{ph}{suffix}_s"),
                             "source": "measured"})
    return pd.DataFrame(rows)


def plot(df: pd.DataFrame, fig) -> None:
    ax = fig.add_subplot(1, 1, 1)
    d = df[df.value.notna()]
    d = d.assign(run=[f"{label(f)}, {label(m)}\n{b:g} bits, {p} tokens"
                      for f, m, b, p in zip(d.framework, d.model, d.bits, d.prompt_tokens)])
    labels = list(dict.fromkeys(d.run))
    for j, (ph, color) in enumerate(zip(PHASES, ("tab:purple", "tab:blue", "tab:orange", "tab:green"))):
        for i, r in enumerate(labels):
            e = d[(d.run == r) & (d.phase == ph)].set_index("stat")["value"]
            x = i + (j - 1.5) * 0.2
            if "predicted" in e:
                ax.bar(x - 0.05, e["predicted"], 0.09, color=color, alpha=0.45,
                       label=f"{label(ph)}, predicted" if i == 0 else None)
            if "median" in e:
                ax.bar(x + 0.05, e["median"], 0.09, color=color, label=f"{label(ph)}, measured" if i == 0 else None)
                if "min" in e and "max" in e:
                    ax.plot([x + 0.05] * 2, [e["min"], e["max"]], "k-", lw=0.8)
    ax.set_xticks(range(len(labels)), labels, fontsize=7)
    ax.set_ylabel("seconds")
    fig_legend(fig, (ax,), ncol=4)
    note(fig, "light: modelled (predicted); dark: measured median, min-max whiskers")


def _pct(v) -> str:
    return "" if v is None else f"{v:+.1f} %"


def _speed(m: dict) -> str:
    """The host speed during the runs vs its calibration (validate's GEMM probe around each run, and its 2-thread
    GEMM probe's median where it ran; older results have none)."""
    if m.get("host_speed") is None:
        return ""
    mt = m.get("host_speed_gemm_mt")
    return (f"{m['host_speed']:.2f} ({m['host_speed_min']:.2f}–{m['host_speed_max']:.2f})"
            + ("" if mt is None else f"; {mt:.2f}"))


def _per_run(m: dict) -> str:
    """Median of the runs' errors against their pre-run-speed predictions, with their range (older results: none)."""
    if m.get("ttft_error_at_run_speed_pct") is None:
        return ""
    return (f"{_pct(m['ttft_error_at_run_speed_pct'])} ({m['ttft_error_at_run_speed_min_pct']:+.1f} … "
            f"{m['ttft_error_at_run_speed_max_pct']:+.1f})")


def _pack(m: dict, when: str) -> str:
    """A wake-up placement (hil.diagnostics.drift.placement_probe): the share packed and the idle time it holds from."""
    share, idle = m[f"measured_{when}_pack_share"], m[f"measured_{when}_pack_idle_s"]
    return f"{100 * share:.0f} % from {1e6 * idle:.0f} us" if share > 0 else "none"


def _repeat_rows(roots: list[Path] | None, pred_key: str, meas_key: str, tol: float, versus: bool,
                 names: dict[str, str]) -> list[dict]:
    """One row per validate configuration (model, framework, bits, prompt) found more than once with the same
    prediction (`pred_key`; `versus`: only rows with interleaved EdgeFlow runs): the measured values' (`meas_key`)
    min, max and spread, whether one prediction could be within ±`tol` of all of them (max / min ≤ (1 + tol) /
    (1 − tol)) and how many invocations were; `names` renames the generic keys (framework, pred, lo, hi, possible,
    within)."""
    groups: dict[tuple, list[float]] = {}
    for _, m in metrics_files(RESULT_ROOTS if roots is None else roots):
        if m.get(pred_key) is None or not m.get(meas_key) or (versus and m.get("versus_framework") != "edgeflow"):
            continue
        key = (m.get("model"), m.get("framework"), m.get("bits"), m.get("prompt_tokens"), round(m[pred_key], 9))
        groups.setdefault(key, []).append(m[meas_key])
    out = []
    for (model, fw, bits, pt, pred), vals in sorted(groups.items(), key=lambda kv: str(kv[0])):
        if len(vals) < 2:
            continue
        lo, hi = min(vals), max(vals)
        out.append({"model": model, names["framework"]: fw, "bits": bits, "prompt_tokens": pt, names["pred"]: pred,
                    "invocations": len(vals), names["lo"]: lo, names["hi"]: hi, "spread_pct": 100 * (hi - lo) / lo,
                    names["possible"]: hi / lo <= (1 + tol) / (1 - tol),
                    names["within"]: sum(abs(pred - x) <= tol * x for x in vals)})
    return out


def repeatability(roots: list[Path] | None = None) -> list[dict]:
    """Every configuration validated more than once with the same prediction (the same profile): the spread of
    its measured medians across invocations, minutes apart on the same host. A fixed prediction can be within
    ±10 % of every one of those medians only if max / min ≤ 1.1 / 0.9 (`constant_within_10pct_possible`);
    `within_10pct` counts the invocations whose own error is within ±10 % — the noise ceiling of a per-row error
    criterion (docs/hil.md "Validation protocol")."""
    return _repeat_rows(roots, "predicted_ttft_s", "measured_ttft_s", 0.10, False,
                        {"framework": "framework", "pred": "predicted_ttft_s", "lo": "measured_min_s",
                         "hi": "measured_max_s", "possible": "constant_within_10pct_possible",
                         "within": "within_10pct"})


def speedup_repeatability(roots: list[Path] | None = None) -> list[dict]:
    """The same for EdgeFlow's interleaved speed-up over a baseline plan (`versus=edgeflow` rows): per (model, bits,
    baseline, prompt, predicted speed-up) validated more than once, the measured speed-ups' min–max and whether any
    single prediction could be within ±15 % of all of them (max / min ≤ 1.15 / 0.85)."""
    return _repeat_rows(roots, "predicted_versus_speedup", "measured_versus_speedup", 0.15, True,
                        {"framework": "baseline", "pred": "predicted_speedup", "lo": "measured_min",
                         "hi": "measured_max", "possible": "constant_within_15pct_possible",
                         "within": "within_15pct"})


def _cells(*cells) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def repeatability_markdown(roots: list[Path] | None = None) -> str:
    """The two repeatability tables (TTFT medians, interleaved speed-ups) as markdown; "" when nothing repeats."""
    rows = repeatability(roots)
    if not rows:
        return ""
    lines = ["| model | framework | bits | prompt | TTFT predicted s (modelled) | invocations | median of each, "
             "min–max s (measured) | spread (max − min) / min | one prediction within ±10 % of all possible | "
             "invocations within ±10 % |", "|" + "---|" * 10]
    lines += [_cells(r["model"], r["framework"], r["bits"], r["prompt_tokens"], f"{r['predicted_ttft_s']:.3f}",
                     r["invocations"], f"{r['measured_min_s']:.3f}–{r['measured_max_s']:.3f}",
                     f"{r['spread_pct']:.1f} %", "yes" if r["constant_within_10pct_possible"] else "no",
                     f"{r['within_10pct']} of {r['invocations']}") for r in rows]
    n = sum(r["within_10pct"] for r in rows)
    tot = sum(r["invocations"] for r in rows)
    ok = sum(r["constant_within_10pct_possible"] for r in rows)
    lines.append(f"\n{n} of {tot} invocations within ±10 % of their prediction; for {ok} of {len(rows)} "
                 "configurations some single prediction could be within ±10 % of every invocation.")
    sp = speedup_repeatability(roots)
    if sp:
        lines += ["", "| model | baseline | prompt | EdgeFlow speed-up predicted (modelled) | invocations | measured, "
                  "min–max (interleaved runs) | one prediction within ±15 % of all possible | invocations within "
                  "±15 % |", "|" + "---|" * 8]
        lines += [_cells(r["model"], r["baseline"], r["prompt_tokens"], f"{r['predicted_speedup']:.2f}×",
                         r["invocations"], f"{r['measured_min']:.2f}–{r['measured_max']:.2f}×",
                         "yes" if r["constant_within_15pct_possible"] else "no",
                         f"{r['within_15pct']} of {r['invocations']}") for r in sp]
    return "\n".join(lines)


def markdown(roots: list[Path] | None = None) -> str:
    """The README / docs tables of the host validate results under `roots` (newest run per configuration):
    predicted vs measured TTFT and phases, EdgeFlow's speed-up over each baseline plan, and the llama.cpp peer."""
    ms = runs(roots)
    lines = ["| model | framework | bits | prompt | TTFT predicted s | TTFT measured s (min–max) | TTFT error | "
             "load error | unpack error | prefill error | host speed (min–max); 2-thread GEMM | "
             "TTFT error at that speed | "
             "TTFT error at the pre-run speed (min … max) |",
             "|" + "---|" * 13]
    for m in ms:
        lines.append(f"| {m['model']} | {m['framework']} | {m['bits']} | {m['prompt_tokens']} | "
                     f"{m['predicted_ttft_s']:.3f} | {m['measured_ttft_s']:.3f} ({m['measured_ttft_min_s']:.3f}–"
                     f"{m['measured_ttft_max_s']:.3f}) | {_pct(m.get('ttft_error_pct'))} | "
                     f"{_pct(m.get('load_error_pct'))} | {_pct(m.get('unpack_error_pct'))} | "
                     f"{_pct(m.get('prefill_error_pct'))} | {_speed(m)} | "
                     f"{_pct(m.get('ttft_error_at_host_speed_pct'))} | {_per_run(m)} |")
    sched = ["| model | framework | bits | prompt | cores busy predicted | traced run: running | idle, queued behind "
             "the other core | idle, waking | idle, no work | wake-ups packed |", "|" + "---|" * 10]
    for m in ms:
        if m.get("measured_sched_running_pct") is None:
            continue
        g = lambda k: m[f"measured_sched_{k}"]  # noqa: E731
        sched.append(f"| {m['model']} | {m['framework']} | {m['bits']} | {m['prompt_tokens']} | "
                     f"{m.get('predicted_core_busy_pct', float('nan')):.0f} % | {g('running_pct'):.1f} % | "
                     f"{g('queued_pct'):.1f} % | {g('waking_pct'):.1f} % | {g('no_work_pct'):.1f} % | "
                     f"{100 * g('packed_share'):.0f} % of {g('wakes_other_core_idle'):.0f} |")
    place = ["| model | framework | bits | prompt | wake-ups packed, calibration | around the runs | TTFT error | "
             "TTFT error at the run-time placement |", "|" + "---|" * 8]
    for m in ms:
        if m.get("predicted_at_run_placement_ttft_s") is None:
            continue
        place.append(f"| {m['model']} | {m['framework']} | {m['bits']} | {m['prompt_tokens']} | "
                     f"{_pack(m, 'calibration')} | {_pack(m, 'run')} | {_pct(m.get('ttft_error_pct'))} | "
                     f"{_pct(m.get('ttft_error_at_run_placement_pct'))} |")
    sp = ["| model | baseline | prompt | EdgeFlow speed-up predicted | measured | error |", "|" + "---|" * 6]
    for m, p, q in speedup_pairs(ms):                     # interleaved runs where a row has them (versus=edgeflow)
        sp.append(f"| {m['model']} | {m['framework']} | {m['prompt_tokens']} | {p:.2f}× | {q:.2f}× | "
                  f"{_pct(100 * (p - q) / q)} |")
    peer = ["| model | prompt | ours (EdgeFlow, bits) measured s | llama.cpp GGUF | llama.cpp measured s (min–max) | "
            "ours faster by |", "|" + "---|" * 6]
    for path, m in metrics_files(RESULT_ROOTS if roots is None else roots):
        if "peer_ttft_s" in m:
            peer.append(f"| {m['model']} | {m['prompt_tokens']} | {m['measured_ttft_s']:.3f} ({m['bits']} b) | "
                        f"{m['peer_weight_type']} | {m['peer_ttft_s']:.3f} ({m['peer_ttft_min_s']:.3f}–"
                        f"{m['peer_ttft_max_s']:.3f}) | {m['speedup_vs_peer']:.2f}× |")
    out = "\n".join(lines) + "\n\n" + ("\n".join(sp) if len(sp) > 2 else "")
    out += "\n\n" + "\n".join(sched) if len(sched) > 2 else ""
    out += "\n\n" + "\n".join(place) if len(place) > 2 else ""
    out += ("\n\n" + "\n".join(peer) if len(peer) > 2 else "")
    rep = repeatability_markdown(roots)
    return out + ("\n\n" + rep if rep else "")


if __name__ == "__main__":       # python -m experiments.figures.host_coldstart [result dir ...]
    import sys

    print(markdown([Path(a) for a in sys.argv[1:]] or None))
