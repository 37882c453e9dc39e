"""Results pages generated from run directories: `docs/results/<topic>.md` with the table as `<topic>.csv` beside it,
and the README's results blocks refreshed from those pages. Nothing in docs/results/ or in the README's results
blocks is written by hand.

    python -m experiments.report multirun/coldstart/<sweep dir>             # -> docs/results/coldstart.md + .csv
    python -m experiments.report outputs/multidevice/<run> … --topic NAME     # page name other than the app's
    python -m experiments.report --data                                       # the pages made from data files
    python -m experiments.report --readme                                     # README blocks <- docs/results/*.md

A run directory is any directory with a `metrics.json` (a sweep directory stands for its finished jobs). Each page
has a manifest: the commit(s) the runs were made at and whether the working tree had uncommitted changes, the
machine's identity (`hil.host.host_identity`: CPU model and signature, cores, memory, kernel, and its hash, which
holds no host name), when the runs finished, and the one-job command of every run directory. The apps record these
in `manifest.json` when they run (`experiments.common.run_manifest`); for an older run directory without one the
command is rebuilt from Hydra's `.hydra/overrides.yaml` and the rest is reported as unknown.

Topics (by the app that made the runs):
- `coldstart` (`experiments.coldstart`): modelled TTFT per framework × workload, one table per model/device/bits.
  The same runs under `--topic coldstart-frameworks`, `coldstart-bits`, `coldstart-models` are the TTFT tables of
  docs/coldstart.md (every framework; bit budgets; other models).
- `coldstart-ablation` (`experiments.coldstart` runs of EdgeFlow's ablation steps, `--topic coldstart-ablation`): per
  step and prompt length, the TTFT, its change from the step before and the resource that bounds the cold start
  (`planner.critical_path`); its summary is the step table of docs/coldstart.md "Ablation steps".
- `coldstart-sensitivity` (`experiments.coldstart_sensitivity`): modelled TTFT per framework with each parameter
  without a source varied; its summary is the table of docs/coldstart.md "Assumptions and sensitivity".
- `coldstart-calibration` (`experiments.coldstart_calibration`): the phone profile's fit and its simulated components
  against the EdgeFlow figures; the same run under `--topic coldstart-threshold`: EdgeFlow's TTFT with the stealing
  threshold fixed, and at the CPU rate the paper's threshold implies. Their summaries are the tables of
  docs/coldstart.md "Calibration".
- `multidevice` (`experiments.multidevice`): modelled TTFT, TPOT and QoS per planner × cluster.
- `multidevice-report` (`experiments.multidevice_report`): the cluster × model family × planner tables of
  docs/multidevice.md "Results" (each section from the newest run directory that has it).
- `validate_cluster` (`experiments.validate_cluster`): the emulated cluster's predicted vs measured TTFT / TPOT per
  cluster × trace, both planner estimates, with and without plan-switch steps (docs/cluster.md).
- `host-<machine kind>` (`experiments.validate`): predicted vs measured cold TTFT per configuration, one page per
  machine kind (CPU model, family, model number); a new report replaces the page (the latest report only).
- `peer-<machine kind>` (`experiments.validate peer=llamacpp`): cold TTFT beside perplexity, ours and llama.cpp's
  (experiments.peer_table); runs with the peer go to this page, not to the host page.

Pages made from a committed data file rather than run directories (`DATA_PAGES`, written by `--data`): their
manifest names the file, its sha256 and the command that re-measures it.
- `multidevice-importance` (`planner/voltron/data/smollm2_importance.json`, `quant.measure_importance`): SmolLM2's
  measured precision effects and shard-pruning importance (experiments.importance_table); its summary is the table
  of docs/multidevice.md "Layer importance and precision effects".

README blocks: `<!-- results: PATTERN -->` … `<!-- /results -->`, where PATTERN names a page (`coldstart`) or a glob
of pages (`host-*`); the block holds each page's summary and a link to it. `tests/test_report.py` checks that the
committed README equals what `--readme` makes of the committed pages. `--readme` refreshes the same blocks in the
docs pages of `DOC_BLOCKS` (docs/coldstart.md's TTFT, ablation and sensitivity tables; docs/multidevice.md's
importance and precision table).
"""
from __future__ import annotations

import argparse
import fnmatch
import json
import re
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pandas as pd

from experiments.common import ConfigError
from experiments.results import jobs
from quant.atomic import atomic_write_text

REPO = Path(__file__).resolve().parents[1]
RESULTS_DIR = REPO / "docs" / "results"
README = REPO / "README.md"
TOPIC_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")
HEADER = "<!-- Generated by `python -m experiments.report`; regenerate it, do not edit it. -->"
SUMMARY_BEGIN, SUMMARY_END = "<!-- summary -->", "<!-- /summary -->"
BLOCK_RE = re.compile(r"(<!-- results: (?P<pattern>[\w*?.-]+) -->\n)(?P<body>.*?)(<!-- /results -->)", re.S)
WITHIN_PCT = 10.0           # %: the per-configuration criterion of a host validation row (docs/hil.md)


class ReportError(ValueError):
    """Bad input to the report (a path, a topic, a run directory); the message is one line."""


# ================================================ run directories ====================================================
@dataclass
class Run:
    """One finished run directory: its metrics and what it was made with."""
    dir: Path
    app: str                        # experiments.<name>
    command: str                    # the one-job command that reproduces it
    argv: list[str]                 # the invocation it was part of (a sweep: the sweep's arguments)
    metrics: dict[str, Any]
    commit: str | None = None       # None: unknown (no manifest, or no git)
    dirty: bool | None = None
    finished_utc: str | None = None
    machine: dict[str, Any] = field(default_factory=dict)


def _yaml(path: Path) -> Any:
    import yaml

    try:
        return yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError):
        return None


def load_run(d: Path) -> Run:
    """A finished run directory -> Run (manifest.json when the app wrote one, else rebuilt from `.hydra/`)."""
    try:
        metrics = json.loads((d / "metrics.json").read_text())
    except (OSError, ValueError) as e:
        raise ReportError(f"{d / 'metrics.json'}: not readable JSON ({type(e).__name__})") from None
    man = {}
    if (d / "manifest.json").is_file():
        try:
            man = json.loads((d / "manifest.json").read_text())
        except ValueError:
            raise ReportError(f"{d / 'manifest.json'}: not valid JSON") from None
    overrides = man.get("overrides")
    if overrides is None:
        overrides = [str(o) for o in (_yaml(d / ".hydra" / "overrides.yaml") or [])
                     if not str(o).lstrip("+~").startswith("hydra")]
    app = man.get("app") or ""
    if not app:
        hy = _yaml(d / ".hydra" / "hydra.yaml") or {}
        name = ((hy.get("hydra") or {}).get("job") or {}).get("name") if isinstance(hy, dict) else None
        app = f"experiments.{name}" if name else ""
    command = man.get("command") or " ".join(["python", "-m", app or "experiments.?", *map(shlex.quote, overrides)])
    return Run(dir=d, app=app, command=command, argv=list(man.get("argv") or []), metrics=metrics,
               commit=man.get("commit"), dirty=man.get("dirty"), finished_utc=man.get("finished_utc"),
               machine=dict(man.get("machine") or {}))


def load_runs(paths: list[str | Path]) -> list[Run]:
    """Every finished run under `paths` (a run directory, or a sweep directory of them), in path order."""
    runs: list[Run] = []
    for p in map(Path, paths):
        if not p.is_dir():
            raise ReportError(f"run dir: {p} is not a directory")
        finished, _ = jobs(p)
        if not finished:
            raise ReportError(f"run dir: no metrics.json under {p}")
        runs.extend(load_run(d) for d in finished)
    return runs


# ================================================ formatting =========================================================
def _num(v: Any, nd: int) -> str:
    if v is None or isinstance(v, bool) or not isinstance(v, (int, float)) or v != v:
        return "–"
    return f"{v:.{nd}f}"


def _pct(v: Any) -> str:
    return "–" if v is None or v != v else f"{v:+.1f} %"


def md_table(df: pd.DataFrame) -> str:
    """A GitHub Markdown table of `df` (cells as text)."""
    head = "| " + " | ".join(map(str, df.columns)) + " |"
    rule = "|" + "---|" * len(df.columns)
    rows = ["| " + " | ".join(str(v) for v in r) + " |" for r in df.itertuples(index=False)]
    return "\n".join([head, rule, *rows])


