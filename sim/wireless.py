"""Wireless links driven by RSSI traces (Voltron §3.2.3 / Fig. 8a; docs/design.md §5).

Owns:
- `TraceConfig`: conf/trace/<name>.yaml (schema `trace_schema`): the CSV file (columns `time_s,link,dbm`, one row per
  sample, links named as in conf/cluster `links`), and how to extend it (hold the last sample).
- `RssiTrace`: loads and validates the CSV (a malformed file fails with one line naming the file, row and column),
  answers the RSSI of every link at time t (sample-and-hold between samples).
- `LinkTracker`: turns the trace into a `LinkState` over time (goodput and latency per link from the RSSI table of
  `planner.voltron.rssi`), disconnected below its threshold and re-connected with hysteresis.
- `synth_trace`: the generator of the shipped traces (`python -m sim.wireless` rewrites conf/trace/*.csv). They are
  synthetic, shaped like the paper's Fig. 8a office walk (no measured trace is public): steady strong; a gradual
  walk-away of the user (phone + watch) from the tablet; the same walk-away that drops the link below the disconnect
  threshold and comes back. Small seeded fading (σ = 1.5 dB) rides on the path.
"""
from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from planner.voltron.comm import LinkState
from planner.voltron.rssi import RssiTable

TRACE_DIR = Path(__file__).resolve().parents[1] / "conf" / "trace"
COLUMNS = ("time_s", "link", "dbm")
MAX_TRACE_BYTES = 64 << 20          # a trace CSV larger than this is rejected before parsing


def _is_float(s: str) -> bool:
    try:
        float(s)
    except ValueError:
        return False
    return True


@dataclass
class TraceConfig:
    name: str = "???"
    csv: str = "???"                 # file name inside conf/trace (or an absolute path)
    description: str = ""
    squeeze_csv: str = ""            # optional CSV `time_s,device,compute,goodput` in conf/trace: a device's compute
                                     # speed and its link's goodput as fractions of nominal (background load,
                                     # throttling, interference); the multi-device simulator applies it
                                     # (sim/multidevice/squeeze.py); "" = none

    def __post_init__(self) -> None:
        if not self.csv.endswith(".csv"):
            raise ValueError(f"trace.csv must name a .csv file (got {self.csv!r})")
        if self.squeeze_csv and not self.squeeze_csv.endswith(".csv"):
            raise ValueError(f"trace.squeeze_csv must name a .csv file (got {self.squeeze_csv!r})")


class RssiTrace:
    def __init__(self, times: dict[str, np.ndarray], dbm: dict[str, np.ndarray], name: str = ""):
        self.name = name
        self.times = times           # link -> (K,) s, ascending
        self.dbm = dbm               # link -> (K,) dBm

    @classmethod
    def load(cls, cfg: TraceConfig) -> "RssiTrace":
        """Parse and validate the CSV: UTF-8 text, header exactly `time_s,link,dbm` (any order, each once), every row
        exactly three fields; a bad file raises ValueError naming the file, the row (1 = header) and the column."""
        path = Path(cfg.csv) if Path(cfg.csv).is_absolute() else TRACE_DIR / cfg.csv
        if not path.is_file():
            raise FileNotFoundError(f"{path} not found (trace={cfg.name})")
        if path.stat().st_size > MAX_TRACE_BYTES:
            raise ValueError(f"{path}: {path.stat().st_size} bytes, larger than the {MAX_TRACE_BYTES}-byte limit")
        raw = path.read_bytes()
        nul = raw.find(b"\0")
        if nul >= 0:
            raise ValueError(f"{path}: binary file (NUL byte at offset {nul}), not a CSV trace")
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ValueError(f"{path}: not UTF-8 text (byte {e.start}), not a CSV trace") from None
        rows: dict[str, list[tuple[float, float]]] = {}
        try:
            reader = csv.reader(io.StringIO(text, newline=""))
            header = next(reader, None)
            if header is None or sorted(header) != sorted(COLUMNS):
                dup = next((c for c in COLUMNS if header and header.count(c) > 1), None)
                why = f"duplicate column {dup!r}" if dup else f"got {header}"
                raise ValueError(f"{path}:1: header must be time_s,link,dbm, each once ({why})")
            col = {c: header.index(c) for c in COLUMNS}
            for row in reader:
                i = reader.line_num
                if not row:
                    continue                         # blank line
                if len(row) != len(COLUMNS):
                    raise ValueError(f"{path}:{i}: {len(row)} fields, the header has {len(COLUMNS)} (got {row})")
                ts, link, ds = row[col["time_s"]], row[col["link"]], row[col["dbm"]]
                try:
                    t, d = float(ts), float(ds)
                except ValueError:
                    bad = "time_s" if not _is_float(ts) else "dbm"
                    raise ValueError(f"{path}:{i}: column {bad} must be a number (got {row})") from None
                if not (np.isfinite(t) and t >= 0):
                    raise ValueError(f"{path}:{i}: column time_s must be a finite number >= 0 (got {row})")
                if not (np.isfinite(d) and -120 <= d <= 0):
                    raise ValueError(f"{path}:{i}: column dbm must be in [-120, 0] (got {row})")
                if not link:
                    raise ValueError(f"{path}:{i}: column link is empty")
                rows.setdefault(link, []).append((t, d))
        except csv.Error as e:
            raise ValueError(f"{path}:{reader.line_num}: malformed CSV ({e})") from None
        if not rows:
            raise ValueError(f"{path}: no samples")
        times, dbm = {}, {}
        for link, s in rows.items():
            a = np.array(s)
            if (np.diff(a[:, 0]) <= 0).any():
                raise ValueError(f"{path}: times of link {link} must be strictly increasing")
            times[link], dbm[link] = a[:, 0], a[:, 1]
        return cls(times, dbm, cfg.name)

    def rssi(self, links: list[str], t: float) -> np.ndarray:
        """(len(links),) dBm at time t (sample-and-hold; before the first sample: the first value)."""
        out = np.empty(len(links))
        for i, link in enumerate(links):
            if link not in self.times:
                raise ValueError(f"trace {self.name} has no link {link!r} (has {sorted(self.times)})")
            k = max(int(np.searchsorted(self.times[link], t, side="right")) - 1, 0)
            out[i] = self.dbm[link][k]
        return out


