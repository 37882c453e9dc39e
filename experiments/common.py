"""Shared plumbing for the thin Hydra apps: config schemas registration, typed conversion with one-line errors,
the run directory, the metrics writer that labels every number as measured or modelled, and the one input-validation
layer every app uses (docs: README "Apps", bad input).

Conventions every app follows:
- `metrics.json` in the run directory: flat keys; `measured_keys` / `modelled_keys` list which numbers were measured on
  this machine and which come out of a model (simulation, cost model, size estimate); `input_keys` are settings of the
  run echoed for convenience (e.g. the bit budget), neither measured nor modelled. `metrics.json` is written last, so a
  run directory is finished exactly when it holds `metrics.json` (`prepare_run_dir` removes it first on a re-run).
- `config.yaml`: the resolved config of the run.
- `manifest.json`: the app, the one-job command, the commit (and whether the tree was dirty), the machine's identity
  and the finish time (`run_manifest`); `experiments.report` builds the results pages of docs/results/ from it.
- Bad input: one line `error: <key>: ...` on stderr naming the key, exit status 2, before any work, nothing written.
  `precheck` composes the config of every job (all jobs of a `-m` sweep) and validates it before Hydra creates a run
  directory or a log file.

Validation helpers (used by the apps and the schemas' range checks): `check_name` (names that become paths),
`safe_path` (every write stays under its root), `finite` / `int_in` / `strict_bool` / `check_numbers` (from
`quant.bounds`: typed, NaN/inf-free ranges, one true/false rule), `check_path_names` (every name in a path),
`SIZE_LIMITS` (documented maxima of the size keys) and `check_resources` (a modelled time / memory estimate checked
against this machine: an error when it cannot fit in the available memory, a warning when it is merely long).
"""
from __future__ import annotations

import contextlib
import errno
import functools
import os
import re
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence, TypeVar

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

from quant.arch import NAME_RE, ModelSpec, check_name  # noqa: F401  (re-exported: one identifier rule)
from quant.atomic import TMP_RE, atomic_write_json, atomic_write_text
from quant.bounds import ConfigError, check_numbers, finite, int_in, strict_bool  # noqa: F401  (re-exported)

T = TypeVar("T")

CONF_DIR = Path(__file__).resolve().parents[1] / "conf"
MAIN_PID_ENV = "EDGELLM_APP_PID"      # pid of the app's main process (joblib workers watch it)
LONG_RUN_S = 60.0                     # s: a modelled run time above this prints a warning with the estimate


# ================================================ value checks =======================================================
def safe_path(root: str | os.PathLike, *parts: str, key: str = "") -> Path:
    """`root/parts...`, resolved; a ConfigError naming `key` when it would leave `root` (.., absolute parts, links)."""
    base = Path(root).resolve()
    p = base.joinpath(*parts).resolve()
    if p != base and base not in p.parents:
        raise ConfigError(f"{key or 'path'}: {'/'.join(parts)!r} would write outside {base}")
    return p


# A name that becomes part of a path (a run directory, a profile store, a cache file) is checked by `check_name`, the
# model.name rule: every config key named `name`, and every key the app's `hydra.run.dir` / `hydra.sweep.dir` /
# `hydra.sweep.subdir` interpolates (`${trace.name}`), for every job, in `precheck`.
HYDRA_DIR_KEYS = ("hydra.run.dir", "hydra.sweep.dir", "hydra.sweep.subdir")
_DIR_REF = re.compile(r"\$\{([A-Za-z_][\w.]*)\}")    # ${key.sub}; not ${now:...} / ${hydra:...} (resolver calls)


def dir_template_keys(templates: Iterable[str]) -> list[str]:
    """Config keys interpolated by run-directory templates (hydra.* keys excluded: Hydra's own, e.g. job.num)."""
    keys = {m.group(1) for t in templates if isinstance(t, str) for m in _DIR_REF.finditer(t)}
    return sorted(k for k in keys if not k.startswith("hydra."))


