"""Bit-exact cross-tests: NumPy reference unpackers vs. the C kernels, one ISA at a time (EdgeFlow §4.2;
docs/packing.md)."""
import hashlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import native
from quant.pack import baselines, pack_bits3, unpack_bits3, weightlet
from quant.pack.layout import PackError
from tests.native.conftest import random_codes

ODD_D = (1, 15, 127, 129, 300, 576)


@pytest.mark.parametrize("R", weightlet.GROUPS)
@pytest.mark.parametrize("B", range(1, 9))
def test_every_width_round_trips_on_every_isa(isa, B, R):
    rng = np.random.default_rng(B * 1000 + R)
    for D in (*ODD_D, 2 * R + 3):
        bits = np.full(5, B)
        q = random_codes(rng, bits, D)
        p = weightlet.pack(q, bits, R)
        assert p.size == weightlet.channel_nbytes(bits, D, R).sum()
        assert np.array_equal(weightlet.unpack_ref(p, bits, D, R), q)
        out = native.unpack_weightlet(p, pack_bits3(bits), 5, D, R)        # isa forced by the fixture
        assert np.array_equal(out, q), (isa, B, R, D)
        row = native.unpack_channel(B, p[:weightlet.channel_nbytes([B], D, R)[0]], D, R)  # unpack_b<B>_<isa>
        assert np.array_equal(row, q[0])


@pytest.mark.parametrize("R", weightlet.GROUPS)
def test_mixed_widths_zero_channels_and_channel_ranges(isa, R):
    rng = np.random.default_rng(R)
    for C, D in ((0, 64), (1, 1), (33, 333), (64, 0)):
        bits = rng.integers(1, 9, C)
        q = random_codes(rng, bits, D)
        p = weightlet.pack(q, bits, R)
        assert np.array_equal(weightlet.unpack_ref(p, bits, D, R), q)
        assert np.array_equal(native.unpack_weightlet(p, pack_bits3(bits), C, D, R), q)
    # a slice of channels (streaming / per-thread split) writes exactly those rows
    bits = rng.integers(1, 9, 40)
    q = random_codes(rng, bits, 200)
    p = weightlet.pack(q, bits, R)
    out = np.full((40, 200), 99, dtype=np.int8)
    native.unpack_weightlet(p, pack_bits3(bits), 40, 200, R, out=out, c0=7, c1=23)
    assert np.array_equal(out[7:23], q[7:23]) and (out[:7] == 99).all() and (out[23:] == 99).all()


def test_threads_split_channels_exactly():
    rng = np.random.default_rng(5)
    bits = rng.integers(1, 9, 37)
    q = random_codes(rng, bits, 257)
    b3 = pack_bits3(bits)
    pw, pm, pk = weightlet.pack(q, bits), baselines.mixed_pack(q, bits), baselines.kquant_pack(q, bits)
    for threads in (2, 3, 8, 64):
        assert np.array_equal(native.unpack_weightlet(pw, b3, 37, 257, threads=threads), q)
        assert np.array_equal(native.unpack_mixed(pm, b3, 37, 257, threads=threads), q)
        assert np.array_equal(native.unpack_kquant(pk, b3, 37, 257, threads=threads), q)
    with pytest.raises(native.NativeError, match="truncated"):
        native.unpack_weightlet(pw[:-1], b3, 37, 257, threads=4)
    with pytest.raises(ValueError, match="threads"):
        native.unpack_weightlet(pw, b3, 37, 257, threads=0)


@pytest.mark.parametrize("fmt", ["mixed", "kquant", "int8"])
def test_baselines_round_trip(isa, fmt):
    rng = np.random.default_rng(7)
    for C, D in ((0, 9), (29, 1), (29, 31), (29, 577), (3, 4096 + 33)):
        bits = rng.integers(1, 9, C)
        q = random_codes(rng, bits, D)
        b3 = pack_bits3(bits)
        if fmt == "mixed":
            p = baselines.mixed_pack(q, bits)
            assert np.array_equal(baselines.mixed_unpack_ref(p, bits, D), q)
            assert np.array_equal(native.unpack_mixed(p, b3, C, D), q)
        elif fmt == "kquant":
            p = baselines.kquant_pack(q, bits)
            assert p.size == baselines.kquant_channel_nbytes(bits, D).sum()
            assert np.array_equal(baselines.kquant_unpack_ref(p, bits, D), q)
            assert np.array_equal(native.unpack_kquant(p, b3, C, D), q)
        else:
            p = baselines.int8_pack(q, bits)
            assert np.array_equal(baselines.int8_unpack_ref(p, bits, D), q)
            assert np.array_equal(native.unpack_int8(p, C, D), q)