class LinkTracker:
    """Stateful view of a trace: a link that dropped below `disconnect_dbm` stays down until the RSSI is
    `reconnect_db` above the threshold again (no flapping at the edge)."""

    def __init__(self, trace: RssiTrace, table: RssiTable, links: list[str]):
        self.trace, self.table, self.links = trace, table, links
        self.up = np.ones(len(links), dtype=bool)

    def state(self, t: float) -> LinkState:
        r = self.trace.rssi(self.links, t)
        down = r < self.table.disconnect_dbm
        back = r >= self.table.disconnect_dbm + self.table.reconnect_db
        self.up = np.where(self.up, ~down, back)
        return LinkState.from_rssi(self.table, r, up=self.up)


def synth_trace(kind: str, duration_s: float = 1800.0, dt: float = 1.0,
                seed: int = 0) -> list[tuple[float, str, float]]:
    """Rows (time_s, link, dbm) of one of the shipped trace shapes."""
    rng = np.random.default_rng(seed)
    t = np.arange(0.0, duration_s + dt / 2, dt)
    fade = lambda: rng.normal(0, 1.5, t.size)                                     # noqa: E731
    if kind == "steady_strong":
        l1, l2 = -42 + fade(), -40 + fade()
    elif kind == "walk_away":
        # user walks away from the tablet between 60 s and 360 s: −42 → −74 dBm (weak, still connected), stays away
        ramp = np.clip((t - 60) / 300, 0, 1)
        l1 = -42 - 32 * ramp + fade()
        l2 = -40 + fade()                                                         # the watch moves with the user
    elif kind == "walk_away_disconnect":
        # −42 → −88 dBm between 60 s and 300 s (link lost below −80), away until 600 s, back to −45 by 720 s
        down = np.clip((t - 60) / 240, 0, 1)
        up = np.clip((t - 600) / 120, 0, 1)
        l1 = -42 - 46 * down + 43 * up + fade()
        l2 = -40 + fade()
    else:
        raise ValueError(f"unknown trace kind {kind!r}")
    rows = [(float(a), "link1", float(np.clip(b, -120, 0))) for a, b in zip(t, l1)]
    rows += [(float(a), "link2", float(np.clip(b, -120, 0))) for a, b in zip(t, l2)]
    return rows


def write_trace(path: Path, rows: list[tuple[float, str, float]]) -> None:
    from quant.atomic import atomic_write_text

    lines = ["time_s,link,dbm"] + [f"{t:.1f},{link},{d:.2f}" for t, link, d in rows]
    atomic_write_text(path, "\n".join(lines) + "\n")


if __name__ == "__main__":
    for k in ("steady_strong", "walk_away", "walk_away_disconnect"):
        write_trace(TRACE_DIR / f"{k}.csv", synth_trace(k))
        print(f"wrote {TRACE_DIR / f'{k}.csv'}")