def path_name_keys(cfg: DictConfig, templates: Iterable[str] = ()) -> list[str]:
    """Every key of `cfg` named `name` (at any depth) plus the keys the run-directory `templates` interpolate."""
    found: list[str] = []

    def walk(node: Any, prefix: str) -> None:
        if not isinstance(node, DictConfig):
            return
        for k in node.keys():
            key = f"{prefix}.{k}" if prefix else str(k)
            if key == "hydra":
                continue
            if k == "name":
                found.append(key)
            elif not OmegaConf.is_missing(node, k) and not OmegaConf.is_interpolation(node, k):
                walk(node._get_node(k), key)

    walk(cfg, "")
    return sorted(set(found) | set(dir_template_keys(templates)))


def check_path_names(cfg: DictConfig, templates: Iterable[str] = ()) -> None:
    """`check_name` on every value that becomes part of a path (`path_name_keys`); numbers pass (`b${bits}`)."""
    for key in path_name_keys(cfg, templates):
        try:
            value = OmegaConf.select(cfg, key, throw_on_missing=False)
        except Exception:               # an interpolation that does not resolve: the app's own check names it
            continue
        if value is None and not key.endswith("name"):
            continue
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            continue
        if isinstance(value, str) and value == "???":
            continue
        check_name(value, key)


# Documented maxima of the size keys (README "Apps"); checked before any work, with the resource estimate.
SIZE_LIMITS: dict[str, int] = {
    "prompt_tokens": 32_768,          # coldstart: prompt length (the largest workload is ~1k tokens)
    "turns": 1_000,                   # multidevice: conversation turns
    "workload.max_in": 32_768,        # multidevice: prompt clip, tokens
    "workload.max_out": 32_768,       # multidevice: response clip, tokens
    "quant.calib_tokens": 4_096,      # quantize: calibration slice, tokens
    "quant.eval_tokens": 4_096,       # quantize: evaluation slice, tokens
    "quant.search_tokens": 4_096,     # quantize: α-search tokens
    "quant.alpha_steps": 101,         # quantize: α grid points
}


def size_key(value: Any, key: str, lo: int = 0) -> int:
    """An integer size key in lo..SIZE_LIMITS[key]."""
    return int_in(value, key, lo, SIZE_LIMITS[key])


@dataclass(frozen=True)
class Estimate:
    """Modelled resources of one run (from measured per-unit costs on this 2-core host; see each app's estimate)."""
    seconds: float          # s, modelled wall time
    bytes: float            # B, modelled peak resident memory
    key: str                # the key that drives it (named in the error / warning)
    what: str = ""          # e.g. "turns=1000"


def available_memory() -> int:
    """Bytes of memory available to a new process (/proc/meminfo MemAvailable; +inf where unknown)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 1 << 62


def check_resources(estimates: Sequence[Estimate], parallel: int = 1) -> list[str]:
    """Error (ConfigError naming the key) when a run's modelled memory (x `parallel` jobs at once) exceeds the
    available memory; returns warnings for a modelled total time above LONG_RUN_S."""
    avail = available_memory()
    for e in estimates:
        if e.bytes * parallel > avail:
            raise ConfigError(f"{e.key}: {e.what or e.key} needs about {e.bytes * parallel / 1e9:.1f} GB "
                              f"(modelled estimate{f', {parallel} jobs at once' if parallel > 1 else ''}), "
                              f"only {avail / 1e9:.1f} GB available")
    total = sum(e.seconds for e in estimates) / max(1, parallel)
    if estimates and total > LONG_RUN_S:
        e = max(estimates, key=lambda x: x.seconds)
        return [f"warning: {e.key}: about {total:.0f} s and {max(x.bytes for x in estimates) / 1e9:.2f} GB "
                f"(modelled estimate{'' if len(estimates) == 1 else f' for {len(estimates)} jobs'}; "
                f"{e.what or e.key}); continuing"]
    return []


# ================================================ typed conversion ===================================================
def _dataclass_field_sentinel(name: str) -> Any:
    """Unpickle one of `dataclasses`' field-kind sentinels (`_FIELD`, `_FIELD_CLASSVAR`, `_FIELD_INITVAR`) as the
    worker's own object (see `pickle_dataclass_fields_by_reference`)."""
    import dataclasses

    return getattr(dataclasses, name)