def test_layout_matches_fig7():
    """Byte j of a 1-bit block = weights j, j+16, ..., j+112, MSB first; 2-bit / 4-bit stripes likewise from the top."""
    def packed(B, idx, code):
        u = np.zeros((1, 128), np.int64)
        u[0, idx] = code
        return weightlet.pack(u - (1 << (B - 1)), [B], 128)
    p = packed(1, 0, 1)
    assert p[0] == 0x80 and p[1:].sum() == 0
    p = packed(1, 16 * 3 + 5, 1)                       # stripe 3, byte 5 -> bit 7-3
    assert p[5] == 0x10 and p.sum() == 0x10
    p = packed(2, 16 * 1 + 2, 3)                       # stripe 1 of block 0 -> bits [4, 6) of byte 2
    assert p[2] == 0x30 and p.sum() == 0x30
    p = packed(4, 16 * 2 + 0, 0xA)                     # stripe 2 -> block 1, high nibble
    assert p[16] == 0xA0 and p.sum() == 0xA0
    p = packed(3, 16 * 0 + 1, 0b101)                   # 3 = 2 + 1: low 2 bits in the 2-bit block, bit 2 in the 1-bit
    assert p[1] == 0x40 and p[32 + 1] == 0x80 and p.sum() == 0xC0
    p = packed(8, 5, 0xC3)                             # 8 bits: plain bytes
    assert p[5] == 0xC3 and p.sum() == 0xC3


def test_golden_packed_bytes():
    """Pinned layout: change the format deliberately (and bump the container version), never silently."""
    rng = np.random.default_rng(1234)
    bits = np.arange(1, 9).repeat(2)
    q = random_codes(rng, bits, 300)
    digest = hashlib.sha256()
    for R in weightlet.GROUPS:
        digest.update(weightlet.pack(q, bits, R).tobytes())
    digest.update(baselines.mixed_pack(q, bits).tobytes())
    digest.update(baselines.kquant_pack(q, bits).tobytes())
    assert digest.hexdigest()[:16] == GOLDEN


GOLDEN = "b3fdea273a898841"  # sha256 prefix of the bytes above, format version 1


def test_bits3_array():
    for C in (0, 1, 2, 3, 8, 11, 1000):
        b = np.random.default_rng(C).integers(1, 9, C)
        b3 = pack_bits3(b)
        assert b3.size == (3 * C + 7) // 8
        assert np.array_equal(unpack_bits3(b3, C), b)
    assert list(pack_bits3(np.array([1, 8, 3]))) == [0b10111000, 0]  # codes 0, 7 (0b111), 2 (0b010) at bits 0, 3, 6


def test_out_of_range_codes_name_the_channel():
    q = np.zeros((4, 8), np.int8)
    q[2, 3] = 8                                        # 4-bit max is 7
    with pytest.raises(PackError, match="channel 2 .*outside \\[-8, 7\\] for 4 bits"):
        weightlet.pack(q, [4, 4, 4, 4])
    with pytest.raises(PackError, match="channel 1 has bits=9"):
        weightlet.pack(q, [4, 9, 4, 4])
    with pytest.raises(ValueError, match="group size"):
        weightlet.pack(q, 4, R=64)


def test_isa_selection():
    isas = native.available_isas()
    assert isas[0] == "ref" and native.best_isa() == isas[-1]
    with native.force_isa("ref"):
        assert native.get_isa() == "ref"
    assert native.get_isa() == native.best_isa()
    with pytest.raises(ValueError, match="unknown isa"):
        native.set_isa("mmx")
    missing = [i for i in native.ISAS if i not in isas]
    if missing:
        with pytest.raises(native.NativeError, match="not available"):
            native.unpack_channel(3, np.zeros(48, np.uint8), 128, isa=missing[0])