def machine_line(m: dict[str, Any]) -> str:
    if not m:
        return "unknown (run directories without manifest.json)"
    return (f"{m.get('cpu_model', '?')} ({m.get('cpu_signature', '?')}), {m.get('logical_cores', '?')} logical / "
            f"{m.get('physical_cores', '?')} physical cores, {m.get('mem_gib', '?')} GiB, kernel "
            f"{m.get('kernel_release', '?')} {m.get('machine', '')}, transparent huge pages {m.get('thp', '?')}; "
            f"identity hash {m.get('id_hash', '?')}")


def machine_kind(m: dict[str, Any]) -> str:
    """CPU model, family and model number, e.g. `AMD EPYC family 26 model 2` (one host page per kind)."""
    if not m:
        return "unknown machine"
    vendor, fam, mod = (str(m.get("cpu_signature", "")).split("/") + ["?"] * 3)[:3]
    return f"{m.get('cpu_model', '?')} family {fam} model {mod}"


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:56] or "unknown"


def _when(runs: list[Run]) -> str:
    """First – last finish time of the runs, to the minute (UTC)."""
    times = sorted(r.finished_utc for r in runs if r.finished_utc)
    if not times:
        return "unknown (run directories without manifest.json)"
    (d0, t0), (d1, t1) = (t.rstrip("Z").split("T") for t in (times[0], times[-1]))
    if d0 == d1:
        return f"{d0} {t0[:5]} UTC" if t0[:5] == t1[:5] else f"{d0} {t0[:5]}–{t1[:5]} UTC"
    return f"{d0} {t0[:5]} – {d1} {t1[:5]} UTC"


def _natural(name: str) -> list:
    """Sort key: `2_x` before `10_x` (Hydra's job numbers)."""
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]


def _cell(v: Any) -> Any:
    """A per-run table cell: integral floats as integers (`bits` 5.0 -> 5), other floats to 3 decimals, a missing
    value (None, NaN) as `–`."""
    if v is None or (isinstance(v, float) and v != v):
        return "–"
    if isinstance(v, float):
        return f"{v:g}" if v.is_integer() else f"{v:.3f}"
    return v


def _commits(runs: list[Run]) -> str:
    seen: dict[tuple, int] = {}
    for r in runs:
        seen[(r.commit, r.dirty)] = seen.get((r.commit, r.dirty), 0) + 1
    parts = []
    for (c, dirty), n in seen.items():
        tree = {True: "with uncommitted changes", False: "clean tree", None: "tree state unknown"}[dirty]
        parts.append(f"`{c}` ({tree}; {n} run{'s' if n > 1 else ''})" if c else f"unknown ({n} runs)")
    return ", ".join(parts)


def _short_provenance(runs: list[Run]) -> str:
    commits = sorted({(r.commit or "unknown")[:10] + ("+dirty" if r.dirty else "") for r in runs})
    kinds = sorted({machine_kind(r.machine) for r in runs})
    return (f"{len(runs)} run dir{'s' if len(runs) > 1 else ''}, commit {', '.join(commits)}, {'; '.join(kinds)}, "
            f"{_when(runs)}")


# ================================================ topics =============================================================
@dataclass(frozen=True)
class Topic:
    """How one app's runs become a page: a title, what the numbers are, the per-run table and the summary."""
    app: str
    title: str
    about: str
    table: Callable[[list[Run]], pd.DataFrame]         # one row per run (also the CSV)
    summary: Callable[[pd.DataFrame], str]             # Markdown: the page's summary (and the README block)


def _m(r: Run, key: str, default: Any = None) -> Any:
    return r.metrics.get(key, default)


def coldstart_table(runs: list[Run]) -> pd.DataFrame:
    rows = [{"model": _m(r, "model"), "device": _m(r, "device"), "bits": _m(r, "bits"),
             "framework": _m(r, "framework"), "workload": _m(r, "workload"), "prompt_tokens": _m(r, "prompt_tokens"),
             "ttft_s": _m(r, "ttft_s"), "load_s": _m(r, "load_s"), "prefill_s": _m(r, "prefill_s"),
             "cpu_bubble_rate": _m(r, "cpu_bubble_rate"), "npu_bubble_rate": _m(r, "npu_bubble_rate"),
             "read_gb": None if _m(r, "bytes_read") is None else _m(r, "bytes_read") / 1e9,
             "peak_mem_gb": _m(r, "peak_mem_gb"), "energy_j": _m(r, "energy_j"), "run": r.dir.name} for r in runs]
    return pd.DataFrame(rows).sort_values(["model", "device", "bits", "framework", "prompt_tokens", "run"],
                                          kind="stable", ignore_index=True)


def coldstart_summary(df: pd.DataFrame) -> str:
    out = []
    for (model, device, bits), g in df.groupby(["model", "device", "bits"], sort=True):
        cols = (g[["workload", "prompt_tokens"]].drop_duplicates().sort_values("prompt_tokens", kind="stable"))
        labels = {w: f"{w} ({t} tok)" for w, t in cols.itertuples(index=False)}
        pivot = g.pivot_table(index="framework", columns="workload", values="ttft_s", aggfunc="median")
        pivot = pivot[[w for w in labels if w in pivot.columns]]
        pivot = pivot.loc[pivot.mean(axis=1).sort_values(ascending=False).index]
        table = pd.DataFrame({"framework": pivot.index,
                              **{labels[w]: [_num(v, 2) for v in pivot[w]] for w in pivot.columns}})
        out.append(f"TTFT in s (modelled), {model} on {device}, {bits:g} bits:\n\n{md_table(table)}")
    return "\n\n".join(out)


ABLATION_TOPIC = "coldstart-ablation"


def ablation_table(runs: list[Run]) -> pd.DataFrame:
    """One row per ablation run: TTFT, its change from the previous step at the same prompt length (s and %), and
    the bounding resource of each critical-path phase with its share. Steps in `sim.coldstart.sweep.ALL_FRAMEWORKS`
    order (llm.npu+ first, EdgeFlow last)."""
    from sim.coldstart.sweep import ALL_FRAMEWORKS

    order = {f: i for i, f in enumerate(ALL_FRAMEWORKS)}
    rows = []
    for r in runs:
        fw, cp = _m(r, "framework"), _m(r, "critical_path")
        if fw not in order or not isinstance(cp, dict):
            raise ReportError(f"{r.dir}: not a cold-start run with a critical path (framework {fw!r})")
        rows.append({"model": _m(r, "model"), "device": _m(r, "device"), "bits": _m(r, "bits"), "framework": fw,
                     "workload": _m(r, "workload"), "prompt_tokens": _m(r, "prompt_tokens"), "ttft_s": _m(r, "ttft_s"),
                     **{f"bound_{p}": cp[p]["bound"] for p in ("load", "prefill", "total")},
                     "bound_share": cp["total"]["share"].get(cp["total"]["bound"], 0.0), "run": r.dir.name})
    df = pd.DataFrame(rows)
    df["step"] = df.framework.map(order)
    df = df.sort_values(["model", "device", "bits", "prompt_tokens", "step", "run"], kind="stable",
                        ignore_index=True)
    prev = df.groupby(["model", "device", "bits", "prompt_tokens"], sort=False).ttft_s.shift()
    df["change_s"] = df.ttft_s - prev
    df["change_pct"] = 100 * df.change_s / prev
    return df.drop(columns="step")


def _recipe_change(prev: str | None, step: str) -> str:
    """The `Recipe` fields (planner/pipeline/npu_plan.py) in which a step differs from the one before it."""
    from dataclasses import asdict

    from sim.coldstart import POLICIES

    b = getattr(POLICIES.get(step), "recipe", None)
    a = getattr(POLICIES.get(prev), "recipe", None) if prev else None
    if a is None or b is None:
        return "–"
    a, b = asdict(a), asdict(b)
    return ", ".join(f"`{k}`" for k in a if a[k] != b[k]) or "none"


def _signed(v: float, nd: int) -> str:
    """`+1.23` / `-0.5` / `0` (no sign on what rounds to zero)."""
    t = f"{v:+.{nd}f}"
    return t[1:] if float(t) == 0 else t


