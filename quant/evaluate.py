"""Accuracy evaluation of quantized models on the real SmolLM2 (docs/quantization.md): perplexity and mean
KL(reference‖quantized).

Owns: the fixed evaluation text (CPython's `pydoc_data.topics`: the values concatenated in sorted-key order, tokenized
with the GGUF tokenizer), the token slices used for evaluation and for calibration (disjoint), the metrics, and their
spread over K disjoint evaluation slices (`slice_offsets`, `eval_slices`, `evaluate_slices`: every accuracy number is
reported as mean ± sd over the slices, sd with ddof=1).

Check figure (measured on this machine kind): the first 512 tokens, fp32 reference forward -> perplexity 17.83.
"""
from __future__ import annotations

import hashlib
import json
import sys
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from quant.arch import ModelSpec
from quant.atomic import atomic_write_json
from quant.gguf_file import tokenizer_of
from quant.gguf_model import gguf_path
from quant.llama import LinearHook, forward_logits

EVAL_OFFSET = 0          # tokens; evaluation slice starts here (the 17.83 check figure uses offset 0)
CALIB_OFFSET = 100_000   # tokens; calibration slice starts far past any evaluation slice (the text has ~113k tokens)


def eval_text() -> str:
    from pydoc_data import topics

    return "".join(topics.topics[k] for k in sorted(topics.topics))


@lru_cache(maxsize=4)
def _all_tokens(gguf: str) -> np.ndarray:
    ids = tokenizer_of(gguf).encode(eval_text(), add_special_tokens=False).ids
    arr = np.asarray(ids, dtype=np.int64)
    arr.flags.writeable = False
    return arr


COUNT_CACHE = Path(__file__).resolve().parents[1] / "outputs" / "cache" / "text_tokens.json"


def text_token_count(spec: ModelSpec) -> int:
    """Number of tokens of the evaluation text, for checking token slices before any work. Tokenizing takes seconds,
    so the count is cached in outputs/cache/text_tokens.json, keyed by the GGUF file (path, size, mtime), the text's
    hash and the Python version (the text is CPython's pydoc_data)."""
    path = gguf_path(spec)
    st = path.stat()
    key = hashlib.sha1(f"{path}|{st.st_size}|{st.st_mtime_ns}|{sys.version}|".encode()
                       + hashlib.sha1(eval_text().encode()).digest()).hexdigest()
    try:
        cache = json.loads(COUNT_CACHE.read_text())
        if isinstance(cache, dict) and isinstance(cache.get(key), int):
            return cache[key]
    except (OSError, ValueError):
        cache = {}
    n = int(_all_tokens(str(path)).size)
    try:
        atomic_write_json(COUNT_CACHE, {**(cache if isinstance(cache, dict) else {}), key: n})
    except OSError:
        pass                                     # a read-only checkout: no cache, same answer
    return n


def eval_text_tokens(spec: ModelSpec, n_tokens: int, offset: int = 0) -> np.ndarray:
    """Tokens [offset, offset + n_tokens) of the evaluation text, int64 (n_tokens,)."""
    if n_tokens < 2:
        raise ValueError(f"n_tokens must be >= 2 (got {n_tokens})")
    if offset < 0:
        raise ValueError(f"offset must be >= 0 (got {offset})")
    toks = _all_tokens(str(gguf_path(spec)))
    if offset + n_tokens > toks.size:
        raise ValueError(f"offset + n_tokens = {offset + n_tokens} exceeds the {toks.size} tokens of the text")
    return toks[offset:offset + n_tokens].copy()


def slice_offsets(count: int, length: int, offset: int = 0, stride: int | None = None) -> list[int]:
    """Starts (tokens) of `count` disjoint slices of `length` tokens: offset + k·stride (None: stride = length)."""
    stride = length if stride is None else stride
    if count < 1:
        raise ValueError(f"eval_slices must be >= 1 (got {count})")
    if length < 2:
        raise ValueError(f"eval_tokens must be >= 2 (got {length})")
    if offset < 0:
        raise ValueError(f"eval_offset must be >= 0 (got {offset})")
    if stride < length:
        raise ValueError(f"eval_stride ({stride}) must be >= eval_tokens ({length}) so the slices are disjoint")
    return [offset + k * stride for k in range(count)]


