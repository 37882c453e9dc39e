"""The llama.cpp peer table: cold TTFT beside perplexity on the same text, for our runner and llama.cpp, from
`experiments.validate peer=llamacpp` run directories (docs/hil.md "Comparing with a peer").

    python -m experiments.validate -m peer=llamacpp peer_gguf=q8_0,q4_0,q4_k_m,q4_1 huge_pages=false,true
        # -> <sweep dir>/peer_table.md, peer_table.csv, peer_table.png (also one run's own, in its run dir)

Both clocks start before the model file is opened: ours is `measured_ttft_from_open_s` (index read, compute buffers
allocated and zero-filled, ops compiled and threads started, then the cold start; hil.runner), llama.cpp's is
`Llama()` + prompt eval (hil.peer). Rows of our runner with transparent huge pages (`huge_pages=true`) are not like
for like: llama.cpp's buffers get none (THP mode `madvise`, and it does not ask), so the like-for-like rows are ours
with `huge_pages=false` against llama.cpp's Q8_0, Q4_0 and Q4_K_M (Q4_1 has no fast x86 prefill kernel in llama.cpp).
Perplexity: llama.cpp's from its logits at every position (hil.peer.llamacpp_perplexity), ours from the native forward
on the packed file the runner reads (hil.native_forward, bit-exact with the runner), on the same slices of the
evaluation text (quant.evaluate.settings_slices: the `quant` settings' eval slices).
"""
from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from quant.atomic import atomic_write_text

LIKE_FORMATS = ("Q8_0", "Q4_0", "Q4_K_M")     # llama.cpp formats with its fast x86 prefill (llamafile sgemm / K-quant)
COLUMNS = ("runtime", "weights", "huge_pages", "like_for_like", "ttft_s", "load_s", "prefill_s", "ppl", "ppl_sd",
           "file_bytes", "run")


def quality(spec, qs, gguf: Path, packed: Path, threads: int) -> dict[str, Any]:
    """Perplexity (mean and sample sd over the slices) of llama.cpp on `gguf` and of the native forward on our
    `packed` file, on the `qs` evaluation slices (measured, untimed)."""
    from hil.native_forward import native_last_logits
    from hil.peer import llamacpp_perplexity
    from quant.evaluate import mean_sd, perplexity_from_logits, settings_slices
    from quant.packed_forward import read_model

    slices = settings_slices(spec, qs)
    peer = llamacpp_perplexity(gguf, slices, threads)
    pm = read_model(packed)
    ours = [perplexity_from_logits(native_last_logits(pm, spec, s, all_positions=True), s) for s in slices]
    (pm_, ps), (om, os_) = mean_sd(peer), mean_sd(ours)
    return {"peer_ppl": pm_, "peer_ppl_sd": ps, "ppl_packed": om, "ppl_packed_sd": os_,
            "ppl_slices": int(slices.shape[0]), "ppl_slice_tokens": int(slices.shape[1])}


