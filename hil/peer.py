"""llama.cpp as a peer in the same run (docs/hil.md, "Synthetic 1B model and the llama.cpp peer"): its cold
time-to-first-token on a GGUF file and its own K-quant dequantization kernels, measured on this host.

EdgeFlow (§6) compares its cold start with llama.cpp on the phone; here the peer runs on the same host, disk and
prompt as our runner (hil.runner), so the ratio of the two is a same-run measurement, never a number from a paper.

Owns:
- `llamacpp_cold_ttft(gguf_path, tokens, threads, repeats)`: per repeat, the file's pages are evicted from the page
  cache (hil.pagecache.evict_cold: up to EVICT_TRIES evictions until resident_fraction is 0, since another process
  reading the same file re-fills the cache; the fraction left is recorded per run), then t0 -> `Llama(...)` returns
  (load_s: model load, context and KV-cache allocation) -> `eval(tokens)` returns (prefill_s: one batch of all prompt
  token ids, fed as ids, never re-tokenized) -> argmax of the last logits (the first token). TTFT = load_s + prefill_s +
  sampling. Loading: `use_mmap=False` (llama.cpp reads the file with plain reads into its own buffers, as our runner
  does with preadv: no lazy page faults moved into the prefill) and `use_mlock=False`; both are recorded in the result.
  n_ctx = the prompt length + 1 (llama.cpp may round it up), n_batch = n_ubatch = the prompt length.
- `ggml_dequant(kind, blocks, n)`: ggml's own `dequantize_row_<kind>` through ctypes on the extra's libggml, and
  `ggml_quantize_ref(kind, x)` (`quantize_row_<kind>_ref`) to make its input: the real K-quant peer of the unpack
  benchmark (tests/bench/test_unpack_bench.py).
- `requantize(src, dst, ftype)`: `llama_model_quantize` (e.g. SmolLM2's shipped Q4_1 -> Q8_0), atomic;
  `peer_gguf_file(spec, kind)`: the peer's file of a model in a weight kind, made and cached on first use.
- `llamacpp_perplexity(gguf_path, slices)`: its perplexity on the project's evaluation slices (quality beside speed).
`llamacpp_cold_ttft` also records llama.cpp's own split (`llama_perf_context`): perf_load_s (model load, context,
KV cache: its t_load less the prompt eval) and perf_prompt_eval_s (t_p_eval).
The extra is optional: without `llama-cpp-python` every entry point raises `PeerUnavailable` with one line saying how
to install it. Version 0.3.16 is pinned: 0.3.36 built natively segfaults in `llama_decode` on this CPU (docs/hil.md).
"""
from __future__ import annotations

import ctypes
import gc
import os
import statistics
import time
from pathlib import Path

import numpy as np

from hil.pagecache import evict_cold, resident_fraction
from hil.timing import timing_lock
from quant.atomic import fsync_file

PEER_VERSION = "0.3.16"
INSTALL_HINT = (f"llama.cpp peer unavailable: install the optional extra with pip install 'edgellm[peer]' "
                f"(llama-cpp-python=={PEER_VERSION}, builds from source in ~4 min)")
DEQUANT_KINDS = ("q4_K", "q5_K", "q6_K", "q8_0", "q4_1")


class PeerUnavailable(RuntimeError):
    """llama-cpp-python (the `peer` extra) is not installed; the message is the one-line install hint."""


def _llama_cpp():
    """The `llama_cpp` module, or PeerUnavailable (one line)."""
    try:
        import llama_cpp
    except ImportError:
        raise PeerUnavailable(INSTALL_HINT) from None
    return llama_cpp


def available() -> bool:
    try:
        _llama_cpp()
    except PeerUnavailable:
        return False
    return True


def peer_version() -> str:
    return str(getattr(_llama_cpp(), "__version__", "?"))


# ---- cold TTFT ---------------------------------------------------------------------------------------------------
def _summary(xs: list[float]) -> dict:
    return {"median": float(statistics.median(xs)), "min": float(min(xs)), "max": float(max(xs)), "runs": list(xs)}