def check_slices(n_text: int, offsets: list[int], length: int,
                 calib: tuple[int, int] | None = None) -> None:
    """Every slice [o, o + length) inside the n_text tokens of the text and disjoint from the calibration slice
    calib = (offset, tokens). One-line ValueError naming the key otherwise."""
    end = max(offsets) + length
    if end > n_text:
        raise ValueError(f"eval_slices: {len(offsets)} slices of {length} tokens (eval_offset {offsets[0]}, stride "
                         f"{offsets[1] - offsets[0] if len(offsets) > 1 else length}) need tokens up to {end}, but the "
                         f"evaluation text has {n_text}; use fewer or shorter slices or a smaller eval_stride")
    if calib is not None:
        c0, c1 = calib[0], calib[0] + calib[1]
        for k, o in enumerate(offsets):
            if o < c1 and c0 < o + length:
                raise ValueError(f"calib_offset: the calibration slice [{c0}, {c1}) overlaps evaluation slice {k} "
                                 f"[{o}, {o + length})")


def eval_slices(spec: ModelSpec, count: int, length: int, offset: int = 0, stride: int | None = None,
                calib: tuple[int, int] | None = None) -> np.ndarray:
    """K = count disjoint evaluation slices of `length` tokens, int64 (K, L), checked against the text length and
    the calibration slice calib = (offset, tokens)."""
    offs = slice_offsets(count, length, offset, stride)
    toks = _all_tokens(str(gguf_path(spec)))
    check_slices(int(toks.size), offs, length, calib)
    return np.stack([toks[o:o + length] for o in offs]).astype(np.int64)


def settings_slices(spec: ModelSpec, settings) -> np.ndarray:
    """The evaluation slices (K, L) of a `quant.settings.QuantSettings`."""
    return eval_slices(spec, settings.eval_slices, settings.eval_tokens, settings.eval_offset, settings.eval_stride,
                       (settings.calib_offset, settings.calib_tokens))


def mean_sd(values) -> tuple[float, float]:
    """Mean and sample standard deviation (ddof=1; 0 for a single value) of per-slice values."""
    v = np.asarray(values, dtype=np.float64)
    return float(v.mean()), float(v.std(ddof=1)) if v.size > 1 else 0.0


@dataclass
class SliceEval:
    """Per-slice measurements of one quantized model against the reference, each (K,)."""
    ppl: np.ndarray
    ref_ppl: np.ndarray
    kl: np.ndarray

    def metrics(self) -> dict:
        """Flat metrics: `ppl`, `ref_ppl`, `kl_mean` are means over slices, `*_sd` their sample sd, `*_slices` the
        per-slice values, `dppl_rel` = mean of ppl/ref_ppl − 1."""
        out: dict = {}
        for key, v in (("ppl", self.ppl), ("ref_ppl", self.ref_ppl), ("kl_mean", self.kl),
                       ("dppl_rel", self.ppl / self.ref_ppl - 1.0)):
            out[key], out[f"{key}_sd"] = mean_sd(v)
            out[f"{key}_slices"] = [float(x) for x in v]
        return out


def evaluate_slices(weights: dict[str, np.ndarray], spec: ModelSpec, slices: np.ndarray,
                    quant: LinearHook | None, ref_logits: list[np.ndarray] | None = None) -> SliceEval:
    """Reference and quantized forward on every slice (K, L): perplexities and mean KL(ref‖quant) per slice.
    `ref_logits` (one (L, V) array per slice) skips the reference forwards when they are already computed."""
    ppl, ref_ppl, kl = [], [], []
    for k, toks in enumerate(np.asarray(slices)):
        ref = forward_logits(weights, spec, toks) if ref_logits is None else ref_logits[k]
        q = forward_logits(weights, spec, toks, quant)
        ppl.append(perplexity_from_logits(q, toks))
        ref_ppl.append(perplexity_from_logits(ref, toks))
        kl.append(kl_mean(ref, q))
    return SliceEval(np.array(ppl), np.array(ref_ppl), np.array(kl))


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """(T, V) -> (T, V) float64 log-probabilities."""
    z = logits.astype(np.float64)
    z -= z.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def perplexity_from_logits(logits: np.ndarray, tokens: np.ndarray) -> float:
    """exp(mean NLL of tokens[1:] given the prefix); logits (T, V) for tokens (T,)."""
    lp = log_softmax(logits[:-1])
    nll = -lp[np.arange(tokens.size - 1), tokens[1:]]
    return float(np.exp(nll.mean()))


def perplexity(weights: dict[str, np.ndarray], spec: ModelSpec, tokens: np.ndarray,
               quant: LinearHook | None = None) -> float:
    """Perplexity of the model (optionally quantized through `quant`) on `tokens`."""
    return perplexity_from_logits(forward_logits(weights, spec, tokens, quant), np.asarray(tokens))


def kl_mean(ref_logits: np.ndarray, q_logits: np.ndarray) -> float:
    """Mean over positions of KL(p_ref ‖ p_q) in nats."""
    lr, lq = log_softmax(ref_logits), log_softmax(q_logits)
    return float((np.exp(lr) * (lr - lq)).sum(axis=-1).mean())
