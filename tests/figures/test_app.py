"""The figures app: argument errors, the files of one figure, the index page, and that the golden check fails on a
changed figure (so a figure cannot change silently)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

import experiments.figures.edgeflow_fig01 as fig01
from experiments.figures import CANNOT, NAMES, available, load
from experiments.figures.app import HEAVY, SHARED, FiguresConfig, build, left_out, resolve, tasks
from experiments.figures.base import FigureSpec
from experiments.figures.index import markdown
from tests.figures.golden_check import check

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("args, key", [(["figure=nope"], "figure:"), (["size=huge"], "size:"),
                                       (["workers=-1"], "workers:")])
def test_bad_arguments_one_line_exit_2(tmp_path, args, key):
    p = subprocess.run([sys.executable, "-m", "experiments.figures", *args, f"out={tmp_path}", "progress=false"],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2
    assert p.stderr.strip().splitlines()[-1].startswith(f"error: {key}")
    assert not any(tmp_path.iterdir())


def test_resolve():
    assert resolve(FiguresConfig(figure="all")) == [n for n in available() if n not in left_out()]
    assert resolve(FiguresConfig(figure="index")) == []
    assert resolve(FiguresConfig(figure="edgeflow_fig01")) == ["edgeflow_fig01"]


def test_every_registered_module_exists_and_has_a_golden():
    assert set(available()) == set(NAMES)
    golden = Path(__file__).parent / "golden"
    for n in available():
        assert (golden / f"{n}.csv").is_file(), n
        assert (Path(__file__).parent / f"test_{n}.py").is_file(), n
        spec = load(n).spec
        assert spec.name == n and spec.claim and spec.title


def test_headings_name_only_the_paper_figures_the_design_text_names():
    for n in available():
        spec = load(n).spec
        if spec.withheld:        # evaluation counterparts: the design text numbers none of them
            assert "Fig." not in spec.heading and "counterpart of" in spec.heading, n
        elif spec.figure:
            assert spec.heading.endswith(f"({spec.paper} {spec.figure})") and spec.topic, n
    with pytest.raises(ValueError, match="names no paper figure"):
        FigureSpec(name="x", paper="EdgeFlow", figure="Fig. 13", topic="t", title="t", claim="c", simulated="",
                   withheld=True)


def test_build_writes_csv_png_pdf_and_index(tmp_path):
    rows = build(["edgeflow_fig01"], "toy", tmp_path, progress=False)
    assert rows[0]["figure"] == "edgeflow_fig01"
    for ext in ("csv", "png", "pdf"):
        assert (tmp_path / f"edgeflow_fig01.{ext}").stat().st_size > 0
    assert (tmp_path / "edgeflow_fig01.png").read_bytes()[:4] == b"\x89PNG"
    assert (tmp_path / "edgeflow_fig01.pdf").read_bytes()[:4] == b"%PDF"
    index = (tmp_path / "index.md").read_text()
    for n in available():
        assert f"`{n}`" in index
    for _paper, fig, _why in CANNOT:
        assert fig in index


def test_index_is_deterministic_and_committed_copy_is_current():
    assert markdown() == markdown()
    committed = ROOT / "figures" / "index.md"
    if committed.is_file():
        assert committed.read_text() == markdown(), "regenerate: python -m experiments.figures figure=index"


def test_golden_check_fails_on_a_changed_figure(monkeypatch):
    real = fig01.data

    def shifted(size):
        df = real(size)
        df.loc[df.source == "modelled", "seconds"] *= 1.01       # a 1 % modelling change
        return df

    monkeypatch.setattr(fig01, "data", shifted)
    monkeypatch.delenv("UPDATE_GOLDEN", raising=False)        # compare, even in a golden-regenerating run
    with pytest.raises(AssertionError, match="seconds"):
        check("edgeflow_fig01")


def test_frame_must_label_rows(monkeypatch):
    monkeypatch.setattr(fig01, "data", lambda size: pd.DataFrame({"x": [1.0]}))
    with pytest.raises(ValueError, match="source"):
        check("edgeflow_fig01")


def test_tasks_group_shared_figures_heaviest_first():
    names = available()
    groups = tasks(names)
    assert sorted(n for g in groups for n in g) == sorted(names)            # each figure once
    assert any(n in HEAVY for n in groups[0])
    for shared in SHARED:
        assert [g for g in groups if set(g) & set(shared)] == [[n for n in shared if n in names]]
    assert tasks(["edgeflow_fig01", "edgeflow_fig10"]) == [["edgeflow_fig01"], ["edgeflow_fig10"]]


def test_parallel_build_writes_what_a_serial_build_writes(tmp_path):
    names = ["edgeflow_fig01", "edgeflow_fig02"]
    serial = build(names, "toy", tmp_path / "serial", progress=False, workers=1)
    parallel = build(names, "toy", tmp_path / "parallel", progress=False, workers=2)
    assert [r["figure"] for r in serial] == [r["figure"] for r in parallel] == names
    for n in names:
        assert (tmp_path / "serial" / f"{n}.csv").read_bytes() == (tmp_path / "parallel" / f"{n}.csv").read_bytes()
        assert (tmp_path / "parallel" / f"{n}.png").stat().st_size > 0


def test_a_shared_simulation_runs_once_per_process():
    from experiments.figures import data

    kw = dict(prompt_tokens=64, bits=5.0)
    before = dict(data.COUNTS)
    first = data.coldstart("llama3_8b", "edgeflow", **kw)
    first["ttft_s"] = -1.0                                  # a caller's change does not reach the shared run
    second = data.coldstart("llama3_8b", "edgeflow", **kw)
    assert data.COUNTS["simulated"] - before["simulated"] <= 1 and data.COUNTS["reused"] - before["reused"] >= 1
    assert second["ttft_s"] > 0
