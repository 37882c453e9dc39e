"""edgeflow_fig12_table4 at `full` is drawn from `python -m experiments.quantize` runs: a `-m` sweep of the toy
settings (its jobs sharing the reference forwards) must give the rows the figure measures in-process (the golden
file), and the figure must find those runs by their settings — and ignore runs of other settings."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import experiments.figures.edgeflow_fig12_table4 as fig12
from experiments.figures import available, load
from experiments.figures.app import FiguresConfig, left_out, resolve, tasks
from tests.figures.golden_check import _compare, _stable

ROOT = Path(__file__).resolve().parents[2]


def test_commands_group_methods_by_their_missing_bits():
    cmds = fig12.commands([("edgeflow", 4), ("edgeflow", 6), ("cmpq", 4), ("cmpq", 6), ("smoothquant", 5),
                           ("int8", 8), ("int4", 4)])
    args = [c[c.index("-m", 2) + 1:] for c in cmds]
    assert [a[:3] for a in args] == [["model=smollm2_135m", "method=edgeflow,cmpq", "bits=4,6"],
                                     ["model=smollm2_135m", "method=smoothquant", "bits=5"],
                                     ["model=smollm2_135m", "method=int8,int4", "quant.eval_tokens=512"]]
    assert all("quant.alpha_steps=11" in a for a in args)


def test_missing_skip_leaves_the_figure_out(monkeypatch):
    monkeypatch.setattr(fig12, "runs", lambda roots=None, size="full": {})
    assert "experiments.quantize" in fig12.missing()
    assert "edgeflow_fig12_table4" in left_out("skip")
    assert "edgeflow_fig12_table4" not in left_out("run")
    assert "edgeflow_fig12_table4" not in resolve(FiguresConfig(figure="all", missing="skip"))
    assert "edgeflow_fig12_table4" in resolve(FiguresConfig(figure="all", missing="run"))
    with pytest.raises(ValueError, match="figure: edgeflow_fig12_table4: 14 of 14"):
        resolve(FiguresConfig(figure="edgeflow_fig12_table4", missing="skip"))
    with pytest.raises(ValueError, match="missing: must be one of run, skip"):
        resolve(FiguresConfig(figure="all", missing="later"))


@pytest.mark.slow      # real SmolLM2 quantization + forward: ~1 min on 2 cores
def test_quantize_runs_give_the_figure_rows(tmp_path):
    base = fig12.commands([("edgeflow", 5)], "toy")[0]
    quant = [a for a in base if a.startswith("quant.")]
    for sub, methods in (("sweep", "method=edgeflow,int8"), ("other", "method=int8")):
        extra = ["quant.alpha_steps=5"] if sub == "other" else []      # other settings: never read
        cmd = [sys.executable, "-m", "experiments.quantize", "-m", "model=smollm2_135m", methods, "bits=5", *quant,
               *extra, f"hydra.sweep.dir={tmp_path / sub}"]
        p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
        assert p.returncode == 0, p.stderr[-2000:]
    found = fig12.runs([tmp_path], "toy")
    assert sorted(found) == [("edgeflow", 5), ("int8", 8)]
    assert all(d.parent == tmp_path / "sweep" for d, _m in found.values())
    df = fig12.pd.DataFrame([fig12.row(found[k][1], k[1]) for k in fig12.wanted("toy")])
    fig = load(fig12.SPEC.name)
    _compare(fig12.SPEC.name, fig, _stable(fig.spec, df))


def test_a_figure_that_runs_its_experiment_starts_first():
    names = list(available())
    assert tasks(names, ("edgeflow_fig12_table4",))[0] == ["edgeflow_fig12_table4"]
    assert tasks(names)[0] != ["edgeflow_fig12_table4"]


def test_missing_run_runs_the_experiment_before_the_figure(monkeypatch, tmp_path, capsys):
    from omegaconf import OmegaConf

    from experiments.figures import app

    state = {"missing": True, "ran": 0}

    def run_missing():
        state["ran"] += 1
        state["missing"] = False

    def data(size):
        assert not state["missing"], "the figure was built before its runs"
        return fig12.pd.read_csv(Path(__file__).parent / "golden" / "edgeflow_fig12_table4.csv")

    monkeypatch.setattr(fig12, "missing", lambda: "2 of 14 quantize + evaluate runs not on disk (run: x)"
                        if state["missing"] else None)
    monkeypatch.setattr(fig12, "estimate_s", lambda: 180.0)
    monkeypatch.setattr(fig12, "run_missing", run_missing)
    monkeypatch.setattr(fig12, "data", data)
    cfg = OmegaConf.create(dict(figure="edgeflow_fig12_table4", size="full", out=str(tmp_path), progress=False,
                                workers=1, missing="run"))
    rows = app.run(cfg)
    assert state["ran"] == 1 and [r["figure"] for r in rows] == ["edgeflow_fig12_table4"]
    err = capsys.readouterr().err
    assert "edgeflow_fig12_table4: 2 of 14 quantize + evaluate runs not on disk (run: x): running them first, " \
           "about 3 min (modelled; missing=skip leaves the figure out)" in err
    assert (tmp_path / "edgeflow_fig12_table4.png").stat().st_size > 0


def _fake_run(d: Path, method: str, bits: int, ppl: float, **change) -> None:
    """A run directory as experiments.quantize writes it (the parts `runs` reads), one field changed by `change`."""
    import dataclasses
    import json
    import os

    import yaml

    from experiments.quantize import code_sha256
    from experiments.resume import file_digest
    from quant.arch import model_spec
    from quant.gguf_model import gguf_path

    gguf = Path(gguf_path(model_spec(fig12.MODEL))).resolve()
    quant = {**dataclasses.asdict(fig12.settings("full")), **change.get("quant", {})}
    d.mkdir(parents=True)
    (d / "config.yaml").write_text(yaml.safe_dump({"model": {"name": fig12.MODEL}, "quant": quant, "method": method,
                                                   "bits": bits, "budget": None, "pack": False}))
    (d / "inputs.json").write_text(json.dumps({"files": {str(gguf): change.get("gguf", file_digest(gguf))}}))
    metrics = {"method": method, "ppl": ppl, "quant_code_sha256": change.get("code", code_sha256())}
    (d / "metrics.json").write_text(json.dumps(metrics))
    if "age_s" in change:
        t = (d / "metrics.json").stat().st_mtime - change["age_s"]
        os.utime(d / "metrics.json", (t, t))


def test_runs_are_matched_by_settings_model_file_and_code(tmp_path):
    try:
        _fake_run(tmp_path / "a", "edgeflow", 5, 17.0)
    except Exception as e:                  # no SmolLM2 GGUF here
        pytest.skip(f"SmolLM2 GGUF not available: {e}")
    _fake_run(tmp_path / "old", "edgeflow", 5, 99.0, age_s=60)                   # older: the newest wins
    _fake_run(tmp_path / "b", "int8", 4, 28.0)                                   # fixed width: counted at 8
    _fake_run(tmp_path / "c", "cmpq", 5, 1.0, code="0" * 64)                     # other quant/ sources
    _fake_run(tmp_path / "d", "smoothquant", 5, 1.0, quant={"alpha_steps": 5})   # other settings
    _fake_run(tmp_path / "e", "shadow_outlier", 5, 1.0, gguf="0" * 64)           # other model file
    found = fig12.runs([tmp_path])
    assert sorted(found) == [("edgeflow", 5), ("int8", 8)]
    assert found["edgeflow", 5][1]["ppl"] == 17.0 and found["int8", 8][0] == tmp_path / "b"
