"""Atomic writes: a failure mid-write leaves the old file (or none) and no temp file behind."""
from __future__ import annotations

import pytest

from quant.atomic import atomic_open, atomic_write_json


def test_atomic_open_failure_keeps_old_file(tmp_path):
    p = tmp_path / "m.json"
    atomic_write_json(p, {"a": 1})
    with pytest.raises(RuntimeError):
        with atomic_open(p) as f:
            f.write(b"half")
            raise RuntimeError("boom")
    assert p.read_text().strip().startswith("{") and '"a": 1' in p.read_text()
    assert sorted(x.name for x in tmp_path.iterdir()) == ["m.json"]


def test_atomic_open_writes_on_success(tmp_path):
    p = tmp_path / "sub" / "x.bin"
    with atomic_open(p) as f:
        f.write(b"abc")
    assert p.read_bytes() == b"abc"
    assert [x.name for x in p.parent.iterdir()] == ["x.bin"]


def test_atomic_files_get_umask_permissions(tmp_path):
    import os

    mask = os.umask(0o022)
    try:
        p = tmp_path / "y.bin"
        with atomic_open(p) as f:
            f.write(b"x")
        assert p.stat().st_mode & 0o777 == 0o644
    finally:
        os.umask(mask)
