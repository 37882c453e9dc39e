"""Resumable sweeps: a job whose run directory already holds a valid `metrics.json` for the same inputs is not re-run.

A run directory counts as finished (`finished`) when
- `metrics.json` exists, parses as a JSON object, and carries the label lists every app writes (`measured_keys`,
  `modelled_keys`, `input_keys`), with every labelled key present, plus any `expected` keys of the app;
- no partial file is left beside it (the hidden `.<name>.<random>.tmp` files of `quant.atomic` writes, which a
  killed job can leave);
- its `config.yaml` equals the configuration of the job about to run (when given), so a changed setting re-runs.

A job is resumed (`resumable`) only when, in addition, the contents of its inputs are those of the finished run:
`inputs.json` (written just before `metrics.json`) records SHA-256 digests of the resolved config, of every file the
config names (a trace CSV, a cost table, a model's GGUF; `input_files`) and of any files the app adds (a measured
profile), and of the metrics document itself; a changed file re-runs the job, and so does a
`metrics.json` edited after the run or one whose echoed inputs (`input_keys`) contradict the config. Digests are cached
by (path, size, mtime_ns) in `outputs/cache/file_hashes.json`, so an unchanged GGUF is not read again.

Apps call it at the start of a job through the `resumable` decorator (outermost, above `one_line_errors`):

    @resumable(expected=("ttft_s",))
    @one_line_errors
    def run(cfg: DictConfig) -> dict: ...

Re-running a killed `-m` sweep with the same `hydra.sweep.dir=<dir>` then finishes only the missing jobs. Set
`EDGELLM_RESUME=0` (or false / no / off, any case: `quant.bounds.strict_bool`) to re-run every job regardless.
"""
from __future__ import annotations

import functools
import hashlib
import json
import math
import os
import sys
from pathlib import Path
from typing import Any, Callable, Iterable

from experiments.common import TMP_RE  # quant.atomic temp files: .<name>.<random>.tmp

RESUME_ENV = "EDGELLM_RESUME"                           # a false value: never skip
LABEL_LISTS = ("measured_keys", "modelled_keys", "input_keys")
INPUTS_FILE = "inputs.json"
REPO = Path(__file__).resolve().parents[1]
HASH_CACHE = REPO / "outputs" / "cache" / "file_hashes.json"
_MISSING = object()


def partial_files(run_dir: str | os.PathLike) -> list[Path]:
    """Leftovers of interrupted atomic writes in `run_dir`."""
    d = Path(run_dir)
    return sorted(p for p in d.iterdir() if p.is_file() and TMP_RE.match(p.name)) if d.is_dir() else []


# ================================================ content digests ====================================================
_hash_memo: dict[str, list] = {}


