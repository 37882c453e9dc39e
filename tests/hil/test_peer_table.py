"""The peer table (experiments.peer_table) from validate metrics: which rows are like for like, which clock each row
uses, and the files it writes. Needs no llama.cpp: the metrics are given."""
from __future__ import annotations

import csv

import pytest

from experiments.peer_table import peer_rows, ratio_like_for_like, write_peer_table


def _m(hp: bool, wt: str, ours: float, peer: float) -> dict:
    return {"framework": "edgeflow", "model": "m", "bits": 5, "prompt_tokens": 16, "huge_pages": float(hp),
            "predicted_ttft_s": 0.2, "measured_ttft_s": ours - 0.05,
            "measured_open_to_t0_s": 0.05, "measured_ttft_from_open_s": ours, "packed_file_bytes": 90_000_000,
            "ppl_packed": 18.0, "ppl_packed_sd": 1.0, "peer_weight_type": wt, "peer_ttft_s": peer,
            "peer_load_s": peer / 2, "peer_prefill_s": peer / 2, "peer_ppl": 17.5, "peer_ppl_sd": 0.9,
            "peer_file_bytes": 145_000_000}


def test_like_for_like_rows_are_ours_without_huge_pages_against_fast_formats():
    runs = [("a", _m(True, "Q8_0", 0.2, 0.4)), ("b", _m(False, "Q8_0", 0.25, 0.6)), ("c", _m(False, "Q4_1", 0.25, 0.5)),
            ("d", {"framework": "edgeflow", "measured_ttft_s": 0.1})]           # no peer: no row
    rows = peer_rows(runs)
    ours = [r for r in rows if r["runtime"].startswith("ours")]
    assert [(r["run"], r["like_for_like"]) for r in ours] == [("b", True), ("c", True), ("a", False)]
    assert all(r["ttft_s"] == runs[i][1]["measured_ttft_from_open_s"] for i, r in
               zip((1, 2, 0), ours))                                           # the clock from the open
    peer = {r["weights"]: r for r in rows if r["runtime"] == "llama.cpp"}
    assert peer["Q8_0"]["ttft_s"] == pytest.approx(0.5) and peer["Q8_0"]["like_for_like"]   # median of a and b
    assert not peer["Q4_1"]["like_for_like"]                     # no fast x86 prefill kernel in llama.cpp
    assert sorted(round(x, 6) for _, _, x in ratio_like_for_like(rows)) == [2.0, 2.0]


def test_write_peer_table_writes_csv_md_and_figure(tmp_path):
    rows = write_peer_table(tmp_path, [("b", _m(False, "Q4_0", 0.25, 0.6))])
    assert len(rows) == 2
    got = list(csv.DictReader((tmp_path / "peer_table.csv").open()))
    assert [g["runtime"] for g in got] == ["ours (edgeflow)", "llama.cpp"] and got[1]["weights"] == "Q4_0"
    assert "17.50 ± 0.90" in (tmp_path / "peer_table.md").read_text()
    assert (tmp_path / "peer_table.png").read_bytes()[:4] == b"\x89PNG"
    assert write_peer_table(tmp_path / "none", [("d", {"measured_ttft_s": 0.1})]) == []


def test_report_puts_peer_runs_on_their_own_page_with_the_like_for_like_summary(tmp_path):
    from experiments.report import Run, page_summary, pages_for

    machine = {"cpu_model": "Test CPU", "family": 6, "model": 85}
    runs = [Run(tmp_path / n, "experiments.validate", f"python -m experiments.validate {n}", [], m, machine=machine)
            for n, m in (("b", _m(False, "Q8_0", 0.25, 0.5)), ("a", _m(True, "Q8_0", 0.2, 0.5)))]
    runs.append(Run(tmp_path / "h", "experiments.validate", "python -m experiments.validate", [],
                    {"framework": "edgeflow", "model": "m", "bits": 5, "prompt_tokens": 16, "measured_ttft_s": 0.1,
                     "predicted_ttft_s": 0.1, "ttft_error_pct": 0.0}, machine=machine))
    pages = {p.topic.split("-")[0]: p for p in pages_for(runs)}
    assert set(pages) == {"host", "peer"}
    peer = pages["peer"]
    assert len(peer.table) == 3 and "ours 5-bit vs Q8_0: 2.00×" in page_summary(peer.markdown)


def test_sweep_callback_writes_the_peer_table_in_the_sweep_dir(tmp_path):
    import json

    from omegaconf import OmegaConf

    from experiments.validate import SpeedupCallback

    for name, m in (("0_a", _m(False, "Q4_0", 0.25, 0.5)), ("1_b", _m(True, "Q4_0", 0.2, 0.6))):
        (tmp_path / name).mkdir()
        (tmp_path / name / "metrics.json").write_text(json.dumps(m))
    SpeedupCallback().on_multirun_end(OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path)}}}))
    got = list(csv.DictReader((tmp_path / "peer_table.csv").open()))
    assert [(g["runtime"], g["huge_pages"]) for g in got] == [("ours (edgeflow)", "no"), ("ours (edgeflow)", "yes"),
                                                              ("llama.cpp", "no")]
    assert float(got[2]["ttft_s"]) == pytest.approx(0.55)


@pytest.mark.slow
def test_validate_with_the_peer_records_both_clocks_and_both_perplexities(tmp_path):
    import json
    import subprocess
    import sys

    from hil import peer
    from tests.conftest import REPO

    if not peer.available():
        pytest.skip(peer.INSTALL_HINT)
    run = tmp_path / "run"
    r = subprocess.run([sys.executable, "-m", "experiments.validate", "peer=llamacpp", "peer_gguf=q8_0",
                        "quick_profile=true", "quant=fast", "prompt_tokens=16", "repeats=1", "warmup=0",
                        "huge_pages=false", f"device.store={tmp_path / 'store'}", f"hydra.run.dir={run}"],
                       cwd=REPO, capture_output=True, text=True, timeout=1800)
    assert r.returncode == 0, r.stderr[-3000:]
    m = json.loads((run / "metrics.json").read_text())
    assert m["speedup_vs_peer"] == pytest.approx(m["peer_ttft_s"] / m["measured_ttft_from_open_s"])
    assert m["measured_ttft_from_open_s"] > m["measured_ttft_s"] and m["huge_pages"] == 0.0
    assert 0 < m["peer_perf_prompt_eval_s"] and m["peer_perf_load_s"] + m["peer_perf_prompt_eval_s"] <= m["peer_ttft_s"]
    assert all(1 < m[k] < 1e4 for k in ("peer_ppl", "ppl_packed")) and m["ppl_slices"] >= 1
    assert m["predicted_peer_ttft_s"] > 0 and "predicted_peer_ttft_s" in m["modelled_keys"]   # the llama.cpp policy
    assert m["peer_ttft_error_pct"] == pytest.approx(100 * (m["predicted_peer_ttft_s"] / m["peer_ttft_s"] - 1))
    rows = list(csv.DictReader((run / "peer_table.csv").open()))
    assert [(x["runtime"], x["weights"], x["like_for_like"]) for x in rows] == [
        ("ours (edgeflow)", f"{m['bits']}-bit", "yes"), ("llama.cpp", "Q8_0", "yes")]
