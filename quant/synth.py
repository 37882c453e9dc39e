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
- the cache: `outputs/models/<name>-<seed>-<hash>.{q8_0,q4_1}.gguf`, where the hash covers the generator version, the
  shapes, the twin and the source file; atomic writes (quant.atomic), a per-model file lock so concurrent callers
  generate once, and re-use only after a header/size check.
Entry point: `ensure_gguf(spec, qtype)` (quant.gguf_model.gguf_path calls it for `weights=synthetic` models). The
EdgeFlow packed file of a synthetic model is `quant.synth_pack`'s. SmolLM2's file is read through quant.gguf_file,
which sits below quant.gguf_model.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import math
import struct
import threading
import time
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from quant.arch import ModelSpec, WeightSource, model_spec
from quant.atomic import atomic_open, atomic_write_json
from quant.gguf_file import open_gguf, package_gguf
from quant.twin import DEPTH_BINS, load_twin, twin_channel_stats, twin_path

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
    return package_gguf(model_spec(SOURCE_MODEL))


@lru_cache(maxsize=1)
def _source() -> tuple[SourceStats, list]:
    """(statistics, tokenizer fields [(key, value, type, sub_type)]) of SmolLM2's GGUF, read once per process."""
    import gguf

    src = model_spec(SOURCE_MODEL)
    reader = open_gguf(str(source_path()))          # shared with the tokenizer and weight loads
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
    skip = ("name", "hf_id", "weights", "gguf_package", "gguf_file")
    shape = {k: v for k, v in asdict(spec).items() if k not in skip}
    src = source_path()
    blob = json.dumps({"v": SYNTH_VERSION, "shape": shape, "seed": int(seed), "twin": twin_path().read_text(),
                       "src": [src.name, src.stat().st_size]}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:8]


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
    atomic_write_json(_sidecar(path), {"model": spec.name, "seed": seed, "qtype": q, "bytes": path.stat().st_size,
                                       "synth_version": SYNTH_VERSION, "generate_s": seconds, "measured": True,
                                       "source": SOURCE_MODEL, "note": "weights sampled from the twin (synthetic)"})


@contextlib.contextmanager
def file_lock(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with _LOCK, open(path, "a+b") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def check_spec(spec: ModelSpec) -> None:
    if spec.weights != WeightSource.synthetic:
        raise SynthError(f"model={spec.name} is not a synthetic model (model.weights={spec.weights.value})")


def ensure_gguf(spec: ModelSpec, qtype: str = "q8_0", seed: int = DEFAULT_SEED, out_dir: Path | None = None) -> Path:
    """Path of the cached GGUF (`qtype` in QTYPES) of synthetic model `spec`; both files are generated if missing."""
    check_spec(spec)
    if qtype not in QTYPES:
        raise SynthError(f"qtype must be one of {QTYPES} (got {qtype!r})")
    out = Path(out_dir) if out_dir is not None else OUT_DIR
    base = stem(spec, seed)
    paths = {q: out / f"{base}.{q}.gguf" for q in QTYPES}
    if gguf_valid(paths[qtype], spec):
        return paths[qtype]
    with file_lock(out / f".{base}.lock"):
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
