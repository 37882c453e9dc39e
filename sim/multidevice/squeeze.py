"""Squeeze of a run-time scenario: a device's compute speed and its link's goodput over time as fractions of nominal,
from the CSV named by a trace's `squeeze_csv` (columns `time_s,device,compute,goodput`; device = index in the
cluster, 0 = main device; compute in (0, 1]: a background app on its big cores, thermal throttling; goodput in (0, 1]:
the share of the PHY goodput its RSSI gives that the link actually gets — interference, a congested channel; the main
device has no link of its own, its goodput must be 1; sample-and-hold, 1 before a device's first sample). The
simulated cluster divides that device's compute seconds by `compute` and multiplies its link's goodput by
`goodput`; the planner is not told (it sees RSSI, and the squeeze only through the step times it measures,
`planner/voltron/feedback.py`).
"""
from __future__ import annotations

import csv
import dataclasses
import io
from pathlib import Path

import numpy as np

from planner.voltron.comm import LinkState
from quant.arch import conf_yaml
from sim.wireless import TRACE_DIR, TraceConfig

COLUMNS = ("time_s", "device", "compute", "goodput")


def trace_config(name: str) -> TraceConfig:
    """conf/trace/<name>.yaml as a TraceConfig (its RSSI csv and optional squeeze_csv), outside Hydra."""
    return TraceConfig(**conf_yaml("trace", name, TRACE_DIR.parent))


class Squeeze:
    def __init__(self, times: dict[int, np.ndarray], values: dict[int, np.ndarray]):
        self.times, self.values = times, values         # device -> (K,) s; device -> (K, 2) compute, goodput

    @classmethod
    def none(cls) -> "Squeeze":
        return cls({}, {})

    @classmethod
    def load(cls, cfg: TraceConfig) -> "Squeeze":
        """The trace's squeeze (none when `squeeze_csv` is empty); a malformed file raises ValueError naming the file,
        the row (1 = header) and the column."""
        if not cfg.squeeze_csv:
            return cls.none()
        path = Path(cfg.squeeze_csv) if Path(cfg.squeeze_csv).is_absolute() else TRACE_DIR / cfg.squeeze_csv
        if not path.is_file():
            raise FileNotFoundError(f"{path} not found (trace={cfg.name}, squeeze_csv)")
        rows: dict[int, list[tuple[float, float, float]]] = {}
        reader = csv.reader(io.StringIO(path.read_text(encoding="utf-8"), newline=""))
        header = next(reader, None)
        if header is None or sorted(header) != sorted(COLUMNS):
            raise ValueError(f"{path}:1: header must be {','.join(COLUMNS)} (got {header})")
        col = {c: header.index(c) for c in COLUMNS}
        for row in reader:
            i = reader.line_num
            if not row:
                continue
            if len(row) != len(COLUMNS):
                raise ValueError(f"{path}:{i}: {len(row)} fields, the header has {len(COLUMNS)} (got {row})")
            vals = {}
            for c in COLUMNS:
                try:
                    vals[c] = int(row[col[c]]) if c == "device" else float(row[col[c]])
                except ValueError:
                    kind = "an integer" if c == "device" else "a number"
                    raise ValueError(f"{path}:{i}: column {c} must be {kind} (got {row})") from None
            t, d, c, g = vals["time_s"], vals["device"], vals["compute"], vals["goodput"]
            if not (np.isfinite(t) and t >= 0) or d < 0 or not all(np.isfinite(x) and 0 < x <= 1 for x in (c, g)):
                raise ValueError(f"{path}:{i}: need time_s >= 0, device >= 0, 0 < compute, goodput <= 1 (got {row})")
            if d == 0 and g != 1:
                raise ValueError(f"{path}:{i}: device 0 (the main device) has no link: goodput must be 1 (got {row})")
            rows.setdefault(d, []).append((t, c, g))
        times, values = {}, {}
        for d, r in rows.items():
            a = np.array(r)
            if (np.diff(a[:, 0]) <= 0).any():
                raise ValueError(f"{path}: times of device {d} must be strictly increasing")
            times[d], values[d] = a[:, 0], a[:, 1:]
        return cls(times, values)

    def check(self, n_devices: int, name: str = "") -> None:
        bad = [d for d in self.times if d >= n_devices]
        if bad:
            raise ValueError(f"trace {name}: squeeze names device {bad[0]}, the cluster has {n_devices} devices")

    def at(self, n_devices: int, t: float) -> tuple[np.ndarray, np.ndarray] | None:
        """((D,) compute speed, (D,) goodput share) of every device at time t; None when nothing is squeezed."""
        if not self.times:
            return None
        out = np.ones((2, n_devices))
        for d, ts in self.times.items():
            k = int(np.searchsorted(ts, t, side="right")) - 1
            if k >= 0 and d < n_devices:
                out[:, d] = self.values[d][k]
        return out[0], out[1]

    @staticmethod
    def links(links: LinkState, goodput: np.ndarray) -> LinkState:
        """The links the cluster actually has: `links` (from RSSI) with each link's goodput scaled by its share."""
        if np.all(goodput == 1):
            return links
        return dataclasses.replace(links, goodput=links.goodput * goodput)


