"""Accuracy evaluation of quantized models on the real SmolLM2 (docs/quantization.md): perplexity and mean
KL(reference‖quantized).

Owns: the fixed evaluation text (CPython's `pydoc_data.topics`: the values concatenated in sorted-key order, tokenized
with the GGUF tokenizer), the token slices used for evaluation and for calibration (disjoint), and the metrics.

Check figure (measured on this machine kind): the first 512 tokens, fp32 reference forward -> perplexity 17.83.
"""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import numpy as np

from quant.arch import ModelSpec
from quant.llama import LinearHook, forward_logits

EVAL_OFFSET = 0          # tokens; evaluation slice starts here (the 17.83 check figure uses offset 0)
CALIB_OFFSET = 100_000   # tokens; calibration slice starts far past any evaluation slice (the text has ~113k tokens)


def eval_text() -> str:
    from pydoc_data import topics

    return "".join(topics.topics[k] for k in sorted(topics.topics))


@lru_cache(maxsize=4)
def _all_tokens(gguf: str) -> np.ndarray:
    from quant.gguf_model import _tokenizer_cached

    ids = _tokenizer_cached(gguf).encode(eval_text(), add_special_tokens=False).ids
    arr = np.asarray(ids, dtype=np.int64)
    arr.flags.writeable = False
    return arr


COUNT_CACHE = Path(__file__).resolve().parents[1] / "outputs" / "cache" / "text_tokens.json"


def text_token_count(spec: ModelSpec) -> int:
    """Number of tokens of the evaluation text, for checking token slices before any work. Tokenizing takes seconds,
    so the count is cached in outputs/cache/text_tokens.json, keyed by the GGUF file (path, size, mtime), the text's
    hash and the Python version (the text is CPython's pydoc_data)."""
    import hashlib
    import json
    import sys

    from quant.atomic import atomic_write_json
    from quant.gguf_model import gguf_path

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
    from quant.gguf_model import gguf_path

    if n_tokens < 2:
        raise ValueError(f"n_tokens must be >= 2 (got {n_tokens})")
    if offset < 0:
        raise ValueError(f"offset must be >= 0 (got {offset})")
    toks = _all_tokens(str(gguf_path(spec)))
    if offset + n_tokens > toks.size:
        raise ValueError(f"offset + n_tokens = {offset + n_tokens} exceeds the {toks.size} tokens of the text")
    return toks[offset:offset + n_tokens].copy()


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
