"""The host validate app end to end on the real SmolLM2 (docs/hil.md "Validate"): a quick host profile, the real
quantizer (fast settings), one framework plan predicted and run twice cold. Checks structure and labels, that the
runner's first token equals the NumPy reference on the same packed weights, and the trace holds both sides; no timing
thresholds (the machine is shared)."""
from __future__ import annotations

import csv
import json
import os
import subprocess
import sys

import pytest

from experiments.validate import speedup_table
from tests.conftest import REPO


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return tmp_path_factory.mktemp("hoststore")


def _validate(store, run, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "experiments.validate", "quick_profile=true", f"device.store={store}",
                           "quant=fast", "prompt_tokens=16", "repeats=2", "warmup=0", f"hydra.run.dir={run}", *args],
                          cwd=REPO, capture_output=True, text=True, timeout=900)


# the fast tier's host HIL run is EdgeFlow's; the baseline with EdgeFlow interleaved (`versus`) is a second full
# quantize + calibrate + run cycle: slow tier
@pytest.mark.parametrize("framework", ["edgeflow", pytest.param("llamacpp", marks=pytest.mark.slow)])
def test_validate_predicts_runs_and_compares(store, tmp_path, framework):
    from hil.diagnostics.schedtrace import available as tracefs_missing

    run = tmp_path / "run"
    traced = framework == "edgeflow" and tracefs_missing() is None    # root with tracefs (CI, this host)
    versus = "edgeflow" if framework == "llamacpp" else "none"   # EdgeFlow's runs interleaved with the baseline's
    r = _validate(store, run, f"framework={framework}", f"sched_trace={str(traced).lower()}", f"versus={versus}",
                  "diagnostics=true")                        # the host probes (hil.diagnostics.drift): opt-in
    assert r.returncode == 0, r.stderr[-3000:]
    m = json.loads((run / "metrics.json").read_text())
    if versus != "none":
        assert m["versus_framework"] == "edgeflow" and m["predicted_versus_ttft_s"] > 0
        assert m["measured_versus_ttft_min_s"] <= m["measured_versus_ttft_s"] <= m["measured_versus_ttft_max_s"]
        assert m["measured_versus_speedup"] == pytest.approx(m["measured_ttft_s"] / m["measured_versus_ttft_s"])
        assert "measured_versus_ttft_s" in m["measured_keys"] and "predicted_versus_speedup" in m["modelled_keys"]
        assert "interleaved" in r.stdout
    else:
        assert "versus_framework" not in m
    for ph in ("ttft_s", "load_s", "prefill_s"):
        name = ph[:-2]
        assert m[f"predicted_{ph}"] > 0 and m[f"measured_{ph}"] > 0
        assert m[f"measured_{name}_min_s"] <= m[f"measured_{ph}"] <= m[f"measured_{name}_max_s"]
        assert f"predicted_{ph}" in m["modelled_keys"] and f"measured_{ph}" in m["measured_keys"]
        want = 100 * (m[f"predicted_{ph}"] - m[f"measured_{ph}"]) / m[f"measured_{ph}"]
        assert m[f"{name}_error_pct"] == pytest.approx(want)
    # the clock a peer is compared with starts at the open: the set-up before t0 is timed and added (hil.runner)
    assert m["measured_open_to_t0_s"] > 0 and "measured_ttft_from_open_s" in m["measured_keys"]
    assert m["measured_ttft_from_open_s"] > m["measured_ttft_s"]
    assert m["logits_native_exact"] is True and m["logits_native_max_abs_diff"] == 0.0   # hil.native_forward
    assert m["logits_within_tolerance"] is True
    # same top-1 wherever the reference's own top-1 survives its 1-ulp nudge (docs/hil.md "Logits": static INT8
    # activations make the float32 forward chaotic, and for some files and prompts the reference's own top-1 flips)
    assert m["logits_top1_match"] is True or m["logits_ref_top1_stable"] is False
    assert m["logits_max_abs_diff"] <= m["logits_tolerance"] and "logits_ref_noise" in m["measured_keys"]
    # the native forward against the reference over every position of the check prompts (experiments.hostrun)
    assert m["correct_ok"] is True and m["correct_positions"] >= 64 and "correct_kl_mean" in m["measured_keys"]
    # cold on the record: the file's cached fraction at each run's start; no run left out on an idle file
    assert m["measured_resident_before_max"] == 0.0 and m["runs_excluded_warm"] == 0
    assert m["device"] == "host" and m["repeats"] == 2
    trace = json.loads((run / "trace.json").read_text())
    procs = {e["pid"]: e["args"]["name"] for e in trace["traceEvents"] if e.get("name") == "process_name"}
    assert procs[1].startswith("predicted (modelled)") and procs[2].startswith("measured")
    assert {e["pid"] for e in trace["traceEvents"] if e["ph"] == "X"} == {1, 2}
    plan = json.loads((run / "plan.json").read_text())
    assert plan["info"]["bound"] is True and plan["cpu_threads"] >= 1
    ops = list(csv.DictReader((run / "ops.csv").open()))
    loads = [r for r in ops if r["op"].startswith("load:")]
    assert loads and all(float(r["predicted_cpu_s"]) > 0 and float(r["measured_cpu_s"]) > 0 for r in loads)
    drift = {k for k in m if k.startswith("host_drift_")}        # the host now vs at calibration (diagnostics.drift)
    base = {"host_drift_gemm_pct", "host_drift_elementwise_pct", "host_drift_unpack_pct", "host_drift_first_touch_pct"}
    newer = {"host_drift_read_pct", "host_drift_read_cpu_pct"} | ({"host_drift_gemm_mt_pct"}    # 2+ CPUs: the
                                                                   if len(os.sched_getaffinity(0)) > 1 else set())
    assert drift == base | newer                                                                # 2-thread GEMM
    assert drift <= set(m["measured_keys"]) and "host since its calibration" in r.stdout
    runs = list(csv.DictReader((run / "runs.csv").open()))      # per measured run, with the host speed around it
    assert len(runs) == 2 and all(float(x["host_speed"]) > 0 for x in runs)
    assert all(x["counted"] == "true" and float(x["resident_before"]) == 0.0 for x in runs)
    ttfts = sorted(float(x["measured_ttft_s"]) for x in runs)
    assert m["measured_ttft_min_s"] == pytest.approx(ttfts[0], abs=1e-6)
    assert m["host_speed_min"] <= m["host_speed"] <= m["host_speed_max"] and "host_speed" in m["measured_keys"]
    assert "host speed during the runs" in r.stdout
    assert m["host_page_reporting"] and "guest free page reporting" in r.stdout      # hil.hostmem, what it did
    assert "host_prefault_s" in m["measured_keys"]
    # where the time goes beyond the phases: core occupancy and blocking events, modelled and measured
    assert 0 < m["predicted_core_busy_pct"] <= 100.0 + 1e-9 and 0 < m["measured_core_busy_pct"] <= 101.0
    assert m["predicted_thread_waits"] >= 0 and m["measured_thread_waits"] > 0
    assert "predicted_core_busy_pct" in m["modelled_keys"] and "measured_thread_waits" in m["measured_keys"]
    assert "cores busy until the first token" in r.stdout
    # the same plan re-simulated with its kernels at the host speed measured around the runs (planner.cost.scaled)
    assert m["predicted_at_host_speed_ttft_s"] > 0 and "predicted_at_host_speed_ttft_s" in m["modelled_keys"]
    want = 100 * (m["predicted_at_host_speed_ttft_s"] - m["measured_ttft_s"]) / m["measured_ttft_s"]
    assert m["ttft_error_at_host_speed_pct"] == pytest.approx(want)
    assert m["host_speed_elementwise"] > 0 and m["host_speed_unpack"] > 0
    if "host_drift_gemm_mt_pct" in m:               # the 2-thread GEMM's own speed (diagnostics.drift, cost.scaled)
        assert m["host_speed_gemm_mt"] > 0 and "host_speed_gemm_mt" in m["measured_keys"]
        assert "2-thread GEMM" in r.stdout
    assert m["host_speed_read"] > 0 and m["host_speed_read_cpu"] > 0 and "cold read" in r.stdout   # read probe
    assert not list(store.glob("scratch/read-*.bin"))          # the read probe's scratch file is gone
    # each run against the plan re-simulated at the speeds probed right before it: the median of the runs' errors
    pr = [float(x["predicted_at_run_speed_ttft_s"]) for x in runs]
    errs = sorted(100 * (p - float(x["measured_ttft_s"])) / float(x["measured_ttft_s"]) for p, x in zip(pr, runs))
    assert m["ttft_error_at_run_speed_pct"] == pytest.approx((errs[0] + errs[1]) / 2, abs=1e-3)
    assert m["ttft_error_at_run_speed_min_pct"] == pytest.approx(errs[0], abs=1e-3)
    assert "predicted_at_run_speed_ttft_s" in m["modelled_keys"] and "at the kernel speeds probed" in r.stdout
    # the wake-up placement probed around the runs, and the plan re-simulated with it (drift.placement_probe)
    if (os.cpu_count() or 1) > 1:
        assert 0 <= m["measured_run_pack_share"] <= 1 and m["measured_run_pack_idle_s"] >= 0
        assert "measured_run_pack_share" in m["measured_keys"]
        assert "predicted_at_run_placement_ttft_s" in m["modelled_keys"] and "wake-up placement around" in r.stdout
        want = 100 * (m["predicted_at_run_placement_ttft_s"] - m["measured_ttft_s"]) / m["measured_ttft_s"]
        assert m["ttft_error_at_run_placement_pct"] == pytest.approx(want)
    if traced:                      # one more cold run with the kernel's scheduler traced (hil.diagnostics.schedtrace)
        pcts = [m[f"measured_sched_{k}_pct"] for k in ("running", "queued", "waking", "no_work", "other")]
        assert sum(pcts) == pytest.approx(100.0) and m["measured_sched_running_pct"] > 0
        assert m["measured_sched_wakes"] > 0 and m["measured_sched_events_lost"] == 0
        assert "measured_sched_queued_pct" in m["measured_keys"] and (run / "sched.json").is_file()
        assert "scheduler traced" in r.stdout