def _check_tokens(tokens, n_vocab: int | None = None) -> list[int]:
    ids = np.asarray(tokens)
    if ids.ndim != 1 or ids.size == 0 or not np.issubdtype(ids.dtype, np.integer):
        raise ValueError(f"tokens must be a non-empty 1-D sequence of token ids (got shape {ids.shape}, {ids.dtype})")
    if ids.min() < 0 or (n_vocab is not None and ids.max() >= n_vocab):
        raise ValueError(f"tokens: ids must be in 0..{n_vocab} (got {int(ids.min())}..{int(ids.max())})")
    return [int(t) for t in ids]


def llamacpp_cold_ttft(gguf_path, tokens, threads: int = 2, repeats: int = 3, evict_cache: bool = True) -> dict:
    """Cold TTFT of llama.cpp on `gguf_path` for the prompt `tokens` (token ids), `repeats` times.

    Returns {"load_s"|"prefill_s"|"ttft_s": {"median", "min", "max", "runs"}, "first_token": [ids per run],
    "resident_before": [fraction of the file in the page cache at t0 per run], settings echoed, "measured": True}.
    """
    llama_cpp = _llama_cpp()
    path = Path(gguf_path)
    if not path.is_file():
        raise FileNotFoundError(f"gguf_path: {path} does not exist")
    ids = _check_tokens(tokens)
    if not isinstance(threads, int) or threads < 1:
        raise ValueError(f"threads must be an integer >= 1 (got {threads!r})")
    if not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be an integer >= 1 (got {repeats!r})")
    n = len(ids)
    kw = dict(model_path=str(path), n_ctx=n + 1, n_batch=n, n_ubatch=n, n_threads=threads, n_threads_batch=threads,
              use_mmap=False, use_mlock=False, logits_all=False, verbose=False)
    with timing_lock(f"llama.cpp {path.name}"):       # one timing run on this machine at a time (hil.timing)
        return _cold_runs(llama_cpp, path, ids, kw, threads, repeats, evict_cache)


def _cold_runs(llama_cpp, path: Path, ids: list[int], kw: dict, threads: int, repeats: int, evict_cache: bool
               ) -> dict:
    n = len(ids)
    load, prefill, ttft, first, resident, perf_load, perf_eval = [], [], [], [], [], [], []
    for _ in range(repeats):
        gc.collect()
        resident.append(evict_cold(path) if evict_cache else resident_fraction(path))   # others may read it
        t0 = time.perf_counter()
        llm = llama_cpp.Llama(**kw)
        t1 = time.perf_counter()
        if llm.n_vocab() <= max(ids):
            llm.close()
            raise ValueError(f"tokens: id {max(ids)} is outside the model's vocabulary of {llm.n_vocab()}")
        llm.eval(ids)
        t2 = time.perf_counter()
        logits = np.ctypeslib.as_array(llm._ctx.get_logits_ith(-1), shape=(llm.n_vocab(),))   # (vocab,) float32
        tok = int(np.argmax(logits))
        t3 = time.perf_counter()
        # llama.cpp's own split: its t_load runs from the model load's start to the end of the first eval, so the
        # prompt eval (t_p_eval) is taken out of it
        perf = llama_cpp.llama_perf_context(llm._ctx.ctx)
        perf_load.append((perf.t_load_ms - perf.t_p_eval_ms) / 1e3)
        perf_eval.append(perf.t_p_eval_ms / 1e3)
        load.append(t1 - t0)
        prefill.append(t2 - t1)
        ttft.append(t3 - t0)
        first.append(tok)
        llm.close()
        del llm
    return {"measured": True, "peer": "llama.cpp", "version": peer_version(), "file": str(path),
            "file_bytes": path.stat().st_size, "prompt_tokens": n, "threads": threads, "repeats": repeats,
            "use_mmap": False, "use_mlock": False, "evicted": bool(evict_cache), "resident_before": resident,
            "load_s": _summary(load), "prefill_s": _summary(prefill), "ttft_s": _summary(ttft), "first_token": first,
            "perf_load_s": _summary(perf_load), "perf_prompt_eval_s": _summary(perf_eval)}


