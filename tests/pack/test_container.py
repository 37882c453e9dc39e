"""Model-file container: exact round trips in every format, and clear one-line errors from both readers
(Python PackedFile and the C ef_container_check) for truncated, corrupt and wrong-version files (docs/packing.md)."""
import struct
import zlib

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import native
from quant.pack import (
    FORMATS,
    PackedFile,
    PackedFileError,
    PackError,
    packed_nbytes,
    read_packed_model,
    write_packed_model,
)
from quant.pack.container import ENTRY, HEADER
from tests.native.conftest import random_codes


def toy_model(seed=0):
    rng = np.random.default_rng(seed)
    t = {}
    for name, (C, D) in {"blk.0.attn_q.weight": (24, 300), "blk.0.ffn_down.weight": (9, 129),
                         "empty": (0, 16)}.items():
        bits = rng.integers(1, 9, C)
        t[name] = (random_codes(rng, bits, D), bits, rng.random(C).astype(np.float32))
    t["blk.0.attn_norm.weight"] = rng.standard_normal(300).astype(np.float32)
    t["smooth2d"] = rng.standard_normal((3, 5)).astype(np.float32)
    return t


def assert_same(got, want):
    assert list(got) == list(want)
    for k, v in want.items():
        if isinstance(v, tuple):
            q, b, s = got[k]
            assert q.dtype == np.int8 and np.array_equal(q, v[0]) and np.array_equal(b, v[1])
            assert np.array_equal(s, v[2])
        else:
            assert got[k].dtype == np.float32 and np.array_equal(got[k], v)


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_round_trip_every_format(tmp_path, fmt):
    t = toy_model()
    p = write_packed_model(tmp_path / f"m.{fmt}", t, fmt=fmt, meta={"model": "toy", "budget": 5.0})
    for backend in ("native", "numpy"):
        assert_same(read_packed_model(p, backend=backend), t)
    buf = p.read_bytes()
    assert native.check_container(buf) == (0, "")
    with PackedFile(p) as f:
        assert f.meta["model"] == "toy" and f.meta["format"] == fmt
        for name, (q, bits, _) in ((n, v) for n, v in t.items() if isinstance(v, tuple)):
            e = f.entry(name)
            assert e.offset % 4096 == 0
            assert e.size == packed_nbytes(bits, q.shape[1], fmt)      # flash bytes the simulator will use
    assert not list(tmp_path.glob(".*tmp"))                            # no temp files left behind


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_c_runner_path_unpacks_every_format(tmp_path, fmt):
    """header+index bytes and one blob per tensor -> ef_unpack_blob gives the original ints (what a C runner does)."""
    t = toy_model(3)
    p = write_packed_model(tmp_path / "m", t, fmt=fmt)
    buf = np.frombuffer(p.read_bytes(), dtype=np.uint8)
    with PackedFile(p) as f:
        head = buf[:min(e.offset for e in f.entries.values())]
        for name, e in f.entries.items():
            blob = buf[e.offset:e.offset + e.size]
            if e.fmt_name == "float32":
                with pytest.raises(native.NativeError):
                    native.unpack_blob(head, e.index, blob, e.C, e.D)
                continue
            assert np.array_equal(native.unpack_blob(head, e.index, blob, e.C, e.D, threads=2), t[name][0])
            if e.size:
                with pytest.raises(native.NativeError, match="truncated"):
                    native.unpack_blob(head, e.index, blob[:-1], e.C, e.D)


def test_native_isa_choice_does_not_change_weights(tmp_path):
    t = toy_model(1)
    p = write_packed_model(tmp_path / "m", t)
    for isa in native.available_isas():
        assert_same(read_packed_model(p, isa=isa), t)
    assert_same(read_packed_model(p, threads=3), t)


def test_packed_nbytes_orders_formats():
    bits = np.array([5] * 90 + [4] * 10)
    D = 4096
    sizes = {f: packed_nbytes(bits, D, f, with_metadata=False) for f in FORMATS}
    assert sizes["weightlet"] == 4096 * (90 * 5 + 10 * 4) // 8
    assert sizes["kquant"] == 128 * (90 * 21 + 10 * 17)
    assert sizes["mixed"] == 90 * 4096 + 10 * 2048 and sizes["int8"] == 100 * 4096


