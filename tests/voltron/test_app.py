"""The `experiments.multidevice` app: composes, runs at toy size, writes labelled metrics; bad input = one line."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from experiments.common import ConfigError
from experiments.multidevice import register, run
from planner.voltron.registry import POLICIES
from sim.multidevice.runner import MEASURED_KEYS, MODELLED_KEYS
from tests.conftest import REPO

REQUIRED = ["ttft_s", "tpot_ms_p50", "tpot_ms_p99", "qos_ttft_ok", "qos_tpot_violation_rate", "accuracy_proxy",
            "replans", "plan_ms_p50", "oom"]


@pytest.fixture(autouse=True)
def _schemas():
    register()


@pytest.mark.parametrize("planner", list(POLICIES))
def test_run_every_planner(compose, planner):
    cfg = compose("multidevice", ["cluster=car", "model=qwen2_5_3b", f"planner={planner}", "trace=steady_strong",
                                  "turns=1", "workload.max_out=24", "planner.profile_points=48"])
    res = run(cfg)
    for k in REQUIRED:
        assert k in res.metrics
        assert k in MEASURED_KEYS + MODELLED_KEYS
    assert not res.metrics["oom"] and res.metrics["tokens_generated"] >= 4
    assert {"time_s", "step_s", "plan_id", "n_int4", "pruned_shards", "rssi_link1"} <= set(res.timeline[0])


def test_bad_values_name_the_key(compose):
    with pytest.raises(ConfigError, match="planner.balance"):
        run(compose("multidevice", ["planner=mp", "planner.balance=random", "turns=1"]))
    with pytest.raises(ConfigError, match="turns: must be >= 1"):
        run(compose("multidevice", ["turns=0"]))
    with pytest.raises(ConfigError, match="no published base score"):
        run(compose("multidevice", ["model=llama3_8b", "turns=1"]))


def test_cli_writes_metrics_and_timeline(tmp_path):
    out = tmp_path / "run"
    r = subprocess.run([sys.executable, "-m", "experiments.multidevice", "cluster=home", "model=qwen2_5_3b",
                        "trace=walk_away", "turns=1", "workload.max_out=16", "planner.profile_points=48",
                        f"hydra.run.dir={out}"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    m = json.loads((out / "metrics.json").read_text())
    assert set(REQUIRED) <= set(m) and "plan_ms_p50" in m["measured_keys"] and "ttft_s" in m["modelled_keys"]
    assert (out / "timeline.csv").read_text().startswith("time_s,")
    from planner.voltron.plan import PhasePlan

    lines = (out / "plans.jsonl").read_text().splitlines()
    assert lines and all(PhasePlan.from_json(json.dumps(json.loads(x)["plan"])).fits for x in lines)
    bad = subprocess.run([sys.executable, "-m", "experiments.multidevice", "planner.qos_tpot_s=-1",
                          f"hydra.run.dir={tmp_path / 'bad'}"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and bad.stderr.strip().count("\n") == 0 and "qos_tpot_s" in bad.stderr
    assert not (tmp_path / "bad" / "metrics.json").exists()


@pytest.mark.parametrize("arg", ["cluster=nope", "planner=voltron,nope", "trace=nope", "model=nope"])
def test_unknown_group_option_one_line(arg, capsys):
    from experiments.common import check_group_choices
    from experiments.multidevice import GROUPS

    with pytest.raises(SystemExit) as e:
        check_group_choices(["turns=1", arg], GROUPS)
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1 and "nope" in err and "use one of" in err
    check_group_choices(["cluster=car,office", "planner=mp", "trace=walk_away", "model=qwen2_5_3b"], GROUPS)  # valid
