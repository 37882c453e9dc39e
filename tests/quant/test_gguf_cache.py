"""quant.gguf_file parses a GGUF file once per version of it within a process: the reader, the tokenizer and the
dequantized tensors are shared while the file is unchanged, and a rewritten file is parsed again."""
from __future__ import annotations

import os

import numpy as np
import pytest

from quant import gguf_file
from tests.quant.conftest import needs_model


def _write(path, values) -> None:
    import gguf

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tensor("x.weight", np.asarray(values, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.fixture
def parses(monkeypatch):
    """The number of gguf.GGUFReader parses so far (a list holding one count)."""
    import gguf

    n, real = [0], gguf.GGUFReader

    def counted(*a, **k):
        n[0] += 1
        return real(*a, **k)

    monkeypatch.setattr(gguf, "GGUFReader", counted)
    return n


def test_one_parse_per_version_of_a_file(tmp_path, parses):
    p = tmp_path / "m.gguf"
    _write(p, [1.0, 2.0, 3.0, 4.0])
    r = gguf_file.open_gguf(str(p))
    assert gguf_file.open_gguf(str(p)) is r and parses[0] == 1
    assert gguf_file.read_tensors(str(p))["x.weight"].tolist() == [1.0, 2.0, 3.0, 4.0] and parses[0] == 1
    st = p.stat()
    _write(p, [5.0, 6.0, 7.0, 8.0])                            # same size: the mtime tells the versions apart
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    assert gguf_file.open_gguf(str(p)) is not r and parses[0] == 2
    assert gguf_file.read_tensors(str(p))["x.weight"].tolist() == [5.0, 6.0, 7.0, 8.0] and parses[0] == 2


def test_a_failed_parse_is_not_kept(tmp_path, parses):
    p = tmp_path / "m.gguf"
    p.write_bytes(b"GGUF" + b"\xff" * 100)
    for _ in range(2):
        with pytest.raises(gguf_file.GGUFError, match="^model.gguf_file: m.gguf is not a valid GGUF file"):
            gguf_file.open_gguf(str(p))
    assert parses[0] == 2


@needs_model
def test_tokenizer_and_weights_share_one_parse_of_the_shipped_file(smol, parses):
    from quant.gguf_model import gguf_path

    path = str(gguf_path(smol))
    before = parses[0]
    tok = gguf_file.tokenizer_of(path)
    gguf_file.open_gguf(path)
    assert gguf_file.tokenizer_of(path) is tok and parses[0] - before <= 1    # 0 when the session parsed it already