def ablation_summary(df: pd.DataFrame) -> str:
    """Per model/device/bits: one row per step; per prompt length the TTFT, its change from the step before and
    the resource bounding the cold start after the step (its share of the critical path)."""
    out = []
    for (model, device, bits), g in df.groupby(["model", "device", "bits"], sort=True):
        cols = g[["workload", "prompt_tokens"]].drop_duplicates().sort_values("prompt_tokens", kind="stable")
        steps = list(dict.fromkeys(g.framework))
        cell = {(r.framework, r.workload): r for r in g.itertuples(index=False)}
        lines = []
        for i, f in enumerate(steps):
            row = {"step": f, "changes (Recipe fields)": _recipe_change(steps[i - 1] if i else None, f)}
            for w, t in cols.itertuples(index=False):
                r = cell.get((f, w))
                if r is None:
                    row[f"{w} ({t} tok)"] = "–"
                    continue
                change = ("" if r.change_s != r.change_s          # the first step: nothing before it
                          else f" ({_signed(r.change_s, 2)} s, {_signed(r.change_pct, 0)} %)")
                row[f"{w} ({t} tok)"] = f"{_num(r.ttft_s, 2)}{change}; {r.bound_total} {100 * r.bound_share:.0f} %"
            lines.append(row)
        out.append(f"TTFT in s after each step, its change from the step before, and the resource bounding the cold "
                   f"start with its share of the critical path (modelled), {model} on {device}, {bits:g} bits:\n\n"
                   + md_table(pd.DataFrame(lines)))
    return "\n\n".join(out)


ABLATION_ABOUT = (
    "EdgeFlow's ablation (docs/coldstart.md \"Ablation steps\"): each step adds one technique to the one before it "
    "(its `Recipe` fields differ in exactly that technique's, `tests/sim/test_ablation.py`). Every number is "
    "modelled by the cold-start simulator; the bound is the resource with the most seconds on the cold start's "
    "critical path (`planner.critical_path`: flash, unpack, sharing = waiting for a core or DRAM, npu, cpu, graph = "
    "QNN set-up and graph restore, idle), walked back from the LM head.")


def ablation_page(topic: str, runs: list[Run]) -> Page:
    df = ablation_table(runs)
    rows_md = df.map(_cell)
    md = "\n".join([
        HEADER, "# Cold-start ablation: TTFT and critical resource per step", "", ABLATION_ABOUT, "",
        SUMMARY_BEGIN, ablation_summary(df), "", f"_{_short_provenance(runs)}._", SUMMARY_END, "",
        "## Runs", "", f"One row per run directory; the same table as CSV: [{topic}.csv]({topic}.csv).", "",
        md_table(rows_md), "", _manifest_md(runs), ""])
    return Page(topic, md, df)


def multidevice_table(runs: list[Run]) -> pd.DataFrame:
    rows = [{"cluster": _m(r, "cluster"), "model": _m(r, "model"), "planner": _m(r, "planner"), "trace": _m(r, "trace"),
             "turns": _m(r, "turns_completed"), "precision": _m(r, "precision"),
             "ttft_s": _m(r, "ttft_s"), "ttft_s_max": _m(r, "ttft_s_max"),
             "tpot_ms_p50": _m(r, "tpot_ms_p50"), "tpot_ms_p99": _m(r, "tpot_ms_p99"),
             "qos_tpot_violation_rate": _m(r, "qos_tpot_violation_rate"), "qos_ttft_ok": _m(r, "qos_ttft_ok"),
             "accuracy_proxy": _m(r, "accuracy_proxy"), "replans": _m(r, "replans"), "oom": _m(r, "oom"),
             "run": r.dir.name} for r in runs]
    return pd.DataFrame(rows).sort_values(["cluster", "model", "planner", "run"], kind="stable", ignore_index=True)


def multidevice_summary(df: pd.DataFrame) -> str:
    t = pd.DataFrame({
        "cluster": df["cluster"], "model": df["model"], "planner": df["planner"], "precision": df["precision"],
        "TTFT mean / max s": [f"{_num(a, 2)} / {_num(b, 2)}" for a, b in zip(df["ttft_s"], df["ttft_s_max"])],
        "TPOT p50 / p99 ms": [f"{_num(a, 0)} / {_num(b, 0)}" for a, b in zip(df["tpot_ms_p50"], df["tpot_ms_p99"])],
        "tokens over TPOT target": [_num(100 * v if v is not None else None, 1) + " %"
                                    for v in df["qos_tpot_violation_rate"]],
        "accuracy proxy": [_num(v, 1) for v in df["accuracy_proxy"]],
        "OOM": ["**yes**" if v else "no" for v in df["oom"]]})
    return f"Modelled by the multi-device simulator (trace `{'`, `'.join(sorted(set(map(str, df['trace']))))}`):" \
           f"\n\n{md_table(t)}"


CLUSTER_WITHIN_PCT = 15.0   # %: the TTFT / TPOT p50 criterion of an emulated-cluster run held out from tuning


def cluster_table(runs: list[Run]) -> pd.DataFrame:
    rows = []
    for r in runs:
        e = _m(r, "errors") or {}
        rows.append({
            "cluster": _m(r, "cluster"), "trace": _m(r, "trace"), "model": _m(r, "model"),
            "planner": _m(r, "planner"),
            "held_out": bool(_m(r, "held_out_cluster") or _m(r, "held_out_trace")),
            "ttft_s": _m(r, "measured_ttft_compute_s"), "ttft_error_pct": _m(r, "ttft_error_pct"),
            "ttft_error_plan_pct": e.get("prefill_all_plan_p50_error_pct"),
            "ttft_error_no_switch_pct": e.get("prefill_no_switch_recosted_p50_error_pct"),
            "tpot_ms_p50": _m(r, "measured_tpot_compute_ms_p50"), "tpot_error_pct": _m(r, "tpot_error_pct"),
            "tpot_error_plan_pct": e.get("decode_all_plan_p50_error_pct"),
            "tpot_error_no_switch_pct": e.get("decode_no_switch_recosted_p50_error_pct"),
            "tpot_error_plan_no_switch_pct": e.get("decode_no_switch_plan_p50_error_pct"),
            "tpot_step_mape_pct": _m(r, "tpot_step_mape_pct"),
            "tpot_step_mape_no_switch_pct": e.get("decode_no_switch_recosted_mape_pct"),
            "tpot_ms_p99": _m(r, "measured_tpot_ms_p99"),
            "tpot_steps_ms_p99": _m(r, "measured_tpot_compute_ms_p99"),
            "predicted_tpot_ms_p99": _m(r, "predicted_tpot_ms_p99"),
            "tpot_over_qos_share": _m(r, "tpot_over_qos_share"),
            "qos_tpot_ms": _m(r, "qos_tpot_ms"), "switch_steps": _m(r, "switch_steps"),
            "kv_rebuilds": _m(r, "kv_rebuilds_measured"),
            "kv_holds": _m(r, "kv_holds"), "disconnects": _m(r, "disconnects"), "tokens": _m(r, "tokens_generated"),
            "run": r.dir.name})
    return pd.DataFrame(rows).sort_values(["held_out", "cluster", "trace", "run"], kind="stable", ignore_index=True)


def cluster_summary(df: pd.DataFrame) -> str:
    def within(v):
        return v is not None and v == v and abs(v) <= CLUSTER_WITHIN_PCT

    verdict = ["tuning run" if not h else ("**yes**" if within(a) and within(b) else "no")
               for h, a, b in zip(df["held_out"], df["ttft_error_pct"], df["tpot_error_pct"])]
    t = pd.DataFrame({
        "cluster / trace": [f"{c} / {tr}" for c, tr in zip(df["cluster"], df["trace"])],
        "TTFT p50 s, error (plan's own; no switch)": [
            f"{_num(s, 3)}, {_pct(a)} ({_pct(b)}; {_pct(c)})" for s, a, b, c in
            zip(df["ttft_s"], df["ttft_error_pct"], df["ttft_error_plan_pct"], df["ttft_error_no_switch_pct"])],
        "TPOT p50 ms, error (plan's own; no switch)": [
            f"{_num(s, 0)}, {_pct(a)} ({_pct(b)}; {_pct(c)})" for s, a, b, c in
            zip(df["tpot_ms_p50"], df["tpot_error_pct"], df["tpot_error_plan_pct"], df["tpot_error_no_switch_pct"])],
        "TPOT p99 ms user / steps (predicted)": [
            f"{_num(a, 0)} / {_num(b, 0)} ({_num(c, 0)})" for a, b, c in
            zip(df["tpot_ms_p99"], df["tpot_steps_ms_p99"], df["predicted_tpot_ms_p99"])],
        "tokens over QoS": [_num(100 * v if v is not None else None, 1) + " %" for v in df["tpot_over_qos_share"]],
        "KV rebuilds / holds": [f"{a} / {b}" for a, b in zip(df["kv_rebuilds"], df["kv_holds"])],
        f"p50 errors within {CLUSTER_WITHIN_PCT:g} %": verdict})
    return ("Measured on the emulated cluster (worker processes, tc-shaped links, cgroup CPU quotas; docs/cluster.md) "
            "against the planner's estimates (modelled). Errors = (predicted − measured) / measured of the medians, "
            "against the measured step without its plan switch; the first error is the plan re-costed for the "
            "step's links and KV, then the planner's own estimate when it made the plan, then the re-costed one "
            "over the steps without a plan switch. TPOT p99 as the user sees it (switches included) and over the "
            f"steps alone; TPOT QoS {', '.join(sorted({_num(v, 0) for v in df['qos_tpot_ms']}))} ms."
            f"\n\n{md_table(t)}")


