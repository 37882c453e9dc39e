"""Table/regression cost model on measured per-op profiles (e.g. this host's from the HIL calibration, docs/hil.md).

A table is JSON with up to four sections; only `points` is required (the original format, still read as before):
- `points`: `[{"unit": "cpu", "kind": "matmul", "work": 1.2e9, "seconds": 0.004, "threads": 4}, ...]` (`threads`
  defaults to 1; extra keys are ignored). Per (unit, kind, threads) a linear fit `seconds = a + b * work`, least
  squares in relative error with a, b >= 0 (a = the fixed cost of a call, what a small op costs), where `work` is the
  op's natural size: FLOPs for matmul/attention, bytes for elementwise/copy, weights for unpack. Attention points
  that also carry `rows` (query rows = m tokens x heads) are fitted as `seconds = a + r * rows + b * FLOPs` (same
  weighting, all >= 0): a causal prefill's rows have few keys each and cost per row, not per FLOP (measured on the
  host: 16 new tokens x 9 heads took 98 us where one decode token over 128 keys, the same FLOPs, took 31 us).
- `unpack`: `[{"fmt": "weightlet", "bits": 5, "threads": 1, "s_per_weight": 1.1e-10}, ...]`: an unpack op with a
  per-bit-width histogram (`OpWork.bits_weights`) costs `sum_b bits_weights[b] * s_per_weight(fmt, b, threads)`, plus
  `sum_b bits_channels[b] * s_per_channel(fmt, b, threads)` where rows carry the optional per-channel cost (short
  rows unpack slower per weight: measured on two shapes); a bit width without a row takes the nearest measured one
  (0-bit weights: the 1-bit row). Without `bits_weights`, or
  for a format / thread count without rows, the `points` fit of kind `unpack` applies (then the fallback model).
- `matmul`: `[{"unit": "npu", "threads": 1, "m": 128, "k": 576, "n": 1536, "seconds": 2.1e-4}, ...]`: INT8 matmul
  and lm_head ops (`wfmt` int8) are interpolated on the measured grid, per (unit, threads):
  1. the (K, N) curve: the measured (K, N) itself, else the nearest one by |ln K - ln K'| + |ln N - ln N'| with the
     time scaled by the FLOP ratio K N / (K' N') at the same M;
  2. along M: seconds are made non-decreasing in M (a larger M cannot be faster; removes timing noise), then
     interpolated linearly in M between measured points; below the smallest measured M the smallest M's time
     (the weight-streaming floor); above the largest, scaled by M / M_max (compute bound).
- elementwise `points` that name their kernel (`"op": "rmsnorm"`, ...; the host calibration's) are also fitted per
  (unit, kernel, threads); an elementwise op whose `OpWork.op` maps to a kernel (`planner.cost.elementwise`) is
  predicted from that kernel's line at `ratio` x its DAG bytes, else from the line over every elementwise point.
- `op_overhead_s`: `{"cpu": s, "npu": s}`, a fixed per-op dispatch cost added to every compute op (matmul, lm_head,
  attention, elementwise) of that unit (the analytic model's cpu_op_overhead_s / npu_dispatch_s; on this host the
  runner's thread hand-off per task); default 0.
A measurement applies only to the thread count it was measured with (a 1-thread profile never stands in for a 4-thread
pool). Op kinds and thread counts without data fall back to another cost model (analytic), so a partial profile is
usable; `fitted_kinds()` says which (unit, kind) pairs are measured.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from planner.cost.base import CostModel
from planner.cost.elementwise import HOST_KERNELS
from planner.plan import OpWork

COMPUTE_KINDS = ("matmul", "lm_head", "attention", "elementwise")


def _work_size(work: OpWork) -> float:
    if work.kind in ("matmul", "lm_head", "attention"):
        return work.flops
    if work.kind == "unpack":
        return float(work.weights)
    return float(work.nbytes)


class _Curve:
    """Seconds of one (unit, threads, K, N) matmul vs M: measured points, made non-decreasing in M."""

    def __init__(self, ms: list[int], secs: list[float]) -> None:
        order = np.argsort(ms)
        self.m = np.asarray(ms, dtype=np.float64)[order]                   # (P,) tokens
        self.s = np.maximum.accumulate(np.asarray(secs, dtype=np.float64)[order])   # (P,) s

    def __call__(self, m: float) -> float:
        if m <= 0:
            return 0.0
        if m > self.m[-1]:
            return float(self.s[-1] * m / self.m[-1])
        return float(np.interp(m, self.m, self.s))


def _fit_rows(rows: np.ndarray, x: np.ndarray, y: np.ndarray) -> tuple[float, float, float]:
    """(a, r, b) >= 0 of seconds ≈ a + r · rows + b · work, least squares in relative error (as `_fit_line`)."""
    from scipy.optimize import nnls

    w = 1.0 / np.maximum(y, 1e-12)
    sr, sx = max(float(rows.max()), 1e-30), max(float(x.max()), 1e-30)
    A = np.stack([np.ones_like(x), rows / sr, x / sx], axis=1) * w[:, None]
    (a, r, b), _ = nnls(A, y * w)
    return float(a), float(r / sr), float(b / sx)


def _fit_line(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """(a, b) >= 0 of seconds ≈ a + b · work, least squares in relative error (weights 1 / seconds): the measured
    sizes span orders of magnitude, and an unweighted fit lets the largest sizes set the intercept — the fixed cost
    of a call (argument checks, the kernel's set-up), which is what a small op costs — often below zero."""
    from scipy.optimize import nnls

    w = 1.0 / np.maximum(y, 1e-12)
    scale = max(float(x.max()), 1e-30)
    A = np.stack([np.ones_like(x), x / scale], axis=1) * w[:, None]
    (a, b), _ = nnls(A, y * w)
    return float(a), float(b / scale)


class TableCostModel(CostModel):
    name = "table"

    def __init__(self, points: list[dict], fallback: CostModel | None = None, unpack: list[dict] | None = None,
                 matmul: list[dict] | None = None, op_overhead_s: dict | None = None) -> None:
        self.fallback = fallback
        self.fits: dict[tuple[str, str, int], tuple[float, float]] = {}   # (unit, kind, threads) -> (s, s per work)
        self.row_fits: dict[tuple[str, str, int], tuple[float, float, float]] = {}   # attention: (s, s/row, s/FLOP)
        groups: dict[tuple[str, str, int], list[tuple[float, float, float]]] = {}
        by_op: dict[tuple[str, str, int], list[tuple[float, float]]] = {}   # elementwise (unit, kernel, threads)
        for i, p in enumerate(points):
            try:
                key = (str(p["unit"]), str(p["kind"]), int(p.get("threads", 1)))
                w, s, r = float(p["work"]), float(p["seconds"]), float(p.get("rows", -1))
            except (KeyError, TypeError, ValueError, AttributeError) as e:
                raise ValueError(f"cost table point {i}: needs unit, kind, work, seconds ({e})") from None
            if w < 0 or s < 0 or key[2] < 1:
                raise ValueError(f"cost table point {i}: work and seconds must be >= 0, threads >= 1")
            groups.setdefault(key, []).append((w, s, r))
            if key[1] == "elementwise" and p.get("op"):
                by_op.setdefault((key[0], str(p["op"]), key[2]), []).append((w, s))
        for key, pts in groups.items():
            x, y, rows = np.array(pts).T                              # (P,), (P,), (P,)
            if key[1] == "attention" and len(pts) >= 3 and rows.min() >= 0 and np.ptp(rows) > 0:
                self.row_fits[key] = _fit_rows(rows, x, y)
            if len(pts) == 1 or np.ptp(x) == 0:
                self.fits[key] = (0.0, float(y.mean() / max(x.mean(), 1e-30)))
                continue
            self.fits[key] = _fit_line(x, y)
        self.op_fits: dict[tuple[str, str, int], tuple[float, float]] = {}   # (unit, kernel, threads) -> (a, b)
        for key, pts in by_op.items():
            x, y = np.array(pts).T
            if x.size >= 2 and np.ptp(x) > 0:
                self.op_fits[key] = _fit_line(x, y)
        self.spw = self._unpack_rows(unpack or [])                   # (fmt, threads) -> (9,) s per weight by bits
        self.spc = self._unpack_rows(unpack or [], "s_per_channel")   # (fmt, threads) -> (9,) s per channel by bits
        self.curves = self._matmul_rows(matmul or [])                # (unit, threads) -> {(K, N): _Curve}
        self.overhead = self._overheads(op_overhead_s or {})         # unit -> s per compute op

    # ---- parsing --------------------------------------------------------------------------------------------------
    @staticmethod
    def _unpack_rows(rows: list[dict], field: str = "s_per_weight") -> dict[tuple[str, int], np.ndarray]:
        """(fmt, threads) -> (9,) `field` by bit width (nearest measured width); `s_per_channel` is optional (0)."""
        got: dict[tuple[str, int], dict[int, float]] = {}
        for i, r in enumerate(rows):
            try:
                fmt, b, th = str(r["fmt"]), int(r["bits"]), int(r.get("threads", 1))
                float(r["s_per_weight"])                             # required in every row
                spw = float(r.get(field, 0.0))
            except (KeyError, TypeError, ValueError, AttributeError) as e:
                raise ValueError(f"cost table unpack row {i}: needs fmt, bits, s_per_weight ({e})") from None
            if not 1 <= b <= 8 or th < 1 or not spw >= 0 or not math.isfinite(spw):
                raise ValueError(f"cost table unpack row {i}: bits must be 1..8, threads >= 1, {field} >= 0")
            got.setdefault((fmt, th), {})[b] = spw
        out = {}
        for key, by_bits in got.items():
            have = np.array(sorted(by_bits))
            table = np.empty(9)
            for b in range(9):                                       # nearest measured bit width (ties: the lower)
                near = int(have[np.argmin(np.abs(have - max(b, 1)))])
                table[b] = by_bits[near]
            out[key] = table
        return out

    @staticmethod
    def _matmul_rows(rows: list[dict]) -> dict[tuple[str, int], dict[tuple[int, int], _Curve]]:
        pts: dict[tuple[str, int], dict[tuple[int, int], tuple[list[int], list[float]]]] = {}
        for i, r in enumerate(rows):
            try:
                unit, th = str(r["unit"]), int(r.get("threads", 1))
                m, k, n, s = int(r["m"]), int(r["k"]), int(r["n"]), float(r["seconds"])
            except (KeyError, TypeError, ValueError, AttributeError) as e:
                raise ValueError(f"cost table matmul row {i}: needs unit, m, k, n, seconds ({e})") from None
            if min(m, k, n, th) < 1 or not s >= 0 or not math.isfinite(s):
                raise ValueError(f"cost table matmul row {i}: m, k, n, threads must be >= 1 and seconds >= 0")
            ms, ss = pts.setdefault((unit, th), {}).setdefault((k, n), ([], []))
            ms.append(m)
            ss.append(s)
        return {key: {kn: _Curve(*v) for kn, v in by_kn.items()} for key, by_kn in pts.items()}

    @staticmethod
    def _overheads(d: dict) -> dict[str, float]:
        if not isinstance(d, dict):
            raise ValueError("cost table op_overhead_s: expected {\"cpu\": s, \"npu\": s}")
        out = {}
        for unit, s in d.items():
            if isinstance(s, bool) or not isinstance(s, (int, float)) or not 0 <= s < math.inf:
                raise ValueError(f"cost table op_overhead_s.{unit}: must be a number >= 0 (got {s!r})")
            out[str(unit)] = float(s)
        return out

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
        for key in ("unpack", "matmul"):
            if not isinstance(doc.get(key, []), list):
                raise ValueError(f"cost table {path}: {key} must be a list of rows")
        if not any(doc.get(k) for k in ("points", "unpack", "matmul")):
            raise ValueError(f"cost table {path}: no measured rows (points, unpack and matmul are empty), so every op "
                             f"would silently take the fallback model; use cost_model=analytic or a measured table")
        try:
            return cls(doc.get("points", []), fallback, doc.get("unpack", []), doc.get("matmul", []),
                       doc.get("op_overhead_s", {}))
        except ValueError as e:
            raise ValueError(f"cost table {path}: {e}") from None

    # ---- queries --------------------------------------------------------------------------------------------------
    def fitted_kinds(self) -> list[tuple[str, str]]:
        kinds = {(u, k) for u, k, _t in self.fits}
        kinds |= {("cpu", "unpack") for _ in self.spw}
        kinds |= {(u, k) for u, _t in self.curves for k in ("matmul", "lm_head")}
        return sorted(kinds)

    def _matmul_grid(self, work: OpWork, unit: str, threads: int) -> float | None:
        by_kn = self.curves.get((unit, threads))
        if not by_kn or work.wfmt != "int8":
            return None
        k, n = max(work.k, 1), max(work.n, 1)
        if (k, n) in by_kn:
            return by_kn[(k, n)](work.m)
        lk, ln = math.log(k), math.log(n)
        kn = min(sorted(by_kn), key=lambda q: abs(math.log(q[0]) - lk) + abs(math.log(q[1]) - ln))
        return by_kn[kn](work.m) * (k * n) / (kn[0] * kn[1])

    def overhead_time(self, work: OpWork, unit: str) -> float:
        return self.overhead.get(unit, 0.0) if work.kind in COMPUTE_KINDS else 0.0

    def op_time(self, work: OpWork, unit: str, threads: int = 1, first_core: int = 0) -> float:
        over = self.overhead_time(work, unit)
        if work.kind == "unpack" and work.bits_weights:
            spw = self.spw.get((work.fmt, threads))
            if spw is not None:
                bw = np.asarray(work.bits_weights[:9], dtype=np.float64)
                t = float(bw @ spw[:bw.size])
                if work.bits_channels:
                    bc = np.asarray(work.bits_channels[:9], dtype=np.float64)
                    t += float(bc @ self.spc[(work.fmt, threads)][:bc.size])
                return t
        if work.kind in ("matmul", "lm_head") and work.wfmt not in ("int8", "kquant") and self.fallback is not None:
            return self.fallback.op_time(work, unit, threads, first_core)    # a peer's measured rate (analytic)
        if work.kind in ("matmul", "lm_head"):
            t = self._matmul_grid(work, unit, threads)
            if t is not None:
                return t + over
        if work.kind == "elementwise" and work.op in HOST_KERNELS:
            kernel, ratio = HOST_KERNELS[work.op]
            kfit = self.op_fits.get((unit, kernel, threads))
            if kfit is not None:                 # the op's own kernel, in its bytes (planner.cost.elementwise)
                return kfit[0] + kfit[1] * work.nbytes * ratio + over
        fit = self.fits.get((unit, work.kind, threads))
        if fit is None:
            if self.fallback is None:
                raise KeyError(f"no measured profile for {unit}/{work.kind} on {threads} thread(s) and no fallback "
                               f"cost model")
            return self.fallback.op_time(work, unit, threads, first_core)
        rf = self.row_fits.get((unit, work.kind, threads))
        if rf is not None:
            return rf[0] + rf[1] * work.m * work.heads + rf[2] * _work_size(work) + over
        a, b = fit
        return a + b * _work_size(work) + over


    def copy_time(self, nbytes: int) -> float:
        fit = self.fits.get(("cpu", "copy", 1))
        if fit is None:
            if self.fallback is None:
                raise KeyError("no measured profile for cpu/copy and no fallback cost model")
            return self.fallback.copy_time(nbytes)
        return fit[0] + fit[1] * nbytes