def merge_runs(results: list[dict]) -> dict:
    """One `llamacpp_cold_ttft` result from several (e.g. one run each, interleaved with other measurements): the
    per-run lists concatenated, the summaries recomputed, `repeats` = the number of runs."""
    if not results:
        raise ValueError("merge_runs: no results")
    out = dict(results[0])
    for key in ("load_s", "prefill_s", "ttft_s", "perf_load_s", "perf_prompt_eval_s"):
        if all(key in r for r in results):
            out[key] = _summary([x for r in results for x in r[key]["runs"]])
    out["first_token"] = [t for r in results for t in r["first_token"]]
    out["resident_before"] = [f for r in results for f in r["resident_before"]]
    out["repeats"] = len(out["ttft_s"]["runs"])
    return out


def llamacpp_perplexity(gguf_path, slices, threads: int = 2) -> list[float]:
    """Perplexity of llama.cpp on `gguf_path` per slice of `slices` (K, L) token ids, from its logits at every
    position (`logits_all=True`, one batch per slice, the context cleared between slices; quant.evaluate's
    perplexity_from_logits, as the project's bit widths are scored). Untimed."""
    from quant.evaluate import perplexity_from_logits

    llama_cpp = _llama_cpp()
    path = Path(gguf_path)
    if not path.is_file():
        raise FileNotFoundError(f"gguf_path: {path} does not exist")
    sl = np.asarray(slices)
    if sl.ndim != 2 or sl.shape[1] < 2:
        raise ValueError(f"slices must be (K, L) token ids with L >= 2 (got shape {sl.shape})")
    n = int(sl.shape[1])
    llm = llama_cpp.Llama(model_path=str(path), n_ctx=n, n_batch=n, n_ubatch=n, n_threads=threads,
                          n_threads_batch=threads, logits_all=True, verbose=False)
    try:
        out = []
        for row in sl:
            ids = _check_tokens(row, llm.n_vocab())
            llm.reset()                               # n_tokens = 0: eval clears the KV cache from position 0 on
            llm.eval(ids)
            logits = np.array(llm.scores[:n], dtype=np.float32)         # (L, vocab)
            out.append(perplexity_from_logits(logits, np.asarray(ids)))
        return out
    finally:
        llm.close()


def requantize(src, dst, ftype: str = "q8_0", threads: int = 2) -> Path:
    """`llama_model_quantize` of GGUF `src` into `dst` (ftype q8_0 | q4_1 | q4_0 | q4_k_m | q5_k_m | q6_k); atomic."""
    llama_cpp = _llama_cpp()
    types = {"q8_0": llama_cpp.LLAMA_FTYPE_MOSTLY_Q8_0, "q4_1": llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_1,
             "q4_0": llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_0, "q4_k_m": llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_K_M,
             "q5_k_m": llama_cpp.LLAMA_FTYPE_MOSTLY_Q5_K_M, "q6_k": llama_cpp.LLAMA_FTYPE_MOSTLY_Q6_K}
    if ftype not in types:
        raise ValueError(f"ftype must be one of {sorted(types)} (got {ftype!r})")
    dst = Path(dst)
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(f".{dst.name}.{os.getpid()}.tmp")
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = types[ftype]
    params.nthread = threads
    params.allow_requantize = True
    try:
        rc = llama_cpp.llama_model_quantize(str(src).encode(), str(tmp).encode(), ctypes.byref(params))
        if rc != 0:
            raise RuntimeError(f"llama_model_quantize({src} -> {ftype}) failed with code {rc}")
        fsync_file(tmp)
        os.replace(tmp, dst)
    finally:
        if tmp.exists():
            tmp.unlink()
    return dst


