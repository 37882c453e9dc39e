"""The cold-start Hydra app: composes every framework/workload config, writes metrics.json + trace.json, rejects bad
input with one line; and TTFTs come out of the components (they move with the device parameters)."""
import json
from dataclasses import replace

import pytest

from experiments.coldstart import register_coldstart, run
from planner.framework import POLICIES
from sim.coldstart.sweep import ALL_FRAMEWORKS, WORKLOADS

KEYS = ("ttft_s", "setup_s", "load_s", "unpack_s", "prefill_s", "cpu_bubble_rate", "npu_bubble_rate", "peak_mem_gb",
        "energy_j", "bytes_read")


@pytest.fixture
def cs(compose):
    register_coldstart()
    return lambda *ov: compose("coldstart", ["bits_source=uniform", *ov])


def test_every_policy_has_a_config():
    assert sorted(ALL_FRAMEWORKS) == sorted(POLICIES)


@pytest.mark.parametrize("fw", ALL_FRAMEWORKS)
def test_app_writes_metrics_and_trace(cs, fw, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    m = run(cs(f"framework={fw}", "workload=winogrande", "model=qwen1_5_1_8b"))
    doc = json.loads((tmp_path / "metrics.json").read_text())
    for k in KEYS:
        assert k in doc and k in doc["modelled_keys"] + (["npu_bubble_rate"] if doc[k] is None else [])
    assert doc["framework"] == fw and doc["prompt_tokens"] == 138 and doc["measured_keys"] == []
    assert m["ttft_s"] >= m["prefill_s"] > 0 and m["bytes_read"] > 0
    trace = json.loads((tmp_path / "trace.json").read_text())
    tracks = {e["args"]["name"] for e in trace["traceEvents"] if e.get("name") == "thread_name"}
    assert "cpu" in tracks and "flash GB/s" in tracks
    if fw not in ("llamacpp", "mnn"):
        assert "npu" in tracks and any(t.startswith("graph") for t in tracks)


@pytest.mark.parametrize("wl", WORKLOADS)
def test_workloads_compose(cs, wl):
    cfg = cs(f"workload={wl}")
    assert cfg.workload.min_tokens <= cfg.workload.max_tokens


@pytest.mark.parametrize("override,needle", [
    ("bits=9", "bits: must be in 1..8"), ("bits=0.5", "bits: must be in 1..8"),
    ("framework.policy=tvm", "framework.policy"), ("device.cpu_big_ghz=0", "device.cpu_big_ghz"),
    ("prompt_tokens=-3", "prompt_tokens"), ("cost_model=table", "cost table"),
    ("workload.min_tokens=0", "workload.min_tokens"), ("framework.compute_threads=0", "framework.compute_threads"),
    ("preloaded_gb=-1", "preloaded_gb"), ("bits_source=magic", "bits_source"),
    ("bits=abc", "bits: must be a number (got 'abc')"), ("prompt_tokens=1.5", "prompt_tokens: must be int"),
    ("write_trace=maybe", "write_trace: must be bool"),
    ("device=pixel7", "device: pixel7 is not a single-SoC cold-start profile (soc_schema); use one of: xiaomi15pro"),
])
def test_bad_input_is_one_line(cs, override, needle, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as e:
        run(cs(override))
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and needle in err and "\n" not in err
    assert not (tmp_path / "metrics.json").exists()


def test_ttft_emerges_from_components():
    """Nothing end-to-end is a constant: EdgeFlow's and llama.cpp's TTFTs follow the flash, CPU and NPU parameters."""
    from planner.framework import FrameworkSpec
    from sim.coldstart.run import ColdStartSettings, run_one
    from sim.coldstart.sweep import load_conf
    from tests.sim.helpers import llama, xiaomi

    dev, s = xiaomi(), ColdStartSettings(bits=5, prompt_tokens=600, bits_source="uniform", write_trace=False)

    def ttft(fw, d, tokens=600):
        st = replace(s, prompt_tokens=tokens)
        return run_one(llama(), d, load_conf("framework", fw, FrameworkSpec), None, st)[0]["ttft_s"]

    base = {fw: ttft(fw, dev) for fw in ("edgeflow", "llamacpp", "mnn")}
    slow_flash = replace(dev, flash_peak_gbps=dev.flash_peak_gbps / 3, flash_reader_gbps=dev.flash_reader_gbps / 3)
    slow_cpu = replace(dev, cpu_int8_gemm_gops_per_ghz=dev.cpu_int8_gemm_gops_per_ghz / 2)
    slow_npu = replace(dev, npu_int8_tops=dev.npu_int8_tops / 2)
    assert ttft("edgeflow", slow_flash, 128) > ttft("edgeflow", dev, 128) * 1.5   # short prompt: load-bound
    assert ttft("edgeflow", slow_npu) > base["edgeflow"] * 1.2
    assert ttft("mnn", slow_cpu) > base["mnn"] * 1.2
    assert ttft("llamacpp", slow_cpu) > base["llamacpp"] * 1.2


def test_table_cost_model_drives_the_simulation(cs, tmp_path, monkeypatch):
    """A measured profile (here: an NPU twice as slow for matmuls as the analytic model) changes the prediction."""
    from planner.cost import AnalyticCostModel
    from planner.plan import OpWork
    from tests.sim.helpers import xiaomi

    an = AnalyticCostModel(xiaomi())
    pts = [{"unit": "npu", "kind": "matmul", "work": OpWork("matmul", m=m, k=4096, n=4096).flops,
            "seconds": 2 * an.op_time(OpWork("matmul", m=m, k=4096, n=4096), "npu")} for m in (16, 64, 128)]
    prof = tmp_path / "profile.json"
    prof.write_text(json.dumps({"points": pts}))
    monkeypatch.chdir(tmp_path)
    base = run(cs("prompt_tokens=600", "write_trace=false"))
    slow = run(cs("prompt_tokens=600", "write_trace=false", "cost_model=table", f"cost_table={prof}"))
    assert slow["npu_busy_s"] > 1.5 * base["npu_busy_s"] and slow["ttft_s"] > base["ttft_s"]


def test_collect_and_table(tmp_path):
    from sim.coldstart.sweep import collect, markdown_table

    for i, (fw, wl, tok, t) in enumerate([("edgeflow", "mmlu", 471, 3.5), ("llamacpp", "lambada", 78, 3.6),
                                          ("edgeflow", "lambada", 78, 1.8)]):
        d = tmp_path / str(i)
        d.mkdir()
        (d / "metrics.json").write_text(json.dumps({"framework": fw, "workload": wl, "prompt_tokens": tok,
                                                    "ttft_s": t, "bits": 5}))
    table = markdown_table(collect(tmp_path)).splitlines()
    assert table[0] == "| framework | lambada (78 tok) | mmlu (471 tok) |"
    assert table[2] == "| llamacpp | 3.60 | – |" and table[3] == "| edgeflow | 1.80 | 3.50 |"
    with pytest.raises(FileNotFoundError):
        collect(tmp_path / "nothing")


def test_same_config_gives_identical_outputs(cs, tmp_path, monkeypatch):
    docs = []
    for i in range(2):
        d = tmp_path / str(i)
        d.mkdir()
        monkeypatch.chdir(d)
        run(cs("framework=edgeflow", "model=qwen1_5_1_8b", "prompt_tokens=300"))
        docs.append(((d / "metrics.json").read_text(), (d / "trace.json").read_text()))
    assert docs[0] == docs[1]


@pytest.mark.parametrize("argv,needle", [
    (["framework=nope"], "error: framework=nope is not a framework config; use one of: edgeflow, "),
    (["-m", "workload=lambada,nope"], "error: workload=nope is not a workload config"),
    (["device=pixel7"], "error: device=pixel7 exists but is not valid for this app; use one of: xiaomi15pro"),
])
def test_unknown_group_option_is_one_line(argv, needle, capsys):
    from experiments.coldstart import GROUPS
    from experiments.common import check_group_choices

    with pytest.raises(SystemExit) as e:
        check_group_choices(argv, GROUPS)
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and err.startswith(needle) and "\n" not in err
    check_group_choices(["framework=edgeflow,mnn", "workload=hellaswag", "device=xiaomi15pro", "bits=4,5"], GROUPS)
    check_group_choices(["--config-dir", "/my/conf", "framework=mine"], GROUPS)     # user config dirs: Hydra decides


def test_multirun_writes_each_job_into_its_own_dir(tmp_path):
    """`-m` sweep with the configured joblib launcher: one metrics.json per job, in the job's own directory, none in
    the cwd."""
    import subprocess
    import sys

    from tests.conftest import REPO

    r = subprocess.run([sys.executable, "-m", "experiments.coldstart", "-m", "model=smollm2_135m", "framework=mnn",
                        "prompt_tokens=4,9", "write_trace=false",
                        f"hydra.sweep.dir={tmp_path / 'sweep'}"], cwd=tmp_path, capture_output=True, text=True,
                       timeout=300, env={**__import__("os").environ, "PYTHONPATH": str(REPO)})
    assert r.returncode == 0, r.stderr[-2000:]
    docs = {p.parent.name: json.loads(p.read_text()) for p in (tmp_path / "sweep").rglob("metrics.json")}
    assert sorted(d["prompt_tokens"] for d in docs.values()) == [4, 9] and len(docs) == 2
    assert not (tmp_path / "metrics.json").exists()