def run_ttfts(r: Run) -> list[float]:
    """The TTFT of each counted cold run of a validate invocation (`runs.csv`; a run that stayed warm has
    counted=false), else its median alone."""
    path = r.dir / "runs.csv"
    if path.is_file():
        try:
            runs = pd.read_csv(path)
            if "counted" in runs:
                runs = runs[runs["counted"].astype(str).str.lower() == "true"]
            vals = [float(v) for v in runs["measured_ttft_s"].dropna()]
        except (ValueError, KeyError, pd.errors.ParserError):
            raise ReportError(f"{path}: no measured_ttft_s column of numbers") from None
        if vals:
            return vals
    med = _m(r, "measured_ttft_s")
    return [float(med)] if isinstance(med, (int, float)) else []


def host_table(runs: list[Run]) -> pd.DataFrame:
    rows = []
    for r in runs:
        lo, hi = _m(r, "measured_ttft_min_s"), _m(r, "measured_ttft_max_s")
        rows.append({"framework": _m(r, "framework"), "model": _m(r, "model"), "bits": _m(r, "bits"),
                     "prompt_tokens": _m(r, "prompt_tokens"), "repeats": _m(r, "repeats"),
                     "predicted_ttft_s": _m(r, "predicted_ttft_s"), "measured_ttft_s": _m(r, "measured_ttft_s"),
                     "measured_ttft_min_s": lo, "measured_ttft_max_s": hi, "ttft_error_pct": _m(r, "ttft_error_pct"),
                     "versus_framework": _m(r, "versus_framework"),
                     "predicted_versus_speedup": _m(r, "predicted_versus_speedup"),
                     "measured_versus_speedup": _m(r, "measured_versus_speedup"),
                     "speedup_vs_peer": _m(r, "speedup_vs_peer"), "run_ttfts_s": json.dumps(run_ttfts(r)),
                     "finished_utc": r.finished_utc, "run": r.dir.name})
    return pd.DataFrame(rows).sort_values(["model", "framework", "bits", "prompt_tokens", "finished_utc", "run"],
                                          kind="stable", ignore_index=True)


CONFIG_KEYS = ["framework", "model", "bits", "prompt_tokens"]


def judged_configurations(df: pd.DataFrame) -> list[tuple[tuple, pd.DataFrame, Any]]:
    """Per configuration: (key, its invocations, `protocol_stats.judge` of the median prediction against every cold
    run, each invocation one round)."""
    from experiments import protocol_stats as ps

    out = []
    for key, g in df.groupby(CONFIG_KEYS, sort=True):
        rounds = [json.loads(v) for v in g["run_ttfts_s"]]
        out.append((key, g, ps.judge(float(g["predicted_ttft_s"].astype(float).median()), rounds)))
    return out


def host_summary(df: pd.DataFrame) -> str:
    """The set's bias with its interval and sign test (`protocol_stats.summarize`), and per framework: configurations,
    invocations, predictions inside their pooled median's interval, the pooled errors, and the invocations within
    ±WITHIN_PCT of their own median (the per-invocation judgement the validate app prints)."""
    from experiments import protocol_stats as ps

    judged = judged_configurations(df)
    s = ps.summarize([j for _, _, j in judged])
    rows = []
    for fw in sorted({k[0] for k, _, _ in judged}):
        mine = [(g, j) for k, g, j in judged if k[0] == fw]
        errs = pd.Series([j.error_pct for _, j in mine])
        inv = pd.concat([g for g, _ in mine])["ttft_error_pct"].astype(float)
        rows.append({"framework": fw, "configurations": len(mine), "invocations": len(inv),
                     "inside interval": sum(j.inside for _, j in mine),
                     "pooled error median (min … max)":
                         f"{_pct(errs.median())} ({_pct(errs.min())} … {_pct(errs.max())})",
                     f"invocations within ±{WITHIN_PCT:g} %": int((inv.abs() <= WITHIN_PCT).sum())})
    level = f"{100 * ps.LEVEL:g} %"
    return ("Cold TTFT on this machine kind: predicted by the simulator with the measured host profile (modelled) "
            "against the pooled median of every cold run of a configuration, each invocation a round, with its "
            f"{level} hierarchical bootstrap interval (measured; docs/hil.md \"Validation protocol\"). "
            f"Set of {s.n}: bias {_pct(s.bias_pct)} [{_pct(s.bias_lo_pct)}, {_pct(s.bias_hi_pct)}], "
            f"{s.over} over / {s.under} under (sign test p = {s.sign_p:.2f}), mean |error| {s.mean_abs_pct:.1f} %, "
            f"prediction inside the interval for {s.inside} of {s.n}, median noise floor (spread of round medians) "
            f"{s.median_noise_pct:.1f} %.\n\n" + md_table(pd.DataFrame(rows)))


def host_configurations(df: pd.DataFrame) -> pd.DataFrame:
    """Per configuration (framework, model, bits, prompt): the prediction against the pooled median of all its cold
    runs with its interval (`judged_configurations`), the range of the invocations' own medians, how many invocations
    were within ±WITHIN_PCT of theirs, and whether one fixed value could be within ±WITHIN_PCT of every invocation's
    median (max / min ≤ (1 + c) / (1 - c)): when it could not, the per-invocation criterion cannot judge the model on
    this host (docs/hil.md "Validation protocol")."""
    rows, c = [], WITHIN_PCT / 100
    for (fw, model, bits, prompt), g, j in judged_configurations(df):
        meas, err = g["measured_ttft_s"].astype(float), g["ttft_error_pct"].astype(float)
        rows.append({"framework": fw, "model": model, "bits": _cell(float(bits)), "prompt": prompt,
                     "invocations": len(g), "runs": j.runs, "predicted s": _num(j.predicted, 3),
                     "pooled median s [interval]": f"{_num(j.measured, 3)} [{_num(j.lo, 3)}, {_num(j.hi, 3)}]",
                     "error": _pct(j.error_pct), "inside": "yes" if j.inside else "no",
                     "invocation medians s (min–max)": f"{_num(meas.min(), 3)}–{_num(meas.max(), 3)}",
                     f"within ±{WITHIN_PCT:g} %": int((err.abs() <= WITHIN_PCT).sum()),
                     "one value within all": "yes" if meas.max() <= meas.min() * (1 + c) / (1 - c) else "no"})
    return pd.DataFrame(rows)


def _host_rows_md(df: pd.DataFrame) -> pd.DataFrame:
    return pd.DataFrame({
        "framework": df["framework"], "model": df["model"], "bits": df["bits"], "prompt": df["prompt_tokens"],
        "predicted s": [_num(v, 3) for v in df["predicted_ttft_s"]],
        "measured s (min–max)": [f"{_num(m, 3)} ({_num(a, 3)}–{_num(b, 3)})" for m, a, b in
                                 zip(df["measured_ttft_s"], df["measured_ttft_min_s"], df["measured_ttft_max_s"])],
        "error": [_pct(v) for v in df["ttft_error_pct"]], "run": df["run"]})


TOPICS: dict[str, Topic] = {
    "experiments.coldstart": Topic(
        "experiments.coldstart", "Simulated cold start",
        "Time to first token of each framework's cold start (flash → first token) as modelled by the cold-start "
        "simulator (docs/coldstart.md); every number is modelled, nothing end-to-end is fitted. Columns of the CSV: "
        "TTFT, its load and prefill parts, the CPU and NPU bubble rates (1 - busy / prefill; empty: no NPU), bytes "
        "read from flash (GB), peak memory (GB) and energy (J).",
        coldstart_table, coldstart_summary),
    "experiments.multidevice": Topic(
        "experiments.multidevice", "Simulated multi-device execution",
        "A conversation on a simulated cluster under an RSSI trace (docs/multidevice.md): mean and worst TTFT, TPOT "
        "percentiles and the share of decode tokens over the TPOT target, all modelled by the simulator (its own "
        "device model, not the planner's latency regression).",
        multidevice_table, multidevice_summary),
    "experiments.validate": Topic(
        "experiments.validate", "Host cold start: predicted vs measured",
        "`experiments.validate` invocations on this machine kind: the simulator's TTFT prediction with the measured "
        "host profile (modelled) against the cold runs (measured); error = (predicted − measured) / measured. One "
        "invocation's error moves by tens of per cent between invocations on a shared VM, so a configuration is "
        "judged on all its runs pooled, each invocation a round (docs/hil.md \"Validation protocol\"); the runs "
        "table keeps one row per invocation.",
        host_table, host_summary),
    "experiments.validate_cluster": Topic(
        "experiments.validate_cluster", "Emulated cluster: predicted vs measured",
        "Voltron conversations on the emulated cluster (`experiments.validate cluster=<name>_emu`, docs/cluster.md): "
        "the planner's step estimates (modelled: the latency regression fitted on the workers' measured profile, "
        "the communication model, the closed loop's corrections) against the steps the workers ran (measured). "
        "The emulation was tuned on office_emu with walk_away_disconnect; the other cluster / trace rows are held "
        "out. Every step, its corrections and the switch costs are in each run's steps.csv.",
        cluster_table, cluster_summary),
}


