"""A model's GGUF file, weights and tokenizer for any `ModelSpec` with weights (docs/quantization.md).

Owns the one answer to "which GGUF file is this model": `weights=real` -> the file shipped inside its pip package
(`quant.gguf_file`, e.g. SmolLM2-135M-Instruct, whose dequantized weights ARE the reference "FP" model);
`weights=synthetic` -> the file `quant.synth` generates on first use and caches under outputs/models. Everything that
reads a model (weights, tokenizer, the header check) goes through `gguf_path`, so a synthetic model works wherever a
real one does. The file-level reading, its cache and its errors live in `quant.gguf_file`.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from quant.arch import ModelSpec, WeightSource
from quant.gguf_file import GGUFError, check_shapes, open_gguf, package_gguf, read_tensors, tokenizer_of
from quant.synth import ensure_gguf


def gguf_path(spec: ModelSpec) -> Path:
    """Path of the model's GGUF file (a synthetic model's is generated on first use)."""
    if spec.weights == WeightSource.synthetic:
        return ensure_gguf(spec)
    return package_gguf(spec)


def check_gguf(spec: ModelSpec) -> Path:
    """The model's GGUF file exists and its header and tensor index are well formed (no tensor data is read)."""
    path = gguf_path(spec)
    open_gguf(str(path))
    return path


def load_weights(spec: ModelSpec) -> dict[str, np.ndarray]:
    """All tensors dequantized to float32 (read-only arrays; a new dict each call, arrays shared with the cache)."""
    w = read_tensors(str(gguf_path(spec)))
    check_shapes(spec, w)
    return w


def load_tokenizer(spec: ModelSpec):
    """`tokenizers.Tokenizer` built from the GGUF vocabulary and merges (no BOS added, as the GGUF says)."""
    path = str(gguf_path(spec))
    try:
        return tokenizer_of(path)
    except GGUFError:
        raise
    except (KeyError, IndexError, UnicodeDecodeError, ValueError, TypeError) as e:
        raise GGUFError(f"model.gguf_file: {Path(path).name} has no usable tokenizer ({e})") from None


def encode(spec: ModelSpec, text: str) -> np.ndarray:
    """Token ids (int64, (T,)) of `text`."""
    return np.asarray(load_tokenizer(spec).encode(text, add_special_tokens=False).ids, dtype=np.int64)
