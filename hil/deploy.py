"""Deploying a cold-start plan to this host (docs/hil.md): which packed file a framework's plan reads, how its threads
fit the host's cores, and the facts of that file a plan is bound to.

- Weight files. EdgeFlow and its ablation steps read the EdgeFlow-quantized model (adaptive per-channel bits at the
  budget) in their recipe's format (weightlet; INT4/INT8 mixed for `ef_mixed`). The baselines read per-channel INT8
  (the papers' evaluation set-up gives every cold-start baseline INT8 weights): MNN and llm.npu(+) natively; the
  llama.cpp-style plan reads the same INT8 rows through on-demand paging (llama.cpp's own Q8_0 — per-block scales,
  weight-only — runs as the separate peer, `hil.peer`). Files are produced by the real quantizer
  (`quant.pipeline.run_quantization` + `quant.export.write_pack`) and cached under `outputs/cache/hil/`, keyed by model,
  method, budget, format and the quantizer settings.
- Threads. A plan's threads must fit the device's cores (every thread occupies a core while it runs; the simulator
  models the sharing). On an NPU-less host one core is the NPU stand-in, so NPU plans get a 1-thread CPU compute pool,
  1 unpack thread and at most 2 loaders; CPU-only plans (llama.cpp, MNN) compute on every core.
- Binding (`hil.packed_index`): the file's byte ranges and per-channel bit widths (read from the index and the 3-bit
  width arrays only), so the plan's unpack work is the file's, not a model of it.
"""
from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import json
import shutil
import sys
import tempfile
from pathlib import Path

from planner.device import SocProfile
from planner.framework import FrameworkSpec
from planner.host_runtime import HostRuntime
from planner.plan import Plan
from quant.arch import ModelSpec
from quant.settings import QuantSettings

CACHE = Path(__file__).resolve().parents[1] / "outputs" / "cache" / "hil"
CPU_ONLY = ("llamacpp", "mnn")


def weight_file_kind(policy: str, recipe_fmt: str | None) -> tuple[str, str]:
    """(quantization method, packed format) a framework's plan reads."""
    if recipe_fmt in ("weightlet", "mixed", "kquant"):
        return "edgeflow", recipe_fmt
    return "int8", "int8"


def fit_threads(fw: FrameworkSpec, dev: SocProfile, runtime: HostRuntime | None = None) -> FrameworkSpec:
    """The framework's thread counts, fitted to the device's cores (see module docstring); `runtime`: the host's
    runtime mechanics (its NPU stand-in is a CPU core: `HostRuntime.npu_on_cpu_core`)."""
    cores = dev.cpu_cores
    if fw.policy in CPU_ONLY:
        return dataclasses.replace(fw, compute_threads=cores, loader_threads=min(fw.loader_threads, cores),
                                   unpack_threads=1, graph_threads=1)
    if runtime is None or not runtime.npu_on_cpu_core:
        return fw
    free = max(1, cores - 1)                     # one core is the NPU stand-in
    return dataclasses.replace(fw, compute_threads=1, unpack_threads=min(fw.unpack_threads, free),
                               loader_threads=min(fw.loader_threads, 2), graph_threads=1)


PACK_LAYOUT = 2     # bump when quant.export's file layout changes (2: LM head / embedding stored raw INT8)


def _settings_key(settings: QuantSettings) -> str:
    doc = json.dumps({"layout": PACK_LAYOUT, **dataclasses.asdict(settings)}, sort_keys=True, default=str)
    return hashlib.sha1(doc.encode()).hexdigest()[:10]


def packed_model(spec: ModelSpec, method: str, bits: int, fmt: str, settings: QuantSettings,
                 cache: Path = CACHE, log=lambda msg: print(msg, file=sys.stderr)) -> Path:
    """Path of the packed file of `spec` quantized with `method` at `bits`, in `fmt`; made once, then cached. A
    cached file is CRC-checked (once per version of it, `quant.pack.verify_file`); a corrupt one is rebuilt with one
    line (`log`) saying so. Concurrent callers build it once: a per-file lock, each build in its own temp directory,
    renamed into place; a caller that finds the file made meanwhile uses it."""
    from quant.pack import PackedFileError, verify_file

    b = 8 if method == "int8" else int(bits)
    if spec.weights.value == "synthetic":                # generated model: its own cached pipeline (quant.synth_pack)
        from quant.synth_pack import ensure_synth

        if method != "edgeflow":
            raise ValueError(f"model {spec.name}: synthetic models are packed with EdgeFlow's allocation only "
                             f"(framework plans reading per-channel INT8 need a real model)")
        path = ensure_synth(spec.name, b, fmt, spec=spec).pack
        if _corrupt(path, log):
            path = ensure_synth(spec.name, b, fmt, spec=spec).pack
            verify_file(path)
        return path
    path = cache / f"{spec.name}.{method}.b{b}.{fmt}.{_settings_key(settings)}.efpk"
    if path.is_file() and not _corrupt(path, log):
        return path
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / f".{path.name}.lock", "a") as lk:
        fcntl.flock(lk, fcntl.LOCK_EX)                    # one build per file on this machine; the others wait
        if path.is_file() and not _corrupt(path, log):   # made by the caller that held the lock
            return path
        _build(spec, method, b, fmt, settings, path)
    try:
        verify_file(path)
    except PackedFileError as e:
        raise PackedFileError(f"{path}: the file just built does not verify ({e})") from None
    return path


def _corrupt(path: Path, log) -> bool:
    """True (and the file removed, with one line) when the cached packed file fails its CRC check."""
    from quant.pack import PackedFileError, verify_file

    try:
        verify_file(path)
        return False
    except PackedFileError as e:
        log(f"{path.name}: cached packed file is corrupt ({str(e).splitlines()[0]}); rebuilding it")
        path.unlink(missing_ok=True)
        return True


def _build(spec: ModelSpec, method: str, b: int, fmt: str, settings: QuantSettings, path: Path) -> None:
    """Quantize and write the packed file in a temp directory of this process, then rename it to `path`. The caller
    holds the file's lock."""
    from quant.export import write_pack
    from quant.gguf_model import load_weights
    from quant.pipeline import run_quantization

    for stale in path.parent.glob(f".build-{path.stem}.*"):     # a killed build's (the caller holds the lock)
        shutil.rmtree(stale, ignore_errors=True)
    res = run_quantization(spec, method, b, float(b), settings)
    tmp_dir = Path(tempfile.mkdtemp(prefix=f".build-{path.stem}.", dir=path.parent))
    try:
        made = write_pack(res.model, spec, load_weights(spec), tmp_dir, fmt=fmt)
        made.replace(path)                        # the writer is atomic; the rename keys it in the cache
    finally:
        shutil.rmtree(tmp_dir, ignore_errors=True)


def plan_summary(plan: Plan) -> dict:
    """Thread counts and schedule of a plan (echoed into metrics as inputs)."""
    return {"loader_threads": plan.loader_threads, "unpack_threads": plan.unpack_threads,
            "cpu_threads": plan.cpu_threads, "steal_threshold": plan.schedule.steal_threshold,
            "priority": plan.schedule.priority, "n_tasks": len(plan.tasks)}
