"""MNN's own costs on this host, for the simulator's MNN policy (planner/pipeline/cpu_plan.py build_mnn_plan;
docs/hil.md "The MNN peer"): timed through the `mnn` extra's LLM runtime on warm files (every byte in the page cache,
so no I/O from the disk enters a figure), as hil.mnn_peer runs it (use_mmap=false, `threads` threads):

- the load: `create` + `set_config` + `load()` of a warm directory; less its files' plain warm read (the copy out of
  the page cache, which the simulator's reads cost), MNN's own load work. Per weight bits, a line through (weight-file
  bytes, own load s) of the directories of models of different sizes (MODELS): `mnn_load_gbps["b<bits>"]` = 1 / its
  slope (the CPU backend's weight re-layout per byte), the load's fixed part (config, graph, tokenizer, backend) the
  median intercept;
- per directory: the first `forward` of a freshly loaded model for each prompt length (hil.calibrate_peer.PROMPTS); a
  line t = a + b x tokens through the medians: `mnn_gemm_gops_per_ghz["b<bits>@<d_model>"]` = the layers' matmul
  FLOPs per token / b / the threads' GHz (SocProfile.thread_ghz); the forward's fixed part is the intercept a;
- `mnn_fixed_s` = the load's fixed part + the median forward intercept.
They are `planner.peer_costs.PeerCosts` fields, not the device profile's: `python -m hil.calibrate_mnn [--remeasure]`
writes them into this machine's stored full host profiles (peers.json, their sources, the per-directory times beside
as `mnn_calibration`; hil.calibrate_peer.write_peer_fields);
`python -m experiments.calibrate device=host` runs the same step (`mnn_step`) when MNN and the converted models are
there. Without the
extra it raises hil.peer.PeerUnavailable (one line); without a converted directory, hil.mnn_convert's error.
"""
from __future__ import annotations

import gc
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

from hil.calibrate_peer import PROMPTS, fit_line, layer_matmul_flops_per_token, version_or_unknown
from planner.device import SocProfile
from quant.arch import ModelSpec

MODELS = ("smollm2_135m", "llama3_2_1b_synth")
BITS = (8, 4)
FIELDS = ("mnn_fixed_s", "mnn_load_gbps", "mnn_gemm_gops_per_ghz")


@dataclass
class DirTimes:
    model: str
    bits: int
    d_model: int
    weight_bytes: int           # B of llm.mnn.weight
    file_bytes: int             # B of every file MNN reads
    read_s: float               # median plain warm read of the files, s
    load_s: float               # median warm create + load, s
    eval_s: dict[int, float]    # prompt tokens -> median first-forward s of a freshly loaded model
    resident: float             # the files' page-cache fraction before the timed loads (1 = warm)


def read_all(files: list[Path]) -> float:
    t0 = time.perf_counter()
    for p in files:
        with open(p, "rb", buffering=0) as f:
            while f.read(1 << 24):
                pass
    return time.perf_counter() - t0


def time_dir(spec: ModelSpec, bits: int, model_dir: Path, prompts=PROMPTS, threads: int = 2, repeats: int = 3
             ) -> DirTimes:
    """MNN's load and first forwards on the warm directory (module doc): medians over `repeats`."""
    from hil.mnn_peer import _mnn_llm, evict_files, model_files
    from hil.peer import bench_prompt

    llm = _mnn_llm()
    files = model_files(model_dir)
    read_all(files)
    resident = evict_files(files, evict=False)
    ids = {p: [int(t) for t in bench_prompt(p)] for p in prompts}
    reads, loads = [], []
    evals: dict[int, list[float]] = {p: [] for p in prompts}
    for _ in range(repeats):
        reads.append(read_all(files))
        for p in prompts:
            gc.collect()
            t0 = time.perf_counter()
            m = llm.create(str(Path(model_dir) / "config.json"))
            m.set_config({"thread_num": threads, "use_mmap": False})
            m.load()
            t1 = time.perf_counter()
            out = m.forward(ids[p])
            out.read()
            t2 = time.perf_counter()
            loads.append(t1 - t0)
            evals[p].append(t2 - t1)
            del out, m
    med = statistics.median
    return DirTimes(spec.name, bits, spec.d_model, (Path(model_dir) / "llm.mnn.weight").stat().st_size,
                    sum(p.stat().st_size for p in files), med(reads), med(loads),
                    {p: med(v) for p, v in evals.items()}, resident)


