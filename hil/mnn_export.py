"""GGUF -> MNN LLM model directory, run as a script by hil.mnn_convert in a separate process (docs/hil.md "The MNN
peer"): `python hil/mnn_export.py --gguf F --out D --bits 8|4 --block N`.

It imports nothing of the project, so it runs under any interpreter with the `mnn-convert` extra (torch, transformers,
llmexport, MNN). Steps:
1. transformers' GGUF loader dequantizes the file into a float32 Hugging Face checkpoint (`<out>/hf`); the loader
   leaves a GGUF quantizer attached to the model, which `save_pretrained` refuses to save, so it is detached first;
2. MNN's exporter (the `llmexport` package) traces that checkpoint to ONNX, converts it with MNN's converter and
   quantizes the weights to `bits` in blocks of `block` input channels (asymmetric, MNN's default), writing
   config.json, llm.mnn, llm.mnn.weight, llm_config.json and tokenizer.mtok into `<out>`; the ONNX and HF
   intermediates are deleted.
MNN's converter module MNN.tools.utils.log, imported by MNN.tools.mnnconvert, runs `pip install -U
aliyun-log-python-sdk` into the running interpreter when that package is missing and sends usage telemetry to a remote
log service on every conversion: a stand-in module without a logger is put in its place before anything of MNN is
imported (mnnconvert then skips logging), and pip is pointed at no index (PIP_NO_INDEX) as a second guard.
llmexport 0.0.5 imports its own `utils` package as a top-level module, so its package directory goes on sys.path.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import types
from pathlib import Path

KEEP = ("config.json", "llm.mnn", "llm.mnn.weight", "llm_config.json", "tokenizer.mtok")


def no_telemetry() -> None:
    """MNN's converter without its pip install and telemetry (module doc)."""
    os.environ["PIP_NO_INDEX"] = "1"
    log = types.ModuleType("MNN.tools.utils.log")
    log.mnn_logger = None
    sys.modules["MNN.tools.utils.log"] = log
    for name in ("aliyun", "aliyun.log", "aliyun.log.logitem"):
        sys.modules.setdefault(name, types.ModuleType(name))


def to_hf(gguf: Path, dst: Path) -> None:
    """The GGUF file as a float32 Hugging Face checkpoint with its tokenizer (step 1)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(str(dst))
    tok.save_pretrained(str(dst))


def export(hf: Path, out: Path, bits: int, block: int) -> None:
    """MNN's exporter on the checkpoint (step 2)."""
    import importlib.util

    spec = importlib.util.find_spec("llmexport")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("mnn_export: the llmexport package is missing: pip install 'edgellm[mnn-convert]'")
    pkg = Path(list(spec.submodule_search_locations)[0])
    sys.path.insert(0, str(pkg))
    mod_spec = importlib.util.spec_from_file_location("llmexport_cli", pkg / "llmexport.py")
    cli = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(cli)

    argv = sys.argv
    sys.argv = ["llmexport", "--path", str(hf), "--export", "mnn", "--quant_bit", str(bits), "--quant_block",
                str(block), "--dst_path", str(out), "--mnnconvert", str(out / "no-MNNConvert-binary")]
    try:
        cli.main()
    finally:
        sys.argv = argv


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="hil/mnn_export.py")
    ap.add_argument("--gguf", required=True, type=Path)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--bits", required=True, type=int, choices=(4, 8))
    ap.add_argument("--block", required=True, type=int)
    a = ap.parse_args(argv)
    no_telemetry()
    a.out.mkdir(parents=True, exist_ok=True)
    hf = a.out / "hf"
    to_hf(a.gguf, hf)
    export(hf, a.out, a.bits, a.block)
    for p in a.out.iterdir():
        if p.name not in KEEP and p.name != "export_args.json":
            shutil.rmtree(p) if p.is_dir() else p.unlink()
    missing = [k for k in KEEP if not (a.out / k).is_file()]
    if missing:
        raise SystemExit(f"mnn_export: the exporter wrote no {', '.join(missing)} in {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