def peer_rows(runs: list[tuple[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    """Table rows from (run name, metrics.json) of validate runs with the peer: one row of our runner per run and
    one of llama.cpp per weight format (its runs of every run directory pooled: median of the run medians)."""
    ours, peer = [], {}
    for name, m in runs:
        if "peer_ttft_s" not in m:
            continue
        hp = bool(m.get("huge_pages", 1.0))
        ours.append({"runtime": f"ours ({m['framework']})", "weights": f"{m['bits']}-bit",
                     "huge_pages": hp, "like_for_like": not hp,
                     "ttft_s": m.get("measured_ttft_from_open_s"), "load_s": m.get("measured_open_to_t0_s"),
                     "prefill_s": m.get("measured_ttft_s"), "ppl": m.get("ppl_packed"),
                     "ppl_sd": m.get("ppl_packed_sd"), "file_bytes": m.get("packed_file_bytes"), "run": name})
        peer.setdefault(m["peer_weight_type"], []).append((name, m))
    rows = sorted(ours, key=lambda r: (r["weights"], r["huge_pages"], r["run"]))
    for wt, ms in sorted(peer.items()):
        med = lambda k: statistics.median([m[k] for _, m in ms]) if all(k in m for _, m in ms) else None  # noqa: E731
        rows.append({"runtime": "llama.cpp", "weights": wt, "huge_pages": False, "like_for_like": wt in LIKE_FORMATS,
                     "ttft_s": med("peer_ttft_s"), "load_s": med("peer_load_s"), "prefill_s": med("peer_prefill_s"),
                     "ppl": med("peer_ppl"), "ppl_sd": med("peer_ppl_sd"), "file_bytes": ms[0][1]["peer_file_bytes"],
                     "run": " ".join(n for n, _ in ms)})
    return rows


def _fmt(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:.3f}"
    return str(v)


def table_csv(rows: list[dict[str, Any]]) -> str:
    return ",".join(COLUMNS) + "\n" + "".join(",".join(_fmt(r[c]) for c in COLUMNS) + "\n" for r in rows)


def table_md(rows: list[dict[str, Any]]) -> str:
    """Markdown: TTFT from the open and its two parts (ours: open -> t0 set-up, t0 -> first token; llama.cpp:
    `Llama()`, prompt eval + argmax); perplexity mean ± sd over the slices. All measured."""
    head = ["runtime", "weights", "huge pages", "like for like", "TTFT s (from open)",
            "set-up to t0 (ours) / Llama() (llama.cpp) s", "t0 to token (ours) / prompt eval (llama.cpp) s",
            "perplexity (± sd)", "file MB"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        ppl = "" if r["ppl"] is None else f"{r['ppl']:.2f} ± {r['ppl_sd'] or 0:.2f}"
        mb = "" if r["file_bytes"] is None else f"{r['file_bytes'] / 1e6:.0f}"
        lines.append("| " + " | ".join([r["runtime"], r["weights"], _fmt(r["huge_pages"]), _fmt(r["like_for_like"]),
                                        _fmt(r["ttft_s"]), _fmt(r["load_s"]), _fmt(r["prefill_s"]), ppl, mb]) + " |")
    return "\n".join(lines) + "\n"


def figure(rows: list[dict[str, Any]], path: Path) -> None:
    """TTFT (from the open) against perplexity, one point per row; like-for-like rows filled, others hollow."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from quant.atomic import atomic_open

    fig, ax = plt.subplots(figsize=(6, 4))
    for r in rows:
        if r["ttft_s"] is None or r["ppl"] is None:
            continue
        c = "tab:blue" if r["runtime"].startswith("ours") else "tab:red"
        ax.scatter([r["ttft_s"]], [r["ppl"]], s=40, color=c if r["like_for_like"] else "none", edgecolors=c)
        ax.annotate(f"{r['weights']}{' THP' if r['huge_pages'] else ''}", (r["ttft_s"], r["ppl"]),
                    textcoords="offset points", xytext=(4, 3), fontsize=7)
    ax.set_xlabel("cold TTFT from the file's open, s (measured)")
    ax.set_ylabel("perplexity on the evaluation slices")
    ax.set_title("ours (blue) vs llama.cpp (red); filled = like for like", fontsize=9)
    fig.tight_layout()
    with atomic_open(path) as f:
        fig.savefig(f, format="png", dpi=120)
    plt.close(fig)


def write_peer_table(out: Path, runs: list[tuple[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    """peer_table.csv / .md / .png in `out` from validate runs with the peer; [] (nothing written) without any."""
    rows = peer_rows(runs)
    if rows:
        atomic_write_text(out / "peer_table.csv", table_csv(rows))
        atomic_write_text(out / "peer_table.md", table_md(rows))
        figure(rows, out / "peer_table.png")
    return rows


def ratio_like_for_like(rows: list[dict[str, Any]]) -> list[tuple[str, str, float]]:
    """(our weights, llama.cpp format, llama.cpp TTFT / ours) for every like-for-like pair (ours without huge
    pages against Q8_0 / Q4_0 / Q4_K_M)."""
    ours = [r for r in rows if r["runtime"].startswith("ours") and r["like_for_like"] and r["ttft_s"]]
    peers = [r for r in rows if r["runtime"] == "llama.cpp" and r["like_for_like"] and r["ttft_s"]]
    return [(o["weights"], p["weights"], p["ttft_s"] / o["ttft_s"]) for o in ours for p in peers]
