"""llama.cpp as a peer (docs/hil.md, "Synthetic 1B model and the llama.cpp peer"): its cold TTFT on this host for the
models our runner (hil) executes, with the same prompt token ids and the same page-cache eviction, for the same-run
comparison of EdgeFlow §6 (cold start vs llama.cpp).

Rows: SmolLM2-135M Q4_1 (the shipped GGUF, byte-identical private copy: pages another process maps cannot be
evicted) and Q8_0 (requantized with llama_model_quantize, cached), the synthetic
~1B Llama (quant.synth) Q8_0 and Q4_1, each at 16 / 64 / 128 prompt tokens (hil.peer.bench_prompt); 2 threads;
REPEATS cold runs per row, round-robin over the rows so that interference from other work on this shared host hits all
alike. Writes outputs/bench/peer.json and peer.csv (every number measured; join key: model, qtype, prompt_tokens).
Skipped, with the one-line install hint, without the `peer` extra.
"""
from __future__ import annotations

import csv
import io
import os
import platform
import statistics
from pathlib import Path

import pytest

from hil import peer
from quant.atomic import atomic_write_json, atomic_write_text

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "outputs" / "bench" / "peer.json"
PROMPTS = (16, 64, 128)          # prompt tokens
REPEATS = 3                      # cold runs per row
THREADS = 2                      # this host's cores


def model_files() -> list[tuple[str, str, Path]]:
    """(model, qtype, GGUF path) of every peer row; generates / requantizes what is not cached yet."""
    from quant.arch import smollm2_spec
    from quant.gguf_model import gguf_path
    from quant.synth import DEFAULT_MODEL
    from quant.synth_pack import ensure_synth

    smol = gguf_path(smollm2_spec())
    big = ensure_synth(DEFAULT_MODEL, bits=None)
    return [("smollm2_135m", "q4_1", peer.private_copy(smol)),      # the shipped file may be mapped by others
            ("smollm2_135m", "q8_0", peer.ensure_requantized(smol, "q8_0")),
            (DEFAULT_MODEL, "q8_0", big.q8_0), (DEFAULT_MODEL, "q4_1", big.q4_1)]


def _stats(xs: list[float]) -> dict:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "runs": xs}


@pytest.mark.bench
def test_llamacpp_cold_ttft():
    if not peer.available():
        pytest.skip(peer.INSTALL_HINT)
    files = model_files()
    prompts = {n: peer.bench_prompt(n) for n in PROMPTS}
    configs = [(m, q, p, n) for m, q, p in files for n in PROMPTS]
    runs: dict[tuple, list[dict]] = {c[:2] + (c[3],): [] for c in configs}
    load_avg = []
    for _ in range(REPEATS):                                  # round-robin: one cold run of every row per round
        for m, q, p, n in configs:
            load_avg.append(os.getloadavg()[0])
            runs[(m, q, n)].append(peer.llamacpp_cold_ttft(p, prompts[n], threads=THREADS, repeats=1))
    rows = []
    for (m, q, n), rs in runs.items():
        r0 = rs[0]
        row = {"model": m, "qtype": q, "prompt_tokens": n, "file": r0["file"], "file_bytes": r0["file_bytes"],
               "threads": THREADS, "repeats": len(rs), "use_mmap": r0["use_mmap"], "use_mlock": r0["use_mlock"],
               "first_token": [r["first_token"][0] for r in rs],
               "resident_before": [r["resident_before"][0] for r in rs]}    # 0.0 = started cold
        for key in ("load_s", "prefill_s", "ttft_s"):
            row[key] = _stats([r[key]["runs"][0] for r in rs])
        rows.append(row)
    result = {"measured": True, "peer": "llama.cpp", "version": peer.peer_version(),
              "host": platform.processor() or platform.machine(), "cpu_count": os.cpu_count(), "threads": THREADS,
              "repeats": REPEATS, "prompt": "first N token ids of quant.evaluate's text (hil.peer.bench_prompt)",
              "eviction": "posix_fadvise(DONTNEED) before every run (hil.pagecache.evict); resident_before == 0",
              "load_average_1min": {"min": min(load_avg), "max": max(load_avg)}, "rows": rows}
    atomic_write_json(OUT, result)
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(["model", "qtype", "prompt_tokens", "file_bytes", "load_s_median", "prefill_s_median",
                "ttft_s_median", "ttft_s_min", "ttft_s_max"])
    for r in rows:
        w.writerow([r["model"], r["qtype"], r["prompt_tokens"], r["file_bytes"], f"{r['load_s']['median']:.4f}",
                    f"{r['prefill_s']['median']:.4f}", f"{r['ttft_s']['median']:.4f}", f"{r['ttft_s']['min']:.4f}",
                    f"{r['ttft_s']['max']:.4f}"])
    atomic_write_text(OUT.with_suffix(".csv"), buf.getvalue())

    print(f"\nllama.cpp {result['version']} cold TTFT, {THREADS} threads, median (min-max) of {REPEATS}, "
          f"1-min load average {min(load_avg):.1f}-{max(load_avg):.1f} (measured)")
    print(f"{'model':20s} {'qtype':5s} {'MB':>7s} {'tok':>4s} {'load s':>7s} {'prefill s':>9s} {'TTFT s':>22s}")
    for r in rows:
        t = r["ttft_s"]
        print(f"{r['model']:20s} {r['qtype']:5s} {r['file_bytes'] / 1e6:7.1f} {r['prompt_tokens']:4d} "
              f"{r['load_s']['median']:7.3f} {r['prefill_s']['median']:9.3f} "
              f"{t['median']:7.3f} ({t['min']:.3f}-{t['max']:.3f})  resident {max(r['resident_before']):.2f}")
    warm = [(r["model"], r["qtype"], r["prompt_tokens"], max(r["resident_before"])) for r in rows
            if max(r["resident_before"]) > 0]
    if warm:                                  # another process read the file between eviction and t0
        print(f"WARNING: runs not fully cold (resident fraction at t0 > 0): {warm}")
    print(f"wrote {OUT} and {OUT.with_suffix('.csv')}")