# ================================================ pages ==============================================================
@dataclass
class Page:
    topic: str
    markdown: str
    table: pd.DataFrame


def _manifest_md(runs: list[Run]) -> str:
    machines = sorted({machine_line(r.machine) for r in runs})
    sweeps = sorted({" ".join(["python", "-m", r.app, *map(shlex.quote, r.argv)]) for r in runs if r.argv})
    lines = ["## Manifest", "",
             f"- Commit: {_commits(runs)}",
             f"- Machine: {'; '.join(machines)}",
             f"- Runs finished: {_when(runs)}"]
    if sweeps:
        lines += ["- Invocations:", *[f"  - `{s}`" for s in sweeps]]
    lines += ["- Each run directory and the one-job command that reproduces it:", ""]
    ordered = sorted(runs, key=lambda r: _natural(r.dir.name))
    cmd = pd.DataFrame({"run": [r.dir.name for r in ordered], "command": [f"`{r.command}`" for r in ordered]})
    return "\n".join(lines) + "\n" + md_table(cmd)


def build_page(topic: str, runs: list[Run]) -> Page:
    """The page of `topic` from `runs` (all of one app)."""
    apps = sorted({r.app for r in runs})
    if len(apps) != 1:
        raise ReportError(f"run dirs: one app per page (found {', '.join(a or '?' for a in apps)})")
    spec = TOPICS.get(apps[0])
    if spec is None:
        raise ReportError(f"run dirs: no results page for app {apps[0] or '?'}; "
                          f"pages exist for {', '.join(sorted(TOPICS))}")
    df = spec.table(runs)
    title = spec.title + (f" — {machine_kind(runs[0].machine)}" if spec.app == "experiments.validate" else "")
    rows_md = (_host_rows_md(df) if spec.app == "experiments.validate"
               else df.map(_cell))
    md = "\n".join([
        HEADER, f"# {title}", "", spec.about, "",
        SUMMARY_BEGIN, spec.summary(df), "", f"_{_short_provenance(runs)}._", SUMMARY_END, "",
        *(["## Per configuration", "", md_table(host_configurations(df)), ""] if spec.app == "experiments.validate"
          else []),
        "## Runs", "", f"One row per run directory; the same table as CSV: [{topic}.csv]({topic}.csv).", "",
        md_table(rows_md), "",
        _manifest_md(runs), ""])
    return Page(topic, md, df)


def protocol_page(topic: str, runs: list[Run]) -> Page:
    """The page of one validation-protocol set on one machine kind (`validate protocol=<set>`, experiments.protocol):
    the set summary, per-configuration and speed-up tables; the table is the per-configuration CSV. A host set is
    judged on the newest run pooled with every other given run that predicted the same figures
    (experiments.protocol_pool: one invocation's bias is a draw on this host), each invocation's own bias listed; a
    peer set on its newest run."""
    from experiments.protocol import about_md, summary_md, tables_md
    from experiments.protocol_pool import pool, read_invocation
    from experiments.protocol_verdict import verdicts, verdicts_md

    runs = sorted(runs, key=lambda x: (x.finished_utc or "", x.dir.name))
    r = runs[-1]
    recs = lambda d: [{k: (None if v != v else v) for k, v in row.items()} for row in d.to_dict("records")]  # noqa
    invocations_md, left = "", []
    if r.metrics.get("protocol_peer"):
        pooled = [r]
        try:
            df = pd.read_csv(r.dir / "protocol.csv")
            sp = pd.read_csv(r.dir / "speedups.csv") if (r.dir / "speedups.csv").stat().st_size else pd.DataFrame()
        except (OSError, ValueError, pd.errors.ParserError) as e:
            raise ReportError(f"{r.dir}: protocol.csv / speedups.csv not readable ({type(e).__name__})") from None
        m = r.metrics
    else:
        try:
            m, judged, inv, left = pool([read_invocation(x.dir) for x in runs])
        except ConfigError as e:
            raise ReportError(str(e)) from None
        by_dir = {x.dir: x for x in runs}
        pooled = [by_dir[i.dir] for i in inv]
        df, sp = pd.DataFrame(judged["rows"]), pd.DataFrame(judged["speedups"])
        invocations_md = _invocations_md(pooled, left)
    held = " (held out: never used to choose or tune a mechanism)" if m.get("protocol_heldout") else ""
    md = "\n".join([
        HEADER, f"# Validation protocol, set `{m['protocol']}`{held} — {machine_kind(r.machine)}", "",
        about_md(m) + " docs/hil.md \"Validation protocol\" defines the protocol; the set is "
        f"conf/protocol/{m['protocol']}.yaml.", "",
        SUMMARY_BEGIN, "\n".join(filter(None, [summary_md(m), verdicts_md(verdicts(m, recs(df), recs(sp)))])), "",
        f"_{_short_provenance(pooled)}._", SUMMARY_END, "",
        invocations_md,
        tables_md(recs(df), recs(sp), m["protocol_level"]),
        f"The per-configuration table as CSV: [{topic}.csv]({topic}.csv).", "",
        _manifest_md(pooled), ""])
    return Page(topic, md, df)


def _invocations_md(pooled: list[Run], left: list[str]) -> str:
    """Each pooled invocation's own judgement (its metrics.json), and the runs left out."""
    def pc(v: Any) -> str:
        return "–" if v is None else f"{v:+.1f} %"

    rows = [{"run": x.dir.name, "finished": x.finished_utc or "?",
             "bias [interval]": f"{pc(x.metrics.get('protocol_bias_pct'))} [{pc(x.metrics.get('protocol_bias_lo_pct'))}"
                                f" … {pc(x.metrics.get('protocol_bias_hi_pct'))}]",
             "mean abs. error": "–" if x.metrics.get("protocol_mean_abs_pct") is None
             else f"{x.metrics['protocol_mean_abs_pct']:.1f} %",
             "noise floor": "–" if x.metrics.get("protocol_median_noise_pct") is None
             else f"{x.metrics['protocol_median_noise_pct']:.1f} %",
             "load average (median)": "–" if x.metrics.get("protocol_loadavg_median") is None
             else f"{x.metrics['protocol_loadavg_median']:.2f}"} for x in pooled]
    lines = ["## Invocations", "",
             f"The summary above judges {len(pooled)} invocation{'s' if len(pooled) > 1 else ''} of the set as one "
             "(their rounds pooled: experiments/protocol_pool.py; docs/hil.md \"Validation protocol\"). Each one "
             "alone (measured against the same predictions):", "", md_table(pd.DataFrame(rows)), ""]
    if left:
        lines += ["Not pooled:", "", *[f"- {x}" for x in left], ""]
    return "\n".join(lines)


def pages_for(runs: list[Run], topic: str | None = None) -> list[Page]:
    """One page per topic: the app's name (`coldstart`, `multidevice`) or, for host validation, one page per
    machine kind (`host-<kind>`); `topic` renames a single page."""
    if topic is not None and not TOPIC_RE.match(topic):
        raise ReportError(f"--topic: {topic!r} must match {TOPIC_RE.pattern}")
    apps = sorted({r.app for r in runs})
    if len(apps) != 1:
        raise ReportError(f"run dirs: one app per page (found {', '.join(a or '?' for a in apps)})")
    if apps[0] == "experiments.multidevice_report":               # one page, every section
        return [multidevice_report_page(topic or "multidevice-report", runs)]
    if apps[0] == "experiments.coldstart_sensitivity":            # one page, the newest run
        return [sensitivity_page(topic or "coldstart-sensitivity", runs)]
    if apps[0] == "experiments.coldstart_calibration":            # one page per topic, the newest run
        return [calibration_page(topic or "coldstart-calibration", runs)]
    if apps[0] == "experiments.validate":
        groups: dict[str, list[Run]] = {}
        for r in runs:                   # a protocol set's page apart from the invocations' page (protocol_page)
            set_ = f"protocol-{_slug(str(r.metrics['protocol']))}-" if "protocol" in r.metrics else ""
            kind = "peer" if "peer_ttft_s" in r.metrics else "host"      # with llama.cpp: its own page (peer_page)
            groups.setdefault(f"{kind}-{set_}" + _slug(machine_kind(r.machine)), []).append(r)
    else:
        groups = {apps[0].removeprefix("experiments."): runs}
    if topic is not None:
        if len(groups) > 1:
            raise ReportError(f"--topic: the runs make {len(groups)} pages ({', '.join(sorted(groups))}); "
                              f"give the run dirs of one machine kind")
        groups = {topic: next(iter(groups.values()))}
    return [protocol_page(t, rs) if "protocol" in rs[0].metrics
            else peer_page(t, rs) if "peer_ttft_s" in rs[0].metrics
            else ablation_page(t, rs) if t == ABLATION_TOPIC and apps[0] == "experiments.coldstart"
            else build_page(t, rs)
            for t, rs in sorted(groups.items())]


