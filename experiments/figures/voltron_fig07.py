"""Voltron Fig. 7 (§3.2.3, computational dynamics): (a) input / output length per conversation turn of the
LMSYS-Chat-1M-like workload and (b) the tokens accumulated in the KV cache across turns (`sim.multidevice.workload`);
(c) Voltron's plan over the turns on the Office cluster — prefill and decode step times and how many sublayers run
TP — from the simulated conversation (`sim.multidevice.runner`)."""
from __future__ import annotations

import pandas as pd

from experiments.figures.base import FigureSpec, fig_legend, note
from experiments.figures.voltron_data import QOS_TPOT_MS, conversation, qos_line
from sim.multidevice.workload import WorkloadConfig
from sim.multidevice.workload import conversation as lengths

GRID = {"full": dict(turns=8, users=(0, 1, 2, 3), model="qwen2_5_14b"),
        "toy": dict(turns=2, users=(0,), model="qwen2_5_3b")}
CLUSTER, TRACE = "office", "steady_strong"

SPEC = FigureSpec(
    name="voltron_fig07", paper="Voltron", figure="Fig. 7",
    topic="Conversation lengths, KV-cache growth and the plan over turns",
    title="LMSYS-Chat-1M-like users; (c) Voltron's plan on the Office cluster, steady strong link, where the "
          "paper's 7c compares MP and TP layer latency",
    claim="Prompt and response lengths vary widely per turn and the KV cache keeps growing over a conversation; "
          "since MP and TP trade places with the phase and the cached length (TP wins decode once the cache is "
          "long), a parallelism plan fixed at the start is not enough.",
    simulated="the workload's per-turn lengths and KV growth (seeded users); Voltron's per-turn plans and step "
              "times on the Office cluster under a steady strong link",
    tolerances={"value": (1e-4, 1e-9)})


def data(size: str) -> pd.DataFrame:
    g = GRID[size]
    rows = []
    for user in g["users"]:
        kv = 0
        for t, (n_in, n_out) in enumerate(lengths(WorkloadConfig(turns=g["turns"], seed=user))):
            kv += n_in + n_out
            rows += [{"panel": "a", "user": user, "turn": t, "metric": "input_tokens", "value": n_in},
                     {"panel": "a", "user": user, "turn": t, "metric": "output_tokens", "value": n_out},
                     {"panel": "b", "user": user, "turn": t, "metric": "kv_tokens_end_of_turn", "value": kv}]
    res = conversation(CLUSTER, g["model"], "voltron", TRACE, g["turns"])
    tl = pd.DataFrame(res.timeline)
    for t, d in tl.groupby("turn"):
        pre, dec = d[d.phase == "prefill"], d[d.phase == "decode"]
        rows += [{"panel": "c", "user": 0, "turn": int(t), "metric": "prefill_s", "value": float(pre.step_s.sum())},
                 {"panel": "c", "user": 0, "turn": int(t), "metric": "decode_step_ms_mean",
                  "value": 1e3 * float(dec.step_s.mean()) if len(dec) else float("nan")},
                 {"panel": "c", "user": 0, "turn": int(t), "metric": "decode_tp_sublayers_mean",
                  "value": float(dec.n_tp.mean()) if len(dec) else float("nan")},
                 {"panel": "c", "user": 0, "turn": int(t), "metric": "prefill_tp_sublayers",
                  "value": float(pre.n_tp.mean()) if len(pre) else float("nan")}]
    df = pd.DataFrame(rows)
    df["source"] = "modelled"
    return df


def plot(df: pd.DataFrame, fig) -> None:
    from matplotlib.ticker import MaxNLocator

    axes = [fig.add_subplot(1, 3, i + 1) for i in range(3)]
    a = df[df.panel == "a"]
    for i, user in enumerate(dict.fromkeys(a.user)):
        color = f"C{i % 10}"
        for k, m in (("input_tokens", "o-"), ("output_tokens", "s--")):
            d = a[(a.user == user) & (a.metric == k)]
            axes[0].plot(d.turn, d.value, m, ms=3, color=color)
        d = df[(df.panel == "b") & (df.user == user)]
        axes[1].plot(d.turn, d.value, "o-", ms=3, color=color, label=f"user {user}")
    axes[0].plot([], [], "o-", ms=3, color="0.4", label="input (per turn)")
    axes[0].plot([], [], "s--", ms=3, color="0.4", label="output (per turn)")
    axes[0].set_ylabel("tokens")
    axes[0].set_title("(a) lengths per turn", fontsize=9)
    axes[1].set_ylabel("tokens in the KV cache")
    axes[1].set_title("(b) KV cache over turns", fontsize=9)
    c = df[df.panel == "c"]
    ax = axes[2]
    d = c[c.metric == "decode_step_ms_mean"]
    ax.plot(d.turn, d.value, "o-", label="Voltron decode step, mean (ms)")
    qos_line(ax)
    ax.set_ylim(0, 1.15 * max(QOS_TPOT_MS, float(d.value.max()) if len(d) else 0.0))
    ax2 = ax.twinx()
    for k, m, lab in (("decode_tp_sublayers_mean", "s--", "sublayers as TP, decode (mean)"),
                      ("prefill_tp_sublayers", "^:", "sublayers as TP, prefill")):
        d = c[c.metric == k]
        ax2.plot(d.turn, d.value, m, color="tab:red", label=lab)
    ax.set_ylabel("decode step, mean (ms)")
    ax2.set_ylabel("sublayers run as TP", color="tab:red")
    ax.set_title("(c) Voltron's plan over turns", fontsize=9)
    for x in axes:
        x.set_xlabel("turn")
        x.xaxis.set_major_locator(MaxNLocator(integer=True))
    fig_legend(fig, (axes[0], axes[1], ax, ax2), ncol=4)
    note(fig, "simulated")