def derive(times: list[DirTimes], specs: dict[str, ModelSpec], dev: SocProfile, threads: int
           ) -> tuple[dict, dict[str, str]]:
    """The PeerCosts fields (FIELDS) and a source line per field from per-directory times."""
    ghz = dev.thread_ghz(threads)
    rates, icpts = {}, []
    for t in times:
        a, b = fit_line(list(t.eval_s), list(t.eval_s.values()))
        rates[f"b{t.bits}@{t.d_model}"] = layer_matmul_flops_per_token(specs[t.model]) / b / 1e9 / ghz
        icpts.append(max(0.0, a))
    gbps, load_icpts = {}, []
    for bits in sorted({t.bits for t in times}, reverse=True):
        pts = {t.weight_bytes: max(0.0, t.load_s - t.read_s) for t in times if t.bits == bits}
        if len(pts) < 2:
            raise ValueError(f"the {bits}-bit load line needs directories of two model sizes or more (got {len(pts)})")
        try:
            a, b = fit_line(list(pts), list(pts.values()))
        except ValueError:
            raise ValueError(f"MNN's own {bits}-bit load work does not grow with the weight file ({pts}): a noisy "
                             f"host?") from None
        gbps[f"b{bits}"] = 1.0 / b / 1e9
        load_icpts.append(max(0.0, a))
    load_fixed, eval_fixed = statistics.median(load_icpts), statistics.median(icpts)
    fields = {"mnn_fixed_s": load_fixed + eval_fixed, "mnn_load_gbps": gbps, "mnn_gemm_gops_per_ghz": rates}
    how = f"measured (hil.calibrate_mnn, MNN {_version()}, warm files, {threads} threads)"
    src = {"mnn_fixed_s": f"{how}: median intercept of warm create+load less a plain read of its files vs weight-file "
                          f"bytes ({load_fixed * 1e3:.1f} ms) + median intercept of the first forward vs prompt tokens "
                          f"({eval_fixed * 1e3:.1f} ms)",
           "mnn_load_gbps": f"{how}: 1 / slope of warm create+load less a plain read of its files vs weight-file bytes "
                            f"per weight bits, over {len({t.model for t in times})} models",
           "mnn_gemm_gops_per_ghz": f"{how}: layer matmul FLOPs per token / slope of first-forward time vs prompt "
                                    f"tokens ({', '.join(map(str, times[0].eval_s))}) / {ghz:.2f} GHz"}
    return fields, src


def _version() -> str:
    from hil.mnn_peer import peer_version

    return version_or_unknown(peer_version)


def default_dirs(convert: bool = True, models=MODELS, bits=BITS) -> list[tuple[ModelSpec, int, Path]] | None:
    """(spec, bits, MNN directory) of the peer's models: converted and cached on first use (hil.mnn_convert) with
    `convert`, else those already converted, or None when one is missing."""
    from hil.mnn_convert import cached_mnn_model, ensure_mnn_model
    from quant.arch import model_spec

    out = []
    for m in models:
        for b in bits:
            spec = model_spec(m)
            d = ensure_mnn_model(spec, b) if convert else cached_mnn_model(spec, b)
            if d is None:
                return None
            out.append((spec, b, d))
    return out


def calibrate(dev: SocProfile, dirs: list[tuple[ModelSpec, int, Path]], prompts=PROMPTS, threads: int | None = None,
              repeats: int = 3, log: Callable[[str], None] = lambda m: None) -> tuple[dict, dict, list[DirTimes]]:
    """(fields, sources, per-directory times) on this host; `threads` defaults to the device's cores (hil.mnn_peer's
    protocol threads)."""
    from hil.timing import timing_lock

    thr = threads or dev.cpu_cores
    times = []
    with timing_lock("MNN calibration (hil.calibrate_mnn)"):     # one timing run on this machine at a time
        for spec, bits, d in dirs:
            log(f"  MNN {spec.name} {bits}-bit: warm loads and first forwards at {list(prompts)} tokens")
            times.append(time_dir(spec, bits, d, prompts, thr, repeats))
    fields, src = derive(times, {s.name: s for s, _b, _d in dirs}, dev, thr)
    return fields, src, times


