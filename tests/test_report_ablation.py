"""The coldstart-ablation results page (experiments.report): per step and prompt length the TTFT, its change from the
step before and the critical resource, from cold-start runs; docs/coldstart.md's block is what `--readme` makes of
the committed page."""
from pathlib import Path

import pytest

from experiments import report
from planner.framework import FrameworkSpec
from quant.arch import ModelSpec
from sim.coldstart.run import ColdStartSettings, run_one
from sim.coldstart.sweep import load_conf
from tests.sim.helpers import xiaomi

STEPS = ("llmnpu_plus", "ef_mixed", "edgeflow")


@pytest.fixture(scope="module")
def runs():
    spec = load_conf("model", "smollm2_135m", ModelSpec)
    out = []
    for tokens in (40, 200):
        for fw in reversed(STEPS):                     # the page orders the steps itself
            m, _ = run_one(spec, xiaomi(), load_conf("framework", fw, FrameworkSpec), None,
                           ColdStartSettings(prompt_tokens=tokens, bits_source="uniform", write_trace=False))
            out.append(report.Run(Path(f"/x/{fw}_{tokens}"), "experiments.coldstart", "cmd", [], m))
    return out


def test_table_orders_steps_and_computes_changes(runs):
    df = report.ablation_table(runs)
    assert list(df.framework[:3]) == list(STEPS) and list(df.prompt_tokens) == [40] * 3 + [200] * 3
    first = df[df.framework == "llmnpu_plus"]
    assert first.change_s.isna().all()
    g = df[df.prompt_tokens == 40].set_index("framework")
    assert g.change_s["ef_mixed"] == pytest.approx(g.ttft_s["ef_mixed"] - g.ttft_s["llmnpu_plus"])
    assert g.change_pct["edgeflow"] == pytest.approx(100 * (g.ttft_s["edgeflow"] / g.ttft_s["ef_mixed"] - 1))
    assert set(df.bound_total) <= {"flash", "unpack", "sharing", "npu", "cpu", "graph", "idle"}


def test_page_summary_is_the_step_table(runs):
    page = report.pages_for(runs, report.ABLATION_TOPIC)[0]
    s = report.page_summary(page.markdown)
    assert "| step | changes (Recipe fields) |" in s and "`fmt`" in s
    row = next(ln for ln in s.splitlines() if ln.startswith("| edgeflow "))
    assert " %) " not in row and row.count(" %") >= 4          # per prompt length: change % and bound share %


def test_not_an_ablation_run_is_a_one_line_error(runs):
    bad = report.Run(Path("/x/y"), "experiments.coldstart", "cmd", [], {"framework": "llamacpp"})
    with pytest.raises(report.ReportError, match="critical path"):
        report.ablation_table([bad])


def test_docs_block_is_generated_from_the_committed_page():
    for doc in report.DOC_BLOCKS:
        text = doc.read_text()
        assert report.BLOCK_RE.search(text), f"{doc.name}: no results block"
        assert report.refresh_readme(text, report.RESULTS_DIR, "results") == text, \
            f"{doc.name}: results block differs from docs/results/: run `python -m experiments.report --readme`"
