"""Synthetic load-bound models (docs/hil.md, "Synthetic 1B model and the llama.cpp peer"): a Llama with real public
shapes but sampled weights, generated on demand and cached under `outputs/models/` (never in git).

Why: the real SmolLM2-135M loads in a fraction of a second, so on this host its cold start is compute-bound; a phone's
8B model is load-bound (EdgeFlow §2-3). A ~1B Llama (Llama-3.2-1B shapes, conf/model/llama3_2_1b_synth.yaml) on this
host's disk is load-bound as well at short prompts, without any 1B weights being downloaded.

Owns:
- sampling the weights, per output channel, from the statistical twin of SmolLM2 (quant.twin: crest factor κ and rms of
  every channel via `twin_channel_stats`, fixed seed); each row is a Gaussian body shaped to exactly that κ (clipped
  at the level that gives κ when κ is below the row's own crest, one raised extreme value when above) and scaled to
  that rms. The twin has no statistics of embeddings and norms: token-embedding rows take κ and rms from the same kind
  of quantiles fitted here on SmolLM2's `token_embd` rows (rms·√D convention of the twin), norm weights are drawn
  element-wise from the empirical quantiles of SmolLM2's norms of the same kind and relative depth.
  It is a twin of a distribution: nothing says a synthetic model computes anything meaningful.
- writing it, one tensor at a time (rows generated in chunks), as two GGUF files (Q8_0; Q4_1 with the token embedding
  in Q8_0, as in the shipped SmolLM2 file) with `gguf.GGUFWriter` + `gguf.quants.quantize`, SmolLM2's tokenizer
  metadata copied so that llama.cpp and quant.gguf_model's tokenizer both work;
- the EdgeFlow packed file (quant.export.write_pack) from the Q8_0 file's dequantized weights (quant.gguf_model),
  calibrated and quantized layer by layer with EdgeFlow's method (quant.methods.edgeflow, paper §4.1);
- the cache: `outputs/models/<name>-<seed>-<hash>.{q8_0,q4_1}.gguf` and `...b<bits>.<fmt>.<code>.efpk`, where the
  hash covers the generator version, the shapes, the twin and the source file, and <code> the packed-file writer's
  source (quant.export, quant.pack, the quantizer); atomic writes (quant.atomic), a per-model
  file lock so concurrent callers generate once, and re-use only after a header/size check.
Entry points: `ensure_gguf(spec, qtype)` (quant.gguf_model.gguf_path calls it for `weights=synthetic` models) and
`ensure_synth(name, bits, fmt)` (validate app, benchmarks).
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import math
import os
import struct
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from quant.arch import ModelSpec, WeightSource

log = logging.getLogger(__name__)

SYNTH_VERSION = 1                      # bump when the sampling or the file layout changes (part of the cache hash)
DEFAULT_MODEL = "llama3_2_1b_synth"
DEFAULT_SEED = 0
SOURCE_MODEL = "smollm2_135m"          # tokenizer and statistics source (the twin is fitted on it too)
ROOT = Path(__file__).resolve().parents[1]
OUT_DIR = ROOT / "outputs" / "models"
QTYPES = ("q8_0", "q4_1")              # GGUF files written for every synthetic model
CHUNK_WEIGHTS = 1 << 22                # weights generated per chunk (16 MiB of float32): bounds the working set
CREST_CAP = 0.9                        # κ ≤ CREST_CAP·√D: a row of D values cannot have a crest above √D
TOP_K_MIN = 64                         # order statistics kept per row to solve the clip level exactly
BISECT_STEPS = 40                      # bisection steps for the clip level (relative precision ~1e-12)
PACK_CODE = ("quant/export.py", "quant/pack/container.py", "quant/pack/formats.py", "quant/pack/weightlet.py",
             "quant/pack/layout.py", "quant/pack/baselines.py", "quant/methods/edgeflow.py", "quant/quantize.py")
PACK_SETTINGS = dict(calib_tokens=64, search_tokens=32, alpha_steps=3, eval_tokens=8)   # fast quantizer settings
_PROBS = np.linspace(0.0, 1.0, 101)    # quantile levels of the source statistics (embedding rows, norms)
_LOCK = threading.Lock()


class SynthError(ValueError):
    """A synthetic model cannot be generated (one line naming the model / file)."""


# ---- source statistics (SmolLM2: embedding rows and norms; the linear layers come from quant.twin) ----------------
@dataclass
class SourceStats:
    probs: list[float]                          # quantile levels
    emb_log_z: list[float]                      # quantiles of ln(κ/√(2 ln D)) of token_embd rows
    emb_log_rms_unit: list[float]               # quantiles of ln(rms·√D) of token_embd rows
    norms: dict[str, list[list[float]]]         # attn_norm / ffn_norm -> [depth bin][q] quantiles of the values
    output_norm: list[float]                    # quantiles of output_norm's values
    depth_bins: int


def _crest_norm(d: int) -> float:
    return float(np.sqrt(2.0 * np.log(d)))


def source_path() -> Path:
    from quant.gguf_model import gguf_path, model_spec

    return gguf_path(model_spec(SOURCE_MODEL))


@lru_cache(maxsize=1)
def _source() -> tuple[SourceStats, list]:
    """(statistics, tokenizer fields [(key, value, type, sub_type)]) of SmolLM2's GGUF, read once per process."""
    import gguf

    from quant.gguf_model import model_spec
    from quant.twin import DEPTH_BINS

    src = model_spec(SOURCE_MODEL)
    reader = gguf.GGUFReader(str(source_path()))
    kv = []
    for key, f in reader.fields.items():                         # tokenizer: vocabulary, merges, ids, template
        if key.startswith("tokenizer."):
            sub = f.types[-1] if f.types[0] == gguf.GGUFValueType.ARRAY else None
            kv.append((key, f.contents(), f.types[0], sub))
    t = {x.name: x for x in reader.tensors}
    e = gguf.quants.dequantize(t["token_embd.weight"].data, t["token_embd.weight"].tensor_type)
    e = np.asarray(e, dtype=np.float64).reshape(src.vocab, src.d_model)          # (vocab, d)
    rms = np.sqrt(np.mean(e * e, axis=1))
    keep = rms > 0
    z = np.abs(e[keep]).max(axis=1) / rms[keep] / _crest_norm(src.d_model)
    q = lambda a: np.quantile(np.asarray(a, dtype=np.float64), _PROBS).round(8).tolist()   # noqa: E731
    norms = {}
    for kind in ("attn_norm", "ffn_norm"):
        norms[kind] = [q(np.concatenate([np.asarray(t[f"blk.{i}.{kind}.weight"].data).ravel()
                                         for i in range(src.n_layers) if i * DEPTH_BINS // src.n_layers == b]))
                       for b in range(DEPTH_BINS)]
    stats = SourceStats(probs=_PROBS.tolist(), emb_log_z=q(np.log(z)),
                        emb_log_rms_unit=q(np.log(rms[keep] * np.sqrt(src.d_model))), norms=norms,
                        output_norm=q(np.asarray(t["output_norm.weight"].data)), depth_bins=DEPTH_BINS)
    return stats, kv


def source_stats() -> SourceStats:
    """Quantiles of SmolLM2's embedding-row and norm statistics (read from its GGUF once per process)."""
    return _source()[0]


# ---- row sampler -------------------------------------------------------------------------------------------------
def shape_rows(x: np.ndarray, crest: np.ndarray, rms: np.ndarray) -> np.ndarray:
    """Rows of `x` (R, D) float32 (i.i.d. N(0,1)) reshaped in place to crest factor max|w|/rms(w) = `crest` (R,) and
    rms `rms` (R,). κ below the row's own crest: clip at the level c with c/rms(clip(x, ±c)) = κ (bisection on the
    top-k order statistics); κ above it: raise the largest |x| to M with M/rms = κ. Returns x."""
    R, D = x.shape
    crest = np.minimum(np.asarray(crest, dtype=np.float64), CREST_CAP * math.sqrt(D))
    k = min(D, max(TOP_K_MIN, D // 16))
    ax = np.abs(x)
    sq_all = np.einsum("ij,ij->i", x, x, dtype=np.float64)                      # (R,) Σx²
    top = -np.sort(-np.partition(ax, D - k, axis=1)[:, D - k:], axis=1).astype(np.float64)   # (R, k) descending
    s_rest = sq_all - np.sum(top * top, axis=1)                                  # (R,) Σx² outside the top k
    mx = top[:, 0]
    natural = mx / np.sqrt(sq_all / D)                                           # (R,) the row's own crest
    lo_rows = crest < natural
    if np.any(lo_rows):                                                           # clip: crest(c) increases with c
        t, sr, kap = top[lo_rows], s_rest[lo_rows], crest[lo_rows]
        lo, hi = np.zeros(kap.size), t[:, 0].copy()
        for _ in range(BISECT_STEPS):
            c = 0.5 * (lo + hi)
            ms = (sr + np.sum(np.minimum(t, c[:, None]) ** 2, axis=1)) / D
            up = c / np.sqrt(ms) < kap
            lo, hi = np.where(up, c, lo), np.where(up, hi, c)
        c = 0.5 * (lo + hi)
        idx = np.flatnonzero(lo_rows)
        cc = c.astype(np.float32)[:, None]
        x[idx] = np.clip(x[idx], -cc, cc)
    hi_rows = np.flatnonzero(~lo_rows)
    if hi_rows.size:                                                              # raise the largest |x|
        j = np.argmax(ax[hi_rows], axis=1)
        s_other = sq_all[hi_rows] - mx[hi_rows] ** 2
        kap = crest[hi_rows]
        m = kap * np.sqrt(s_other / (D - kap * kap))
        x[hi_rows, j] = (np.sign(x[hi_rows, j]) * m).astype(np.float32)
    cur = np.sqrt(np.einsum("ij,ij->i", x, x, dtype=np.float64) / D)
    x *= (np.asarray(rms, dtype=np.float64) / np.maximum(cur, 1e-30)).astype(np.float32)[:, None]
    return x


def _interp(quantiles, u: np.ndarray, probs) -> np.ndarray:
    return np.interp(u, np.asarray(probs), np.asarray(quantiles))


# ---- tensor plan -------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TensorPlan:
    name: str                 # GGUF tensor name
    shape: tuple[int, ...]    # (C, D) for matrices (out_channels, in_channels), (d,) for norms
    kind: str                 # linear-layer key of ModelSpec.linear_shapes(), "token_embd" or a norm name
    layer: int                # block index, -1 outside blocks


def tensor_plan(spec: ModelSpec) -> list[TensorPlan]:
    """Tensors in file order (tied embeddings: no output.weight, llama.cpp uses token_embd as the head)."""
    if not spec.tied_embeddings:
        raise SynthError(f"model={spec.name}: synthetic models are written with tied embeddings only")
    if spec.is_moe or spec.sliding_window:
        raise SynthError(f"model={spec.name}: synthetic models are dense Llamas (no MoE, no sliding window)")
    plan = [TensorPlan("token_embd.weight", (spec.vocab, spec.d_model), "token_embd", -1)]
    shapes = spec.linear_shapes()
    for i in range(spec.n_layers):
        plan.append(TensorPlan(f"blk.{i}.attn_norm.weight", (spec.d_model,), "attn_norm", i))
        for kind in ("attn_q", "attn_k", "attn_v", "attn_output"):
            plan.append(TensorPlan(f"blk.{i}.{kind}.weight", shapes[kind], kind, i))
        plan.append(TensorPlan(f"blk.{i}.ffn_norm.weight", (spec.d_model,), "ffn_norm", i))
        for kind in ("ffn_gate", "ffn_up", "ffn_down"):
            plan.append(TensorPlan(f"blk.{i}.{kind}.weight", shapes[kind], kind, i))
    plan.append(TensorPlan("output_norm.weight", (spec.d_model,), "output_norm", -1))
    return plan


class Sampler:
    """Deterministic per-tensor sampling: tensor k of the plan uses rng([seed, k]); rows in fixed-size chunks."""

    def __init__(self, spec: ModelSpec, seed: int) -> None:
        from quant.twin import load_twin, twin_channel_stats

        self.spec, self.seed = spec, int(seed)
        self.twin = load_twin()
        self.src = source_stats()
        self.stats = twin_channel_stats(spec, self.seed, self.twin)   # kind -> (max_abs (L·C,), mean_sq (L·C,))

    def channel_targets(self, tp: TensorPlan, k: int) -> tuple[np.ndarray, np.ndarray]:
        """(crest (C,), rms (C,)) float64 targets of the rows of matrix tensor `tp` (index k in the plan)."""
        C, D = tp.shape
        if tp.kind == "token_embd":
            rng = np.random.default_rng([self.seed, k, 1])
            p = self.src.probs
            crest = np.exp(_interp(self.src.emb_log_z, rng.random(C), p)) * _crest_norm(D)
            rms = np.exp(_interp(self.src.emb_log_rms_unit, rng.random(C), p)) / np.sqrt(D)
            return crest, rms
        m, s = self.stats[tp.kind]
        m, s = m[tp.layer * C:(tp.layer + 1) * C], s[tp.layer * C:(tp.layer + 1) * C]
        rms = np.sqrt(s)
        return m / rms, rms

    def norm(self, tp: TensorPlan, k: int) -> np.ndarray:
        """Norm weights (d,) float32 drawn from the source model's values of the same kind and relative depth."""
        rng = np.random.default_rng([self.seed, k])
        u = rng.random(tp.shape[0])
        if tp.kind == "output_norm":
            q = self.src.output_norm
        else:
            q = self.src.norms[tp.kind][tp.layer * self.src.depth_bins // self.spec.n_layers]
        return _interp(q, u, self.src.probs).astype(np.float32)

    def matrix_chunks(self, tp: TensorPlan, k: int):
        """Yield row chunks (r, D) float32 of matrix tensor `tp`, in order."""
        C, D = tp.shape
        crest, rms = self.channel_targets(tp, k)
        rng = np.random.default_rng([self.seed, k])
        step = max(1, CHUNK_WEIGHTS // D)
        for r0 in range(0, C, step):
            r1 = min(C, r0 + step)
            x = rng.standard_normal((r1 - r0, D), dtype=np.float32)
            yield shape_rows(x, crest[r0:r1], rms[r0:r1])


# ---- GGUF writing ------------------------------------------------------------------------------------------------
def _qtype(name: str):
    import gguf

    return {"q8_0": gguf.GGMLQuantizationType.Q8_0, "q4_1": gguf.GGMLQuantizationType.Q4_1}[name]


def _file_type(name: str) -> int:
    import gguf

    return {"q8_0": gguf.LlamaFileType.MOSTLY_Q8_0, "q4_1": gguf.LlamaFileType.MOSTLY_Q4_1}[name]


def _tensor_qtype(tp: TensorPlan, file_q: str) -> str:
    return "q8_0" if tp.kind == "token_embd" else file_q       # as in the shipped SmolLM2 Q4_1 file


def _nbytes(shape: tuple[int, ...], q: str) -> int:
    import gguf

    blk, size = gguf.GGML_QUANT_SIZES[_qtype(q)]
    C, D = shape
    if D % blk:
        raise SynthError(f"row length {D} is not a multiple of the {q} block size {blk}")
    return C * (D // blk) * size


def _writer(spec: ModelSpec, q: str, plan: list[TensorPlan], fh):
    """A GGUFWriter whose header, metadata and tensor index are written to the open binary handle `fh`."""
    import gguf
    from gguf.gguf_writer import WriterState

    w = gguf.GGUFWriter(None, "llama")
    w.add_name(f"{spec.name} (synthetic: weights sampled from the SmolLM2 twin)")
    w.add_context_length(4096)
    w.add_block_count(spec.n_layers)
    w.add_embedding_length(spec.d_model)
    w.add_feed_forward_length(spec.d_ffn)
    w.add_head_count(spec.n_heads)
    w.add_head_count_kv(spec.n_kv_heads)
    w.add_rope_dimension_count(spec.head_dim)
    w.add_rope_freq_base(float(spec.rope_base))
    w.add_layer_norm_rms_eps(float(spec.norm_eps))
    w.add_vocab_size(spec.vocab)
    w.add_file_type(_file_type(q))
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    for key, val, vtype, sub in _source()[1]:                   # SmolLM2's tokenizer, copied
        w.add_key_value(key, val, vtype, sub)
    for tp in plan:
        if len(tp.shape) == 1:
            w.add_tensor_info(tp.name, tp.shape, np.dtype(np.float32), 4 * tp.shape[0])
        else:
            tq = _tensor_qtype(tp, q)
            w.add_tensor_info(tp.name, tp.shape, np.dtype(np.float32), _nbytes(tp.shape, tq), raw_dtype=_qtype(tq))
    w.fout = [fh]
    w.state = WriterState.EMPTY
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    return w


def write_gguf(spec: ModelSpec, seed: int, paths: dict[str, Path], progress=None) -> dict[str, Path]:
    """Generate the model once and write it to every file in `paths` (qtype -> path), atomically. Returns `paths`."""
    import gguf

    from quant.atomic import atomic_open

    plan = tensor_plan(spec)
    sampler = Sampler(spec, seed)
    with contextlib.ExitStack() as stack:
        handles = {q: stack.enter_context(atomic_open(p)) for q, p in paths.items()}
        writers = {q: _writer(spec, q, plan, fh) for q, fh in handles.items()}
        for k, tp in enumerate(plan):
            if len(tp.shape) == 1:
                arr = sampler.norm(tp, k)
                for w in writers.values():
                    w.write_tensor_data(arr)
            else:
                parts: dict[str, list[np.ndarray]] = {q: [] for q in writers}
                for chunk in sampler.matrix_chunks(tp, k):          # (r, D) float32
                    for q in writers:
                        parts[q].append(gguf.quants.quantize(chunk, _qtype(_tensor_qtype(tp, q))))
                    del chunk
                for q, w in writers.items():
                    w.write_tensor_data(np.concatenate(parts[q], axis=0))
                parts.clear()
            if progress:
                progress(k + 1, len(plan))
    return paths


# ---- cache -------------------------------------------------------------------------------------------------------
def cache_key(spec: ModelSpec, seed: int) -> str:
    """8 hex digits over what determines the files: generator version, shapes, seed, twin, source file (name, size)."""
    from quant.twin import twin_path

    skip = ("name", "hf_id", "weights", "gguf_package", "gguf_file")
    shape = {k: v for k, v in asdict(spec).items() if k not in skip}
    src = source_path()
    blob = json.dumps({"v": SYNTH_VERSION, "shape": shape, "seed": int(seed), "twin": twin_path().read_text(),
                       "src": [src.name, src.stat().st_size]}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:8]


def pack_code_key() -> str:
    """6 hex digits over the source of the packed-file writer (quant.export, quant.pack): a packed file made by other
    writer code is not re-used (the file layout changes with it)."""
    h = hashlib.sha256(str(PACK_SETTINGS).encode())
    for rel in PACK_CODE:
        h.update((ROOT / rel).read_bytes())
    return h.hexdigest()[:6]


def stem(spec: ModelSpec, seed: int) -> str:
    return f"{spec.name}-{int(seed)}-{cache_key(spec, seed)}"


def _header(path: Path) -> tuple[int, int, int, int]:
    """(magic, version, n_tensors, n_kv) of a GGUF file's fixed 24-byte header."""
    with open(path, "rb") as f:
        return struct.unpack("<IIQQ", f.read(24))


def _sidecar(path: Path) -> Path:
    return path.with_name(path.name + ".json")


def gguf_valid(path: Path, spec: ModelSpec) -> bool:
    """A cached GGUF is usable: its header says GGUF with the planned tensor count and its size equals the size
    recorded when it was written (the sidecar `<file>.json`, written after the GGUF itself)."""
    import gguf

    try:
        meta = json.loads(_sidecar(path).read_text())
        magic, version, n_t, _ = _header(path)
        size = path.stat().st_size
    except (OSError, ValueError, struct.error):
        return False
    return (magic == gguf.GGUF_MAGIC and version == gguf.GGUF_VERSION and n_t == len(tensor_plan(spec))
            and size == meta.get("bytes") and meta.get("synth_version") == SYNTH_VERSION)


def _write_sidecar(path: Path, spec: ModelSpec, seed: int, q: str, seconds: float) -> None:
    from quant.atomic import atomic_write_json

    atomic_write_json(_sidecar(path), {"model": spec.name, "seed": seed, "qtype": q, "bytes": path.stat().st_size,
                                       "synth_version": SYNTH_VERSION, "generate_s": seconds, "measured": True,
                                       "source": SOURCE_MODEL, "note": "weights sampled from the twin (synthetic)"})


@contextlib.contextmanager
def _file_lock(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with _LOCK, open(path, "a+b") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _check_spec(spec: ModelSpec) -> None:
    if spec.weights != WeightSource.synthetic:
        raise SynthError(f"model={spec.name} is not a synthetic model (model.weights={spec.weights.value})")


def ensure_gguf(spec: ModelSpec, qtype: str = "q8_0", seed: int = DEFAULT_SEED, out_dir: Path | None = None) -> Path:
    """Path of the cached GGUF (`qtype` in QTYPES) of synthetic model `spec`; both files are generated if missing."""
    _check_spec(spec)
    if qtype not in QTYPES:
        raise SynthError(f"qtype must be one of {QTYPES} (got {qtype!r})")
    out = Path(out_dir) if out_dir is not None else OUT_DIR
    base = stem(spec, seed)
    paths = {q: out / f"{base}.{q}.gguf" for q in QTYPES}
    if gguf_valid(paths[qtype], spec):
        return paths[qtype]
    with _file_lock(out / f".{base}.lock"):
        todo = {q: p for q, p in paths.items() if not gguf_valid(p, spec)}
        if todo:
            t0 = time.perf_counter()
            log.info("generating synthetic %s (seed %d) -> %s", spec.name, seed, ", ".join(map(str, todo.values())))
            write_gguf(spec, seed, todo)
            dt = time.perf_counter() - t0
            for q, p in todo.items():
                _write_sidecar(p, spec, seed, q, dt)
            log.info("generated in %.1f s", dt)
    return paths[qtype]


@dataclass(frozen=True)
class SynthPaths:
    q8_0: Path                 # GGUF, Q8_0 weights (llama.cpp peer; source of the packed file)
    q4_1: Path                 # GGUF, Q4_1 linear weights, Q8_0 token embedding (llama.cpp peer)
    pack: Path | None          # EdgeFlow packed file (quant.pack container) or None when not asked for
    bits: int | None           # EdgeFlow budget of the packed file (bits per weight)
    fmt: str | None            # packed format of the packed file (weightlet | mixed | kquant | int8)


def _pack_meta_ok(path: Path) -> bool:
    try:
        from quant.pack import PackedFile

        with PackedFile(path):
            return True
    except Exception:
        return False


class GGUFWeights(Mapping):
    """Read-only mapping GGUF tensor name -> float32 array ((out_channels, in_channels) for matrices), dequantized on
    access from the memory-mapped file, the `keep` most recently used arrays cached: the quantizer sees the weights
    dict it expects while at most a few tensors exist in float32 (1B model: ~1 GB instead of 4.3 GB)."""

    def __init__(self, path: Path, keep: int = 8) -> None:
        import gguf

        self._tensors = {t.name: t for t in gguf.GGUFReader(str(path)).tensors}
        self._cache: OrderedDict[str, np.ndarray] = OrderedDict()
        self._keep = keep

    def __getitem__(self, name: str) -> np.ndarray:
        import gguf

        if name in self._cache:
            self._cache.move_to_end(name)
            return self._cache[name]
        t = self._tensors[name]
        shape = tuple(int(s) for s in reversed(t.shape))
        arr = np.ascontiguousarray(np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32)
                                   .reshape(shape))
        arr.flags.writeable = False
        self._cache[name] = arr
        while len(self._cache) > self._keep:
            self._cache.popitem(last=False)
        return arr

    def __iter__(self):
        return iter(self._tensors)

    def __len__(self) -> int:
        return len(self._tensors)


def write_synth_pack(spec: ModelSpec, gguf_q8: Path, bits: int, fmt: str, dest: Path, progress=None) -> dict:
    """EdgeFlow packed file of `spec` at `dest` from the Q8_0 GGUF's dequantized weights: EdgeFlow's quantizer
    (paper §4.1; quant.methods.edgeflow.search_group, per-tensor budget `bits`) with fast settings (PACK_SETTINGS),
    calibrated on the calibration slice of the evaluation text (SmolLM2's tokenizer = this model's), layer by layer,
    then quant.export.write_pack. Unlike quant.pipeline.run_quantization it holds the float32 weights only a few
    tensors at a time (GGUFWeights), drops each layer's float32 fake-quantized weight copy as soon as the layer is
    done and runs no evaluation forward (at 1B scale those would add ~8 GB; the perplexity of sampled weights means
    nothing). Returns measured times and peak RSS."""
    import resource
    import tempfile

    from quant.calibrate import calibrate
    from quant.evaluate import eval_text_tokens
    from quant.export import write_pack
    from quant.gguf_model import model_spec
    from quant.methods import METHODS
    from quant.methods.base import QuantizedModel
    from quant.methods.edgeflow import search_group
    from quant.settings import QuantSettings
    from quant.smoothing import smoothing_groups

    st = QuantSettings(**PACK_SETTINGS)
    t0 = time.perf_counter()
    weights = GGUFWeights(gguf_q8)                                # float32 on demand, a few tensors at a time
    t_load = time.perf_counter() - t0                               # index only: tensors are read when used
    toks = eval_text_tokens(model_spec(SOURCE_MODEL), st.calib_tokens, st.calib_offset)
    calib = calibrate(weights, spec, toks)
    method = METHODS["edgeflow"](st)
    alphas = np.linspace(0.0, 1.0, st.alpha_steps) if st.smoothing else np.zeros(1)
    layers = {}
    for i in range(spec.n_layers):
        for names in smoothing_groups(spec, i):
            _, got = search_group(names, weights, spec, calib, alphas, st.beta,
                                  lambda wp: method.allocate_rows(wp, float(bits)), st)
            for n, layer in got.items():
                layer.w_hat = None                                  # not needed to pack; 4 bytes per weight
                layers[n] = layer
        for n in [k for k in calib.inputs if k.startswith(f"blk.{i}.")]:
            calib.inputs[n] = None                                  # this layer's activations are no longer needed
        if progress:
            progress(i + 1, spec.n_layers)
    t_quant = time.perf_counter() - t0 - t_load
    qm = QuantizedModel(layers, "edgeflow")
    b, d = qm.all_bits()
    with tempfile.TemporaryDirectory(dir=dest.parent, prefix=".pack-") as td:
        p = write_pack(qm, spec, weights, td, fmt=fmt)
        os.replace(p, dest)
    return {"load_s": t_load, "quantize_s": t_quant, "total_s": time.perf_counter() - t0,
            "avg_bits": float((b * d).sum() / d.sum()), "file_bytes": dest.stat().st_size,
            "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6,
            "settings": {**PACK_SETTINGS, "method": "edgeflow", "scope": st.scope}}


def ensure_synth(name: str = DEFAULT_MODEL, bits: int | None = 5, fmt: str = "weightlet", seed: int = DEFAULT_SEED,
                 out_dir: Path | None = None, spec: ModelSpec | None = None) -> SynthPaths:
    """Cached files of synthetic model conf/model/<name>.yaml: both GGUFs and (bits given) the EdgeFlow packed file at
    `bits` bits per weight in packed format `fmt`. Generates what is missing (1B: GGUFs ~2-3 min, pack a few min)."""
    from quant.gguf_model import model_spec
    from quant.pack import FORMATS

    spec = spec or model_spec(name)
    _check_spec(spec)
    if bits is not None and (isinstance(bits, bool) or not isinstance(bits, int) or not 1 <= bits <= 8):
        raise SynthError(f"bits must be an integer in 1..8 (got {bits!r})")
    if fmt not in FORMATS:
        raise SynthError(f"fmt must be one of {sorted(FORMATS)} (got {fmt!r})")
    out = Path(out_dir) if out_dir is not None else OUT_DIR
    q8 = ensure_gguf(spec, "q8_0", seed, out)
    q41 = ensure_gguf(spec, "q4_1", seed, out)
    if bits is None:
        return SynthPaths(q8, q41, None, None, None)
    base = stem(spec, seed)
    pack = out / f"{base}.b{bits}.{fmt}.{pack_code_key()}.efpk"
    if not _pack_meta_ok(pack):
        with _file_lock(out / f".{base}.lock"):
            if not _pack_meta_ok(pack):
                info = write_synth_pack(spec, q8, bits, fmt, pack)
                from quant.atomic import atomic_write_json

                atomic_write_json(pack.with_suffix(".json"), {"measured": True, **info, "bits": bits, "fmt": fmt})
    return SynthPaths(q8, q41, pack, bits, fmt)


if __name__ == "__main__":                     # python -m quant.synth [name] [bits] [fmt]: generate and print paths
    import sys

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    a = sys.argv[1:]
    print(ensure_synth(a[0] if a else DEFAULT_MODEL, int(a[1]) if len(a) > 1 else 5,
                       a[2] if len(a) > 2 else "weightlet"))
