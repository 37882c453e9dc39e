"""llama.cpp's own costs on this host, for the simulator's llama.cpp policy (planner/pipeline/cpu_plan.py; docs/hil.md
"The llama.cpp policy"): timed through the `peer` extra's library on warm files (every byte in the page cache, so
no I/O enters a figure), each by llama.cpp's own phase boundaries (its C API, llama-cpp-python's low-level binding):

- the open: `llama_model_load_from_file` with vocab_only (GGUF metadata and the vocabulary parse), plus
  llama-cpp-python's own set-up inside `Llama()` (a warm `Llama()` less the open, weights and context below);
- weights (warm): the full `llama_model_load_from_file` (use_mmap=false, as hil.peer runs it) less the open: copies out
  of the page cache, plus for the repacked types (planner.formats.GGML_REPACK_X86) ggml's repack. With a Q8_0 file
  (nothing repacked) and a Q4_0 file (all linear weights repacked) of one model: copy s/B = Q8_0's time / its bytes;
  `llamacpp_repack_gbps` = Q4_0's repacked bytes / (Q4_0's time - its bytes x copy s/B);
- the context: `llama_init_from_model` (KV cache, output buffer, graph reserve);
- per file type and model width: the first `llama_decode` of a fresh context for each prompt length (n_batch =
  n_ubatch = the prompt, `threads` threads, as hil.peer runs it); a line t = a + b x tokens through the medians:
  `llamacpp_gemm_gops_per_ghz["<type>@<d_model>"]` = the layers' matmul FLOPs per token / b / the threads' GHz
  (SocProfile.thread_ghz); the eval's fixed part is the intercept a;
- `llamacpp_fixed_s` = the medians over the files of the open, the context and the eval's fixed part, summed.
They are `planner.peer_costs.PeerCosts` fields, not the device profile's: `calibrate_into_store(store)` writes them
into a stored host profile's peers.json (their sources, the per-file times beside; the store rewritten whole, its
manifest re-sealed), where hil.host.load_peers reads them. Without the extra it raises hil.peer.PeerUnavailable (one
line).
"""
from __future__ import annotations

import json
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from planner.device import SocProfile
from planner.peer_costs import PeerCosts
from quant.arch import ModelSpec

PROMPTS = (32, 128, 256)        # tokens per timed eval: the protocol's range (16..256)
FTYPES = ("q8_0", "q4_0", "q4_k_m")
MODELS = ("smollm2_135m", "llama3_2_1b_synth")
FIELDS = ("llamacpp_fixed_s", "llamacpp_repack_gbps", "llamacpp_gemm_gops_per_ghz")


@dataclass
class FileTimes:
    model: str
    ftype: str                  # upper case, as planner.formats names file types
    d_model: int
    file_bytes: int
    open_s: float               # median, s
    weights_s: float            # median full load less the open, s
    context_s: float            # median, s
    binding_s: float            # median warm `Llama()` less the open, weights and context: llama-cpp-python's own
    #                             set-up (hil.peer times `Llama()`), s
    eval_s: dict[int, float]    # prompt tokens -> median first-eval s
    resident: float             # the file's page-cache fraction before the timed loads (1 = warm)


def layer_matmul_flops_per_token(spec: ModelSpec) -> float:
    """FLOPs of every layer's weight matmuls for one prompt token (2 x the linear weights)."""
    return 2.0 * spec.n_layers * sum(c * d for c, d in spec.linear_shapes().values())


def _warm(path: Path) -> float:
    from hil.pagecache import resident_fraction

    with open(path, "rb") as f:
        while f.read(1 << 24):
            pass
    return resident_fraction(path)