def sensitivity_page(topic: str, runs: list[Run]) -> Page:
    """The page of the newest `experiments.coldstart_sensitivity` run: each framework's TTFT per variant of a
    parameter without a source, and EdgeFlow's speed-up over llama.cpp (`sim.coldstart.sensitivity.markdown`)."""
    from sim.coldstart.sensitivity import markdown

    r = max(runs, key=lambda x: (x.finished_utc or "", x.dir.name))
    m = r.metrics
    if not m.get("sensitivity_rows"):
        raise ReportError(f"{r.dir / 'metrics.json'}: no sensitivity_rows "
                          "(not an experiments.coldstart_sensitivity run)")
    md = "\n".join([
        HEADER, "# Cold-start sensitivity to the parameters without a source", "",
        "Each parameter of the phone profile without a published source (its YAML comment says `assumed`), each "
        "modelling assumption, and llama.cpp's own costs (measured on the project's host, 0 = not modelled on the "
        "phone) at ½× / 2× or under the alternative assumption; the default is the conservative choice "
        "(docs/coldstart.md \"Assumptions and sensitivity\", `sim.coldstart.sensitivity`). Every number is modelled "
        "by the cold-start simulator.", "",
        SUMMARY_BEGIN, f"TTFT in s (modelled) and its change from the default, {m['model']} on {m['device']}, "
        f"{m['bits']:g} bits:", "", markdown(m["sensitivity_rows"]), "", f"_{_short_provenance([r])}._",
        SUMMARY_END, "", f"The rows as CSV: [{topic}.csv]({topic}.csv).", "", _manifest_md([r]), ""])
    return Page(topic, md, pd.DataFrame(m["sensitivity_rows"]))


THRESHOLD_TOPIC = "coldstart-threshold"


def calibration_page(topic: str, runs: list[Run]) -> Page:
    """The page of the newest `experiments.coldstart_calibration` run: the fit and the simulated components against
    the figures, or, under THRESHOLD_TOPIC, EdgeFlow's TTFT with the stealing threshold fixed
    (`sim.coldstart.calibration`'s Markdown tables)."""
    from sim.coldstart.calibration import check_markdown, consistent_markdown, fit_markdown, threshold_markdown

    r = max(runs, key=lambda x: (x.finished_utc or "", x.dir.name))
    m = r.metrics
    if not all(m.get(k) for k in ("fit_rows", "check_rows", "threshold_rows", "consistent_rows")):
        raise ReportError(f"{r.dir / 'metrics.json'}: no fit_rows / check_rows / threshold_rows / consistent_rows "
                          "(not an experiments.coldstart_calibration run)")
    setting = f"{m['model']} on {m['device']}"
    if topic == THRESHOLD_TOPIC:
        title = "EdgeFlow's cold start with the stealing threshold fixed"
        about = ("EdgeFlow's cold start with the stealing threshold it derives from the modelled CPU / NPU matmul "
                 "time ratio (EdgeFlow §4.3) replaced by a fixed one, beside `ef_priority` (the same plan without "
                 "stealing) and the derived threshold; then the CPU baselines and EdgeFlow with the profile's "
                 "sourced CPU INT8 GEMM rate and with the rate at which the derived threshold is the paper's "
                 "(docs/coldstart.md \"Calibration\", `sim.coldstart.calibration.threshold_rows`, "
                 "`consistent_rate_rows`). Every number is modelled by the cold-start simulator.")
        summary = (f"TTFT in s and stolen NPU ops (modelled), {setting}, {m['bits']:g} bits:\n\n"
                   + threshold_markdown(m["threshold_rows"])
                   + f"\n\nTTFT in s (modelled) at the sourced and at the threshold-consistent CPU INT8 GEMM rate, "
                   f"{setting}, {m['bits']:g} bits:\n\n" + consistent_markdown(m["consistent_rows"]))
        table = pd.DataFrame([{"table": "threshold", **x} for x in m["threshold_rows"]]
                             + [{"table": "cpu_rate", **x} for x in m["consistent_rows"]])
    else:
        title = "Cold-start calibration: the phone profile against the EdgeFlow component figures"
        about = ("The fit of the phone profile (`sim.coldstart.calibration.fit_profile`: one parameter per figure "
                 "by root finding on the same simulator, in the order of the first table; flash and copy rates "
                 "iterate to a joint solution) next to the values the profile stores, and every component scenario "
                 "simulated with the stored profile against the figure's value (`tests/sim/test_calibration.py` "
                 "requires ±10 %; check rows are not fitted). The stealing threshold is derived from the modelled "
                 "rates and only reported; the weightlet rows run Fig. 4b's scenario in EdgeFlow's format, which the "
                 "paper does not show (predictions). Figure values are the EdgeFlow paper's; every other number is "
                 "modelled (docs/coldstart.md \"Calibration\").")
        summary = (f"Fit ({m['rounds']} rounds) and stored profile values, {setting}:\n\n"
                   + fit_markdown(m["fit_rows"])
                   + f"\n\nSimulated (modelled, stored profile) against the figures, {setting}:\n\n"
                   + check_markdown(m["check_rows"]))
        table = pd.DataFrame([{"table": "fit", **x} for x in m["fit_rows"]]
                             + [{"table": "check", **x} for x in m["check_rows"]])
    md = "\n".join([
        HEADER, f"# {title}", "", about, "",
        SUMMARY_BEGIN, summary, "", f"_{_short_provenance([r])}._", SUMMARY_END, "",
        f"The rows as CSV: [{topic}.csv]({topic}.csv).", "", _manifest_md([r]), ""])
    return Page(topic, md, table)


def _by_pair(pairs: list[tuple[str, str, float]]) -> dict[tuple[str, str], list[float]]:
    """Ratios grouped by (our weights, llama.cpp format), in first-seen order."""
    out: dict[tuple[str, str], list[float]] = {}
    for o, w, x in pairs:
        out.setdefault((o, w), []).append(x)
    return out


def _peer_pair_md(ours: str, fmt: str, ratios: list[float], rows: list[dict]) -> str:
    """`ours 5-bit vs Q8_0: 1.53× (1.41–1.55), perplexity 17.53 / 14.98` for the page's summary."""
    def ppl(pick) -> str:
        vals = [r["ppl"] for r in rows if pick(r) and r.get("ppl") is not None]
        return f"{float(np.median(vals)):.2f}" if vals else "n/a"

    p_ours = ppl(lambda r: r["runtime"].startswith("ours") and r["weights"] == ours)
    p_peer = ppl(lambda r: r["runtime"] == "llama.cpp" and r["weights"] == fmt)
    return (f"ours {ours} vs {fmt}: {float(np.median(ratios)):.2f}× ({min(ratios):.2f}–{max(ratios):.2f}), "
            f"perplexity {p_ours} / {p_peer}")