def _reduce_dataclass_field_sentinel(sentinel: Any) -> tuple:
    return _dataclass_field_sentinel, (sentinel.name,)


def pickle_dataclass_fields_by_reference() -> None:
    """Make a dataclass defined in an app run as `python -m experiments.<app>` survive a trip to a joblib/loky worker.

    The task function and the schema dataclasses of such an app live in `__main__`, so cloudpickle sends them by value.
    Each `Field` of the copy then carries a *copy* of dataclasses' `_FIELD` sentinel, `dataclasses.fields()` (which
    tests identity) returns nothing, and `OmegaConf.to_object` builds the schema with no arguments
    (`model='???'` -> "'str' object has no attribute 'weights'"). Pickling the sentinels by name restores them;
    cloudpickle >= 3 does the same, but hydra-ray-launcher pins cloudpickle < 3. Idempotent; the main process
    registers it (it pickles), workers only need this module importable (they unpickle)."""
    import copyreg
    import dataclasses

    copyreg.pickle(dataclasses._FIELD_BASE, _reduce_dataclass_field_sentinel)  # type: ignore[attr-defined]


def register_common() -> None:
    """Schemas of the groups several apps share (idempotent): `model`, and both kinds of `device` profile — a
    single-SoC cold-start profile (`soc_schema`) and a multi-device cluster member (`edge_device_schema`) — so any
    app can compose any device file and reject the wrong kind with a clear error. Also makes the apps' own schema
    dataclasses picklable into joblib workers (`pickle_dataclass_fields_by_reference`)."""
    from planner.device import SocProfile
    from planner.voltron.devices import EdgeDevice

    pickle_dataclass_fields_by_reference()
    cs = ConfigStore.instance()
    cs.store(group="model", name="model_schema", node=ModelSpec)
    cs.store(group="device", name="soc_schema", node=SocProfile)
    cs.store(group="device", name="edge_device_schema", node=EdgeDevice)


def _with_key(key: str, msg: str) -> str:
    """Prefix `key: ` unless the message already starts with a key (`key.sub: ...` / `key.sub must ...`)."""
    if not key:
        return msg
    head = msg.split(" ", 1)[0].rstrip(":")
    if head == key or head.startswith(key + ".") or head.startswith(key + "["):
        return msg
    return f"{key}: {msg}"


def typed(node: Any, cls: type[T], key: str = "") -> T:
    """Turn a (structured) config node into an instance of `cls`; a bad value becomes a ConfigError naming `key`."""
    try:
        if isinstance(node, DictConfig):
            if OmegaConf.get_type(node) is cls:
                return OmegaConf.to_object(node)  # type: ignore[return-value]
            return cls(**OmegaConf.to_container(node, resolve=True))  # type: ignore[arg-type]
        return cls(**node)
    except (ConfigError, OSError):             # OSError: e.g. a missing model package, its own one-line message
        raise
    except (ValueError, TypeError) as e:
        raise ConfigError(_with_key(key, str(e).splitlines()[0] if str(e) else type(e).__name__)) from e
    except Exception as e:                      # OmegaConf validation / interpolation errors: one line, key named
        raise ConfigError(_with_key(key, _omegaconf_message(e))) from e


def _omegaconf_message(e: BaseException) -> str:
    msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    full_key = getattr(e, "full_key", None)
    return f"{full_key}: {msg}" if full_key else msg


def run_dir() -> Path:
    """The Hydra run/sweep-job output directory (Hydra ≥1.2 does not chdir)."""
    try:
        from hydra.core.hydra_config import HydraConfig

        return Path(HydraConfig.get().runtime.output_dir)
    except Exception:  # called outside a Hydra app (tests, notebooks)
        return Path.cwd()


