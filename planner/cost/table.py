"""Table/regression cost model: per (unit, op kind) linear fits `seconds = a + b * work` on measured profile points.

`work` is the op's natural size: FLOPs for matmul/attention, bytes for elementwise/copy, weights for unpack. A measured
profile (JSON) looks like `{"points": [{"unit": "cpu", "kind": "matmul", "work": 1.2e9, "seconds": 0.004,
"threads": 4}, ...]}` (`threads` defaults to 1); the HIL calibration of this host writes it. A fit applies only to
the thread count it was measured with: a 1-thread profile never stands in for the 4-thread compute pool. Op kinds
(and thread counts) without points fall back to another cost model (analytic), so a partial profile is usable;
`fitted_kinds()` says which ones are measured. Fits are least squares with a >= 0 intercept.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from planner.cost.base import CostModel
from planner.plan import OpWork


def _work_size(work: OpWork) -> float:
    if work.kind in ("matmul", "lm_head", "attention"):
        return work.flops
    if work.kind == "unpack":
        return float(work.weights)
    return float(work.nbytes)


class TableCostModel(CostModel):
    name = "table"

    def __init__(self, points: list[dict], fallback: CostModel | None = None) -> None:
        self.fallback = fallback
        self.fits: dict[tuple[str, str, int], tuple[float, float]] = {}   # (unit, kind, threads) -> (s, s per work)
        groups: dict[tuple[str, str, int], list[tuple[float, float]]] = {}
        for i, p in enumerate(points):
            try:
                key = (str(p["unit"]), str(p["kind"]), int(p.get("threads", 1)))
                w, s = float(p["work"]), float(p["seconds"])
            except (KeyError, TypeError, ValueError, AttributeError) as e:
                raise ValueError(f"cost table point {i}: needs unit, kind, work, seconds ({e})") from None
            if w < 0 or s < 0 or key[2] < 1:
                raise ValueError(f"cost table point {i}: work and seconds must be >= 0, threads >= 1")
            groups.setdefault(key, []).append((w, s))
        for key, pts in groups.items():
            x, y = np.array(pts).T                                    # (P,), (P,)
            if len(pts) == 1 or np.ptp(x) == 0:
                self.fits[key] = (0.0, float(y.mean() / max(x.mean(), 1e-30)))
                continue
            b, a = np.polyfit(x, y, 1)
            if a < 0:                                                 # refit through the origin
                a, b = 0.0, float((x @ y) / (x @ x))
            self.fits[key] = (float(a), float(b))

    @classmethod
    def from_json_file(cls, path: str, fallback: CostModel | None = None) -> "TableCostModel":
        p = Path(path)
        if not path or not p.is_file():
            raise FileNotFoundError(f"cost table profile not found: {path!r}")
        try:
            doc = json.loads(p.read_text())
        except json.JSONDecodeError as e:
            raise ValueError(f"cost table {path}: not JSON ({e})") from None
        if not isinstance(doc, dict) or not isinstance(doc.get("points", []), list):
            raise ValueError(f"cost table {path}: expected {{\"points\": [...]}}")
        return cls(doc.get("points", []), fallback)

    def fitted_kinds(self) -> list[tuple[str, str]]:
        return sorted({(u, k) for u, k, _t in self.fits})

    def op_time(self, work: OpWork, unit: str, threads: int = 1, first_core: int = 0) -> float:
        fit = self.fits.get((unit, work.kind, threads))
        if fit is None:
            if self.fallback is None:
                raise KeyError(f"no measured profile for {unit}/{work.kind} on {threads} thread(s) and no fallback "
                               f"cost model")
            return self.fallback.op_time(work, unit, threads, first_core)
        a, b = fit
        return a + b * _work_size(work)

    def copy_time(self, nbytes: int) -> float:
        fit = self.fits.get(("cpu", "copy", 1))
        if fit is None:
            if self.fallback is None:
                raise KeyError("no measured profile for cpu/copy and no fallback cost model")
            return self.fallback.copy_time(nbytes)
        return fit[0] + fit[1] * nbytes
