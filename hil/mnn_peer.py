"""MNN as a peer in the same run (docs/hil.md "The MNN peer"): the cold time-to-first-token of MNN 3.x's LLM runtime
(the `mnn` extra) on a model directory converted from the project's GGUF (hil.mnn_convert), on this host.

As hil.peer does for llama.cpp, per repeat: every file of the directory is evicted from the page cache
(hil.pagecache.evict_cold, up to EVICT_TRIES evictions each; the byte-weighted fraction left is recorded per run),
then t0 -> `MNN.llm.create(config.json)` + `set_config` + `load()` return (load_s: config, graph, tokenizer, the
weight file read into MNN's buffers (use_mmap=false) and the CPU backend's set-up) -> `forward(ids)` returns the
last position's logits (prefill_s: one forward of all prompt token ids, fed as ids, never re-tokenized) -> argmax
(the first token). TTFT = load_s + prefill_s + sampling, the clock started before the first file is opened.
MNN's own split: its context's `load_us` (perf_load_s); `forward` does not advance the context's prefill counter, so
the prefill is the wall time above. Threads: `thread_num` = `threads`; the directory's precision and memory modes
(the exporter's: low / low, INT8 activations on this CPU) are recorded.
Without MNN every entry point raises hil.peer.PeerUnavailable with one line saying how to install it.
"""
from __future__ import annotations

import gc
import json
import time
from pathlib import Path

import numpy as np

from hil.pagecache import evict_cold, resident_fraction
from hil.peer import PeerUnavailable, _check_tokens, _summary
from hil.timing import timing_lock

MNN_VERSION = "3.6.1"
INSTALL_HINT = (f"MNN peer unavailable: install the optional extra with pip install 'edgellm[mnn]' "
                f"(MNN=={MNN_VERSION}, a 18 MB wheel)")
MODEL_FILES = ("config.json", "llm_config.json", "llm.mnn", "llm.mnn.weight", "tokenizer.mtok")


def _mnn_llm():
    """The `MNN.llm` module, or PeerUnavailable (one line)."""
    try:
        import MNN.llm as llm
    except ImportError:
        raise PeerUnavailable(INSTALL_HINT) from None
    return llm


def available() -> bool:
    try:
        _mnn_llm()
    except PeerUnavailable:
        return False
    return True


def peer_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    _mnn_llm()
    try:
        return version("MNN")
    except PackageNotFoundError:
        return "?"


def model_files(model_dir) -> list[Path]:
    """The files MNN reads from `model_dir` (FileNotFoundError naming the first one missing)."""
    d = Path(model_dir)
    out = [d / n for n in MODEL_FILES]
    for p in out:
        if not p.is_file():
            raise FileNotFoundError(f"model_dir: {d} has no {p.name} (python -m hil.mnn_convert makes it)")
    return out


def evict_files(paths: list[Path], evict: bool = True) -> float:
    """Evict every file (hil.pagecache.evict_cold) unless `evict` is false; the byte-weighted fraction still cached."""
    total = cached = 0
    for p in paths:
        size = p.stat().st_size
        frac = evict_cold(p) if evict else resident_fraction(p)
        total += size
        cached += frac * size
    return cached / total if total else 0.0


def mnn_settings(model_dir) -> dict:
    """The directory's config.json (the exporter's runtime settings: precision, memory, ...)."""
    try:
        return json.loads((Path(model_dir) / "config.json").read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"model_dir: {model_dir}/config.json is not readable JSON ({e})") from None


def mnn_cold_ttft(model_dir, tokens, threads: int = 2, repeats: int = 3, evict_cache: bool = True,
                  n_vocab: int | None = None) -> dict:
    """Cold TTFT of MNN on `model_dir` for the prompt `tokens` (token ids), `repeats` times.

    Returns {"load_s"|"prefill_s"|"ttft_s"|"perf_load_s": {"median", "min", "max", "runs"}, "first_token": [ids per
    run], "resident_before": [fraction of the files in the page cache at t0 per run], settings echoed,
    "measured": True}: the shape of hil.peer.llamacpp_cold_ttft's result (hil.peer.merge_runs merges either).
    """
    llm = _mnn_llm()
    d = Path(model_dir)
    files = model_files(d)
    ids = _check_tokens(tokens, n_vocab)
    if not isinstance(threads, int) or isinstance(threads, bool) or threads < 1:
        raise ValueError(f"threads must be an integer >= 1 (got {threads!r})")
    if not isinstance(repeats, int) or isinstance(repeats, bool) or repeats < 1:
        raise ValueError(f"repeats must be an integer >= 1 (got {repeats!r})")
    conf = mnn_settings(d)
    with timing_lock(f"MNN {d.name}"):             # one timing run on this machine at a time (hil.timing)
        load, prefill, ttft, first, resident, perf_load = [], [], [], [], [], []
        for _ in range(repeats):
            gc.collect()
            resident.append(evict_files(files, evict_cache))
            t0 = time.perf_counter()
            m = llm.create(str(d / "config.json"))
            m.set_config({"thread_num": threads, "use_mmap": False})
            m.load()
            t1 = time.perf_counter()
            logits = m.forward(ids)
            row = np.asarray(logits.read()).reshape(-1)          # (vocab,) float32: the last position's logits
            t2 = time.perf_counter()
            tok = int(np.argmax(row))
            t3 = time.perf_counter()
            perf_load.append(float(m.context.load_us) / 1e6)
            load.append(t1 - t0)
            prefill.append(t2 - t1)
            ttft.append(t3 - t0)
            first.append(tok)
            del logits, m
    return {"measured": True, "peer": "MNN", "version": peer_version(), "file": str(d),
            "file_bytes": sum(p.stat().st_size for p in files), "prompt_tokens": len(ids), "threads": threads,
            "repeats": repeats, "use_mmap": False, "precision": conf.get("precision", ""),
            "memory": conf.get("memory", ""), "evicted": bool(evict_cache), "resident_before": resident,
            "load_s": _summary(load), "prefill_s": _summary(prefill), "ttft_s": _summary(ttft), "first_token": first,
            "perf_load_s": _summary(perf_load)}