def test_writer_rejects_bad_input(tmp_path):
    q = np.zeros((2, 4), np.int8)
    with pytest.raises(PackError, match="unknown packed format"):
        write_packed_model(tmp_path / "a", {"w": (q, [4, 4], np.ones(2, np.float32))}, fmt="q4_0")
    with pytest.raises(PackError, match="tensor 'w': channel 1 has values in \\[-3, 0\\], outside \\[-2, 1\\]"):
        write_packed_model(tmp_path / "a", {"w": (np.array([[0, 0], [-3, 0]], np.int8), [2, 2], np.ones(2))})
    with pytest.raises(PackError, match="scales must have shape"):
        write_packed_model(tmp_path / "a", {"w": (q, [4, 4], np.ones(3, np.float32))})
    with pytest.raises(PackError, match="name"):
        write_packed_model(tmp_path / "a", {"x" * 96: (q, [4, 4], np.ones(2, np.float32))})
    assert not list(tmp_path.iterdir())                                 # nothing half-written


@pytest.fixture(scope="module")
def good_file(tmp_path_factory):
    p = tmp_path_factory.mktemp("c") / "m.efp"
    write_packed_model(p, toy_model(2), alignment=64)                   # small file: fast fuzzing
    return p.read_bytes()


def errors(tmp_path, buf: bytes):
    """(python error message or None, (C rc, C message)); the streaming C path must agree with the in-memory one."""
    p = tmp_path / "x.efp"
    p.write_bytes(buf)
    try:
        with PackedFile(p) as f:
            f.verify()
        py = None
    except PackedFileError as e:
        py = str(e)
    whole, streamed = native.check_container(buf), native.check_container_file(p)
    assert whole == streamed
    return py, whole


def test_specific_corruptions_name_tensor_and_offset(tmp_path, good_file):
    with PackedFile_from(tmp_path, good_file) as f:
        e = f.entry("blk.0.ffn_down.weight")
    bad = bytearray(good_file)
    bad[e.offset + e.payload_off + 3] ^= 0x10
    py, (rc, msg) = errors(tmp_path, bytes(bad))
    want = f"tensor 'blk.0.ffn_down.weight' (#1) at offset {e.offset}: checksum mismatch"
    assert want in py and want in msg and rc == -7
    py, (rc, msg) = errors(tmp_path, good_file[:-1])
    assert "truncated" in py and "truncated" in msg and rc == -2
    py, (rc, msg) = errors(tmp_path, good_file[:10])
    assert "shorter than the 64-byte header" in py and "shorter than the 64-byte header" in msg
    v2 = bytearray(good_file)
    v2[8:12] = struct.pack("<I", 2)
    v2[60:64] = struct.pack("<I", zlib.crc32(bytes(v2[:60])))
    py, (rc, msg) = errors(tmp_path, bytes(v2))
    assert "unsupported file version 2 at offset 8" in py and "unsupported file version 2 at offset 8" in msg
    assert rc == -4
    py, (rc, msg) = errors(tmp_path, b"GGUF" + good_file[4:])
    assert "bad magic" in py and "bad magic" in msg
    with pytest.raises(PackedFileError, match="cannot open"):
        PackedFile(tmp_path / "missing.efp")
    with pytest.raises(PackedFileError, match="not a regular file"):
        PackedFile(tmp_path)


def PackedFile_from(tmp_path, buf):
    p = tmp_path / "ok.efp"
    p.write_bytes(buf)
    return PackedFile(p)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_fuzz_random_corruptions(tmp_path, good_file, data):
    """Any flipped bytes / truncation: both readers reject it, or (flip inside unchecked alignment padding) both
    accept it and the weights are exactly the original ones. Never a crash, never silently different weights."""
    fuzz_once(tmp_path, good_file, data)


