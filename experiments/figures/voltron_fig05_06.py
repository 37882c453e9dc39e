"""Voltron Figs. 5-6 (§3.2.2, model and precision heterogeneity): per-layer latency of MP (whole layer on the main,
high-end device) vs TP (shards over every device) for each layer variant — MHA, GQA, SWA attention; dense and MoE
FFN — and at each weight precision, plus each variant's memory footprint and the memory / accuracy of fixed vs mixed
precision. Latencies are the Voltron planner's own per-layer option costs (`planner.voltron.hybrid.HybridPlanner.
options`: the fitted latency regression + the Wi-Fi communication model) on the Office cluster at a strong link
(-40 dBm), decode of one token over a 1k-token KV cache; accuracy is the planner's proxy
(`planner.voltron.accuracy.accuracy_proxy`). Modelled."""
from __future__ import annotations

import numpy as np
import pandas as pd

from experiments.figures.base import FigureSpec, fig_legend, note
from experiments.figures.names import label, labels
from experiments.figures.voltron_data import context

CLUSTER, RSSI_DBM, KV_LEN = "office", -40.0, 1024
TYPE_MODEL = {"full": {"attn_mha": "qwen1_5_14b", "attn_gqa": "qwen2_5_14b", "attn_swa": "gemma3_12b",
                       "ffn_dense": "qwen2_5_14b", "ffn_moe": "qwen1_5_moe_a2_7b"},
              "toy": {"attn_gqa": "qwen2_5_3b", "ffn_dense": "qwen2_5_3b"}}
PREC_MODEL = {"full": "qwen2_5_14b", "toy": "qwen2_5_3b"}

SPEC = FigureSpec(
    name="voltron_fig05_06", paper="Voltron", figure="Figs. 5-6",
    topic="Per-layer MP vs TP latency by layer variant and precision",
    title="Office cluster, -40 dBm, one decode token over a 1k-token KV cache; memory and accuracy by precision",
    claim="The better parallelism differs by layer variant (TP for compute-heavy MHA and dense FFN, MP for the "
          "lighter GQA/SWA attention and MoE) and by precision (lower precision shrinks compute but not traffic, so "
          "TP's edge narrows), while mixed precision reaches near-FP16 accuracy in much less memory — so parallelism "
          "and precision must be chosen per layer, together.",
    simulated="the planner's per-layer option costs (latency regression + communication model), memory per layer, "
              "accuracy proxy",
    tolerances={"value": (1e-4, 1e-9)})


def _costs(model: str, kv_len: int = KV_LEN, rssi: float = RSSI_DBM, phase: int = 1, n_tokens: int = 1):
    """(planner, option table, env) of `model` on the cluster for one decode step."""
    from planner.voltron.comm import LinkState
    from planner.voltron.hybrid import HybridPlanner
    from planner.voltron.options import PhaseEnv
    from planner.voltron.rssi import RssiTable

    ctx, _ = context(CLUSTER, model, 0)
    hp = HybridPlanner(ctx.table, ctx.cluster, ctx.latency)
    links = LinkState.from_rssi(RssiTable(), np.full(ctx.cluster.n - 1, rssi))
    env = PhaseEnv(phase=phase, n_tokens=n_tokens, kv_len=kv_len, kv_plan=kv_len, links=links,
                   budgets=ctx.cluster.budgets())
    return hp, hp.options(env), ctx


def _mp_tp(hp, opt, t: int, p: int) -> tuple[float, float, float]:
    """(MP on the main device, TP over all devices, sublayer bytes at precision p) of type id t, in s / s / B."""
    from planner.voltron.devices import ACT_BYTES, PRECISIONS

    A = len(ACT_BYTES)
    c = int(hp.tpos[t]) * len(PRECISIONS) * A + p * A                  # class (type, precision, FP16 activations)
    all_dev = int(np.flatnonzero(hp.subsets.all(axis=1))[0])
    o_tp = hp.D + all_dev
    mp = float(opt.comp[c, 0] + opt.comm[c, 0])
    tp = float(opt.comp[c, o_tp] + opt.comm[c, o_tp])
    mem = float(opt.mem[c, 0].sum())
    return mp, tp, mem