def time_file(spec: ModelSpec, ftype: str, path: Path, prompts=PROMPTS, threads: int = 2, repeats: int = 3
              ) -> FileTimes:
    """llama.cpp's phases on warm `path` (module doc): medians over `repeats`."""
    import llama_cpp as L

    from hil.peer import _llama_cpp, bench_prompt
    _llama_cpp()                                  # PeerUnavailable (one line) without the extra
    resident = _warm(path)
    name = str(path).encode()
    opens, weights, ctxs, whole = [], [], [], []
    evals: dict[int, list[float]] = {p: [] for p in prompts}
    ids = {p: [int(t) for t in bench_prompt(p)] for p in prompts}
    with L._utils.suppress_stdout_stderr(disable=False):
        L.llama_backend_init()
        for _ in range(repeats):
            mp = L.llama_model_default_params()
            mp.use_mmap, mp.vocab_only = False, True
            t0 = time.perf_counter()
            m = L.llama_model_load_from_file(name, mp)
            t1 = time.perf_counter()
            if not m:
                raise RuntimeError(f"llama.cpp could not open {path}")
            L.llama_model_free(m)
            mp = L.llama_model_default_params()
            mp.use_mmap = False
            t2 = time.perf_counter()
            m = L.llama_model_load_from_file(name, mp)
            t3 = time.perf_counter()
            opens.append(t1 - t0)
            weights.append(max(0.0, (t3 - t2) - (t1 - t0)))
            try:
                for p in prompts:
                    cp = L.llama_context_default_params()
                    cp.n_ctx, cp.n_batch, cp.n_ubatch = p + 1, p, p
                    cp.n_threads = cp.n_threads_batch = threads
                    t4 = time.perf_counter()
                    ctx = L.llama_init_from_model(m, cp)
                    t5 = time.perf_counter()
                    toks = (L.llama_token * p)(*ids[p])
                    t6 = time.perf_counter()
                    rc = L.llama_decode(ctx, L.llama_batch_get_one(toks, p))
                    t7 = time.perf_counter()
                    L.llama_free(ctx)
                    if rc != 0:
                        raise RuntimeError(f"llama_decode of {p} tokens on {path} returned {rc}")
                    ctxs.append(t5 - t4)
                    evals[p].append(t7 - t6)
            finally:
                L.llama_model_free(m)
            p = max(prompts)
            t8 = time.perf_counter()
            llm = L.Llama(model_path=str(path), n_ctx=p + 1, n_batch=p, n_ubatch=p, n_threads=threads,
                          n_threads_batch=threads, use_mmap=False, use_mlock=False, verbose=False)
            t9 = time.perf_counter()
            llm.close()
            whole.append(t9 - t8)
    med = statistics.median
    binding = max(0.0, med(whole) - med(opens) - med(weights) - med(ctxs))
    return FileTimes(spec.name, ftype.upper(), spec.d_model, path.stat().st_size, med(opens), med(weights),
                     med(ctxs), binding, {p: med(v) for p, v in evals.items()}, resident)