@pytest.mark.slow
@settings(max_examples=3000, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_fuzz_random_corruptions_long(tmp_path, good_file, data):
    fuzz_once(tmp_path, good_file, data)


def fuzz_once(tmp_path, good_file: bytes, data) -> None:
    buf = bytearray(good_file)
    kind = data.draw(st.sampled_from(["flip", "trunc", "header", "index"]))
    if kind == "trunc":
        buf = buf[:data.draw(st.integers(0, len(buf) - 1))]
    else:
        lo, hi = {"flip": (0, len(buf)), "header": (0, HEADER.size),
                  "index": (HEADER.size, HEADER.size + 5 * ENTRY.size)}[kind]
        for _ in range(data.draw(st.integers(1, 4))):
            i = data.draw(st.integers(lo, hi - 1))
            buf[i] ^= data.draw(st.integers(1, 255))
    py, (rc, msg) = errors(tmp_path, bytes(buf))
    assert (py is None) == (rc == 0), (py, rc, msg)
    if py is None:
        assert_same(read_packed_model(tmp_path / "x.efp"), toy_model(2))
    else:
        assert "\n" not in py and str(tmp_path) in py and msg and "\n" not in msg


def _c_runner_case(tmp_path):
    p = write_packed_model(tmp_path / "m", toy_model(3), fmt="weightlet")
    buf = np.frombuffer(p.read_bytes(), dtype=np.uint8)
    with PackedFile(p) as f:
        e = f.entry("blk.0.attn_q.weight")
        head = buf[:min(x.offset for x in f.entries.values())].copy()
    return head, e, buf[e.offset:e.offset + e.size]


def test_unpack_blob_checks_shape_head_and_blob(tmp_path):
    """The binding validates before the kernels write C*D bytes: a smaller (C, D) than the index's would write
    past `out`, a short or corrupt head would be read unchecked."""
    head, e, blob = _c_runner_case(tmp_path)
    with pytest.raises(ValueError, match=r"shape \(1, 1\) differs from the index's \(24, 300\)"):
        native.unpack_blob(head, e.index, blob, 1, 1)
    with pytest.raises(native.NativeError, match="shorter than the 64-byte header"):
        native.unpack_blob(head[:10], e.index, blob, e.C, e.D)
    bad = blob.copy()
    bad[e.payload_off] ^= 1
    with pytest.raises(native.NativeError, match="checksum mismatch"):
        native.unpack_blob(head, e.index, bad, e.C, e.D)
    with pytest.raises(native.NativeError, match="bad argument"):
        native.tensor_entry(head, 99)


def test_c_unpack_blob_bounds_checks_an_unvalidated_entry(tmp_path):
    """ef_unpack_blob itself never reads outside head or blob, even when called on a head nobody validated:
    a payload offset that wraps around 2^64 (pl_off + pl_size == size mod 2^64) and an index offset past the head."""
    head, e, blob = _c_runner_case(tmp_path)
    lib = native._load()
    out = np.empty((e.C, e.D), np.int8)

    def call(h):
        return lib.ef_unpack_blob(native.ISAS.index("ref"), h.ctypes.data, h.nbytes, e.index, blob.ctypes.data,
                                  blob.nbytes, out.ctypes.data, 0, e.C, None)

    assert call(head) == 0 and np.array_equal(out, toy_model(3)["blk.0.attn_q.weight"][0])
    at = HEADER.size + e.index * ENTRY.size
    wrap = head.copy()
    wrap[at + 152:at + 168] = np.frombuffer(struct.pack("<QQ", (1 << 64) - 4096, e.size + 4096), np.uint8)
    assert call(wrap) != 0
    far = head.copy()
    far[24:32] = np.frombuffer(struct.pack("<Q", (1 << 64) - 8), np.uint8)
    assert call(far) == -1
    assert call(head[:32]) == -1


def test_reader_loops_on_short_reads(tmp_path, monkeypatch):
    """preadv may return fewer bytes than asked (Linux caps one call at ~2 GiB): not a truncation."""
    import os

    import quant.pack.container as container

    t = toy_model(4)
    p = write_packed_model(tmp_path / "m", t)
    real = os.preadv
    monkeypatch.setattr(container.os, "preadv", lambda fd, bufs, off: real(fd, [memoryview(bufs[0])[:1000]], off))
    assert_same(read_packed_model(p), t)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_fuzz_c_runner_unpack_path(tmp_path, data):
    """Flipped bytes in the head (header + index + metadata) or the blob given to `unpack_blob`: an error, or
    (flip in unchecked padding) exactly the original weights. Never a crash, never different weights."""
    head, e, blob = _c_runner_case(tmp_path)
    head, blob = head.copy(), blob.copy()
    target = data.draw(st.sampled_from(["head", "blob"]))
    buf = head if target == "head" else blob
    for _ in range(data.draw(st.integers(1, 3))):
        buf[data.draw(st.integers(0, buf.size - 1))] ^= data.draw(st.integers(1, 255))
    try:
        got = native.unpack_blob(head, e.index, blob, e.C, e.D)
    except (native.NativeError, ValueError):
        return
    assert np.array_equal(got, toy_model(3)["blk.0.attn_q.weight"][0])
