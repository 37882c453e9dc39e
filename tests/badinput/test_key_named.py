"""Bad input — every error names the key (or the file): seed=-1, turns=abc, the NaN cases, a binary trace
file, and quant.eval_tokens=1e8 (reported as itself, not as a quant.calib_offset problem)."""
from __future__ import annotations

from tests.badinput.helpers import reject


def test_errors_name_the_key(capsys):
    reject(capsys, "multidevice", ["seed=-1"], "seed")
    reject(capsys, "coldstart", ["seed=-1"], "seed")
    reject(capsys, "multidevice", ["turns=abc"], "turns")
    reject(capsys, "multidevice", ["turns="], "turns")
    reject(capsys, "quantize", ["quant.eval_tokens=1e8"], "quant.eval_tokens")
    reject(capsys, "quantize", ["quant.eval_tokens=100000000"], "quant.eval_tokens")
    reject(capsys, "quantize", ["bits=9"], "bits")
    reject(capsys, "quantize", ["quant.eval_offset=100000"], "quant.calib_offset")      # a real overlap: both named
    reject(capsys, "coldstart", ["framework.chunk_tokens=-1"], "framework.chunk_tokens")
    import pytest

    from experiments.coldstart import GROUPS, validate
    from experiments.common import precheck

    with pytest.raises(SystemExit):                                                   # group option: key=value named
        precheck("coldstart", ["framework=nope"], validate, GROUPS)
    assert capsys.readouterr().err.startswith("error: framework=nope is not a framework config; use one of: ")


def test_binary_trace_names_the_file(capsys, tmp_path):
    p = tmp_path / "trace.csv"
    p.write_bytes(bytes(range(256)))
    err = reject(capsys, "multidevice", [f"trace.csv={p}"], "trace.csv")
    assert str(p) in err and "binary" in err
