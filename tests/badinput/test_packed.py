"""Bad input — packed files: one rule, both readers (Python `PackedFile` and the C validator, in memory and
streaming), FIFOs / directories / missing files rejected without blocking, zero padding required, and a mutation fuzz
with 0 crashes and 0 silent corruptions (docs/packing.md "Model file")."""
from __future__ import annotations

import json
import os
import signal
import struct
import zlib
from contextlib import contextmanager

import numpy as np
import pytest

import native
from quant.pack import PackedFile, PackedFileError, read_packed_model, write_packed_model
from quant.pack.container import ENTRY, HEADER
from tests.pack.test_container import assert_same, toy_model


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    p = tmp_path_factory.mktemp("badpack") / "m.efp"
    write_packed_model(p, toy_model(2), alignment=64)
    return p.read_bytes()


@contextmanager
def no_hang(seconds: int = 20):
    """Fail (instead of hanging the suite) when a reader blocks."""
    def boom(*_):
        raise TimeoutError("reader blocked")
    old = signal.signal(signal.SIGALRM, boom)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def repair(buf: bytearray) -> bytearray:
    """Recompute the index/metadata CRC and the header CRC from the (possibly mutated) header fields."""
    n, index_off, meta_off, meta_size = (struct.unpack_from("<I", buf, 16)[0], *struct.unpack_from("<QQQ", buf, 24))
    if index_off + n * ENTRY.size <= len(buf) and meta_off + meta_size <= len(buf):
        crc = zlib.crc32(bytes(buf[meta_off:meta_off + meta_size]),
                         zlib.crc32(bytes(buf[index_off:index_off + n * ENTRY.size])))
        struct.pack_into("<I", buf, 56, crc)
    struct.pack_into("<I", buf, 60, zlib.crc32(bytes(buf[:60])))
    return buf


def verdicts(path, buf: bytes):
    """-> (python message or None, C (rc, msg) in memory); asserts the streaming C path agrees and every message is
    one line. Any exception other than PackedFileError propagates (a crash)."""
    path.write_bytes(buf)
    try:
        with PackedFile(path) as f:
            f.verify()
        py = None
    except PackedFileError as e:
        py = str(e)
        assert "\n" not in py and str(path) in py
    whole = native.check_container(np.frombuffer(buf, np.uint8) if buf else np.zeros(0, np.uint8))
    streamed = native.check_container_file(path)
    assert (whole[0] == 0) == (streamed[0] == 0), (whole, streamed)
    if whole[0]:
        assert whole[1] and "\n" not in whole[1]
    return py, whole


def entry_off(i: int) -> int:
    return HEADER.size + i * ENTRY.size


def names_in(buf: bytes) -> list[str]:
    n = struct.unpack_from("<I", buf, 16)[0]
    return [bytes(buf[entry_off(i):entry_off(i) + 96]).split(b"\0")[0].decode() for i in range(n)]


def both_reject(tmp_path, buf, *words):
    py, (rc, msg) = verdicts(tmp_path / "x.efp", bytes(buf))
    assert py is not None and rc != 0, (py, rc, msg)
    for w in words:
        assert w in py and w in msg, (w, py, msg)