def file_digest(path: str | os.PathLike) -> str:
    """SHA-256 of a file's contents, cached by (resolved path, size, mtime_ns) in this process and in HASH_CACHE."""
    from quant.atomic import atomic_write_json

    p = Path(path).resolve()
    st = p.stat()
    key, stamp = str(p), [st.st_size, st.st_mtime_ns]
    if not _hash_memo and HASH_CACHE.is_file():
        try:
            _hash_memo.update(json.loads(HASH_CACHE.read_text()))
        except (OSError, ValueError):
            pass
    hit = _hash_memo.get(key)
    if isinstance(hit, list) and hit[:2] == stamp:
        return hit[2]
    h = hashlib.sha256()
    with open(p, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    _hash_memo[key] = [*stamp, h.hexdigest()]
    try:
        atomic_write_json(HASH_CACHE, _hash_memo)
    except OSError:                            # a read-only checkout: digests are recomputed, never wrong
        pass
    return h.hexdigest()


def input_files(cfg) -> list[Path]:
    """Files the resolved config names: a string value that is an existing file, absolute, inside its group's conf/
    directory (`trace.csv: walk_away.csv`) or relative to the repository; and the model's GGUF when it has one."""
    from omegaconf import OmegaConf

    from experiments.common import CONF_DIR

    try:
        plain = OmegaConf.to_container(cfg, resolve=True)
    except Exception:
        plain = OmegaConf.to_container(cfg, resolve=False)
    found: set[Path] = set()

    def walk(node: Any, key: str) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                walk(v, f"{key}.{k}" if key else str(k))
        elif isinstance(node, list):
            for v in node:
                walk(v, key)
        elif isinstance(node, str) and node and len(node) < 4096 and "\n" not in node and "\0" not in node:
            p = Path(node)
            cands = [p] if p.is_absolute() else [CONF_DIR / key.split(".")[0] / p, REPO / p]
            for c in cands:
                try:
                    if c.is_file():
                        found.add(c.resolve())
                        break
                except OSError:
                    continue

    walk(plain, "")
    model = plain.get("model") if isinstance(plain, dict) else None
    if isinstance(model, dict) and model.get("gguf_file"):
        try:
            from quant.arch import ModelSpec
            from quant.gguf_model import gguf_path

            found.add(Path(gguf_path(ModelSpec(**model))).resolve())
        except Exception:                      # no such package here: the app's own check reports it
            pass
    return sorted(found)


def metrics_digest(doc: dict) -> str:
    """SHA-256 of a metrics document in a canonical JSON form (the same before it is written and after it is read)."""
    from quant.atomic import json_default

    canon = json.loads(json.dumps(doc, default=json_default))
    return hashlib.sha256(json.dumps(canon, sort_keys=True).encode()).hexdigest()


def input_digest(config_yaml: str, files: Iterable[Path], metrics: dict | None = None) -> dict:
    """What `inputs.json` holds: digests of the config text, of each input file (by path) and of the metrics."""
    doc = {"config_sha256": hashlib.sha256(config_yaml.encode()).hexdigest(),
           "files": {str(p): file_digest(p) for p in sorted(set(files)) if Path(p).is_file()}}
    if metrics is not None:
        doc["metrics_sha256"] = metrics_digest(metrics)
    return doc


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool) \
            and not isinstance(b, bool):
        return math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=0.0) or a == b
    return a == b


def contradiction(doc: dict, cfg) -> str | None:
    """The first echoed input of metrics.json (`input_keys`) that the config gives differently, as text, or None.
    Keys the app derives (not in the config, or null / 0 there: "the default") are covered by the metrics digest."""
    from omegaconf import OmegaConf

    for k in doc.get("input_keys", []):
        try:
            v = OmegaConf.select(cfg, k, default=_MISSING)
        except Exception:
            continue
        if v is _MISSING or v is None or (isinstance(v, (int, float)) and not isinstance(v, bool) and v == 0):
            continue                           # derived by the app (the devices' cores; 0 / null: "the default")
        v = OmegaConf.to_container(v, resolve=True) if OmegaConf.is_config(v) else v
        if not _same(doc.get(k), v):
            return f"{k} = {doc.get(k)!r} in metrics.json, {v!r} in the config"
    return None


# ================================================ finished runs ======================================================
def load_finished(run_dir: str | os.PathLike, expected: Iterable[str] = (), config_yaml: str | None = None
                  ) -> dict[str, Any] | None:
    """The metrics of a finished run in `run_dir` (see the module docstring), else None."""
    d = Path(run_dir)
    path = d / "metrics.json"
    if not path.is_file() or partial_files(d):
        return None
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict) or any(not isinstance(doc.get(k), list) for k in LABEL_LISTS):
        return None
    labelled = {k for lst in LABEL_LISTS for k in doc[lst] if isinstance(k, str)}
    if any(k not in doc for k in labelled) or any(k not in doc for k in expected):
        return None
    if config_yaml is not None:
        try:
            if (d / "config.yaml").read_text() != config_yaml:
                return None
        except OSError:
            return None
    return doc