def fit_line(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """(intercept, slope) of the least-squares line; the slope must be positive (more tokens, more time)."""
    if len(xs) < 2:
        raise ValueError("a line needs two prompt lengths or more")
    b, a = np.polyfit(np.asarray(xs, float), np.asarray(ys, float), 1)
    if b <= 0:
        raise ValueError(f"prompt eval time does not grow with the prompt ({dict(zip(xs, ys))}): a noisy host?")
    return float(a), float(b)


def derive(times: list[FileTimes], specs: dict[str, ModelSpec], dev: SocProfile, threads: int
           ) -> tuple[dict, dict[str, str]]:
    """The PeerCosts fields (FIELDS) and a source line per field from per-file times."""
    from planner.pipeline.cpu_plan import ggml_layers

    ghz = dev.thread_ghz(threads)
    rates, icpts = {}, []
    for t in times:
        a, b = fit_line(list(t.eval_s), list(t.eval_s.values()))
        rates[f"{t.ftype}@{t.d_model}"] = layer_matmul_flops_per_token(specs[t.model]) / b / 1e9 / ghz
        icpts.append(max(0.0, a))
    repack = []
    probe = PeerCosts(llamacpp_repack_gbps=1.0)               # which bytes a repacking CPU repacks
    for model in {t.model for t in times}:
        by = {t.ftype: t for t in times if t.model == model}
        if "Q8_0" in by and "Q4_0" in by:
            copy = by["Q8_0"].weights_s / by["Q8_0"].file_bytes
            rb = sum(ly.repack_bytes for ly in ggml_layers(specs[model], "Q4_0", probe, embedding=True))
            left = by["Q4_0"].weights_s - by["Q4_0"].file_bytes * copy
            if rb > 0 and left > 0:
                repack.append(rb / left / 1e9)
    med = statistics.median
    parts = {"open": med(t.open_s + t.binding_s for t in times), "context": med(t.context_s for t in times),
             "eval": med(icpts)}
    fields = {"llamacpp_fixed_s": sum(parts.values()), "llamacpp_repack_gbps": med(repack) if repack else 0.0,
              "llamacpp_gemm_gops_per_ghz": rates}
    how = f"measured (hil.calibrate_peer, llama.cpp {_version()}, warm files, {threads} threads)"
    src = {"llamacpp_fixed_s": f"{how}: medians over {len(times)} files of the vocab_only load with Llama()'s own "
                               f"set-up ({parts['open'] * 1e3:.1f} ms), llama_init_from_model "
                               f"({parts['context'] * 1e3:.1f} ms) and the first eval's intercept vs prompt tokens "
                               f"({parts['eval'] * 1e3:.1f} ms)",
           "llamacpp_repack_gbps": (f"{how}: Q4_0 load less its bytes at Q8_0's copy rate, per repacked byte"
                                    if repack else "not measured: no Q8_0 + Q4_0 pair of one model"),
           "llamacpp_gemm_gops_per_ghz": f"{how}: layer matmul FLOPs per token / slope of first-eval time vs "
                                         f"prompt tokens ({', '.join(map(str, times[0].eval_s))}) / {ghz:.2f} GHz"}
    return fields, src


def version_or_unknown(peer_version: Callable[[], str]) -> str:
    """A peer's version for the source lines; "?" without its extra (derive works on recorded times)."""
    from hil.peer import PeerUnavailable

    try:
        return peer_version()
    except PeerUnavailable:
        return "?"


def _version() -> str:
    from hil.peer import peer_version

    return version_or_unknown(peer_version)


def default_files(models=MODELS, ftypes=FTYPES) -> list[tuple[ModelSpec, str, Path]]:
    """(spec, file type, GGUF) of the peer's files (hil.peer.peer_gguf_file: made and cached on first use)."""
    from hil.peer import peer_gguf_file
    from quant.arch import model_spec

    return [(model_spec(m), f, peer_gguf_file(model_spec(m), f)) for m in models for f in ftypes]


def calibrate(dev: SocProfile, files: list[tuple[ModelSpec, str, Path]], prompts=PROMPTS, threads: int | None = None,
              repeats: int = 3, log: Callable[[str], None] = lambda m: None) -> tuple[dict, dict, list[FileTimes]]:
    """(fields, sources, per-file times) on this host; `threads` defaults to the device's cores (hil.peer's)."""
    from hil.timing import timing_lock

    thr = threads or dev.cpu_cores
    times = []
    with timing_lock("llama.cpp calibration (hil.calibrate_peer)"):     # one timing run on this machine at a time
        for spec, ftype, path in files:
            log(f"  llama.cpp {spec.name} {ftype.upper()}: warm load, context and prompt evals at {list(prompts)} "
                f"tokens")
            times.append(time_file(spec, ftype, path, prompts, thr, repeats))
    fields, src = derive(times, {s.name: s for s, _f, _p in files}, dev, thr)
    return fields, src, times


def calibrate_into_store(store: Path, files: list[tuple[ModelSpec, str, Path]] | None = None, prompts=PROMPTS,
                         repeats: int = 3, log: Callable[[str], None] = print, also: tuple[Path, ...] = ()) -> dict:
    """Measure (module doc) with `store`'s device profile and write the fields into its peers.json and into those of
    the stores in `also` (the same host with and without huge pages); returns the fields."""
    from hil.host import load_device_json

    dev = load_device_json(store / "device.json")
    fields, src, times = calibrate(dev, files if files is not None else default_files(), prompts, repeats=repeats,
                                   log=log)
    for d in (store, *also):
        write_fields(d, fields, src, times)
    return fields


def write_fields(store: Path, fields: dict, src: dict[str, str], times: list[FileTimes]) -> None:
    """The fields and their sources into `store`'s peers.json, the per-file times beside (write_peer_fields)."""
    write_peer_fields(store, fields, src, "llamacpp_calibration",
                         [{"model": t.model, "ftype": t.ftype, "file_bytes": t.file_bytes, "open_s": t.open_s,
                           "weights_s": t.weights_s, "context_s": t.context_s, "binding_s": t.binding_s,
                           "eval_s": {str(k): v for k, v in t.eval_s.items()}, "resident": t.resident}
                          for t in times])


def write_peer_fields(store: Path, fields: dict, src: dict[str, str], key: str, records: list[dict]) -> None:
    """Measured peer-cost `fields` (planner.peer_costs.PeerCosts) and their sources into `store`'s peers.json, the
    raw `records` beside under `key`: the store rewritten as one unit (hil.host.write_store, under its lock; `store`
    may be the link or the version directory it points to). A store of the older layout (the fields inside
    device.json's "profile") has them moved into peers.json first (hil.host.peer_parts), so the other peer's fields
    stay. Shared by the llama.cpp and MNN steps (hil.calibrate_mnn)."""
    from hil.host import peer_parts, store_lock, store_parts, write_store

    link = store_link(store)
    with store_lock(link.parent):
        d = link.resolve()
        parts = {n: json.loads((d / n).read_text()) for n in store_parts(d)}
        doc = peer_parts(parts)
        doc["peers"].update(fields)
        doc.setdefault("sources", {}).update(src)
        doc[key] = records
        PeerCosts(**doc["peers"])                 # still valid peer costs
        write_store(link, parts)


def store_link(store: Path) -> Path:
    """The store's name (`<root>/<id>`) for a version directory `<root>/.<id>.v-<random>` (what a loaded profile's
    paths point into), else `store` itself."""
    name = store.name
    if name.startswith(".") and ".v-" in name:
        return store.parent / name[1:].rsplit(".v-", 1)[0]
    return store


def has_fields(store: Path) -> bool:
    """Whether `store` already holds measured llama.cpp fields (hil.host.load_peers: its peers.json or the older
    layout)."""
    from hil.host import load_peers

    try:
        return bool(load_peers(store).llamacpp_gemm_gops_per_ghz)
    except (OSError, ValueError):
        return False


def peer_step(store: Path, remeasure: bool = False, quick: bool = False, log: Callable[[str], None] = print,
              also: tuple[Path, ...] = ()) -> str:
    """The host calibration's llama.cpp step (experiments.calibrate): measure into `store` (and the stores in `also`)
    unless the extra is missing, the calibration is a quick one, or the stores already have the fields (and
    `remeasure` is false); returns (and logs) one line saying which."""
    from hil.peer import INSTALL_HINT, available

    if not available():
        msg = f"llama.cpp step skipped ({INSTALL_HINT}); the llama.cpp policy keeps the device's INT8/K-quant rates"
    elif quick:
        msg = "llama.cpp step skipped in a quick calibration (it needs the peer's model files and ~4 min)"
    elif all(has_fields(d) for d in (store, *also)) and not remeasure:
        msg = f"llama.cpp step: kept the measured fields of {store} (remeasure=true re-measures)"
    else:
        fields = calibrate_into_store(store, log=log, also=also)
        rates = ", ".join(f"{k} {v:.1f}" for k, v in sorted(fields["llamacpp_gemm_gops_per_ghz"].items()))
        msg = (f"llama.cpp step (measured, warm files): fixed {fields['llamacpp_fixed_s'] * 1e3:.0f} ms, "
               f"repack {fields['llamacpp_repack_gbps']:.2f} GB/s, GOP/s per core-GHz: {rates}")
    log(msg)
    return msg


def host_stores() -> tuple[list[Path], list[str]]:
    """This machine's stored full host profiles (without huge pages first, then with; those that exist) and a line
    per one that is missing. Shared by the llama.cpp and MNN steps' entry points."""
    from hil.host import DEFAULT_ROOT, host_identity, load_stored

    stores, why_not = [], []
    for huge in (False, True):
        prof, d, why = load_stored(Path(DEFAULT_ROOT), host_identity(), quick=False, huge=huge)
        if prof is None:
            why_not.append(f"huge_pages={str(huge).lower()}: no usable host profile ({why})")
        else:
            stores.append(d)
    return stores, why_not


def main(argv: list[str]) -> int:
    """python -m hil.calibrate_peer [--remeasure]: the llama.cpp step alone, measured once and written into this
    machine's stored full host profiles (with and without huge pages, those that exist; python -m
    experiments.calibrate device=host [huge_pages=false] makes one and runs this step too)."""
    import sys

    if any(a not in ("--remeasure",) for a in argv):
        print("usage: python -m hil.calibrate_peer [--remeasure]", file=sys.stderr)
        return 2
    stores, why_not = host_stores()
    for line in why_not:
        print(line, file=sys.stderr)
    if not stores:
        print("run python -m experiments.calibrate device=host huge_pages=false first", file=sys.stderr)
        return 1
    peer_step(stores[0], remeasure="--remeasure" in argv, log=lambda m: print(m, file=sys.stderr, flush=True),
              also=tuple(stores[1:]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(__import__("sys").argv[1:]))
