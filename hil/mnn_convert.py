"""A model's MNN LLM directory, converted from the project's own GGUF file (docs/hil.md "The MNN peer").

`ensure_mnn_model(spec, bits)` returns `outputs/models/peer/mnn/<model>-<source sha256[:12]>.b<bits>g<block>/`
(config.json, llm.mnn, llm.mnn.weight, llm_config.json, tokenizer.mtok and `mnn_model.json`, the manifest): made on
first use, re-used while its manifest names the same source file hash, bits and block and every file it lists has its
recorded size. The source is the model's GGUF as the project holds it (quant.gguf_model.gguf_path: SmolLM2's shipped
file, a synthetic model's generated Q8_0), never a download. The conversion (hil/mnn_export.py: GGUF -> float
checkpoint -> MNN's exporter, `bits`-bit weights in blocks of MNN_BLOCK input channels) runs as a script in a separate
process under `python` (default: this interpreter), which needs the `mnn-convert` extra; it writes a temporary
directory that is renamed into place only when complete.

    python -m hil.mnn_convert model=smollm2_135m bits=8 [python=/path/to/python]
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from quant.arch import ModelSpec
from quant.atomic import fsync_file

MNN_BITS = (4, 8)           # weight bits MNN's exporter writes (llmexport --quant_bit)
MNN_BLOCK = 64              # input channels per quantization block (llmexport's default --quant_block)
MNN_DIR = Path(__file__).resolve().parents[1] / "outputs" / "models" / "peer" / "mnn"
EXPORT_SCRIPT = Path(__file__).resolve().with_name("mnn_export.py")
FILES = ("config.json", "llm.mnn", "llm.mnn.weight", "llm_config.json", "tokenizer.mtok")
MANIFEST = "mnn_model.json"
CONVERT_MODULES = ("torch", "transformers", "accelerate", "llmexport", "MNN", "sentencepiece", "gguf")
CONVERT_HINT = ("install the conversion extra into that interpreter: pip install 'edgellm[mnn-convert]' (a CPU-only "
                "torch wheel first keeps it small: docs/hil.md \"The MNN peer\")")


class ConvertError(RuntimeError):
    """The conversion cannot run or failed (one line, naming the log where there is one)."""


def check_bits(bits) -> int:
    if isinstance(bits, bool) or not isinstance(bits, int) or bits not in MNN_BITS:
        raise ValueError(f"bits must be one of {', '.join(map(str, MNN_BITS))} (got {bits!r})")
    return bits


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def source_gguf(spec: ModelSpec) -> Path:
    """The model's GGUF file as the project holds it (module doc)."""
    from quant.gguf_model import gguf_path

    return Path(gguf_path(spec))


def model_dir(spec: ModelSpec, bits: int, digest: str, root: Path | None = None) -> Path:
    return Path(root or MNN_DIR) / f"{spec.name}-{digest[:12]}.b{bits}g{MNN_BLOCK}"


def read_manifest(d: Path) -> dict | None:
    """`d`'s manifest when every file it lists is there with its recorded size, else None."""
    try:
        doc = json.loads((d / MANIFEST).read_text())
        sizes = doc["files"]
        ok = set(sizes) >= set(FILES) and all((d / n).stat().st_size == int(b) for n, b in sizes.items())
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return doc if ok else None


def missing_modules(python: str) -> list[str]:
    """Modules of the conversion extra that `python` cannot import (found without importing them)."""
    code = ("import importlib.util as u; print(' '.join(n for n in %r if u.find_spec(n) is None))"
            % (CONVERT_MODULES,))
    try:
        r = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=120)
    except OSError as e:
        raise ConvertError(f"python={python}: cannot run it ({e.strerror})") from None
    if r.returncode != 0:
        raise ConvertError(f"python={python}: exited with {r.returncode}: {r.stderr.strip().splitlines()[-1:]}")
    return r.stdout.split()


def cached_mnn_model(spec: ModelSpec, bits: int = 8, root: Path | None = None) -> Path | None:
    """The MNN directory of `spec` at `bits` when it is converted and current, else None (nothing is converted)."""
    d = model_dir(spec, check_bits(bits), sha256(source_gguf(spec)), root)
    return d if read_manifest(d) is not None else None


