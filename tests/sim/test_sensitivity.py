"""The sensitivity rows of llama.cpp's own costs on the phone (sim.coldstart.sensitivity): its fixed part transferred
from the host measurement moves llama.cpp's TTFT up by that time and nothing else; the repack rate moves nothing for
the phone figures' Q8_0 file because of the format (the same rate repacks a Q4_0 file); the rows reach the generated
page (experiments.coldstart_sensitivity -> experiments.report)."""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import pytest

from experiments import report
from planner.framework import FrameworkSpec
from planner.peer_costs import NO_PEER_COSTS
from planner.pipeline.cpu_plan import build_llamacpp_plan
from sim.coldstart import sensitivity as sens
from sim.coldstart.run import ColdStartSettings, run_one
from sim.coldstart.sweep import load_conf
from tests.conftest import REPO
from tests.sim.helpers import llama, xiaomi

ENV = {**os.environ, "PYTHONPATH": str(REPO)}


@pytest.fixture(scope="module")
def rows():
    return sens.table(frameworks=("llamacpp", "edgeflow"), workloads=("lambada",), parameters=("llamacpp",))


def test_fixed_part_is_the_host_measurement_scaled_by_clock():
    dev = xiaomi()
    assert not hasattr(dev, "llamacpp_fixed_s")         # not the phone's: llama.cpp's own costs (planner.peer_costs)
    assert sens.phone_llamacpp_fixed_s(dev) == pytest.approx(0.0554 * 2.596 / 4.32)
    names = [v[0] for v in sens.variants("xiaomi15pro")]
    assert names[-4:] == ["llamacpp_fixed_s (host, clock-scaled)"] * 3 + ["llamacpp_repack_gbps"]


def test_fixed_part_raises_llamacpp_ttft_by_its_time_and_leaves_edgeflow(rows):
    base = rows[0]
    assert base["parameter"] == "(default)" and base["prompt_tokens"] == 78
    fixed = [r for r in rows if r["parameter"].startswith("llamacpp_fixed_s")]
    assert [r["variant"].split("x:")[0] for r in fixed] == ["0.5", "1", "2"]
    t = sens.phone_llamacpp_fixed_s(xiaomi())
    for f, r in zip((0.5, 1.0, 2.0), fixed):
        assert r["llamacpp"] - base["llamacpp"] == pytest.approx(f * t, rel=1e-6)     # serial before everything
        assert r["edgeflow"] == base["edgeflow"]
    assert base["llamacpp"] < fixed[0]["llamacpp"] < fixed[1]["llamacpp"] < fixed[2]["llamacpp"]


def test_repack_row_is_zero_for_q8_0_because_of_the_format(rows):
    (rep,) = [r for r in rows if r["parameter"] == "llamacpp_repack_gbps"]
    assert "Q8_0: no repack layout" in rep["variant"]
    assert rep["llamacpp"] == rows[0]["llamacpp"] and rep["edgeflow"] == rows[0]["edgeflow"]
    fw = load_conf("framework", "llamacpp", FrameworkSpec)
    assert fw.weight_type == "Q8_0" and "Q8_0" not in sens.GGML_REPACK_ARM_0_3_16
    transform = next(t for k, _, t in sens.variants("xiaomi15pro") if k == "llamacpp_repack_gbps")
    dev, _, peers = transform(xiaomi(), fw, NO_PEER_COSTS)
    assert dev == xiaomi() and peers.llamacpp_repack_gbps == xiaomi().cpu_copy_gbps
    assert build_llamacpp_plan(llama(), dev, fw, 78, 5.0, peers=peers).info["repack_bytes"] == 0
    q4 = dataclasses.replace(fw, weight_type="Q4_0")          # the mechanism is live for a repacked type
    assert build_llamacpp_plan(llama(), dev, q4, 78, 5.0, peers=peers).info["repack_bytes"] > 0
    s = ColdStartSettings(prompt_tokens=78, write_trace=False)
    assert run_one(llama(), dev, q4, None, s, peers)[0]["ttft_s"] > run_one(llama(), dev, q4, None, s)[0]["ttft_s"]


def test_markdown_shows_the_change_and_the_speedup(rows):
    md = sens.markdown(rows)
    head = md.splitlines()[0]
    assert head.endswith("| edgeflow speed-up over llamacpp |")
    line = next(ln for ln in md.splitlines() if "| 2x:" in ln)
    b, r = rows[0], next(r for r in rows if r["variant"].startswith("2x:"))
    assert f"{b['llamacpp'] / b['edgeflow']:.2f}x -> {r['llamacpp'] / r['edgeflow']:.2f}x" in line
    assert f"({100 * (r['llamacpp'] / b['llamacpp'] - 1):+.1f} %)" in line and "lambada (78 tok)" in line


def test_app_run_becomes_the_sensitivity_page(tmp_path):
    out = tmp_path / "run"
    r = subprocess.run([sys.executable, "-m", "experiments.coldstart_sensitivity", "--out", str(out), "--model",
                        "qwen1_5_1_8b", "--frameworks", "llamacpp,edgeflow", "--workloads", "lambada",
                        "--parameters", "llamacpp"], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                       env=ENV)
    assert r.returncode == 0, r.stderr[-2000:]
    (page,) = report.pages_for(report.load_runs([out]))
    assert page.topic == "coldstart-sensitivity"
    m = json.loads((out / "metrics.json").read_text())
    assert report.page_summary(page.markdown).count("| llamacpp_fixed_s") == 3
    assert len(page.table) == len(m["sensitivity_rows"]) == 5
    man = json.loads((out / "manifest.json").read_text())
    assert man["app"] == "experiments.coldstart_sensitivity" and f"`{man['command']}`" in page.markdown


def test_app_bad_argument_is_one_line_exit_2(tmp_path):
    r = subprocess.run([sys.executable, "-m", "experiments.coldstart_sensitivity", "--out", str(tmp_path / "x"),
                        "--frameworks", "llamacpp,nope"], capture_output=True, text=True, cwd=tmp_path,
                       env=ENV)
    assert r.returncode == 2 and "--frameworks: unknown nope" in r.stderr and not (tmp_path / "x").exists()
