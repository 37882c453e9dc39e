"""One results table from a multirun (docs/sweeps.md "One results table"): every job's `metrics.json` under a sweep
directory, of any app, becomes one row; the swept factors (from each job's `.hydra/overrides.yaml`) become columns.

    python -m experiments.results multirun/coldstart/<date_time>               # -> results.parquet + results.csv there
    python -m experiments.results <sweep dir> --out <dir>

Columns (prefixes keep the labels in the column names, so they survive the CSV):
- `job` (run directory relative to the sweep dir), `app` (Hydra job name);
- `sweep.<key>`: every override of the job's command line, typed as YAML reads it (`bits=5` -> 5.0 stays a float if
  written `5.0`); keys of the `hydra` namespace are left out;
- `measured.<key>` / `modelled.<key>` / `input.<key>`: numbers as labelled by the job's `measured_keys` /
  `modelled_keys` / `input_keys`; `info.<key>`: unlabelled values (names, strings); nested values as JSON text;
- `<label>.critical_path.<phase>.bound`: the resource bounding each cold-start phase (`planner.critical_path`), beside
  the whole attribution's JSON text in `<label>.critical_path`.
A key labelled differently by different jobs keeps each job's label (two columns). Jobs without a `metrics.json`
(unfinished, failed) are counted and left out. Load with `pandas.read_parquet(<dir>/results.parquet)`.

`ResultsCallback` builds the same table automatically at the end of a multirun (`hydra.callbacks`).
"""
from __future__ import annotations

import argparse
import io
import json
import sys
from pathlib import Path
from typing import Any

import pandas as pd

from quant.atomic import atomic_write_bytes

LABELS = (("measured_keys", "measured"), ("modelled_keys", "modelled"), ("input_keys", "input"))
META = {k for k, _ in LABELS}


def _overrides(job: Path) -> dict[str, Any]:
    import yaml

    p = job / ".hydra" / "overrides.yaml"
    if not p.is_file():
        return {}
    try:
        items = yaml.safe_load(p.read_text()) or []
    except (yaml.YAMLError, ValueError) as e:
        raise ValueError(f"{p}: not valid YAML ({' '.join(str(e).split())[:200]})") from None
    if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
        raise ValueError(f"{p}: must be a list of key=value overrides (got {type(items).__name__})")
    return sweep_columns(items)


def sweep_columns(items: list[str]) -> dict[str, Any]:
    """`sweep.<key>` columns of a job's `key=value` overrides, typed as YAML reads them; `hydra.*` left out."""
    import yaml

    out = {}
    for item in items:
        key, sep, val = str(item).partition("=")
        key = key.lstrip("+~")
        if not sep or key.startswith("hydra"):
            continue
        try:
            v = yaml.safe_load(val)
        except yaml.YAMLError:
            v = val
        out[f"sweep.{key}"] = v if isinstance(v, (int, float, str, bool)) or v is None else json.dumps(v)
    return out


def _app(job: Path) -> str:
    import yaml

    p = job / ".hydra" / "hydra.yaml"
    if p.is_file():
        try:
            return str(yaml.safe_load(p.read_text())["hydra"]["job"]["name"])
        except (KeyError, TypeError, yaml.YAMLError):
            pass
    return ""


def _row(job: Path, root: Path, doc: dict) -> dict[str, Any]:
    return row(str(job.relative_to(root)) if job != root else ".", _app(job), _overrides(job), doc)


def row(job: str, app: str, sweep: dict[str, Any], doc: dict) -> dict[str, Any]:
    """One row of the table: the job's name and app, its `sweep.*` columns and its labelled metrics `doc`."""
    label = {}
    for lst, name in LABELS:
        for k in doc.get(lst, []) or []:
            label.setdefault(k, name)
    out: dict[str, Any] = {"job": job, "app": app}
    out.update(sweep)
    for k, v in doc.items():
        if k in META:
            continue
        if k == "critical_path" and isinstance(v, dict):      # the bound of each phase, a column to filter on
            for phase, a in v.items():
                if isinstance(a, dict) and "bound" in a:
                    out[f"{label.get(k, 'info')}.critical_path.{phase}.bound"] = a["bound"]
        if isinstance(v, (dict, list)):
            v = json.dumps(v, sort_keys=True)
        out[f"{label.get(k, 'info')}.{k}"] = v
    return out