def has_fields(store: Path) -> bool:
    """Whether `store` already holds measured MNN fields (hil.host.load_peers: its peers.json or the older
    layout)."""
    from hil.host import load_peers

    try:
        return bool(load_peers(store).mnn_gemm_gops_per_ghz)
    except (OSError, ValueError):
        return False


def mnn_step(store: Path, remeasure: bool = False, quick: bool = False, log: Callable[[str], None] = print,
             also: tuple[Path, ...] = (), convert: bool = False, repeats: int = 3) -> str:
    """The MNN step of a host calibration (experiments.calibrate; hil.calibrate_peer.peer_step's twin): measure into
    `store` (and the stores in `also`) unless MNN is missing, the calibration is a quick one, the models are not
    converted (and `convert` is false), or the stores already have the fields (and `remeasure` is false); returns
    (and logs) one line saying which."""
    from hil.calibrate_peer import write_peer_fields
    from hil.host import load_device_json
    from hil.mnn_peer import INSTALL_HINT, available

    stores = (store, *also)
    if not available():
        msg = f"MNN step skipped ({INSTALL_HINT}); the MNN policy keeps the device's INT8 rates"
    elif quick:
        msg = "MNN step skipped in a quick calibration (it needs the converted models and ~4 min)"
    elif all(has_fields(d) for d in stores) and not remeasure:
        msg = f"MNN step: kept the measured fields of {store} (remeasure re-measures)"
    elif (dirs := default_dirs(convert)) is None:
        msg = ("MNN step skipped: the peer's models are not converted (python -m hil.mnn_convert model=<name> "
               "bits=8|4, or python -m hil.calibrate_mnn converts them)")
    else:
        dev = load_device_json(store / "device.json")
        fields, src, times = calibrate(dev, dirs, repeats=repeats, log=log)
        for d in stores:
            write_peer_fields(d, fields, src, "mnn_calibration",
                                 [asdict(t) | {"eval_s": {str(k): v for k, v in t.eval_s.items()}} for t in times])
        loads = ", ".join(f"{k} {v:.2f}" for k, v in sorted(fields["mnn_load_gbps"].items()))
        rates = ", ".join(f"{k} {v:.1f}" for k, v in sorted(fields["mnn_gemm_gops_per_ghz"].items()))
        msg = (f"MNN step (measured, warm files): fixed {fields['mnn_fixed_s'] * 1e3:.0f} ms, own load GB/s: "
               f"{loads}, GOP/s per core-GHz: {rates}")
    log(msg)
    return msg


def main(argv: list[str]) -> int:
    """python -m hil.calibrate_mnn [--remeasure]: the MNN step alone (the models converted first where missing),
    measured once and written into this machine's stored full host profiles (with and without huge pages, those that
    exist; python -m experiments.calibrate device=host runs this step too when the models are converted)."""
    import sys

    from hil.calibrate_peer import host_stores
    from hil.mnn_convert import ConvertError
    from hil.peer import PeerUnavailable

    if any(a != "--remeasure" for a in argv):
        print("usage: python -m hil.calibrate_mnn [--remeasure]", file=sys.stderr)
        return 2
    stores, why_not = host_stores()
    for line in why_not:
        print(line, file=sys.stderr)
    if not stores:
        print("run python -m experiments.calibrate device=host huge_pages=false first", file=sys.stderr)
        return 1
    try:
        mnn_step(stores[0], remeasure="--remeasure" in argv, log=lambda m: print(m, file=sys.stderr, flush=True),
                 also=tuple(stores[1:]), convert=True)
    except (PeerUnavailable, ConvertError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main(__import__("sys").argv[1:]))