def peer_page(topic: str, runs: list[Run]) -> Page:
    """The llama.cpp peer page of one machine kind (`validate peer=llamacpp`, experiments.peer_table): cold TTFT
    from the file's open beside perplexity on the same text, ours with and without huge pages, llama.cpp per format;
    the summary is the like-for-like comparison only."""
    from experiments.peer_table import COLUMNS, peer_rows, ratio_like_for_like, table_md

    rows = peer_rows([(r.dir.name, r.metrics) for r in sorted(runs, key=lambda x: _natural(x.dir.name))])
    pairs = ratio_like_for_like(rows)
    summary = ("No like-for-like pair (ours with huge_pages=false and llama.cpp in Q8_0, Q4_0 or Q4_K_M)." if not pairs
               else "Like for like (both clocks from the model file's open, no huge pages on either side; measured, "
                    "same runs): llama.cpp's cold TTFT over ours, median (min–max) over the pairs of runs, with "
                    "perplexity on the same text (ours / llama.cpp) — " + "; ".join(
                        _peer_pair_md(o, w, xs, rows) for (o, w), xs in _by_pair(pairs).items()) + ".")
    md = "\n".join([
        HEADER, f"# Cold start and quality beside llama.cpp — {machine_kind(runs[0].machine)}", "",
        "Both clocks start before the model file is opened: ours includes the index read, compute buffers allocated "
        "and zero-filled, op compilation and thread start; llama.cpp's includes `Llama()` (GGUF and vocabulary "
        "parse, context, KV cache) and the prompt eval. Perplexity on the same slices of the evaluation text: "
        "llama.cpp's from its logits, ours from the native forward on the packed file the runner reads "
        "(docs/hil.md \"Comparing with a peer\"). Rows with huge pages are not like for like (llama.cpp gets none); "
        "Q4_1 has no fast x86 prefill kernel in llama.cpp.", "",
        SUMMARY_BEGIN, summary, "", f"_{_short_provenance(runs)}._", SUMMARY_END, "",
        table_md(rows), f"The same table as CSV: [{topic}.csv]({topic}.csv).", "",
        _manifest_md(runs), ""])
    return Page(topic, md, pd.DataFrame(rows, columns=list(COLUMNS)))


MD_REPORT_SECTIONS = {      # section of experiments.multidevice_report -> (heading, what it shows)
    "qos": ("Best model each planner runs within QoS (rule `qos`)",
            "Each planner runs the most accurate model of the family for which it meets QoS (every TTFT ≤ 10 s, ≤ 5 % "
            "of tokens above 400 ms; models tried by descending published MMLU), else the largest model it can run "
            "(the paper's objective). `single` = the fastest device of the cluster alone; `mp` / `tp` = the "
            "heterogeneity-aware baselines with the best uniform precision that meets QoS; `precision` = what the "
            "planner ran (uniform, or Voltron's mix as FP16 / INT8 / INT4 shares of sublayer-steps)."),
    "largest": ("Largest model each planner runs (rule `largest`)",
                "The largest model each planner runs without OOM, regardless of QoS (paper: \"the largest model that "
                "fits\")."),
    "equal_split": ("Naive equal split vs heterogeneity-aware vs Voltron on the Office cluster (paper Fig. 4b)",
                    "The largest model of every family, each planner with an equal or a heterogeneity-aware split."),
    "pred_err": ("Planner prediction error against the simulated cluster",
                 "Per run of the `qos` and equal-split tables: the planner's estimate against the simulated cluster "
                 "(Voltron's are those of its closed-loop corrected estimates)."),
    "latency": ("Latency-regression accuracy",
                "Held-out 20 % of the profiling runs of the simulated devices (5 % profile noise); the regression is "
                "fitted per (device, precision, phase) on single-sublayer runs."),
    "energy": ("Energy mode against the single device",
               "Decode energy per token (mJ), Voltron with energy mode off and on against the single device, each "
               "running the model the `qos` rule chose for it (Voltron: ≤ {max_violation:g} % of tokens over 400 ms); "
               "a configuration that misses QoS saves nothing. Trace `{energy_trace}`."),
    "gains": ("Voltron − single accuracy by INT4 loss scale",
              "The accuracy proxy's gain (MMLU points) of Voltron over the single device under the `qos` rule, with "
              "the INT4 loss of every model scaled by `accuracy.int4_scale` (docs/multidevice.md \"Accuracy "
              "model\")."),
    "ablation": ("Ablation of Voltron's run-time mechanisms (Voltron Fig. 11 counterpart)",
                 "Office / Qwen2.5-14B, Voltron with one mechanism switched off at a time on the trace built to "
                 "need it (docs/multidevice.md \"Run-time scenarios that need each lever\"); stall total = weight "
                 "reloads and KV work a step waited for, KV rebuild = restored ATTN shards' KV (mostly in the user's "
                 "think time)."),
    "sensitivity": ("Sensitivity to the parameters without a source",
                    "Each parameter of the multi-device model without a published source at ½× and 2× its default "
                    "(docs/multidevice.md \"Assumptions and sensitivity\"): `truth.*` and `jitter` change only the "
                    "simulated cluster, `device.*` / `rssi.*` the world (devices, the planner's profiles of them, its "
                    "view of the links), `workload.*` the conversation, `planner.*` only the planner."),
}
MD_REPORT_ROW_KEYS = ("cluster", "family", "planner", "model", "precision", "ttft_s", "ttft_s_max", "qos_ttft_ok",
                      "tpot_ms_p50", "tpot_ms_p99", "qos_tpot_violation_rate", "accuracy_proxy", "oom", "qos_met",
                      "energy_mj_per_token", "pred_err_ttft_bias", "pred_err_ttft_mape", "pred_err_tpot_bias",
                      "pred_err_tpot_mape", "plan_ms_p50_search")


def multidevice_report_summary(m: dict[str, Any]) -> str:
    """QoS met per planner and Voltron's accuracy gain over the single device, from the `qos` section."""
    rows = m["sections"].get("qos")
    if not rows:
        return "No `qos` section in these runs (`experiments.multidevice_report --only qos,...`)."
    from sim.multidevice.report import gains

    planners = list(dict.fromkeys(r["planner"] for r in rows))
    met = {p: [bool(r["qos_met"]) for r in rows if r["planner"] == p] for p in planners}
    g = sorted(gains(rows).values())
    gain = ("" if not g else f"; Voltron's accuracy proxy minus the single device's: {g[0]:+.2f} to {g[-1]:+.2f} "
            f"MMLU points (median {float(np.median(g)):+.2f})")
    return (f"Modelled (simulated cluster), trace `{m['trace']}`, {m['turns']} turns, seed {m['seed']}, rule `qos`: "
            "cluster × family cells where the planner met QoS — "
            + ", ".join(f"{p} {sum(v)}/{len(v)}" for p, v in met.items()) + gain + ".")


