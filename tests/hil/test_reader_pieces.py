"""hil.diagnostics.reader_pieces on a small file: every (piece, readers) pair measured each round, the whole file
read (a rate, not a timing threshold), and a file the eviction cannot drop is refused."""
import numpy as np
import pytest

from hil.diagnostics import reader_pieces as rp
from hil.pagecache import evict, resident_fraction


def _file(tmp_path, nbytes=3 * rp.MIB + 4096):
    p = tmp_path / "f.bin"
    p.write_bytes(np.random.default_rng(0).integers(0, 256, nbytes, dtype=np.uint8).tobytes())
    return p


def test_measure_covers_every_pair_each_round(tmp_path, monkeypatch):
    monkeypatch.setattr(rp, "PIECES", (rp.MIB // 4, rp.MIB))
    path = _file(tmp_path)
    evict(path)
    if resident_fraction(path) > rp.COLD_MAX:
        pytest.skip("this filesystem keeps the file cached (no cold read here)")
    res = rp.measure(path, rounds=3)
    assert set(res) == {(p, r) for p in rp.PIECES for r in rp.READERS}
    assert all(len(v) == 3 and all(x > 0 for x in v) for v in res.values())


def test_a_file_that_stays_cached_is_refused(tmp_path, monkeypatch):
    path = _file(tmp_path, rp.MIB)
    monkeypatch.setattr(rp, "read_rate", lambda *a, **k: (1e9, 1.0))     # read, but found cached
    with pytest.raises(RuntimeError, match="stayed in the page cache"):
        rp.rate(path, rp.MIB, 2)


def test_main_refuses_too_few_rounds(capsys):
    assert rp.main(["2"]) == 2 and "rounds must be >= 3" in capsys.readouterr().err