# ---- the shipped run-time scenarios (python -m sim.multidevice.squeeze rewrites their CSVs in conf/trace) ----------
def scenario_rows(kind: str, duration_s: float = 1800.0, dt: float = 1.0, seed: int = 0):
    """(RSSI rows (time_s, link, dbm), squeeze rows (time_s, device, compute, goodput)) of a shipped scenario.
    Synthetic, with the same seeded fading (σ = 1.5 dB) as `sim.wireless.synth_trace`:
    - `weak_link`: the user carries phone and watch into the next room at 40 s: within 2 s the tablet's link (link1)
      falls from −42 to −76 dBm (MCS 0–2; held above the MCS 0 sensitivity, −79 dBm, so it stays connected) and gets
      10 % of the goodput that RSSI gives (walls, a congested channel: the 802.11 table gives the PHY rate of an
      otherwise idle channel), until 160 s; by 164 s both are back. The planner sees only the RSSI. A model that
      needs the tablet's memory keeps exchanging activations with it; only communication scaling (activations to
      INT8 / INT4, then pruning activations with their remote shards) shrinks those bytes — pruning shards or lowering
      weight precision does not.
    - `compute_squeeze`: links steady and strong; from 40 s to 200 s the main device runs at 45 % of its nominal compute
      speed (a background app on its big cores / thermal throttling), then recovers. The planner is not told; it sees
      slower steps. Lower precision needs a reload and does not suffice; pruning shards does, at once."""
    rng = np.random.default_rng(seed)
    t = np.arange(0.0, duration_s + dt / 2, dt)
    fade = lambda: rng.normal(0, 1.5, t.size)                                     # noqa: E731
    if kind == "weak_link":
        down = np.clip((t - 40) / 2, 0, 1) - np.clip((t - 160) / 4, 0, 1)
        l1 = -42 - 34 * down + fade()
        l2 = -40 + fade()
        squeeze = [(0.0, 1, 1.0, 1.0), (40.0, 1, 1.0, 0.03), (164.0, 1, 1.0, 1.0)]
    elif kind == "compute_squeeze":
        l1, l2 = -42 + fade(), -40 + fade()
        squeeze = [(0.0, 0, 1.0, 1.0), (40.0, 0, 0.45, 1.0), (200.0, 0, 1.0, 1.0)]
    else:
        raise ValueError(f"unknown scenario {kind!r}")
    rows = [(float(a), "link1", float(np.clip(b, -78.5, 0))) for a, b in zip(t, l1)]
    rows += [(float(a), "link2", float(np.clip(b, -120, 0))) for a, b in zip(t, l2)]
    return rows, squeeze


def write_squeeze(path: Path, rows) -> None:
    from quant.atomic import atomic_write_text

    lines = [",".join(COLUMNS)] + [f"{t:.1f},{d},{c:.3f},{g:.3f}" for t, d, c, g in rows]
    atomic_write_text(path, "\n".join(lines) + "\n")


if __name__ == "__main__":
    from sim.wireless import write_trace

    for k in ("weak_link", "compute_squeeze"):
        rssi_rows, sq = scenario_rows(k)
        write_trace(TRACE_DIR / f"{k}.csv", rssi_rows)
        write_squeeze(TRACE_DIR / f"{k}_load.csv", sq)
        print(f"wrote {TRACE_DIR / f'{k}.csv'} and {TRACE_DIR / f'{k}_load.csv'}")