def multidevice_report_page(topic: str, runs: list[Run]) -> Page:
    """The page of `experiments.multidevice_report` runs: every section from the newest run that has it (sections'
    tables formatted by `sim.multidevice.report`); the CSV holds every section's rows."""
    from sim.multidevice import report as md

    newest = sorted(runs, key=lambda x: (x.finished_utc or "", x.dir.name), reverse=True)
    src: dict[str, Run] = {}
    for r in newest:
        if not isinstance(r.metrics.get("sections"), dict):
            raise ReportError(f"{r.dir / 'metrics.json'}: no sections (not an experiments.multidevice_report run)")
        for k in r.metrics["sections"]:
            src.setdefault(k, r)
    used = sorted({id(r): r for r in src.values()}.values(), key=lambda x: _natural(x.dir.name))
    sec = {k: r.metrics["sections"][k] for k, r in src.items()}
    meta = {k: r.metrics for k, r in src.items()}
    parts, csv_rows = [], []

    def add(key: str, body: str, m: dict[str, Any], run: Run) -> None:
        head, about = MD_REPORT_SECTIONS[key]
        about = about.format(max_violation=100 * m.get("energy_max_violation", 0.01),
                             energy_trace=m.get("energy_trace", "?"))
        parts.extend([f"## {head}", "", f"{about} Run `{run.dir.name}`.", "", body.rstrip(), ""])

    def rows_csv(name: str, rows: list[dict], run: Run) -> None:
        csv_rows.extend({"table": name, **{k: r.get(k) for k in MD_REPORT_ROW_KEYS}, "run": run.dir.name}
                        for r in rows)

    for key in ("qos", "largest", "equal_split"):
        if key in sec:
            m = meta[key]
            add(key, md.markdown(sec[key], m["trace"], m["turns"]), m, src[key])
            rows_csv(key, sec[key], src[key])
    if "qos" in sec or "equal_split" in sec:
        run = src.get("qos") or src["equal_split"]
        add("pred_err", md.pred_err_markdown(sec.get("qos", []) + sec.get("equal_split", [])), run.metrics, run)
    if "latency" in sec:
        add("latency", md.latency_markdown(sec["latency"]), meta["latency"], src["latency"])
        csv_rows.extend({"table": "latency", **r, "run": src["latency"].dir.name} for r in sec["latency"])
    if "energy" in sec:
        m, e = meta["energy"], sec["energy"]
        add("energy", md.energy_markdown(e["normal"], e["energy_mode"], m.get("energy_max_violation", 0.01)), m,
            src["energy"])
        rows_csv("energy", e["normal"], src["energy"])
        rows_csv("energy_mode", e["energy_mode"], src["energy"])
    if "gains" in sec:
        by = {float(s): rows for s, rows in sec["gains"].items()}
        add("gains", md.gain_markdown(by), meta["gains"], src["gains"])
        for s, rows in sec["gains"].items():
            rows_csv(f"gains int4_scale={s}", rows, src["gains"])
    if "ablation" in sec:
        add("ablation", md.ablation_markdown(sec["ablation"]), meta["ablation"], src["ablation"])
        csv_rows.extend({"table": "ablation", "trace": r["trace"], "variant": r["variant"],
                         **{k: r.get(k) for k in MD_REPORT_ROW_KEYS}, "stall_s_total": r.get("stall_s_total"),
                         "kv_recompute_s_total": r.get("kv_recompute_s_total"),
                         "kv_rebuild_s_total": r.get("kv_rebuild_s_total"), "run": src["ablation"].dir.name}
                        for r in sec["ablation"])
    if "sensitivity" in sec:
        from sim.multidevice.sensitivity import PLANNERS as SENSITIVITY_PLANNERS
        from sim.multidevice.sensitivity import markdown as sensitivity_markdown

        m = meta["sensitivity"]
        add("sensitivity", sensitivity_markdown(sec["sensitivity"], m["turns"]), m, src["sensitivity"])
        csv_rows.extend({"table": "sensitivity", "parameter": r["parameter"], "alternative": r["alternative"],
                         "capped": r["capped"], "planner": p, **r[p], "run": src["sensitivity"].dir.name}
                        for r in sec["sensitivity"] for p in SENSITIVITY_PLANNERS)
    if not parts:
        raise ReportError("run dirs: no section of experiments.multidevice_report in them")
    summary_m = (src.get("qos") or used[-1]).metrics
    md_text = "\n".join([
        HEADER, "# Simulated multi-device execution: cluster × model family × planner", "",
        "The cluster × model family × planner tables of docs/multidevice.md \"Results\" (Voltron §5 setting): every "
        "run executes on the simulated cluster (`sim/multidevice/device_model.py`), not on the planner's cost model. "
        "All numbers are modelled except the planner's search times (`search ms p50`, measured on the machine in the "
        "manifest, shared with other jobs).", "",
        SUMMARY_BEGIN, multidevice_report_summary(summary_m), "", f"_{_short_provenance(used)}._", SUMMARY_END, "",
        *parts,
        f"Every section's rows as CSV: [{topic}.csv]({topic}.csv).", "",
        _manifest_md(used), ""])
    return Page(topic, md_text, pd.DataFrame(csv_rows))


IMPORTANCE_TOPIC = "multidevice-importance"


def importance_page(topic: str = IMPORTANCE_TOPIC, path: Path | None = None) -> Page:
    """The page of SmolLM2's measured importance and precision effects from the data file `path` (default: the one
    the planner reads); the CSV holds every measured precision row and the per-block importance."""
    from experiments import importance_table as it
    from planner.voltron.importance import DATA

    path = Path(path or DATA)
    try:
        summary = "\n".join([it.settings_md(path), "", it.table_intro_md(path), "", md_table(it.precision_table(path)),
                             "", it.pruning_md(path), "", f"_{it.provenance_md(path, REPO)}._"])
        blocks = it.block_table(path)
        # one CSV for both tables (a `table` column): nullable dtypes keep counts integral beside the gaps
        rows = pd.concat([it.precision_rows(path), it.block_rows(path)], ignore_index=True).convert_dtypes()
        manifest = it.manifest_items(path, REPO)
    except (OSError, ValueError, KeyError) as e:
        raise ReportError(f"{path}: not a measure_importance data file ({type(e).__name__}: {e})") from None
    md = "\n".join([
        HEADER, f"# {it.TITLE}", "",
        "What lowering the weight precision and pruning each shard cost the real SmolLM2-135M, the numbers the "
        "accuracy proxy and the layer importance of the multi-device planner are built on (docs/multidevice.md "
        "\"Accuracy proxy\", \"Layer importance\"). Every number is measured by `quant.measure_importance` and read "
        "through `planner.voltron.accuracy.precision_loss` and `planner.voltron.importance.shard_stats`.", "",
        SUMMARY_BEGIN, summary, SUMMARY_END, "",
        "## Per block", "",
        "Layer importance (Σ of the shards' mean Δppl/ppl_ref, within-noise shards 0), mean KL(ref ‖ pruned) summed "
        "over the shards (nats/token), and the shards within noise, per block and sublayer kind.", "",
        md_table(blocks), "",
        "Every measured precision row (each format × scope) and the per-block rows as CSV: "
        f"[{topic}.csv]({topic}.csv).", "",
        "## Manifest", "", *[ln if ln.startswith("  ") else f"- {ln}" for ln in manifest], ""])
    return Page(topic, md, rows)


DATA_PAGES: dict[str, Callable[[str], Page]] = {IMPORTANCE_TOPIC: importance_page}   # pages made from data files


def write_page(page: Page, out: Path = RESULTS_DIR) -> tuple[Path, Path]:
    md, csv = out / f"{page.topic}.md", out / f"{page.topic}.csv"
    atomic_write_text(csv, page.table.to_csv(index=False))
    atomic_write_text(md, page.markdown)
    return md, csv


# ================================================ README blocks ======================================================
def page_summary(text: str) -> str:
    """The summary block of a generated page."""
    if SUMMARY_BEGIN not in text or SUMMARY_END not in text:
        raise ReportError("page: no summary block (not a generated page)")
    return text.split(SUMMARY_BEGIN, 1)[1].split(SUMMARY_END, 1)[0].strip()


# docs pages with results blocks (their links relative to docs/)
DOC_BLOCKS = (REPO / "docs" / "coldstart.md", REPO / "docs" / "multidevice.md")


def readme_block(pattern: str, results: Path = RESULTS_DIR, link_root: str = "docs/results") -> str:
    """The body of one README block: each matching page's summary and a link to the page."""
    names = sorted(p.stem for p in results.glob("*.md") if fnmatch.fnmatchcase(p.stem, pattern))
    if not names:
        return f"No page yet: `python -m experiments.report <run dirs>` writes it into `{link_root}/`.\n"
    parts = []
    for n in names:
        text = (results / f"{n}.md").read_text()
        title = next((ln[2:] for ln in text.splitlines() if ln.startswith("# ")), n)
        parts.append(f"**{title}** ([full page]({link_root}/{n}.md))\n\n{page_summary(text)}\n")
    return "\n".join(parts)


def refresh_readme(text: str, results: Path = RESULTS_DIR, link_root: str = "docs/results") -> str:
    """`text` with every `<!-- results: PATTERN -->` block replaced by `readme_block(PATTERN)`."""
    return BLOCK_RE.sub(lambda m: m.group(1) + readme_block(m.group("pattern"), results, link_root) + m.group(4),
                        text)


# ================================================ CLI ================================================================
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dirs", nargs="*", help="run directories or sweep directories of one app")
    ap.add_argument("--topic", help="page name (default: the app's; host validation: host-<machine kind>)")
    ap.add_argument("--out", default=str(RESULTS_DIR), help="pages directory (default: docs/results)")
    ap.add_argument("--data", action="store_true",
                    help=f"write the pages made from committed data files ({', '.join(DATA_PAGES)})")
    ap.add_argument("--readme", action="store_true", help="refresh the README's results blocks from the pages")
    a = ap.parse_args(argv)
    if not a.run_dirs and not a.readme and not a.data:
        ap.error("give run dirs, --data, --readme, or a combination")
    try:
        if a.data:                     # before --readme, so one call refreshes a page and its blocks
            out = Path(a.out)
            out.mkdir(parents=True, exist_ok=True)
            for topic, make in DATA_PAGES.items():
                md, csv = write_page(make(topic), out)
                print(f"{md}\n{csv}")
        if a.run_dirs:
            out = Path(a.out)
            out.mkdir(parents=True, exist_ok=True)
            for page in pages_for(load_runs(a.run_dirs), a.topic):
                md, csv = write_page(page, out)
                print(f"{md}\n{csv}")
        if a.readme:
            text = README.read_text()
            new = refresh_readme(text, Path(a.out))
            if new != text:
                atomic_write_text(README, new)
            print(f"{README}: {'refreshed' if new != text else 'already up to date'}")
            for doc in DOC_BLOCKS:
                text = doc.read_text()
                new = refresh_readme(text, Path(a.out), "results")
                if new != text:
                    atomic_write_text(doc, new)
                print(f"{doc}: {'refreshed' if new != text else 'already up to date'}")
    except ReportError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