def test_binding_checks_arrays_and_sizes():
    p = weightlet.pack(np.zeros((2, 128), np.int8), [5, 5])
    with pytest.raises(TypeError, match="out must be"):
        native.unpack_weightlet(p, pack_bits3(np.array([5, 5])), 2, 128, out=np.zeros((2, 128), np.int16))
    with pytest.raises(native.NativeError, match="truncated"):
        native.unpack_weightlet(p[:-1], pack_bits3(np.array([5, 5])), 2, 128)
    with pytest.raises(TypeError, match="C-contiguous"):
        native.unpack_weightlet(np.zeros(200, np.uint8)[::2], pack_bits3(np.array([5, 5])), 2, 128)
    ro = np.frombuffer(bytes(16), np.uint8)            # read-only (a bytes object): memcpy must not write into it
    with pytest.raises(ValueError, match="dst writable"):
        native.memcpy(ro, np.ones(16, np.uint8))
    assert not ro.any()


def test_crc32_matches_zlib():
    import zlib
    for n in (0, 1, 3, 4, 5, 1000):
        b = np.random.default_rng(n).integers(0, 256, n, dtype=np.uint8).tobytes()
        assert native.crc32(b) == zlib.crc32(b)


@settings(max_examples=60, deadline=None)
@given(C=st.integers(0, 12), D=st.integers(0, 700), R=st.sampled_from(weightlet.GROUPS), seed=st.integers(0, 2**32 - 1))
def test_random_shapes_round_trip_every_format_and_isa(C, D, R, seed):
    rng = np.random.default_rng(seed)
    bits = rng.integers(1, 9, C)
    q = random_codes(rng, bits, D)
    b3 = pack_bits3(bits)
    pw = weightlet.pack(q, bits, R)
    assert pw.size == int(bits.sum()) * -(-D // 8)                           # B * ceil(D/8) bytes per channel
    assert np.array_equal(weightlet.unpack_ref(pw, bits, D, R), q)
    pm, pk = baselines.mixed_pack(q, bits), baselines.kquant_pack(q, bits)
    for isa in native.available_isas():
        assert np.array_equal(native.unpack_weightlet(pw, b3, C, D, R, isa=isa), q), isa
        assert np.array_equal(native.unpack_mixed(pm, b3, C, D, isa=isa), q), isa
        assert np.array_equal(native.unpack_kquant(pk, b3, C, D, isa=isa), q), isa


def test_read_pieces_reads_copies_and_reports_errors(tmp_path):
    """native.read_pieces: every piece from its offset in requests smaller, equal to and larger than it (odd sizes),
    the copies where asked, the bytes read; a short read and a bad descriptor raise OSError naming the offset."""
    import os
    rng = np.random.default_rng(9)
    data = rng.integers(0, 256, 100_003, dtype=np.uint8)
    path = tmp_path / "blob.bin"
    path.write_bytes(data.tobytes())
    fd = os.open(path, os.O_RDONLY)
    try:
        spans = [(0, 1), (7, 4099), (50_001, 33_333), (100_000, 3), (5, 0)]
        for request in (1, 97, 4096, 1 << 20):
            bufs = [np.full(n, 0xAA, np.uint8) for _, n in spans]
            copies = [np.zeros(n, np.uint8) if i % 2 else None for i, (_, n) in enumerate(spans)]
            got = native.read_pieces(fd, bufs, [o for o, _ in spans], request, copies)
            assert got == sum(n for _, n in spans)
            for (o, n), b, c in zip(spans, bufs, copies):
                assert np.array_equal(b, data[o:o + n])
                if c is not None:
                    assert np.array_equal(c, b)
        assert native.read_pieces(fd, [], [], 64) == 0
        with pytest.raises(OSError, match="short read .* at offset 99990"):
            native.read_pieces(fd, [np.empty(100, np.uint8)], [99_990], 64, path=path)
        with pytest.raises(ValueError, match="same length"):
            native.read_pieces(fd, [np.empty(4, np.uint8)], [], 64)
        with pytest.raises(ValueError, match="copy buffer"):
            native.read_pieces(fd, [np.empty(4, np.uint8)], [0], 64, [np.empty(3, np.uint8)])
        with pytest.raises(ValueError, match="writable"):
            native.read_pieces(fd, [np.frombuffer(bytes(4), np.uint8)], [0], 64)
    finally:
        os.close(fd)
    with pytest.raises(OSError, match="Bad file descriptor"):
        native.read_pieces(fd, [np.empty(4, np.uint8)], [0], 64)
