"""The measured layer-importance and precision-effect tables of SmolLM2-135M (docs/multidevice.md "Layer importance
and precision effects"), generated from the data file `planner/voltron/data/smollm2_importance.json` that
`python -m quant.measure_importance` writes. `experiments.report --data` turns these parts into the page
`docs/results/multidevice-importance.md` (+ .csv); `experiments.report --readme` copies its summary into
docs/multidevice.md.

Every number comes through the functions the planner itself reads the file with, so the page cannot drift from what
the accuracy proxy uses: `accuracy.precision_loss` (Δppl, KL, q = 1 − ppl_ref/ppl and its noise rule) and
`importance.shard_stats` (shard importance, the noise rule, layer importance = Σ shards). Only presentation lives here:
which rows the table shows, their labels, and the number formats.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from planner.voltron.accuracy import PROXY_FORMAT, PrecisionLoss, precision_loss
from planner.voltron.importance import DATA, KINDS, NOISE_Z, ShardStats, load_measurement, shard_stats

TITLE = "Layer importance and precision effects (SmolLM2-135M, measured)"
SCOPES = ("all", "attn", "ffn")
KIND_NAME = {"attn": "ATTN", "ffn": "FFN"}
PROXY_ROWS = (PROXY_FORMAT["int8"], PROXY_FORMAT["int4"])     # the rows the accuracy proxy reads (bold)
TABLE_COLUMNS = ("precision", "scope", "Δppl (relative)", "KL nats/token", "q (proxy)")


@dataclass(frozen=True)
class Row:
    """One row of the precision table: a measured row of the file (`fmt`, `scope`) and how the table names it."""
    fmt: str
    scope: str
    label: str
    scope_label: str


def _rows(fmt: str, first: str, short: str, scopes: tuple[str, ...] = SCOPES) -> list[Row]:
    """The full label on a format's first row, the short one on its ATTN / FFN rows."""
    names = {"all": "all", "attn": "ATTN only", "ffn": "FFN only"}
    return [Row(fmt, s, first if i == 0 else short, names[s]) for i, s in enumerate(scopes)]


# Which measured rows the table shows, in the order the text discusses them; the CSV holds every row of the file.
ROWS: tuple[Row, ...] = (
    Row("fp16", "all", "FP16 (weights rounded)", "all linears"),
    *_rows("q8_0", "**INT8 = Q8_0** (weights + Q8_0 activation blocks)", "INT8 = Q8_0"),
    *_rows("q4_k", "**INT4 = Q4_K** (weights + Q8_K activation blocks)", "INT4 = Q4_K"),
    *_rows("q8_0_weights_only", "Q8_0 weights only, fp32 activations (context)", "", ("all",)),
    *_rows("q4_k_weights_only", "Q4_K weights only, fp32 activations (context)", "Q4_K weights only"),
    *_rows("q4_k_aligned", "Q4_K weights on the shipped Q4_1 grid (context: artefact)", "", ("all",)),
    *_rows("host_int8_w8a8", "host kernel: INT8 W8A8, dynamic per-tensor activations", "host INT8 W8A8"),
    *_rows("host_int4_per_channel", "host kernel: INT4 weight-only per channel", "host INT4 per channel"),
    *_rows("host_int8_weight_only", "host kernel: INT8 weight-only per channel (context)", "", ("all",)),
)


# ================================================ formats ============================================================
def _fixed(v: float) -> str:
    """Three significant figures for the table's magnitudes (1 decimal from 10 on, else 2)."""
    return f"{v:.{1 if abs(v) >= 10 else 2}f}"


def _pct_pm(mean: float, sd: float) -> str:
    """`+0.53 ± 0.88 %`: a relative change in percent, the sd with the mean's decimals, a typographic minus."""
    m, s = 100 * mean, 100 * sd
    nd = 1 if abs(m) >= 10 else 2
    sign = "−" if round(m, nd) < 0 else "+"
    return f"{sign}{abs(m):.{nd}f} ± {s:.{nd}f} %"


def _kl_pm(mean: float, sd: float) -> str:
    """Mean KL ± sd: 4 decimals below 0.01 nats/token (Q8_0's effect would round to 0), else 3."""
    nd = 4 if mean < 0.01 else 3
    return f"{mean:.{nd}f} ± {sd:.{nd}f}"