def ensure_mnn_model(spec: ModelSpec, bits: int = 8, python: str | None = None, root: Path | None = None,
                     log=print) -> Path:
    """The MNN directory of `spec` at `bits` (module doc), converted when missing or stale."""
    check_bits(bits)
    src = source_gguf(spec)
    digest = sha256(src)
    dst = model_dir(spec, bits, digest, root)
    if read_manifest(dst) is not None:
        return dst
    python = python or sys.executable
    missing = missing_modules(python)
    if missing:
        raise ConvertError(f"MNN conversion: {python} lacks {', '.join(missing)}: {CONVERT_HINT}")
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(f".{dst.name}.{os.getpid()}.tmp")
    logf = dst.with_name(f"{dst.name}.log")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()                                     # also the exporter's working directory (its .export.log)
    log(f"converting {src.name} -> {dst.name} (MNN {bits}-bit, blocks of {MNN_BLOCK}; log {logf})")
    env = dict(os.environ, PIP_NO_INDEX="1")       # hil/mnn_export.py: MNN's converter must not pip-install
    try:
        with open(logf, "w") as lf:
            r = subprocess.run([python, str(EXPORT_SCRIPT), "--gguf", str(src), "--out", str(tmp), "--bits",
                                str(bits), "--block", str(MNN_BLOCK)], stdout=lf, stderr=subprocess.STDOUT, env=env,
                               cwd=str(tmp))
        if r.returncode != 0:
            tail = [ln.strip() for ln in logf.read_text(errors="replace").splitlines() if ln.strip()][-1:]
            raise ConvertError(f"MNN conversion of {src.name} failed (exit {r.returncode}): "
                               f"{tail[0] if tail else 'no output'} (log {logf})")
        sizes = {}
        for n in FILES:
            p = tmp / n
            if not p.is_file():
                raise ConvertError(f"MNN conversion of {src.name} wrote no {n} (log {logf})")
            fsync_file(p)
            sizes[n] = p.stat().st_size
        (tmp / MANIFEST).write_text(json.dumps({
            "model": spec.name, "source": str(src), "source_sha256": digest, "bits": bits, "quant_block": MNN_BLOCK,
            "exporter": _versions(python), "files": sizes}, indent=1) + "\n")
        if dst.exists():                            # a stale or partial directory of the same name
            shutil.rmtree(dst)
        os.rename(tmp, dst)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dst


def _versions(python: str) -> dict[str, str]:
    """Versions of the conversion's packages under `python` (recorded in the manifest)."""
    code = ("import importlib.metadata as m, json; print(json.dumps({n: m.version(n) for n in "
            "('MNN', 'llmexport', 'torch', 'transformers')}))")
    r = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=120)
    try:
        return json.loads(r.stdout)
    except ValueError:
        return {}


def parse_args(argv: list[str]) -> dict:
    """`model=<name> bits=4|8 [python=<interpreter>]` (one ValueError line otherwise)."""
    out: dict = {"bits": 8, "python": None}
    for a in argv:
        key, eq, val = a.partition("=")
        if not eq or key not in ("model", "bits", "python") or not val:
            raise ValueError(f"unknown argument {a!r}: usage: python -m hil.mnn_convert model=<name> bits=4|8 "
                             f"[python=<interpreter>]")
        out[key] = val
    if "model" not in out:
        raise ValueError("model=<name> is required (a conf/model name with weights here, e.g. smollm2_135m)")
    try:
        out["bits"] = check_bits(int(out["bits"]))
    except (TypeError, ValueError):
        raise ValueError(f"bits must be one of {', '.join(map(str, MNN_BITS))} (got {out['bits']!r})") from None
    return out


def main(argv: list[str]) -> int:
    from quant.arch import WeightSource, model_spec

    try:
        a = parse_args(argv)
        try:
            spec = model_spec(a["model"])
        except FileNotFoundError as e:
            raise ValueError(f"model: {e}") from None
        if spec.weights == WeightSource.twin:
            raise ValueError(f"model: {spec.name} has no weights on this machine")
        d = ensure_mnn_model(spec, a["bits"], a["python"], log=lambda m: print(m, file=sys.stderr, flush=True))
    except (ValueError, ConvertError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2 if isinstance(e, ValueError) else 1
    print(d)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