def test_drift_is_the_change_of_the_median_probe_against_the_profile():
    from hil.diagnostics.drift import PROBES, drift_pct, probe

    now = probe(reps=3)
    multi = set() if len(os.sched_getaffinity(0)) > 1 else {"gemm_mt_s"}
    reads = {"read_s_per_byte", "read_cpu_s_per_byte"}                  # only with a scratch file (read_path)
    assert set(now) == set(PROBES) - multi - reads and all(v > 0 for v in now.values())
    ref = {"gemm_s": 2.0, "elementwise_s": 1.0}                   # a probe the profile lacks is left out
    got = drift_pct(ref, [{"gemm_s": 1.0, "elementwise_s": 1.5, "first_touch_s_per_byte": 1.0},
                          {"gemm_s": 3.0, "elementwise_s": 0.5}])
    assert got == pytest.approx({"gemm_s": 0.0, "elementwise_s": 0.0})


def test_run_speed_is_the_calibration_probe_over_the_probes_around_each_run():
    from hil.diagnostics.drift import run_speeds, speed_probe

    now = speed_probe()
    multi = {"gemm_mt_s"} if len(os.sched_getaffinity(0)) > 1 else set()     # the 2-thread GEMM: 2+ CPUs only
    assert set(now) == {"gemm_s", "elementwise_s", "unpack_s"} | multi and all(v > 0 for v in now.values())
    ref = {"gemm_s": 2.0}
    around = [{"gemm_s": 2.0}, {"gemm_s": 4.0}, {"gemm_s": 1.0}, {}]
    assert run_speeds(ref, around) == pytest.approx([2.0 / 3.0, 2.0 / 2.5, 2.0])   # the last run: one probe only
    assert run_speeds({}, around) == [None, None, None]