def _q_cell(p: PrecisionLoss, scope: str) -> str:
    if p.fmt == PROXY_FORMAT["fp16"]:
        return "0 (not used: FP16 is the proxy's 0)"
    text = "0 (within noise)" if p.within_noise else f"{p.loss:.3f} ± {p.loss_sd:.3f}"
    return f"**{text}**" if scope == "all" and p.fmt in PROXY_ROWS else text


def _sig(v: float) -> float:
    """CSV values to 6 significant figures: the file's precision, stable across numpy builds' last bits."""
    return float(f"{v:.6g}")


# ================================================ tables =============================================================
def precision_table(path: Path = DATA) -> pd.DataFrame:
    """The table of the docs page: one row per `ROWS` entry, cells as text."""
    cells = []
    for r in ROWS:
        p = precision_loss(r.fmt, r.scope, str(path))
        cells.append((r.label, r.scope_label, _pct_pm(p.dppl_rel, p.dppl_rel_sd), _kl_pm(p.kl, p.kl_sd),
                      _q_cell(p, r.scope)))
    return pd.DataFrame(cells, columns=list(TABLE_COLUMNS))


def precision_rows(path: Path = DATA) -> pd.DataFrame:
    """Every measured precision row of the file (format × scope), numbers as in `accuracy.precision_loss`."""
    doc = load_measurement(str(path))
    out = []
    for fmt, scopes in doc["precision"].items():
        for scope in scopes:
            p = precision_loss(fmt, scope, str(path))
            out.append({"table": "precision", "format": fmt, "scope": scope,
                        "dppl_rel": _sig(p.dppl_rel), "dppl_rel_sd": _sig(p.dppl_rel_sd), "kl": _sig(p.kl),
                        "kl_sd": _sig(p.kl_sd), "q": _sig(p.loss), "q_sd": _sig(p.loss_sd),
                        "within_noise": p.within_noise, "slices": p.slices})
    return pd.DataFrame(out)


def _stats(path: Path) -> dict[str, ShardStats]:
    return {k: shard_stats(load_measurement(str(path)), k) for k in KINDS}


def block_rows(path: Path = DATA) -> pd.DataFrame:
    """Per block and sublayer kind: layer importance, KL summed over the shards, shards within noise."""
    out = []
    for k, st in _stats(path).items():
        for b, (imp, kl, noise) in enumerate(zip(st.layer_importance, st.kl_mean.sum(axis=1), st.noise)):
            out.append({"table": "block", "kind": k, "block": b, "importance": _sig(float(imp)),
                        "kl_sum": _sig(float(kl)), "shards": int(noise.size), "shards_within_noise": int(noise.sum())})
    return pd.DataFrame(out)


def block_table(path: Path = DATA) -> pd.DataFrame:
    """`block_rows` side by side per kind, cells as text (the page's per-block table)."""
    df = block_rows(path)
    cols: dict[str, Any] = {"block": sorted(set(df.block))}
    for k in KINDS:
        d = df[df.kind == k].set_index("block").loc[cols["block"]]
        cols[f"{KIND_NAME[k]} importance"] = [f"{v:.3f}" for v in d.importance]
        cols[f"{KIND_NAME[k]} KL Σ shards"] = [f"{v:.3f}" for v in d.kl_sum]
        cols[f"{KIND_NAME[k]} within noise"] = [f"{n}/{s}" for n, s in zip(d.shards_within_noise, d.shards)]
    return pd.DataFrame(cols)


# ================================================ text ===============================================================
def settings_md(path: Path = DATA) -> str:
    """The measurement's slices, reference perplexities and wall time, from the file."""
    doc = load_measurement(str(path))
    sl = doc["slices"]
    c0, c1 = sl["calibration_excluded"]
    ref = " / ".join(f"{v:.2f}" for v in doc["ref_ppl_slices"])
    sec = doc.get("seconds", {})
    wall = (f"; wall time of the measurement: shard pruning {sec['pruning']:.0f} s, precision rows "
            f"{sec['precision']:.0f} s" if {"pruning", "precision"} <= set(sec) else "")
    return (f"{sl['count']} disjoint slices of {sl['tokens']} tokens of the evaluation text at offsets "
            f"{', '.join(map(str, sl['offsets']))} (the quantizer's calibration slice {c0}–{c1} excluded), reference "
            f"perplexity (fp32) {ref}{wall}.")