def check_shape(doc: Any, path: Path) -> None:
    """A metrics.json as the apps write it: an object whose label lists (when present) are lists of key names."""
    if not isinstance(doc, dict):
        raise ValueError(f"{path}: must be a JSON object of metrics (got {type(doc).__name__})")
    for lst, _ in LABELS:
        v = doc.get(lst, [])
        if not isinstance(v, list) or not all(isinstance(k, str) for k in v):
            raise ValueError(f"{path}: {lst} must be a list of key names (got {v!r:.80})")


def jobs(root: str | Path) -> tuple[list[Path], list[Path]]:
    """(finished job dirs, unfinished job dirs) under a sweep dir; a job dir holds `.hydra/` or `metrics.json`."""
    root = Path(root)
    dirs = {p.parent for p in root.rglob("metrics.json")} | {p.parent.parent for p in root.rglob(".hydra/config.yaml")}
    fin = sorted(d for d in dirs if (d / "metrics.json").is_file())
    return fin, sorted(d for d in dirs if d not in fin)


def build(root: str | Path) -> pd.DataFrame:
    """The results table of the sweep under `root` (one row per finished job, sorted by job)."""
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"sweep dir: {root} is not a directory")
    fin, _ = jobs(root)
    if not fin:
        raise FileNotFoundError(f"sweep dir: no metrics.json under {root}")
    rows = []
    for job in fin:
        try:
            doc = json.loads((job / "metrics.json").read_text())
        except ValueError as e:
            raise ValueError(f"{job / 'metrics.json'}: not valid JSON ({e})") from None
        check_shape(doc, job / "metrics.json")
        rows.append(_row(job, root, doc))
    return table(rows)


def table(rows: list[dict[str, Any]] | pd.DataFrame) -> pd.DataFrame:
    """Rows (`row`) as the results table: `job`, `app`, the `sweep.*` columns sorted, then the rest; one type per
    column."""
    df = rows if isinstance(rows, pd.DataFrame) else pd.DataFrame(rows)
    front = ["job", "app"] + sorted(c for c in df.columns if c.startswith("sweep."))
    rest = [c for c in df.columns if c not in front]
    df = df[front + rest]
    for c in df.columns:                      # Parquet needs one type per column: mixed objects become text
        if df[c].dtype == object and df[c].map(lambda v: type(v) if v is not None else None).nunique() > 1:
            df[c] = df[c].map(lambda v: None if v is None or (isinstance(v, float) and v != v) else str(v))
    return df


def write(df: pd.DataFrame, out: str | Path) -> dict[str, Path]:
    """`results.parquet` (pyarrow) and `results.csv` in `out`, atomically."""
    out = Path(out)
    buf = io.BytesIO()
    df.to_parquet(buf, engine="pyarrow", index=False)
    paths = {"parquet": out / "results.parquet", "csv": out / "results.csv"}
    atomic_write_bytes(paths["parquet"], buf.getvalue())
    atomic_write_bytes(paths["csv"], df.to_csv(index=False).encode())
    return paths


try:
    from hydra.experimental.callback import Callback
except ImportError:                                  # pragma: no cover - hydra is a dependency
    Callback = object


class ResultsCallback(Callback):
    """Hydra callback: build the results table in the sweep dir when a multirun ends.

        hydra:
          callbacks:
            results:
              _target_: experiments.results.ResultsCallback
    """

    def on_multirun_end(self, config, **kwargs) -> None:
        root = Path(config.hydra.sweep.dir)
        try:
            paths = write(build(root), root)
            print(f"results table: {paths['parquet']} ({paths['csv'].name})", file=sys.stderr)
        except (FileNotFoundError, ValueError) as e:
            print(f"results table not written: {e}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sweep_dir", help="a Hydra multirun directory (or any directory with */metrics.json)")
    ap.add_argument("--out", help="output directory (default: the sweep dir)")
    a = ap.parse_args(argv)
    try:
        df = build(a.sweep_dir)
        paths = write(df, a.out or a.sweep_dir)
    except (OSError, ValueError) as e:
        print(f"error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    _, unfinished = jobs(a.sweep_dir)
    sweep_cols = [c for c in df.columns if c.startswith("sweep.")]
    print(f"{len(df)} jobs ({len(unfinished)} unfinished left out), factors: {', '.join(sweep_cols) or 'none'}")
    print(f"{paths['parquet']}\n{paths['csv']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