def test_validate_rejects_a_bad_host_memory_mode_in_one_line(tmp_path):
    r = subprocess.run([sys.executable, "-m", "experiments.validate", "host_memory=keep",
                        f"hydra.run.dir={tmp_path / 'r'}"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0 and "host_memory" in r.stderr, r.stderr


def test_validate_rejects_a_bad_huge_pages_value_in_one_line(tmp_path):
    r = subprocess.run([sys.executable, "-m", "experiments.validate", "huge_pages=maybe",
                        f"hydra.run.dir={tmp_path / 'r'}"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0 and "huge_pages" in r.stderr, r.stderr


def test_validate_rejects_a_phone_device_in_one_line(tmp_path):
    r = subprocess.run([sys.executable, "-m", "experiments.validate", "device=xiaomi15pro",
                        f"hydra.run.dir={tmp_path / 'r'}"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0 and "device" in r.stderr


def test_speedup_table_pairs_edgeflow_with_each_baseline():
    rows = [{"framework": f, "model": "m", "bits": 5, "prompt_tokens": 16, "predicted_ttft_s": p,
             "measured_ttft_s": q} for f, p, q in (("edgeflow", 1.0, 2.0), ("llamacpp", 3.0, 5.0), ("mnn", 2.0, 4.0))]
    t = speedup_table(rows)
    assert t[0][:2] == ["baseline", "model"]
    body = {r[0]: r for r in t[1:]}
    assert body["llamacpp"][4:] == [3.0, 2.5, 20.0] and body["mnn"][4:] == [2.0, 2.0, 0.0]


def test_speedup_table_takes_interleaved_runs_when_a_row_has_them():
    base = {"model": "m", "bits": 5, "prompt_tokens": 16}
    rows = [base | {"framework": "edgeflow", "predicted_ttft_s": 1.0, "measured_ttft_s": 1.0},
            base | {"framework": "mnn", "predicted_ttft_s": 2.0, "measured_ttft_s": 9.0, "versus_framework": "edgeflow",
                    "predicted_versus_speedup": 1.5, "measured_versus_speedup": 1.25, "versus_speedup_error_pct": 20.0}]
    body = {r[0]: r for r in speedup_table(rows)[1:]}
    assert body["mnn"][4:] == [1.5, 1.25, 20.0]          # not 2.0 / 9.0 from the separately run EdgeFlow job


def test_versus_metrics_are_this_plan_over_the_interleaved_one():
    from types import SimpleNamespace

    from experiments.validate import versus_metrics

    vs = SimpleNamespace(predicted_ttft_s=0.5, measured=[0.4, 0.6, 0.5])
    m = versus_metrics("edgeflow", vs, 1.0, 0.8)
    assert m["measured_versus_ttft_s"] == 0.5 and m["measured_versus_ttft_min_s"] == 0.4
    assert m["predicted_versus_speedup"] == 2.0 and m["measured_versus_speedup"] == 1.6
    assert abs(m["versus_speedup_error_pct"] - 25.0) < 1e-9


def test_versus_names_a_framework_config_or_is_a_one_line_error(tmp_path):
    from experiments.common import ConfigError
    from experiments.validate import versus_framework

    assert versus_framework("edgeflow").policy == "edgeflow"
    with pytest.raises(ConfigError, match="versus: unknown framework 'edgefow'"):
        versus_framework("edgefow")
    r = subprocess.run([sys.executable, "-m", "experiments.validate", "versus=edgefow",
                        f"hydra.run.dir={tmp_path / 'r'}"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0 and "versus" in r.stderr, r.stderr


def test_sched_trace_without_tracefs_is_a_config_error_before_any_work(monkeypatch, tmp_path):
    from hydra import compose, initialize_config_dir

    import experiments.validate as v
    from experiments.common import ConfigError
    from hil.diagnostics import schedtrace

    monkeypatch.setattr(schedtrace, "TRACEFS", (str(tmp_path / "none"),))
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base=None):
        cfg = compose("validate", overrides=["sched_trace=true"])
    with pytest.raises(ConfigError, match="sched_trace: no tracefs"):
        v.settings(cfg)


def test_read_probe_reads_the_file_cold_and_gives_rates_per_byte(tmp_path):
    from hil.diagnostics.drift import read_probe

    f = tmp_path / "scratch.bin"
    f.write_bytes(os.urandom(3 << 20))
    got = read_probe(f, reps=2, nbytes=2 << 20)
    assert set(got) == {"read_s_per_byte", "read_cpu_s_per_byte"} and all(v > 0 for v in got.values())
    assert got["read_cpu_s_per_byte"] < 1e-6 and got["read_s_per_byte"] < 1e-6     # ns per byte, not per call
    (tmp_path / "empty.bin").write_bytes(b"")
    with pytest.raises(ValueError, match="empty"):
        read_probe(tmp_path / "empty.bin", reps=1)


def test_speeds_before_use_only_the_probe_before_each_run():
    from hil.diagnostics.drift import speeds_before

    ref = {"gemm_s": 1.0, "elementwise_s": 2.0, "unpack_s": 0.0}          # no unpack reference: class left out
    got = speeds_before(ref, [{"gemm_s": 2.0, "elementwise_s": 2.0, "unpack_s": 1.0}, {"gemm_s": 0.5}])
    assert got == [{"gemm": 0.5, "elementwise": 1.0}, {"gemm": 2.0}]
    two = speeds_before({"gemm_s": 1.0, "gemm_mt_s": 0.6}, [{"gemm_s": 1.0, "gemm_mt_s": 1.2}])
    assert two == [{"gemm": 1.0, "gemm_mt": 0.5}]                  # the 2-thread GEMM is its own class
    reads = speeds_before({"read_s_per_byte": 2e-10, "read_cpu_s_per_byte": 5e-11},
                          [{"read_s_per_byte": 4e-10, "read_cpu_s_per_byte": 5e-11}])
    assert reads == [{"read": pytest.approx(0.5), "read_cpu": pytest.approx(1.0)}]


def test_placement_probes_merge_per_gap_and_none_wins():
    from hil.diagnostics.drift import merge_placements

    a = [dict(gap_us=0, idle_s=1e-4, share=0.2), dict(gap_us=500, idle_s=6e-4, share=0.6)]
    b = [dict(gap_us=0, idle_s=3e-4, share=0.4), dict(gap_us=500, idle_s=8e-4, share=1.0)]
    got = merge_placements([a, b])
    assert [r["gap_us"] for r in got] == [0, 500]
    assert got[0]["idle_s"] == pytest.approx(2e-4) and got[1]["share"] == pytest.approx(0.8)
    assert merge_placements([a, None]) is None and merge_placements([]) is None
    with pytest.raises(ValueError, match="different gaps"):
        merge_placements([a, [dict(b[0], gap_us=20), b[1]]])


def test_without_diagnostics_the_report_says_the_host_probes_are_off(capsys, tmp_path):
    from experiments.validate import ValidateConfig, _print

    assert ValidateConfig.diagnostics is False                  # opt-in (hil.diagnostics)
    m = {"framework": "edgeflow", "model": "smollm2_135m", "bits": 5, "prompt_tokens": 16}
    _print(m, tmp_path, diagnostics=False)
    assert "host probes: off (diagnostics=true" in capsys.readouterr().out
    _print(m, tmp_path, diagnostics=True)
    assert "host probes: off" not in capsys.readouterr().out