def test_float32_1d_with_d_above_one_is_rejected_by_both(tmp_path, good):
    buf = bytearray(good)
    i = names_in(good).index("blk.0.attn_norm.weight")
    C, D = struct.unpack_from("<QQ", buf, entry_off(i) + 104)
    struct.pack_into("<QQ", buf, entry_off(i) + 104, C // 2, 2)        # same bytes, ndim stays 1
    both_reject(tmp_path, repair(buf), "1-D float32 tensor with D = 2")


@pytest.mark.parametrize("meta, word", [(b'{"a": NaN}', "not valid JSON"), (b"not json", "not valid JSON"),
                                        (b'["list"]', "top level must be an object"),
                                        (b'{"a": "\xff"}', "not UTF-8"),
                                        (b'{"a":' + b"[" * 70 + b"]" * 70 + b"}", "metadata at offset"),
                                        (b'{"a": ' + b"1" * 4301 + b"}", "metadata at offset")])
def test_metadata_must_be_json_object_for_both(tmp_path, good, meta, word):
    _index_off, meta_off, meta_size = struct.unpack_from("<QQQ", good, 24)
    old = good[meta_off:meta_off + meta_size]
    new = meta.ljust(len(old), b" ") if len(meta) <= len(old) else None
    if new is None:                                        # longer metadata: rewrite the file with it
        t = toy_model(2)
        p = tmp_path / "big.efp"
        write_packed_model(p, t, alignment=64, meta={"pad": "x" * (len(meta) + 10)})
        good = p.read_bytes()
        meta_off, meta_size = struct.unpack_from("<QQ", good, 32)
        new = meta.ljust(meta_size, b" ")
    buf = bytearray(good)
    buf[meta_off:meta_off + meta_size] = new
    both_reject(tmp_path, repair(buf), word)


def test_names_must_be_utf8_and_unique_for_both(tmp_path, good):
    buf = bytearray(good)
    buf[entry_off(0):entry_off(0) + 3] = b"\xc3\x28x"                    # invalid UTF-8
    both_reject(tmp_path, repair(buf), "not UTF-8")
    buf = bytearray(good)
    names = names_in(good)
    buf[entry_off(1):entry_off(1) + 96] = names[0].encode().ljust(96, b"\0")
    both_reject(tmp_path, repair(buf), "duplicate name")


def test_padding_must_be_zero_for_both(tmp_path, good):
    with PackedFile(_write(tmp_path, good)) as f:
        e = list(f.entries.values())[0]
        meta_end = HEADER.size + len(f.entries) * ENTRY.size + struct.unpack_from("<Q", good, 40)[0]
    assert e.offset > meta_end                                         # there is padding before the first tensor
    buf = bytearray(good)
    buf[e.offset - 1] = 7
    both_reject(tmp_path, buf, "non-zero padding")


def test_non_canonical_layout_is_rejected_by_both(tmp_path, good):
    buf = bytearray(good) + bytes(64)                                  # trailing zeros, header says so
    struct.pack_into("<Q", buf, 48, len(buf))
    both_reject(tmp_path, repair(buf), "sections end at")


def _write(tmp_path, buf):
    p = tmp_path / "ok.efp"
    p.write_bytes(buf)
    return p


def test_fifo_directory_and_missing_file_fail_fast_with_one_line(tmp_path):
    fifo = tmp_path / "pipe.efp"
    os.mkfifo(fifo)
    with no_hang():
        for p, word in ((fifo, "not a regular file"), (tmp_path, "not a regular file"),
                        (tmp_path / "missing.efp", "cannot open")):
            with pytest.raises(PackedFileError, match=word) as ei:
                PackedFile(p)
            assert "\n" not in str(ei.value)
            rc, msg = native.check_container_file(p)
            assert rc != 0 and word in msg
            with pytest.raises(PackedFileError):
                read_packed_model(p)


# ================================================ mutation fuzz ======================================================
def mutate(rng: np.random.Generator, good: bytes) -> tuple[bytes, bool]:
    """One random mutation -> (bytes, repaired: checksums recomputed so the semantic checks are reached)."""
    buf = bytearray(good)
    kind = rng.integers(0, 10)
    if kind == 0:                                          # flip bytes anywhere
        for _ in range(rng.integers(1, 5)):
            buf[rng.integers(0, len(buf))] ^= int(rng.integers(1, 256))
        return bytes(buf), False
    if kind == 1:                                          # truncate / extend / insert / delete
        op = rng.integers(0, 4)
        at = int(rng.integers(0, len(buf)))
        if op == 0:
            return bytes(buf[:at]), False
        if op == 1:
            return bytes(buf + bytes(int(rng.integers(1, 200)))), False
        if op == 2:
            return bytes(buf[:at] + bytes([int(rng.integers(0, 256))]) + buf[at:]), False
        return bytes(buf[:at] + buf[at + 1:]), False
    if kind == 2:                                          # overwrite a run with random bytes
        at = int(rng.integers(0, len(buf)))
        k = int(rng.integers(1, 32))
        buf[at:at + k] = rng.integers(0, 256, min(k, len(buf) - at), dtype=np.uint8).tobytes()
        return bytes(buf), False
    # repaired mutations: header / index / metadata / padding edits with valid checksums
    n = struct.unpack_from("<I", buf, 16)[0]
    if kind in (3, 4, 5):                                  # one index field set to a random or edge value
        i = int(rng.integers(0, n))
        field = [(96, "I"), (100, "I"), (104, "Q"), (112, "Q"), (120, "Q"), (128, "Q"), (136, "Q"), (144, "Q"),
                 (152, "Q"), (160, "Q"), (168, "I")][int(rng.integers(0, 11))]
        off, f = entry_off(i) + field[0], field[1]
        old = struct.unpack_from("<" + f, buf, off)[0]
        choices = [0, 1, 2, 4, 32, 64, 128, old + 1, max(old - 1, 0), old * 2, old // 2, (1 << 32) - 1,
                   int(rng.integers(0, 1 << 31))] + ([(1 << 63), (1 << 64) - 1] if f == "Q" else [])
        mask = (1 << (32 if f == "I" else 64)) - 1
        struct.pack_into("<" + f, buf, off, choices[int(rng.integers(0, len(choices)))] & mask)
    elif kind == 6:                                        # a name byte
        i = int(rng.integers(0, n))
        buf[entry_off(i) + int(rng.integers(0, 96))] = int(rng.choice([0, 0x80, 0xc0, 0xff, 0x2e, 0x41, 0xed]))
    elif kind == 7:                                        # a metadata byte
        meta_off, meta_size = struct.unpack_from("<QQ", buf, 32)
        buf[meta_off + int(rng.integers(0, meta_size))] = int(rng.choice(list(b'{}[]":,0-e.nNtf \\\x00\x7f\xc3\xff')))
    elif kind == 8:                                        # a header field
        off, f = [(16, "I"), (20, "I"), (24, "Q"), (32, "Q"), (40, "Q"), (48, "Q")][int(rng.integers(0, 6))]
        old = struct.unpack_from("<" + f, buf, off)[0]
        struct.pack_into("<" + f, buf, off, int(rng.choice([0, old + 1, max(old - 1, 0), old + 64, 128, 4096])))
    else:                                                  # a non-zero byte somewhere (often padding)
        buf[int(rng.integers(0, len(buf)))] = int(rng.integers(1, 256))
        return bytes(buf), False
    return bytes(repair(buf)), True


def fuzz(tmp_path, good: bytes, count: int, seed: int) -> dict:
    """Run `count` mutations; returns the figures (crashes, silent corruptions, disagreements, accepted)."""
    rng = np.random.default_rng(seed)
    want = toy_model(2)
    fig = dict(mutations=0, rejected=0, accepted=0, crashes=0, silent_corruptions=0, disagreements=0, repaired=0)
    path = tmp_path / "x.efp"
    for _ in range(count):
        buf, repaired = mutate(rng, good)
        fig["mutations"] += 1
        fig["repaired"] += repaired
        try:
            py, (rc, _msg) = verdicts(path, buf)
            if (py is None) != (rc == 0):
                fig["disagreements"] += 1
                continue
            if py is not None:
                fig["rejected"] += 1
                continue
            fig["accepted"] += 1
            got = read_packed_model(path)
            if not repaired:                               # without checksum repair, accepted must mean identical
                try:
                    assert_same(got, want)
                except AssertionError:
                    fig["silent_corruptions"] += 1
        except Exception:                                  # anything but a clean PackedFileError / C error code
            fig["crashes"] += 1
    return fig


def test_fuzz_short(tmp_path, good):
    fig = fuzz(tmp_path, good, 400, seed=11)
    assert fig["crashes"] == 0 and fig["silent_corruptions"] == 0 and fig["disagreements"] == 0, fig
    assert fig["rejected"] > 300


@pytest.mark.slow
def test_fuzz_12000_mutations(tmp_path, good, capsys):
    fig = fuzz(tmp_path, good, 12_000, seed=2026)
    with capsys.disabled():
        print(f"\npacked-file fuzz: {json.dumps(fig)}")
    assert fig["mutations"] >= 10_000
    assert fig["crashes"] == 0 and fig["silent_corruptions"] == 0 and fig["disagreements"] == 0, fig
