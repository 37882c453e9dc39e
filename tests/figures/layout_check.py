"""Layout check of a drawn figure: no legend over data, no text cut by the figure's edge.

`problems(fig)` lists, after drawing, every legend whose box covers a data artist of the axes it describes (a
figure-level legend: of any axes) — a line's vertex, a bar, a scatter point, each as far as it is inside its axes —
and every visible text whose window extent leaves the figure. An empty list is a clean layout.
"""
from __future__ import annotations

import numpy as np
from matplotlib.collections import PathCollection
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Rectangle
from matplotlib.text import Text
from matplotlib.transforms import Bbox

TOL_PX = 1.0        # px of slack for rounding of extents


def _inside(points: np.ndarray, box: Bbox) -> np.ndarray:
    return ((points[:, 0] > box.x0 + TOL_PX) & (points[:, 0] < box.x1 - TOL_PX)
            & (points[:, 1] > box.y0 + TOL_PX) & (points[:, 1] < box.y1 - TOL_PX))


def _data_boxes(ax, renderer) -> list[tuple[str, np.ndarray | Bbox]]:
    """(what, display points or a box) of the axes' data artists, cut to what lies inside the axes."""
    area = ax.get_window_extent(renderer)
    out: list[tuple[str, np.ndarray | Bbox]] = []
    for line in ax.lines:
        if not isinstance(line, Line2D) or not line.get_visible():
            continue
        xy = np.asarray(line.get_xydata(), float)          # unit-converted (categorical axes, dates)
        pts = line.get_transform().transform(xy) if len(xy) else xy
        pts = pts[np.isfinite(pts).all(axis=1)] if len(pts) else pts
        if len(pts):
            out.append((f"line {line.get_label()!r}", pts[_inside(pts, area)]))
    for patch in ax.patches:
        if isinstance(patch, Rectangle) and patch.get_visible():
            b = patch.get_window_extent(renderer)
            if np.isfinite(b.get_points()).all() and b.width > 0 and b.height > 0:
                c = Bbox.intersection(b, area)
                if c is not None:
                    out.append((f"bar {patch.get_label()!r}", c))
    for coll in ax.collections:
        if isinstance(coll, PathCollection) and coll.get_visible():
            pts = coll.get_offset_transform().transform(np.asarray(coll.get_offsets(), float))
            pts = pts[np.isfinite(pts).all(axis=1)] if len(pts) else pts
            if len(pts):
                out.append((f"scatter {coll.get_label()!r}", pts[_inside(pts, area)]))
    return out


def _overlaps(box: Bbox, data) -> bool:
    if isinstance(data, Bbox):
        return (min(box.x1, data.x1) - max(box.x0, data.x0) > TOL_PX
                and min(box.y1, data.y1) - max(box.y0, data.y0) > TOL_PX)
    return bool(len(data)) and bool(_inside(data, box).any())


def _drawn_texts(fig: Figure) -> list[Text]:
    """The visible, non-empty texts of the figure; tick labels only of ticks inside the view (matplotlib keeps
    labels of ticks beyond the limits, undrawn)."""
    ticks, drawn = set(), []
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            lo, hi = sorted(axis.get_view_interval())
            span = max(hi - lo, 1e-300)
            for tick in axis.get_major_ticks() + axis.get_minor_ticks():
                labs = (tick.label1, tick.label2)
                ticks.update(id(t) for t in labs)
                loc = tick.get_loc()
                if loc is not None and lo - 1e-9 * span <= loc <= hi + 1e-9 * span:
                    drawn += [t for t in labs if t.get_visible()]
    drawn += [t for t in fig.findobj(Text) if id(t) not in ticks and t.get_visible()]
    return [t for t in drawn if t.get_text().strip()]


def problems(fig: Figure) -> list[str]:
    """Every legend over data and every text outside the figure, after drawing `fig`."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    found = []
    legends = [(leg, [ax]) for ax in fig.axes if (leg := ax.get_legend()) is not None]
    legends += [(leg, list(fig.axes)) for leg in fig.legends]
    for leg, axes in legends:
        box = leg.get_window_extent(renderer)
        for ax in axes:
            for what, data in _data_boxes(ax, renderer):
                if _overlaps(box, data):
                    found.append(f"legend over data: {what} in axes {ax.get_title() or ax.get_ylabel()!r}")
    page = fig.bbox
    for t in _drawn_texts(fig):
        b = t.get_window_extent(renderer)
        if (b.x0 < page.x0 - TOL_PX or b.y0 < page.y0 - TOL_PX or b.x1 > page.x1 + TOL_PX
                or b.y1 > page.y1 + TOL_PX):
            found.append(f"text cut by the figure edge: {t.get_text()[:40]!r}")
    return found