def finished(run_dir: str | os.PathLike, expected: Iterable[str] = (), config_yaml: str | None = None) -> bool:
    """True when `run_dir` holds a valid, complete result (see the module docstring)."""
    return load_finished(run_dir, expected, config_yaml) is not None


def resume_check(run_dir: Path, cfg, expected: Iterable[str] = (), files: Iterable[Path] = ()
                 ) -> tuple[dict | None, str]:
    """(stored metrics, "") when the job in `run_dir` may be skipped; else (None, why not — "" when there is simply
    no finished run)."""
    from omegaconf import OmegaConf

    text = OmegaConf.to_yaml(cfg, resolve=True)
    doc = load_finished(run_dir, expected, text)
    if doc is None:
        return None, "config changed" if load_finished(run_dir, expected) is not None else ""
    try:
        stored = json.loads((Path(run_dir) / INPUTS_FILE).read_text())
    except (OSError, ValueError):
        return None, f"no {INPUTS_FILE} (input digests) beside metrics.json"
    now = input_digest(text, [*input_files(cfg), *files], doc)
    if not isinstance(stored, dict) or stored.get("metrics_sha256") != now["metrics_sha256"]:
        return None, "metrics.json changed after the run"
    if stored.get("config_sha256") != now["config_sha256"]:
        return None, "config changed"
    changed = sorted(set(stored.get("files", {}).items()) ^ set(now["files"].items()))
    if changed:
        return None, f"input file {changed[0][0]} changed"
    why = contradiction(doc, cfg)
    if why:
        return None, f"metrics.json contradicts the config ({why})"
    return doc, ""


def enabled() -> bool:
    """False when EDGELLM_RESUME holds a false value (0 / false / no / off, any case); a bad spelling is an error."""
    from quant.bounds import strict_bool

    return strict_bool(os.environ.get(RESUME_ENV, "1"), RESUME_ENV)


_pending: list = []                                       # (cfg, files) of the job running in this process


def _record_inputs(out: Path, doc: dict) -> None:
    """`experiments.common.BEFORE_METRICS` hook: write inputs.json for the running job, just before metrics.json."""
    if not _pending:
        return
    from omegaconf import OmegaConf

    from quant.atomic import atomic_write_json

    cfg, files = _pending[-1]
    extra = list(files(cfg)) if files is not None else []       # e.g. a profile measured by this very run
    text = OmegaConf.to_yaml(cfg, resolve=True)
    atomic_write_json(Path(out) / INPUTS_FILE, input_digest(text, [*input_files(cfg), *extra], doc))


def resumable(expected: Iterable[str] = (), files: Callable[[Any], Iterable[Path]] | None = None) -> Callable:
    """Decorator for an app's `run(cfg)`: return the stored metrics instead of running when the job's run directory
    (`experiments.common.run_dir`) is finished for the same inputs (`resume_check`); otherwise run; `inputs.json` is
    written just before the run's metrics.json. `files(cfg)`: input files the config does not name (a measured
    profile)."""
    expected = tuple(expected)

    def deco(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def wrapper(cfg, *args, **kwargs):
            from experiments.common import BEFORE_METRICS, ConfigError, fail, run_dir

            out = run_dir()
            try:
                on = enabled()
            except ConfigError as e:
                fail(str(e))
            if on:
                doc, why = resume_check(out, cfg, expected, list(files(cfg)) if files is not None else [])
                if doc is not None:
                    print(f"{out}: finished earlier (valid metrics.json, same inputs): not re-run", file=sys.stderr)
                    return doc
                if why:
                    print(f"{out}: re-run: {why}", file=sys.stderr)
            (out / INPUTS_FILE).unlink(missing_ok=True)
            if _record_inputs not in BEFORE_METRICS:
                BEFORE_METRICS.append(_record_inputs)
            _pending.append((cfg, files))
            try:
                return fn(cfg, *args, **kwargs)
            finally:
                _pending.pop()

        wrapper.resumable = True
        return wrapper

    return deco