def ensure_requantized(src, ftype: str = "q8_0", out_dir=None) -> Path:
    """Cached `requantize` of `src` as `<out_dir>/<src stem>.<ftype>.gguf` (default outputs/models/); re-used when its
    header is GGUF. SmolLM2's shipped Q4_1 file -> Q8_0 for the peer's Q8_0 row."""
    src = Path(src)
    out = Path(out_dir) if out_dir is not None else Path(__file__).resolve().parents[1] / "outputs" / "models"
    dst = out / f"{src.name.rsplit('.', 2)[0]}.{ftype}.gguf"
    try:
        with open(dst, "rb") as f:
            if f.read(4) == b"GGUF" and dst.stat().st_size > 1024:
                return dst
    except OSError:
        pass
    return requantize(src, dst, ftype)


PEER_COPIES = Path(__file__).resolve().parents[1] / "outputs" / "models" / "peer"   # llama.cpp's private copies


def peer_gguf_file(spec, kind: str) -> Path:
    """The GGUF file llama.cpp reads for model `spec` (quant.arch.ModelSpec) in `kind` (q4_1 | q8_0 | q4_0 |
    q4_k_m): SmolLM2's shipped Q4_1 (a private copy) and the other kinds requantized from it by llama.cpp, cached (a
    second rounding, so report their perplexity beside); a private copy of a synthetic model's generated Q4_1 / Q8_0
    (quant.synth.ensure_gguf) and the other kinds requantized from its Q8_0."""
    from quant.arch import WeightSource
    from quant.gguf_model import gguf_path

    if spec.weights == WeightSource.synthetic:
        from quant.synth import QTYPES, ensure_gguf

        if kind not in QTYPES:
            return ensure_requantized(ensure_gguf(spec, "q8_0"), kind)
        # the generated Q8_0 is also the model's tokenizer and weight source, read through quant.gguf_file's shared
        # reader, which keeps it mapped: llama.cpp reads a copy, or ~0.15 % of the file (the mapped header) stays
        # resident through every eviction and every run is left out as warm (measured: 72 of 72 on the 1B model)
        return private_copy(ensure_gguf(spec, kind), out_dir=PEER_COPIES)
    src = private_copy(gguf_path(spec))        # a copy nobody else maps, so eviction really empties the page cache
    return src if kind == "q4_1" else ensure_requantized(src, kind)


def private_copy(src, out_dir=None) -> Path:
    """A byte-identical copy of `src` under `out_dir` (default outputs/models/), made once (atomic), re-used while its
    size matches. Pages of a file that another process has mapped (e.g. a GGUFReader of the shipped SmolLM2 file in a
    long-running process) cannot be evicted; a private copy nobody else opens can."""
    import shutil

    from quant.atomic import atomic_open

    src = Path(src)
    out = Path(out_dir) if out_dir is not None else Path(__file__).resolve().parents[1] / "outputs" / "models"
    dst = out / src.name
    if dst.is_file() and dst.stat().st_size == src.stat().st_size:
        return dst
    with open(src, "rb") as fi, atomic_open(dst) as fo:
        shutil.copyfileobj(fi, fo, 1 << 22)
    return dst


def bench_prompt(n: int) -> np.ndarray:
    """The benchmark prompt: the first `n` token ids (int64, (n,)) of quant.evaluate's evaluation text with SmolLM2's
    tokenizer (the synthetic models share it), the same ids for our runner and the peer."""
    from quant.arch import smollm2_spec
    from quant.evaluate import eval_text_tokens

    return np.asarray(eval_text_tokens(smollm2_spec(), int(n), 0), dtype=np.int64)


# ---- ggml's own (de)quantization kernels -------------------------------------------------------------------------
_GGML = None
_TYPES = {"q4_1": 3, "q8_0": 8, "q4_K": 12, "q5_K": 13, "q6_K": 14}     # enum ggml_type values