def data(size: str) -> pd.DataFrame:
    from planner.voltron.accuracy import AccuracyConfig, accuracy_proxy
    from planner.voltron.devices import PRECISIONS
    from planner.voltron.layers import TYPES

    rows = []
    for tname, model in TYPE_MODEL[size].items():                   # Fig. 5: layer variants, FP16
        hp, opt, _ = _costs(model)
        mp, tp, mem = _mp_tp(hp, opt, TYPES.index(tname), 0)
        rows += [{"panel": "5a", "item": tname, "model": model, "precision": "fp16", "metric": k, "value": v}
                 for k, v in (("mp_ms", 1e3 * mp), ("tp_ms", 1e3 * tp))]
        rows.append({"panel": "5b", "item": tname, "model": model, "precision": "fp16", "metric": "mem_mb",
                     "value": mem / 1e6})
    model = PREC_MODEL[size]
    hp, opt, ctx = _costs(model)
    for p, pname in enumerate(PRECISIONS):                            # Fig. 6b: precision
        for tname in ("attn_gqa", "ffn_dense"):
            mp, tp, mem = _mp_tp(hp, opt, TYPES.index(tname), p)
            rows += [{"panel": "6b", "item": tname, "model": model, "precision": pname, "metric": k, "value": v}
                     for k, v in (("mp_ms", 1e3 * mp), ("tp_ms", 1e3 * tp))]
    n = ctx.table.n                                                   # Fig. 6a: fixed vs mixed precision
    w = ctx.importance.per_sublayer
    mixed = np.where(w >= np.median(w), 1, 2)                         # more important half INT8, the rest INT4
    zeros = np.zeros(n, dtype=np.int64)
    for name, prec in (("fp16", np.zeros(n, np.int64)), ("int8", np.ones(n, np.int64)),
                        ("int4", np.full(n, 2, np.int64)), ("mixed int8/int4", mixed)):
        mem = float(sum(_mp_tp(hp, opt, int(ctx.table.type_of[j]), int(prec[j]))[2] for j in range(n)))
        acc = accuracy_proxy(model, ctx.importance, AccuracyConfig(), prec, zeros, np.zeros(n))
        rows += [{"panel": "6a", "item": name, "model": model, "precision": name, "metric": "mem_gb",
                  "value": mem / 1e9},
                 {"panel": "6a", "item": name, "model": model, "precision": name, "metric": "accuracy_proxy",
                  "value": acc}]
    df = pd.DataFrame(rows)
    df["source"] = "modelled"
    return df


def plot(df: pd.DataFrame, fig) -> None:
    axes = [fig.add_subplot(1, 4, i + 1) for i in range(4)]
    a = df[df.panel == "5a"]
    items = list(dict.fromkeys(a.item))
    norm = float(a[(a.metric == "mp_ms")].value.iloc[0])
    for j, (k, color) in enumerate((("mp_ms", "tab:blue"), ("tp_ms", "tab:orange"))):
        d = a[a.metric == k].set_index("item")["value"]
        axes[0].bar([i + 0.4 * j for i in range(len(items))], [d[it] / norm for it in items], 0.4, color=color,
                    label=k[:2].upper())
    axes[0].set_xticks([i + 0.2 for i in range(len(items))], labels(items), rotation=45, ha="right", fontsize=7)
    axes[0].set_ylabel(f"latency / MP of {label(items[0])}")
    axes[0].set_title("(5a) layer variants, FP16", fontsize=8)
    b = df[df.panel == "5b"]
    axes[1].bar(range(len(b)), b.value, color="0.5")
    axes[1].set_xticks(range(len(b)), labels(b.item), rotation=45, ha="right", fontsize=7)
    axes[1].set_ylabel("MB per layer (weights + KV)")
    axes[1].set_title("(5b) memory per layer", fontsize=8)
    c = df[df.panel == "6a"].pivot(index="item", columns="metric", values="value")
    axes[2].scatter(c.mem_gb, c.accuracy_proxy, color="0.3")
    for it, r in c.iterrows():
        axes[2].annotate(label(it), (r.mem_gb, r.accuracy_proxy), xytext=(3, 3), textcoords="offset points",
                         fontsize=7)
    axes[2].margins(x=0.3, y=0.15)                 # room for the labels inside the axes
    axes[2].set_xlabel("model memory (GB)")
    axes[2].set_ylabel("accuracy proxy")
    axes[2].set_title("(6a) fixed vs mixed precision", fontsize=8)
    e = df[df.panel == "6b"]
    norm6 = float(e[(e.item == "attn_gqa") & (e.metric == "mp_ms") & (e.precision == "fp16")].value.iloc[0])
    for it, marker in (("attn_gqa", "o"), ("ffn_dense", "s")):
        for k, ls, color in (("mp_ms", "-", "tab:blue"), ("tp_ms", "--", "tab:orange")):
            d = e[(e.item == it) & (e.metric == k)]
            axes[3].plot(labels(d.precision), d.value / norm6, marker + ls, color=color,
                         label=f"{label(it)}, {k[:2].upper()}")
    axes[3].set_ylabel(f"latency / MP of {label('attn_gqa')} at FP16 (decode)")
    axes[3].set_title("(6b) precision", fontsize=8)
    fig_legend(fig, (axes[0], axes[3]), ncol=3)
    note(fig, "modelled")
