"""Results pages (experiments.report): the apps record a manifest, the generator builds pages from real run
directories made at toy size, and the README's results blocks are exactly what the generator makes of the committed
pages in docs/results/ (a hand edit of either fails here)."""
from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys

import pytest

from experiments import report
from tests.conftest import REPO

ENV = {**os.environ, "PYTHONPATH": str(REPO)}


def _app(tmp_path, *args: str) -> None:
    r = subprocess.run([sys.executable, "-m", *args], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                       env=ENV)
    assert r.returncode == 0, r.stderr[-2000:]


def _is_a_commit_of_this_history(commit: str | None) -> bool:
    """True when `commit` is HEAD or one of its ancestors (other work may commit while a test runs); with no git
    checkout the manifest has None."""
    r = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True)
    if r.returncode != 0:
        return commit is None
    return bool(commit) and subprocess.run(["git", "-C", str(REPO), "merge-base", "--is-ancestor", commit, "HEAD"],
                                           capture_output=True).returncode == 0


@pytest.fixture(scope="module")
def coldstart_sweep(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cs")
    _app(tmp, "experiments.coldstart", "-m", "model=smollm2_135m", "framework=mnn,edgeflow",
         "workload=lambada,mmlu", "write_trace=false", "hydra.launcher.n_jobs=1", f"hydra.sweep.dir={tmp / 'sweep'}")
    return tmp / "sweep"


def test_every_run_dir_gets_a_manifest_with_a_command_that_names_its_job(coldstart_sweep):
    runs = report.load_runs([coldstart_sweep])
    assert len(runs) == 4
    for r in runs:
        man = json.loads((r.dir / "manifest.json").read_text())
        assert man["app"] == "experiments.coldstart" and _is_a_commit_of_this_history(man["commit"])
        assert man["dirty"] in (True, False) and man["finished_utc"].endswith("Z")
        assert man["machine"]["logical_cores"] == os.cpu_count() and len(man["machine"]["id_hash"]) == 16
        fw, wl = r.metrics["framework"], r.metrics["workload"]
        assert man["command"].startswith("python -m experiments.coldstart ")
        assert f"framework={fw}" in man["command"] and f"workload={wl}" in man["command"]
        assert "," not in man["command"] and "hydra." not in man["command"]      # one job, no sweep lists


def test_coldstart_page_pivots_ttft_per_framework_and_workload(coldstart_sweep, tmp_path):
    (page,) = report.pages_for(report.load_runs([coldstart_sweep]))
    assert page.topic == "coldstart"
    md, csv_path = report.write_page(page, tmp_path)
    text = md.read_text()
    summary = report.page_summary(text)
    assert "| framework | lambada (" in summary and "mmlu (" in summary
    runs = {(r.metrics["framework"], r.metrics["workload"]): r.metrics["ttft_s"]
            for r in report.load_runs([coldstart_sweep])}
    edgeflow_row = next(ln for ln in summary.splitlines() if ln.startswith("| edgeflow |"))
    assert f"{runs['edgeflow', 'lambada']:.2f}" in edgeflow_row and f"{runs['edgeflow', 'mmlu']:.2f}" in edgeflow_row
    rows = list(csv.DictReader(csv_path.open()))
    assert len(rows) == 4 and {float(r["ttft_s"]) for r in rows} == set(runs.values())
    commit = json.loads(next(coldstart_sweep.rglob("manifest.json")).read_text())["commit"]
    assert f"`{commit}`" in text and "## Manifest" in text
    assert "python -m experiments.coldstart -m model=smollm2_135m framework=mnn,edgeflow" in text   # the invocation


def test_a_run_dir_without_manifest_rebuilds_its_command_and_says_what_is_unknown(coldstart_sweep, tmp_path):
    job = sorted(p.parent for p in coldstart_sweep.rglob("metrics.json"))[0]
    old = tmp_path / job.name
    shutil.copytree(job, old)
    (old / "manifest.json").unlink()
    (r,) = report.load_runs([old])
    assert r.app == "experiments.coldstart" and r.commit is None
    assert f"framework={r.metrics['framework']}" in r.command
    text = report.pages_for([r])[0].markdown
    assert "unknown (run directories without manifest.json)" in text


def test_multidevice_page_from_a_toy_run(tmp_path):
    for planner in ("voltron", "mp"):
        _app(tmp_path, "experiments.multidevice", "cluster=home", "model=qwen2_5_3b", f"planner={planner}",
             "turns=1", "workload.max_out=16", "timeline=false", f"hydra.run.dir={tmp_path / planner}")
    (page,) = report.pages_for(report.load_runs([tmp_path / "voltron", tmp_path / "mp"]))
    assert page.topic == "multidevice" and list(page.table["planner"]) == ["mp-hetero", "voltron"]
    summary = report.page_summary(page.markdown)
    m = json.loads((tmp_path / "voltron" / "metrics.json").read_text())
    assert f"| home | qwen2_5_3b | voltron | {m['precision']} | {m['ttft_s']:.2f} / " in summary


def test_multidevice_report_page_from_a_toy_run(tmp_path):
    _app(tmp_path, "experiments.multidevice_report", "--out", str(tmp_path / "md"), "--turns", "1",
         "--clusters", "office", "--families", "qwen2_5", "--only", "qos,equal_split,latency")
    (page,) = report.pages_for(report.load_runs([tmp_path / "md"]))
    assert page.topic == "multidevice-report"
    m = json.loads((tmp_path / "md" / "metrics.json").read_text())["sections"]
    assert sorted(m) == ["equal_split", "latency", "qos"] and len(m["qos"]) == 4 and len(m["equal_split"]) == 5
    v = next(r for r in m["qos"] if r["planner"] == "voltron")
    row = next(ln for ln in page.markdown.splitlines() if ln.startswith("| office | qwen2_5 | voltron |"))
    assert f"| {v['model']} |" in row and f"| {v['ttft_s']:.2f} / {v['ttft_s_max']:.2f} |" in row
    met = sum(bool(r["qos_met"]) for r in m["qos"] if r["planner"] == "voltron")
    assert f"voltron {met}/1" in report.page_summary(page.markdown)
    assert "## Planner prediction error" in page.markdown and "## Latency-regression accuracy" in page.markdown
    assert "## Energy mode" not in page.markdown                    # a section the run did not make
    assert list(page.table["table"]).count("qos") == 4 and list(page.table["table"]).count("latency") == 3
    man = json.loads((tmp_path / "md" / "manifest.json").read_text())
    assert man["app"] == "experiments.multidevice_report" and _is_a_commit_of_this_history(man["commit"])
    assert man["command"].endswith("--families qwen2_5 --only qos,equal_split,latency")
    assert f"`{man['command']}`" in page.markdown and man["machine"]["id_hash"] in page.markdown


def test_multidevice_report_bad_argument_is_one_line_exit_2(tmp_path):
    r = subprocess.run([sys.executable, "-m", "experiments.multidevice_report", "--out", str(tmp_path / "x"),
                        "--only", "qos,nope"], capture_output=True, text=True, env=ENV, cwd=tmp_path)
    assert r.returncode == 2 and "--only: unknown nope" in r.stderr and not (tmp_path / "x").exists()


def _fake_validate_run(root, name, kind_sig, framework, predicted, runs):
    """A validate run directory as the app writes it (metrics.json keys and runs.csv of experiments.validate). The
    app itself is not run here: it times the host (its own tests run it); this checks the page generator on its
    output format."""
    import statistics

    from experiments.common import run_manifest

    d = root / name
    d.mkdir(parents=True)
    med = statistics.median(runs)
    m = {"framework": framework, "model": "smollm2_135m", "device": "host", "bits": 5, "prompt_tokens": 16,
         "repeats": len(runs), "predicted_ttft_s": predicted, "measured_ttft_s": med, "measured_ttft_min_s": min(runs),
         "measured_ttft_max_s": max(runs), "ttft_error_pct": 100 * (predicted - med) / med,
         "measured_keys": ["measured_ttft_s", "measured_ttft_min_s", "measured_ttft_max_s", "ttft_error_pct"],
         "modelled_keys": ["predicted_ttft_s"], "input_keys": ["bits", "prompt_tokens", "repeats"]}
    (d / "metrics.json").write_text(json.dumps(m))
    (d / "runs.csv").write_text("run,measured_ttft_s,measured_load_s\n" +
                                "".join(f"{k},{t},0.01\n" for k, t in enumerate(runs)))
    man = run_manifest()
    man.update(app="experiments.validate", command=f"python -m experiments.validate framework={framework}",
               machine={**man["machine"], "cpu_model": "Test CPU", "cpu_signature": kind_sig})
    (d / "manifest.json").write_text(json.dumps(man))
    return d


def test_host_pages_one_per_machine_kind_judged_on_pooled_runs(tmp_path):
    dirs = [_fake_validate_run(tmp_path, "a", "V/25/17/1", "edgeflow", 0.105, [0.095, 0.100, 0.120]),   # +5 %
            _fake_validate_run(tmp_path, "b", "V/25/17/1", "edgeflow", 0.105, [0.090, 0.110, 0.100]),   # +5 %
            _fake_validate_run(tmp_path, "c", "V/25/17/1", "mnn", 0.150, [0.200, 0.210, 0.230]),        # -28.6 %
            _fake_validate_run(tmp_path, "d", "V/26/2/0", "edgeflow", 0.100, [0.100, 0.100, 0.100])]
    pages = {p.topic: p for p in report.pages_for(report.load_runs(dirs))}
    assert sorted(pages) == ["host-test-cpu-family-25-model-17", "host-test-cpu-family-26-model-2"]
    text = pages["host-test-cpu-family-25-model-17"].markdown
    assert "Test CPU family 25 model 17" in text
    summary = report.page_summary(text)
    assert "Set of 2: bias " in summary and "1 over / 1 under" in summary
    # edgeflow: 6 runs pooled, median 0.100 (runs 0.090 … 0.120), predicted 0.105: +5 %, inside its interval
    assert "| edgeflow | smollm2_135m | 5 | 16 | 2 | 6 | 0.105 | 0.100 [" in text
    row = next(ln for ln in text.splitlines() if ln.startswith("| edgeflow | smollm2_135m | 5 | 16 | 2 | 6 |"))
    assert "| +5.0 % | yes |" in row and row.endswith("| 2 | yes |")
    # mnn: every run above 0.2 s, predicted 0.150: outside any interval of the pooled median
    row = next(ln for ln in text.splitlines() if ln.startswith("| mnn | smollm2_135m | 5 | 16 | 1 | 3 |"))
    assert "0.210 [" in row and "| -28.6 % | no |" in row
    assert "| edgeflow | 1 | 2 | 1 | +5.0 % (+5.0 % … +5.0 %) | 2 |" in summary
    with pytest.raises(report.ReportError, match="--topic: the runs make 2 pages"):
        report.pages_for(report.load_runs(dirs), topic="host")


def test_bad_input_is_one_line_exit_2(tmp_path):
    r = subprocess.run([sys.executable, "-m", "experiments.report", str(tmp_path / "nope")], capture_output=True,
                       text=True, env=ENV, cwd=REPO)
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0 and "is not a directory" in r.stderr
    with pytest.raises(report.ReportError, match="--topic"):
        report.pages_for([], topic="../x")


def test_readme_blocks_are_generated_from_the_committed_pages():
    text = (REPO / "README.md").read_text()
    blocks = report.BLOCK_RE.findall(text)
    assert blocks, "README.md has no <!-- results: … --> blocks"
    assert report.refresh_readme(text) == text, \
        "README results blocks differ from docs/results/: run `python -m experiments.report --readme`"


def test_committed_pages_are_generated_pages():
    pages = sorted(report.RESULTS_DIR.glob("*.md"))
    assert pages
    for p in pages:
        text = p.read_text()
        assert text.startswith(report.HEADER) and report.page_summary(text)
        assert (p.with_suffix(".csv")).is_file(), f"{p.name}: its CSV is missing"


def test_refresh_replaces_a_hand_edit(tmp_path):
    (tmp_path / "x.md").write_text(f"{report.HEADER}\n# X\n\n{report.SUMMARY_BEGIN}\n| a |\n|---|\n| 1 |\n"
                                   f"{report.SUMMARY_END}\n")
    edited = "intro\n<!-- results: x -->\n| a |\n|---|\n| 2 |\n<!-- /results -->\nend\n"
    out = report.refresh_readme(edited, tmp_path)
    assert "| 1 |" in out and "| 2 |" not in out and out.startswith("intro\n") and out.endswith("end\n")
    assert "No page yet" in report.refresh_readme("<!-- results: host-* -->\n<!-- /results -->\n", tmp_path)


def test_one_value_within_all_invocations_only_when_their_spread_allows_it():
    import pandas as pd

    def cfg(measured):
        return pd.DataFrame({"framework": "edgeflow", "model": "m", "bits": 5.0, "prompt_tokens": 16,
                             "predicted_ttft_s": 0.1, "measured_ttft_s": measured,
                             "ttft_error_pct": [100 * (0.1 - m) / m for m in measured],
                             "run_ttfts_s": [json.dumps([m]) for m in measured]})

    assert report.host_configurations(cfg([0.100, 0.122]))["one value within all"][0] == "yes"   # 1.22 ≤ 1.1 / 0.9
    assert report.host_configurations(cfg([0.100, 0.123]))["one value within all"][0] == "no"
