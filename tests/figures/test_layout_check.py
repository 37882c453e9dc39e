"""The layout check can fail: a legend over the data and a label off the page are both reported."""
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from experiments.figures.base import legend  # noqa: E402
from tests.figures.layout_check import problems  # noqa: E402


def _fig():
    return plt.figure(figsize=(6, 4), layout="constrained")


def test_clean_figure_passes():
    fig = _fig()
    ax = fig.add_subplot(1, 1, 1)
    ax.plot([0, 1, 2, 3], [0, 1, 2, 3], "o-", label="rising")
    ax.bar([0.5, 2.5], [2.5, 2.5], 0.4, label="bars")
    legend(ax)
    ax.set_xlabel("x")
    try:
        assert problems(fig) == []
    finally:
        plt.close(fig)


def test_legend_over_line_points_is_reported():
    fig = _fig()
    ax = fig.add_subplot(1, 1, 1)
    ax.plot(range(20), [1.0] * 20, "o", label="flat")          # points across the top of the axes
    ax.set_ylim(0, 1.05)
    ax.legend(loc="upper center")
    try:
        assert any("legend over data: line 'flat'" in p for p in problems(fig))
    finally:
        plt.close(fig)


def test_legend_over_bars_and_scatter_is_reported():
    fig = _fig()
    ax1, ax2 = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    ax1.bar(range(4), [1, 1, 1, 1], 0.9, label="tall")
    ax1.legend(loc="center")
    ax2.scatter([0.5] * 3, [0.5] * 3, label="dots")
    ax2.set_xlim(0, 1)
    ax2.set_ylim(0, 1)
    ax2.legend(loc="center")
    try:
        found = problems(fig)
        assert any("bar" in p for p in found) and any("scatter 'dots'" in p for p in found)
    finally:
        plt.close(fig)


def test_text_off_the_figure_is_reported():
    fig = plt.figure(figsize=(6, 4))                           # no layout engine: nothing pulls the label in
    ax = fig.add_subplot(1, 1, 1)
    ax.plot([0, 1], [0, 1])
    ax.set_yticks([0, 1], ["a very long tick label that runs off the left edge", "b"])
    fig.text(0.98, 0.5, "caption beyond the right edge")
    try:
        found = problems(fig)
        assert any("a very long tick label" in p for p in found) and any("caption beyond" in p for p in found)
    finally:
        plt.close(fig)