# Called with (run dir, metrics document) just before `write_run_outputs` writes metrics.json: `experiments.resume`
# records the digests of the run's inputs there, so a run killed after its metrics.json still has them.
BEFORE_METRICS: list[Callable[[Path, dict], None]] = []


def write_run_outputs(out: Path, cfg: DictConfig | None, metrics: dict[str, Any],
                      measured: list[str], modelled: list[str], inputs: list[str] = ()) -> Path:
    """Write `metrics.json` (+ the resolved `config.yaml`) atomically. Every numeric key must be labelled: measured on
    this machine, modelled (simulation / cost model / estimate), or an input echoed from the run's settings."""
    labelled = set(measured) | set(modelled) | set(inputs)
    unlabelled = [k for k, v in metrics.items() if k not in labelled and not isinstance(v, str)]
    if unlabelled:
        raise ValueError(f"metrics without a measured/modelled/input label: {unlabelled}")
    doc = dict(metrics)
    doc["measured_keys"] = sorted(k for k in measured if k in metrics)
    doc["modelled_keys"] = sorted(k for k in modelled if k in metrics)
    doc["input_keys"] = sorted(k for k in inputs if k in metrics)
    if cfg is not None:
        atomic_write_text(out / "config.yaml", OmegaConf.to_yaml(cfg, resolve=True))
    write_manifest(out)
    for hook in BEFORE_METRICS:
        hook(out, doc)
    return atomic_write_json(out / "metrics.json", doc)


# ================================================ run manifest =======================================================
REPO_DIR = Path(__file__).resolve().parents[1]
MANIFEST_VERSION = 1