def table_intro_md(path: Path = DATA) -> str:
    k = len(load_measurement(str(path))["ref_ppl_slices"])
    return (f"Whole model and per sublayer kind at each precision: relative perplexity increase ppl/ppl_ref − 1 and "
            f"mean KL(ref ‖ p) per token, mean ± sd over the {k} slices; q = 1 − ppl_ref/ppl (the accuracy proxy's "
            f"q), 0 when within noise (mean ≤ {NOISE_Z:g}·sd/√{k}):")


def pruning_md(path: Path = DATA) -> str:
    """Layer importance by kind (mean, max and its block), the most important block by KL, the noise shares."""
    st = _stats(path)
    n_layers = st["attn"].mean.shape[0]
    groups = " + ".join(f"{s.mean.shape[1]} {KIND_NAME[k]}" for k, s in st.items())
    noise = np.concatenate([s.noise.ravel() for s in st.values()])
    imp = ", ".join(f"{KIND_NAME[k]} mean {_fixed(float(s.layer_importance.mean()))} (max "
                    f"{_fixed(float(s.layer_importance.max()))} at block {int(s.layer_importance.argmax())})"
                    for k, s in st.items())
    kl = {k: s.kl_mean.sum(axis=1) for k, s in st.items()}
    a, f = (kl[k] for k in KINDS)
    share = ", ".join(f"{KIND_NAME[k]} {100 * s.noise.mean():.0f} %" for k, s in st.items())
    return (f"Shard pruning, {noise.size} shards ({n_layers} blocks × ({groups} groups)): layer importance (Σ of the "
            f"shards' mean Δppl/ppl_ref, within-noise shards 0) {imp}; by KL the most important blocks are ATTN "
            f"{int(a.argmax())} ({_fixed(float(a.max()))} nats summed over its shards) and FFN {int(f.argmax())} "
            f"({_fixed(float(f.max()))}); within noise: {100 * noise.mean():.0f} % of the shards ({share}).")


def sha256(path: Path = DATA) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def shown_path(path: Path, repo: Path) -> str:
    """The data file as the page names it: relative to the checkout when inside it."""
    p = Path(path).resolve()
    return str(p.relative_to(repo)) if p.is_relative_to(repo) else str(p)


def provenance_md(path: Path, repo: Path) -> str:
    doc = load_measurement(str(path))
    return (f"Measured on the real model, not modelled; data file `{shown_path(path, repo)}` (sha256 "
            f"`{sha256(path)[:12]}`), written by `{doc.get('regenerate', 'python -m quant.measure_importance')}`")


def manifest_items(path: Path, repo: Path) -> list[str]:
    """The manifest: the file, its hash, the commands and every measurement setting the file records."""
    doc = load_measurement(str(path))
    sl = ", ".join(f"{k} {v}" for k, v in doc["slices"].items())
    sec = ", ".join(f"{k} {v} s" for k, v in doc.get("seconds", {}).items())
    items = [f"Data file: `{shown_path(path, repo)}`, sha256 `{sha256(path)}`",
             f"Measured by: `{doc.get('regenerate', 'python -m quant.measure_importance')}`",
             "This page: `python -m experiments.report --data`; the block in docs/multidevice.md: "
             "`python -m experiments.report --readme`",
             f"Model: `{doc.get('model', '?')}` ({doc.get('label', '?')}); method: {doc.get('method', '?')}",
             f"Slices: {sl}; FFN groups: {doc.get('ffn_groups', '?')}",
             f"Noise rule: a mean ≤ {NOISE_Z:g} standard errors (sd/√K over the slices) counts as 0 "
             "(`planner.voltron.importance.NOISE_Z`)",
             f"Wall time (s, the host that measured; not a benchmark): {sec or 'not recorded'}",
             "Precision rows:"]
    items += [f"  - `{k}`: {v}" for k, v in doc.get("precision_semantics", {}).items()]
    return items
