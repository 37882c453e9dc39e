"""The EdgeFlow packed file of a synthetic model (docs/hil.md, "Synthetic 1B model and the llama.cpp peer"): the
model's Q8_0 GGUF (`quant.synth`) quantized with EdgeFlow's method (quant.methods.edgeflow, paper §4.1) at a bit
budget and written by quant.export.write_pack.

Owns:
- `write_synth_pack`: calibrated and quantized layer by layer from the GGUF's dequantized weights, a few tensors in
  float32 at a time (`GGUFWeights`), with fast quantizer settings (`PACK_SETTINGS`);
- the cache `outputs/models/<name>-<seed>-<hash>.b<bits>.<fmt>.<code>.efpk` beside the GGUFs (`quant.synth.stem`), where
  <code> covers the packed-file writer's source (quant.export, quant.pack, the quantizer), written atomically under
  the model's file lock and re-used after a header check.
Entry point: `ensure_synth(name, bits, fmt)` (validate app, hil deploy, benchmarks); `python -m quant.synth_pack
[name] [bits] [fmt]` generates and prints the paths.
"""
from __future__ import annotations

import hashlib
import logging
import os
import resource
import sys
import tempfile
import time
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from quant.arch import ModelSpec, model_spec
from quant.atomic import atomic_write_json
from quant.calibrate import calibrate
from quant.evaluate import eval_text_tokens
from quant.export import write_pack
from quant.methods import METHODS
from quant.methods.base import QuantizedModel
from quant.methods.edgeflow import search_group
from quant.pack import FORMATS, PackedFile
from quant.settings import QuantSettings
from quant.smoothing import smoothing_groups
from quant.synth import (
    DEFAULT_MODEL,
    DEFAULT_SEED,
    OUT_DIR,
    ROOT,
    SOURCE_MODEL,
    SynthError,
    check_spec,
    ensure_gguf,
    file_lock,
    stem,
)

PACK_CODE = ("quant/export.py", "quant/pack/container.py", "quant/pack/formats.py", "quant/pack/weightlet.py",
             "quant/pack/layout.py", "quant/pack/baselines.py", "quant/methods/edgeflow.py", "quant/quantize.py")
PACK_SETTINGS = dict(calib_tokens=64, search_tokens=32, alpha_steps=3, eval_tokens=8)   # fast quantizer settings


def pack_code_key() -> str:
    """6 hex digits over the source of the packed-file writer (quant.export, quant.pack): a packed file made by other
    writer code is not re-used (the file layout changes with it)."""
    h = hashlib.sha256(str(PACK_SETTINGS).encode())
    for rel in PACK_CODE:
        h.update((ROOT / rel).read_bytes())
    return h.hexdigest()[:6]


@dataclass(frozen=True)
class SynthPaths:
    q8_0: Path                 # GGUF, Q8_0 weights (llama.cpp peer; source of the packed file)
    q4_1: Path                 # GGUF, Q4_1 linear weights, Q8_0 token embedding (llama.cpp peer)
    pack: Path | None          # EdgeFlow packed file (quant.pack container) or None when not asked for
    bits: int | None           # EdgeFlow budget of the packed file (bits per weight)
    fmt: str | None            # packed format of the packed file (weightlet | mixed | kquant | int8)


def _pack_meta_ok(path: Path) -> bool:
    try:
        with PackedFile(path):
            return True
    except Exception:
        return False


class GGUFWeights(Mapping):
    """Read-only mapping GGUF tensor name -> float32 array ((out_channels, in_channels) for matrices), dequantized on
    access from the memory-mapped file, the `keep` most recently used arrays cached: the quantizer sees the weights
    dict it expects while at most a few tensors exist in float32 (1B model: ~1 GB instead of 4.3 GB)."""

    def __init__(self, path: Path, keep: int = 8) -> None:
        from quant.gguf_file import open_gguf

        self._tensors = {t.name: t for t in open_gguf(str(path)).tensors}
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
    spec = spec or model_spec(name)
    check_spec(spec)
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
        with file_lock(out / f".{base}.lock"):
            if not _pack_meta_ok(pack):
                info = write_synth_pack(spec, q8, bits, fmt, pack)
                atomic_write_json(pack.with_suffix(".json"), {"measured": True, **info, "bits": bits, "fmt": fmt})
    return SynthPaths(q8, q41, pack, bits, fmt)


if __name__ == "__main__":                     # python -m quant.synth_pack [name] [bits] [fmt]: generate, print paths
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    a = sys.argv[1:]
    print(ensure_synth(a[0] if a else DEFAULT_MODEL, int(a[1]) if len(a) > 1 else 5,
                       a[2] if len(a) > 2 else "weightlet"))
