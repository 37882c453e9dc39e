"""Bad input — one line instead of a traceback: corrupt / empty / truncated GGUF files, an out-of-range
quant.calib_offset (before any work), multidevice turns=3.5 and jitter=abc."""
from __future__ import annotations

import os

import pytest

from quant.arch import smollm2_spec
from quant.gguf_file import GGUFError, open_gguf
from quant.gguf_model import gguf_path
from tests.badinput.helpers import reject


@pytest.fixture(scope="module")
def gguf_bytes():
    with open(gguf_path(smollm2_spec()), "rb") as f:
        return f.read(400_000)


def _cases(src: bytes) -> dict[str, bytes]:
    return {"empty": b"", "tiny": src[:10], "header_only": src[:4096], "truncated": src[:300_000],
            "bad_magic": b"XXXX" + src[4:], "huge_count": src[:8] + (2**62).to_bytes(8, "little") + src[16:],
            "random": os.urandom(50_000), "bad_kv": src[:24] + b"\xff" * 1000}


def test_corrupt_gguf_files_give_one_line_naming_the_key(tmp_path, gguf_bytes):
    for name, data in _cases(gguf_bytes).items():
        p = tmp_path / f"{name}.gguf"
        p.write_bytes(data)
        with pytest.raises(GGUFError) as ei:
            open_gguf(str(p))
        msg = str(ei.value)
        assert msg.startswith("model.gguf_file: ") and "\n" not in msg, (name, msg)


def test_gguf_errors_print_one_line_through_an_app(capsys, tmp_path, gguf_bytes, monkeypatch):
    from quant import gguf_model

    bad = tmp_path / "SmolLM2-135M-Instruct.Q4_1.gguf"
    bad.write_bytes(gguf_bytes[:5000])
    monkeypatch.setattr(gguf_model, "gguf_path", lambda spec: bad)          # the installed file, corrupted
    reject(capsys, "quantize", [], "model.gguf_file")


def test_calib_offset_out_of_range_before_any_work(capsys):
    err = reject(capsys, "quantize", ["quant.calib_offset=112800"], "quant.calib_offset")
    assert "tokens of the evaluation text" in err


def test_multidevice_types(capsys):
    reject(capsys, "multidevice", ["turns=3.5"], "turns")
    reject(capsys, "multidevice", ["jitter=abc"], "jitter")
    reject(capsys, "coldstart", ["bits=abc"], "bits")