def _ggml():
    """ctypes handle on the extra's libggml-base (dequantize_row_* / quantize_row_*_ref are exported there)."""
    global _GGML
    if _GGML is None:
        llama_cpp = _llama_cpp()
        libdir = Path(llama_cpp.__file__).resolve().parent / "lib"
        names = ["libggml-base.so", "libggml.so"]
        lib = None
        for nm in names:
            if (libdir / nm).is_file():
                cand = ctypes.CDLL(str(libdir / nm))
                if hasattr(cand, "dequantize_row_q4_K"):
                    lib = cand
                    break
        if lib is None:
            raise PeerUnavailable(f"llama.cpp peer: no libggml with dequantize_row_q4_K in {libdir}; {INSTALL_HINT}")
        for k in _TYPES:
            for fn in (f"dequantize_row_{k}", f"quantize_row_{k}_ref"):
                f = getattr(lib, fn)
                f.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
                f.restype = None
        lib.ggml_row_size.argtypes = [ctypes.c_int, ctypes.c_int64]
        lib.ggml_row_size.restype = ctypes.c_size_t
        lib.ggml_blck_size.argtypes = [ctypes.c_int]
        lib.ggml_blck_size.restype = ctypes.c_int64
        _GGML = lib
    return _GGML


def _kind(kind: str) -> int:
    if kind not in _TYPES:
        raise ValueError(f"kind must be one of {sorted(_TYPES)} (got {kind!r})")
    return _TYPES[kind]


def ggml_block_size(kind: str) -> int:
    """Weights per block of `kind` (32 for q8_0 / q4_1, 256 for the K-quants)."""
    return int(_ggml().ggml_blck_size(_kind(kind)))


def ggml_row_bytes(kind: str, n: int) -> int:
    """Bytes of `n` weights (a multiple of the block size) quantized as `kind`."""
    return int(_ggml().ggml_row_size(_kind(kind), n))


def ggml_quantize_ref(kind: str, x: np.ndarray) -> np.ndarray:
    """ggml's scalar reference quantizer: float32 x (n,) (n a multiple of the block size) -> blocks (bytes,) uint8."""
    lib = _ggml()
    x = np.ascontiguousarray(x, dtype=np.float32).reshape(-1)
    bs = ggml_block_size(kind)
    if x.size % bs:
        raise ValueError(f"x: {x.size} weights is not a multiple of the {kind} block size {bs}")
    out = np.empty(ggml_row_bytes(kind, x.size), dtype=np.uint8)
    getattr(lib, f"quantize_row_{kind}_ref")(x.ctypes.data, out.ctypes.data, x.size)
    return out


def ggml_dequant(kind: str, blocks: np.ndarray, n: int | None = None, out: np.ndarray | None = None) -> np.ndarray:
    """ggml's own `dequantize_row_<kind>` (single thread, the ISA the extra was built for): blocks (bytes,) uint8 ->
    float32 (n,) weights (`n` defaults to what the blocks hold); `out` (n,) float32 is reused when given."""
    lib = _ggml()
    blocks = np.ascontiguousarray(blocks).view(np.uint8).reshape(-1)
    bs = ggml_block_size(kind)
    per_block = ggml_row_bytes(kind, bs)
    if blocks.size % per_block:
        raise ValueError(f"blocks: {blocks.size} bytes is not a whole number of {kind} blocks ({per_block} bytes)")
    n = blocks.size // per_block * bs if n is None else int(n)
    if n % bs or ggml_row_bytes(kind, n) > blocks.size:
        raise ValueError(f"n={n} must be a multiple of {bs} within the {blocks.size // per_block} blocks given")
    if out is None:
        out = np.empty(n, dtype=np.float32)
    if out.dtype != np.float32 or not out.flags.c_contiguous or out.size < n:
        raise ValueError("out must be a C-contiguous float32 array of at least n elements")
    getattr(lib, f"dequantize_row_{kind}")(blocks.ctypes.data, out.ctypes.data, n)
    return out