def _git(*args: str) -> str | None:
    """stdout of `git <args>` in the repository, or None (no git, not a checkout, error)."""
    import subprocess

    try:
        r = subprocess.run(["git", "-C", str(REPO_DIR), *args], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    return r.stdout.strip() if r.returncode == 0 else None


def _app_module() -> str:
    """`experiments.<app>` of the running app: the `-m` module, else the Hydra job name (apps called in-process)."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    if spec is not None and spec.name.startswith("experiments."):
        return spec.name
    try:
        from hydra.core.hydra_config import HydraConfig

        return f"experiments.{HydraConfig.get().job.name}"
    except Exception:  # outside a Hydra app
        return ""


def _job_overrides() -> list[str]:
    """This job's command-line overrides (one job of a `-m` sweep: its own values), `hydra.*` keys left out."""
    try:
        from hydra.core.hydra_config import HydraConfig

        task = list(HydraConfig.get().overrides.task)
    except Exception:  # outside a Hydra app
        return []
    return [o for o in task if not o.lstrip("+~").startswith("hydra")]


def run_manifest() -> dict[str, Any]:
    """What a run's numbers depend on besides its config: the app and the one-job command that reproduces the run,
    the commit and whether the tree had uncommitted changes, this machine's identity (`hil.host.host_identity`, the
    one the host profile store is keyed by) and the UTC time the run finished. Read by `experiments.report`."""
    import datetime
    import platform
    import shlex

    from hil.host import host_identity

    ident = host_identity()
    app = _app_module()
    overrides = _job_overrides()
    status = _git("status", "--porcelain", "--untracked-files=no")
    return {
        "version": MANIFEST_VERSION,
        "app": app,
        "command": " ".join(["python", "-m", app or "experiments.?", *map(shlex.quote, overrides)]),
        "overrides": overrides,
        "argv": list(sys.argv[1:]),
        "commit": _git("rev-parse", "HEAD"),
        "dirty": None if status is None else bool(status),
        "finished_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "machine": {**ident.to_json(), "id_hash": ident.id_hash()},
        "python": platform.python_version(),
    }


def write_manifest(out: Path) -> Path:
    """`manifest.json` (`run_manifest`) into the run directory, atomically."""
    return atomic_write_json(Path(out) / "manifest.json", run_manifest())


# ================================================ run directories ====================================================
def prepare_run_dir(out: Path, outputs: Iterable[str] = ()) -> list[Path]:
    """Start of a run in `out`: remove what a killed earlier run in the same directory may have left (the hidden
    partial `.<file>.<random>.tmp` of an atomic write of one of this app's files) and the previous run's
    `metrics.json` and app `outputs` (so the directory counts as finished again only when this run ends). Other files
    are the user's: a hidden `.x.tmp` of theirs is never touched, and a directory that is not a run directory of this
    project (`is_run_dir`) but holds files the run would replace is refused (ConfigError naming hydra.run.dir).
    Marks `out` as a run directory (`RUN_MARKER`). Returns the removed paths."""
    out = Path(out)
    removed = []
    if not out.is_dir():
        return removed
    own = ("metrics.json", *outputs)
    stale = [p for p in out.iterdir() if p.is_file() and TMP_RE.match(p.name)
             and any(p.name.startswith(f".{n}.") and "/" not in n for n in own)]
    stale += [out / n for n in own if (out / n).is_file()]
    if stale and not is_run_dir(out):
        names = ", ".join(sorted(p.name for p in stale)[:4])
        raise ConfigError(f"hydra.run.dir: {out} holds files this run would replace ({names}) but is not a run "
                          f"directory of this project; choose a new or empty directory")
    for p in stale:
        with contextlib.suppress(FileNotFoundError):
            p.unlink()
            removed.append(p)
    atomic_write_text(out / RUN_MARKER, "a run directory of experiments.* (experiments.common.prepare_run_dir)\n")
    return removed


def start_cli_run(out: Path) -> bool:
    """prepare_run_dir for an argparse app's `--out` (the apps without Hydra); False, after a one-line error on
    stderr, when the directory is refused."""
    try:
        prepare_run_dir(out, ["manifest.json"])
    except ValueError as e:
        print(f"error: {str(e).replace('hydra.run.dir', '--out')}", file=sys.stderr)
        return False
    out.mkdir(parents=True, exist_ok=True)
    return True


def finish_cli_run(out: Path, app: str, argv: Sequence[str], metrics: dict[str, Any]) -> int:
    """The end of an argparse app's run: its manifest (the app and the command that reproduces it, also when called
    in-process), then `metrics.json`, last, so the directory counts as finished only from here. Returns 0."""
    import shlex

    man = run_manifest()
    man["app"] = app
    man["command"] = " ".join(["python", "-m", app, *map(shlex.quote, argv)])
    atomic_write_json(out / "manifest.json", man)
    atomic_write_json(out / "metrics.json", metrics)
    print(out / "metrics.json")
    return 0


RUN_MARKER = ".edgellm-run"                  # written into every run directory at the start of a run


def is_run_dir(d: Path) -> bool:
    """`d` was made for a run of this project: it holds the run marker, or lies under the repository's outputs/ or
    multirun/ (runs from before the marker existed). Only then does a run replace files already in it."""
    d = Path(d).resolve()
    roots = [CONF_DIR.parent / "outputs", CONF_DIR.parent / "multirun"]
    return (d / RUN_MARKER).is_file() or any(r.resolve() in d.parents for r in roots)


# ================================================ worker lifetime ====================================================
_WATCHDOG: threading.Thread | None = None


def watch_parent(poll_s: float = 0.5) -> bool:
    """In a joblib/loky worker of an app (a process other than the one `precheck` marked as main): exit as soon as
    the main process is gone (killed with SIGKILL it cannot tell its workers). Returns True when a watchdog runs."""
    global _WATCHDOG
    main = os.environ.get(MAIN_PID_ENV)
    if not main or not main.isdigit() or int(main) == os.getpid() or _WATCHDOG is not None:
        return _WATCHDOG is not None
    main_pid, parent = int(main), os.getppid()

    def alive() -> bool:
        if os.getppid() != parent:                   # re-parented: our parent died
            return False
        try:
            os.kill(main_pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass
        return True

    def loop() -> None:
        import time

        while alive():
            time.sleep(poll_s)
        os._exit(3)

    _WATCHDOG = threading.Thread(target=loop, name="edgellm-parent-watchdog", daemon=True)
    _WATCHDOG.start()
    return True


# ================================================ errors and the pre-check ===========================================
_KEY_MUST = re.compile(r"^([A-Za-z_][\w.\[\]-]*) (must|needs|is not|has) ")


def keyed(msg: str) -> str:
    """One line `<key>: ...`: whitespace collapsed; `key must ...` (the schemas' style) becomes `key: must ...`."""
    msg = " ".join(str(msg).split())
    m = _KEY_MUST.match(msg)
    return f"{m.group(1)}: {msg[m.end(1) + 1:]}" if m else msg


_progress_line: list[bool] = [False]          # a `Progress` line is on the terminal (erased before an error line)


def _erase_progress() -> None:
    if _progress_line[0]:
        print("\r\x1b[K", end="", file=sys.stderr, flush=True)
        _progress_line[0] = False


def fail(msg: str) -> None:
    """Print one line `error: <key>: ...` on stderr and exit 2."""
    _erase_progress()
    print(f"error: {keyed(msg)}", file=sys.stderr)
    raise SystemExit(2)


def interrupted() -> None:
    """Ctrl-C: one line on stderr, exit 130 (128 + SIGINT), as a shell reports it."""
    _erase_progress()
    print("error: interrupted (Ctrl-C); an unfinished run directory holds no metrics.json and is re-run next time",
          file=sys.stderr)
    raise SystemExit(130)


def one_line_error_types() -> tuple[type[BaseException], ...]:
    """Exceptions whose message is one line naming the key or file: printed as `error: ...`, exit 2."""
    from quant.gguf_file import GGUFError
    from quant.pack.container import PackedFileError

    return ConfigError, FileNotFoundError, PackedFileError, GGUFError


def one_line_errors(fn: Callable[..., T]) -> Callable[..., T]:
    """Decorator for Hydra task functions: bad input exits with one line naming the problem, no traceback."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> T:
        try:
            return fn(*args, **kwargs)
        except one_line_error_types() as e:
            fail(str(e))
            raise  # unreachable
        except KeyboardInterrupt:
            interrupted()
            raise  # unreachable
        except OSError as e:
            if e.errno != errno.ENOSPC:
                raise
            fail(f"{e.filename or run_dir()}: no space left on device (the run directory holds no metrics.json: it "
                 f"is re-run next time)")
            raise  # unreachable

    return wrapper


def group_options(group: str) -> list[str]:
    """Names of the options of a config group in conf/."""
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))


_USER_CONF = ("-cd", "--config-dir", "-cp", "--config-path")


def check_group_choices(argv: list[str], groups: dict[str, Callable[[], list[str]] | None]) -> None:
    """One-line error for an unknown or empty config-group option (`framework=nope`, `framework=`, also inside a `-m`
    list) before Hydra composes (Hydra's own report spans many lines). `groups` maps a group to a function listing its
    valid options (None: every yaml in conf/<group>). Only plain `group=a,b` overrides are checked, and nothing when
    the user adds config directories (their options are not in conf/)."""
    if any(a.startswith(_USER_CONF) or "searchpath" in a for a in argv):
        return
    pattern = re.compile(rf"({'|'.join(map(re.escape, groups))})=([^=]*)")
    for arg in argv:
        m = pattern.fullmatch(arg)
        if not m:
            continue
        group, values = m.groups()
        lister = groups[group]
        options = lister() if lister else group_options(group)
        if not values.strip():
            fail(f"{group}: empty value; use one of: {', '.join(options)}")
        if not re.fullmatch(r"[\w.,-]+", values):
            continue                             # sweep functions (choice(...), glob(...)): composed and checked later
        for v in values.split(","):
            if v not in options:
                why = ("exists but is not valid for this app" if (CONF_DIR / group / f"{v}.yaml").is_file()
                       else f"is not a {group} config")
                fail(f"{group}={v} {why}; use one of: {', '.join(options)}")


def _split_argv(argv: list[str]) -> tuple[bool, str | None, list[str], bool]:
    """-> (multirun, config name override, overrides, skip). skip: a flag other than -m / -cn (--help, --cfg,
    --config-dir, ...): no work is done or the configs are not all in conf/, so Hydra decides alone."""
    multirun, name, overrides = False, None, []
    i = 0
    while i < len(argv):
        a = argv[i]
        if a in ("-m", "--multirun"):
            multirun = True
        elif a.split("=", 1)[0] in ("-cn", "--config-name"):
            if "=" in a:
                name = a.split("=", 1)[1]
            elif i + 1 < len(argv):
                name, i = argv[i + 1], i + 1
        elif a.startswith("-"):
            return multirun, name, overrides, True
        else:
            overrides.append(a)
        i += 1
    return multirun, name, overrides, False


def _compose_error(e: BaseException, override: str = "") -> str:
    """One line naming the key from Hydra's / OmegaConf's multi-line composition errors."""
    cause = e.__cause__ or e.__context__
    key = getattr(cause, "full_key", None) or (override.lstrip("+~").split("=", 1)[0] if override else "")
    text = str(cause if cause is not None and str(cause).strip() else e).strip()
    first = text.splitlines()[0] if text else type(e).__name__
    m = re.match(r"In '[^']*': Could not find '([^/']+)/([^']*)'", first)
    if m:
        group, val = m.groups()
        return f"{group}: {'empty value' if not val else repr(val) + ' is not a ' + group + ' config'}; " \
               f"use one of: {', '.join(group_options(group))}"
    if not key:
        m = re.search(r"override '([^']+)'|Key '([^']+)'", first)
        key = next((g for g in (m.groups() if m else ()) if g), "")
    return f"{key}: {first}" if key else first


def _plain(cfg: DictConfig) -> Any:
    """The config as plain containers, interpolations resolved where they resolve (else left as text)."""
    try:
        return OmegaConf.to_container(cfg, resolve=True)
    except Exception:
        return OmegaConf.to_container(cfg, resolve=False)


def run_dir_templates(config_name: str, hydra_overrides: Iterable[str] = ()) -> list[str]:
    """The run-directory templates of an app: `hydra.run.dir` / `hydra.sweep.dir` / `hydra.sweep.subdir` of
    conf/<config_name>.yaml, and those given on the command line (`hydra.run.dir=...`)."""
    import yaml

    templates: list[str] = []
    path = CONF_DIR / f"{config_name}.yaml"
    doc = yaml.safe_load(path.read_text()) if path.is_file() else None
    for k in HYDRA_DIR_KEYS:
        node = doc
        for part in k.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, str):
            templates.append(node)
    for o in hydra_overrides:
        k, _, v = o.lstrip("+~").partition("=")
        if k in HYDRA_DIR_KEYS:
            templates.append(v)
    return templates


class Progress:
    """`checking 1200/4000 jobs` on one terminal line, rewritten at most every PROGRESS_S while a long pre-check runs
    (only on a terminal: a log keeps its one `error:` line); erased when the check ends, before any error line.
    Ctrl-C during the check: one line, exit 130."""
    PROGRESS_S = 1.0

    def __init__(self, total: int):
        import time

        self.total, self._clock = total, time.monotonic
        self._last = self._clock()

    def update(self, n: int) -> None:
        now = self._clock()
        if now - self._last >= self.PROGRESS_S and sys.stderr.isatty():
            print(f"\rchecking {n}/{self.total} jobs", end="", file=sys.stderr, flush=True)
            self._last, _progress_line[0] = now, True

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, kind, exc, tb) -> None:
        _erase_progress()
        if kind is KeyboardInterrupt:
            interrupted()


def precheck(config_name: str, argv: list[str], validate: Callable[[DictConfig], Any],
             groups: dict[str, Callable[[], list[str]] | None] | None = None, parallel: int = 1) -> int:
    """Validate every job of an app invocation before Hydra starts: compose the config of each job (the one run, or
    every combination of a `-m` sweep) from conf/ and call `validate(cfg)` on it (it raises ConfigError / ValueError
    naming the key, or returns an `Estimate` / list of them). On bad input: one line `error: <key>: ...` on stderr,
    exit 2, nothing created (no run dir, no log). A modelled run time above LONG_RUN_S prints one warning line with
    the estimate. Marks this process as the app's main process for `watch_parent`. Returns the number of jobs.

    Not checked here (Hydra decides, as before): invocations with --config-dir / --config-path or no-work flags
    (--help, --cfg, --info, ...)."""
    from hydra import compose, initialize_config_dir
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    os.environ[MAIN_PID_ENV] = str(os.getpid())
    multirun, name, overrides, skip = _split_argv(list(argv))
    if skip:
        return 0
    if groups:
        check_group_choices(overrides, groups)
    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except HydraException as e:
        fail(_compose_error(e))
    job_ovr = [o for o in parsed if not o.is_hydra_override()]
    text = {id(o): o.input_line for o in parsed}
    for o in job_ovr:                    # `+key=v` adds a key no app reads: an error, not silently ignored
        key = o.key_or_group
        if (o.is_add() or o.is_force_add()) and not ("." not in key and (CONF_DIR / key).is_dir()):
            fail(f"{key}: not a setting of this app ('+{key}' adds a key nothing reads; see conf/{name or config_name}"
                 f".yaml)")
    if not multirun:
        sweeps = [o for o in job_ovr if o.is_sweep_override()]
        if sweeps:
            fail(f"{sweeps[0].get_key_element()}: a list or sweep of values ({sweeps[0].input_line}) needs -m "
                 f"(multirun)")
        jobs = [[text[id(o)] for o in job_ovr]]
    else:
        try:
            jobs = [j for batch in BasicSweeper.split_arguments(job_ovr, None) for j in batch]
        except Exception as e:
            fail(_compose_error(e))
    templates = run_dir_templates(name or config_name, [text[id(o)] for o in parsed if o.is_hydra_override()])
    estimates: list[Estimate] = []
    progress = Progress(len(jobs))
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3", job_name=config_name), progress:
        for n, job in enumerate(jobs):
            progress.update(n)
            where = f" (sweep job #{n}: {' '.join(job)})" if multirun and len(jobs) > 1 else ""
            try:
                cfg = compose(config_name=name or config_name, overrides=job)
            except Exception as e:
                bad = next((o for o in job if o.lstrip("+~").split("=", 1)[0] in str(e)), "")
                fail(_compose_error(e, bad) + where)
            try:
                check_path_names(cfg, templates)
                check_numbers(_plain(cfg))
                est = validate(cfg)
            except (ConfigError, ValueError, TypeError, FileNotFoundError) as e:
                msg = str(e).splitlines()[0] if str(e) else type(e).__name__
                fail(msg + where)
            except Exception as e:                 # OmegaConf errors on access (missing / wrongly typed value)
                fail(_omegaconf_message(e) + where)
            if est is not None:
                estimates.extend(est if isinstance(est, list) else [est])
    for o in parsed:                             # jobs at once: `hydra/launcher=joblib` (all cores), its n_jobs
        if o.key_or_group == "hydra/launcher" and o.value() == "joblib":
            parallel = max(parallel, os.cpu_count() or 1)
        if o.key_or_group == "hydra.launcher.n_jobs" and isinstance(o.value(), int) and o.value() > 0:
            parallel = o.value()
    try:
        warnings = check_resources(estimates, parallel=min(parallel, len(jobs)) if multirun else 1)
    except ConfigError as e:
        fail(str(e))
    for w in warnings:
        print(w, file=sys.stderr)
    return len(jobs)
