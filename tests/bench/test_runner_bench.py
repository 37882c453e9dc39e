"""Host HIL runner benchmark (`make bench`): measured cold TTFT of SmolLM2-135M, EdgeFlow 5 bits (fast quantizer
settings), for 16 / 64 / 128-token prompts, with the plans of EdgeFlow and the llama.cpp / MNN / llm.npu+ policies
(built on the xiaomi15pro profile with its NPU graph durations zeroed: this host has no NPU graph; the NPU queue runs
on the runner's NPU stand-in thread). Median of 3 cold runs (file evicted from the page cache before each), per-phase
spans (hil.runner_report). Every run's logits must equal, bit for bit, the same forward computed op by op with the
runner's native kernels (hil.native_forward). Every plan runs with the runner's fresh memory on 4 KiB pages and on
transparent huge pages (hil.runner_state.huge_pages), alternately, and the table gives the ratio of the two medians
(the baseline is the 4 KiB run of the same plan, same session). Prints a table, writes outputs/bench/runner.json
(every number measured).
"""
from __future__ import annotations

import functools
import statistics

import numpy as np
import pytest

from hil.native_forward import native_last_logits
from hil.runner import run_plan
from hil.runner_report import phase_summary
from hil.runner_state import huge_pages
from native.compute import aligned
from quant.atomic import atomic_write_json
from quant.packed_forward import read_model
from tests.conftest import REPO
from tests.hil.test_runner import smol_pack  # noqa: F401  (session fixture: the packed SmolLM2)
from tests.hil.tinymodel import bound_plan
from tests.quant.conftest import needs_model

pytestmark = pytest.mark.bench

FRAMEWORKS = ("edgeflow", "llamacpp", "mnn", "llmnpu_plus")
PROMPTS = (16, 64, 128)
REPEATS = 3


@needs_model
def test_runner_cold_ttft(smol_pack):  # noqa: F811
    from quant.evaluate import eval_text_tokens

    spec, path = smol_pack
    pm = read_model(path)
    rows = []
    for T in PROMPTS:
        toks = eval_text_tokens(spec, T, 5000)
        want = native_last_logits(pm, spec, toks)        # the same forward with the runner's kernels: bit-exact
        for fw in FRAMEWORKS:
            plan = bound_plan(fw, spec, path, T)
            runs: dict[bool, list] = {False: [], True: []}
            for _ in range(REPEATS):
                for huge in (False, True):                     # alternately: both see the same host conditions
                    with huge_pages(huge):
                        r = run_plan(plan, path, toks, spec=spec)
                    assert r.resident_before == 0.0 and np.array_equal(r.logits, want), (fw, T, huge)
                    runs[huge].append(phase_summary(plan, r.timeline))
            for huge in (False, True):
                med = sorted(runs[huge], key=lambda x: x["ttft_s"])[REPEATS // 2]
                rows.append({"framework": fw, "prompt_tokens": T, "huge_pages": huge, **med,
                             "ttft_all_s": [x["ttft_s"] for x in runs[huge]],
                             "ttft_median_s": statistics.median(x["ttft_s"] for x in runs[huge])})
    print(f"\nSmolLM2-135M EdgeFlow 5 b, cold TTFT on this host (measured; median of {REPEATS})")
    print(f"{'framework':<13}{'T':>5}{'pages':>7}{'TTFT s':>9}{'load s':>15}{'unpack s':>15}{'prefill s':>15}"
          f"{'stolen':>8}{'4K/huge':>9}")

    def span(r, ph):
        return f"{r[ph + '_start_s']:.3f}-{r[ph + '_end_s']:.3f}" if ph + "_start_s" in r else "-"

    base = {(r["framework"], r["prompt_tokens"]): r["ttft_median_s"] for r in rows if not r["huge_pages"]}
    for r in rows:
        key = (r["framework"], r["prompt_tokens"])
        r["speedup_vs_4k"] = base[key] / r["ttft_median_s"]
        print(f"{r['framework']:<13}{r['prompt_tokens']:>5}{'huge' if r['huge_pages'] else '4K':>7}"
              f"{r['ttft_median_s']:>9.3f}{span(r, 'load'):>15}{span(r, 'unpack'):>15}{span(r, 'prefill'):>15}"
              f"{int(r['stolen_ops']):>8}{r['speedup_vs_4k']:>8.2f}x")
    atomic_write_json(REPO / "outputs" / "bench" / "runner.json",
                      {"model": spec.name, "bits": 5, "repeats": REPEATS, "measured": True,
                       "device_plan": "xiaomi15pro, NPU graph durations zeroed", "rows": rows,
                       "bytes_read": int(np.median([r["bytes_read"] for r in rows]))})


_at_16 = functools.partial(aligned, offset=16)    # 16 B past a cache line: where malloc's alignment often put a buffer


@needs_model
def test_runner_operand_alignment(smol_pack, monkeypatch):  # noqa: F811
    """Cold TTFT with the runner's compute buffers on cache lines (hil.runner_state via native.compute.aligned) and
    the same buffers at +16 B, runs alternating (same host conditions), 128-token prompt, median of 5 each; logits
    bit-exact in both. Writes outputs/bench/runner_alignment.json (measured)."""
    import hil.runner_state as rsm
    from quant.evaluate import eval_text_tokens

    spec, path = smol_pack
    T, reps = 128, 5
    toks = eval_text_tokens(spec, T, 5000)
    want = native_last_logits(read_model(path), spec, toks)
    rows = []
    for fw in ("edgeflow", "llamacpp"):
        plan = bound_plan(fw, spec, path, T)
        ttft: dict[str, list[float]] = {"aligned": [], "+16 B": []}
        for k in range(2 * reps + 2):                      # the first pair warms up, not counted
            name = "aligned" if k % 2 == 0 else "+16 B"
            monkeypatch.setattr(rsm, "_al", aligned if name == "aligned" else _at_16)
            r = run_plan(plan, path, toks, spec=spec)
            assert np.array_equal(r.logits, want), (fw, name)
            if k >= 2:
                ttft[name].append(r.timeline.end_s)
        med = {n: statistics.median(v) for n, v in ttft.items()}
        rows.append({"framework": fw, "prompt_tokens": T, "ttft_median_s": med, "ttft_all_s": ttft,
                     "misaligned_x_aligned": med["+16 B"] / med["aligned"]})
        print(f"\n{fw:10s} {T} tokens: cold TTFT aligned {med['aligned'] * 1e3:.1f} ms, +16 B "
              f"{med['+16 B'] * 1e3:.1f} ms (x{med['+16 B'] / med['aligned']:.2f}; measured, median of {reps})")
    atomic_write_json(REPO / "outputs" / "bench" / "runner_alignment.json",
                      dict(what="runner cold TTFT, compute buffers 64-B aligned vs at +16 B (measured)", rows=rows,
                           measured_keys=["rows"]))
