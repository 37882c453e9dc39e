"""The multidevice-importance page (experiments.importance_table via experiments.report --data): generated from the
committed SmolLM2 measurement file, through the planner's own readers, and docs/multidevice.md's block is what
`--readme` makes of the committed page. No model runs here."""
from __future__ import annotations

import json

import pytest

from experiments import importance_table as it
from experiments import report
from planner.voltron.accuracy import precision_loss
from planner.voltron.importance import DATA, importance_for
from quant.arch import model_spec

DOC = report.REPO / "docs" / "multidevice.md"
PAGE = report.RESULTS_DIR / f"{report.IMPORTANCE_TOPIC}.md"


def test_committed_page_is_generated_from_the_committed_data_file():
    page = report.importance_page()
    assert PAGE.read_text() == page.markdown, \
        "docs/results/multidevice-importance.md differs from the data file: run `python -m experiments.report --data`"
    assert PAGE.with_suffix(".csv").read_text() == page.table.to_csv(index=False)


def test_docs_block_is_the_committed_page_summary():
    text = DOC.read_text()
    assert f"<!-- results: {report.IMPORTANCE_TOPIC} -->" in text and DOC in report.DOC_BLOCKS
    assert report.refresh_readme(text, report.RESULTS_DIR, "results") == text, \
        "docs/multidevice.md's block differs from docs/results/: run `python -m experiments.report --readme`"


def test_numbers_come_from_the_planners_readers():
    s = report.page_summary(report.importance_page().markdown)
    q4 = precision_loss("int4")
    assert f"| **{q4.loss:.3f} ± {q4.loss_sd:.3f}** |" in s                  # the q the accuracy proxy uses
    assert precision_loss("int8").within_noise and "| **0 (within noise)** |" in s
    imp = importance_for(model_spec("smollm2_135m"))
    assert f"within noise: {100 * imp.noise_share:.0f} % of the shards" in s
    assert [r.label for r in it.ROWS].count("FP16 (weights rounded)") == 1 and len(it.precision_table()) == len(it.ROWS)


def test_a_changed_data_file_changes_the_page(tmp_path):
    doc = json.loads(DATA.read_text())
    same = tmp_path / "same.json"
    same.write_text(DATA.read_text())
    committed = report.page_summary(PAGE.read_text())
    # an unchanged copy differs only in the file's name: the content alone makes the numbers
    assert report.page_summary(report.importance_page(path=same).markdown) == committed.replace(
        "planner/voltron/data/smollm2_importance.json", str(same.resolve()))
    doc["precision"]["q4_k"]["all"]["ppl"][0] *= 1.1                          # a re-measured Q4_K slice
    doc["ref_ppl_slices"][0] *= 1.01                                         # and a different pruning reference
    changed = tmp_path / "changed.json"
    changed.write_text(json.dumps(doc))
    page = report.importance_page(path=changed)
    row = lambda text: next(ln for ln in text.splitlines() if ln.startswith("| **INT4 = Q4_K**"))  # noqa: E731
    assert row(page.markdown) != row(committed)
    assert it.pruning_md(changed) != it.pruning_md(DATA) or it.settings_md(changed) != it.settings_md(DATA)
    assert it.sha256(changed) not in committed and it.sha256(DATA)[:12] in committed
    (tmp_path / "pages").mkdir()
    report.write_page(page, tmp_path / "pages")
    assert report.refresh_readme(DOC.read_text(), tmp_path / "pages", "results") != DOC.read_text()


def test_not_a_data_file_is_a_one_line_error(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"ref_ppl_slices": [1.0]}))
    with pytest.raises(report.ReportError, match="not a measure_importance data file") as e:
        report.importance_page(path=bad)
    assert "\n" not in str(e.value)


def test_cli_writes_the_data_pages(tmp_path):
    assert report.main(["--data", "--out", str(tmp_path)]) == 0
    assert (tmp_path / f"{report.IMPORTANCE_TOPIC}.md").read_text() == PAGE.read_text()
    assert (tmp_path / f"{report.IMPORTANCE_TOPIC}.csv").is_file()
