"""The packed model file (container): writer and streaming reader (docs/packing.md; EdgeFlow Fig. 7 "Quantized Model").

One file holds a whole model: a versioned header, a tensor index, a JSON metadata block, then one blob per tensor,
each starting on an `alignment`-byte boundary (4096 by default: direct I/O and per-layer streaming reads can fetch a
tensor with one aligned pread). Every tensor carries a CRC32 (zlib polynomial; the C reader in
native/src/ef_container.c computes the same). Any malformed, truncated, corrupted or wrong-version file raises
`PackedFileError` with one line naming the file, the tensor and the byte offset; the C reader applies the same rules.

Layout (little-endian):
  header, 64 bytes:  magic "EDGEFLW\\0" | version u32 (=1) | header_size u32 (=64) | n_tensors u32 | alignment u32 |
                     index_offset u64 | meta_offset u64 | meta_size u64 | file_size u64 | index_crc u32 (CRC32 of the
                     index bytes followed by the metadata bytes) | header_crc u32 (CRC32 of bytes 0..59)
  index, 176 bytes per tensor: name 96s (UTF-8, NUL-terminated) | fmt u32 (0 weightlet, 1 int8, 2 mixed, 3 kquant,
                     4 float32) | group u32 (weightlet R; kquant 32; float32: ndim) | C u64 | D u64 | offset u64 |
                     size u64 | bits_off u64 (=0) | scales_off u64 | payload_off u64 | payload_size u64 | crc u32 |
                     reserved u32
  metadata: UTF-8 JSON object (model-level: anything the writer's caller passes, plus {"format": ...}).
  tensor blob: packed 3-bit widths (ceil(3C/8) bytes) | scales float32 (C,) | payload, sections 64-byte aligned;
               float32 tensors have only the payload (C*D*4 bytes; ndim 1 means D = 1).
One rule, both readers (docs/packing.md "Model file"): the layout is canonical — index right after the header, metadata
right after the index, tensor i at the first `alignment` boundary after the previous section, the file ends right after
the last tensor (with no tensors: at the first boundary after the metadata) — and every padding byte is zero, so every
byte of a file is either covered by a CRC32 or required to be zero. Names are UTF-8 and unique; the metadata is UTF-8
JSON (RFC 8259: no NaN / Infinity) whose top level is an object, nested at most MAX_JSON_DEPTH deep. Only regular
files are opened (FIFOs, directories and devices are rejected without blocking).
The writer streams blobs into a temp file in the target directory, then writes the index and header and renames:
nothing is ever half-written.
"""
from __future__ import annotations

import json
import os
import stat
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from quant.atomic import atomic_open, json_default
from quant.pack.formats import BY_CODE, F32_CODE, FORMATS, blob_layout, get_format
from quant.pack.layout import PackError, bits_array, check_codes, pack_bits3, unpack_bits3
from quant.pack.weightlet import DEFAULT_GROUP

MAGIC = b"EDGEFLW\0"
VERSION = 1
HEADER = struct.Struct("<8sIIIIQQQQII")         # 64 bytes
ENTRY = struct.Struct("<96sIIQQQQQQQQII")       # 176 bytes
NAME_LEN = 96
DEFAULT_ALIGNMENT = 4096                        # bytes, page / direct-I/O block
MAX_ELEMS = 1 << 40
MAX_JSON_DEPTH = 64                             # nesting of the metadata JSON (the C validator has the same limit)
MAX_INT_DIGITS = 4300                           # digits of a JSON integer literal (Python's int() limit; C the same)
assert HEADER.size == 64 and ENTRY.size == 176


class PackedFileError(ValueError):
    """A packed model file is malformed (one line: file, tensor, offset, reason)."""


@dataclass(frozen=True)
class TensorEntry:
    """One index entry; offsets in bytes (absolute `offset`, the rest relative to the blob)."""
    index: int
    name: str
    fmt: int           # format code (quant.pack.formats)
    group: int         # weightlet R (bits) / kquant group / float32 ndim
    C: int             # output channels (rows)
    D: int             # weights per channel
    offset: int        # blob start in the file
    size: int          # blob bytes
    bits_off: int
    scales_off: int
    payload_off: int
    payload_size: int
    crc: int

    @property
    def fmt_name(self) -> str:
        return "float32" if self.fmt == F32_CODE else BY_CODE[self.fmt].name


def _align(x: int, a: int) -> int:
    return -(-x // a) * a


# ==================================================== writer ==========================================================
def _encode(name: str, value, fmt: str, group: int):
    """-> (fmt code, group, C, D, list of (relative offset, bytes-like), blob size, scales_off, payload_off, psize)."""
    if isinstance(value, np.ndarray):
        a = np.ascontiguousarray(value, dtype=np.float32)
        if a.ndim not in (1, 2):
            raise PackError(f"tensor {name!r}: float32 tensors must be 1-D or 2-D (got shape {a.shape})")
        C, D = (a.shape[0], 1) if a.ndim == 1 else a.shape
        return F32_CODE, a.ndim, C, D, [(0, a.view(np.uint8).ravel())], a.nbytes, 0, 0, a.nbytes
    if not (isinstance(value, tuple) and len(value) == 3):
        raise PackError(f"tensor {name!r}: expected (q int8 (C, D), bits (C,), scales float32 (C,)) or a float32 array")
    q, bits, scales = value
    q = np.asarray(q)
    if q.ndim != 2:
        raise PackError(f"tensor {name!r}: quantized ints must be 2-D (got shape {q.shape})")
    C, D = q.shape
    b = bits_array(bits, C, f"tensor {name!r}")
    q = check_codes(q, b, f"tensor {name!r}")
    s = np.ascontiguousarray(scales, dtype=np.float32)
    if s.shape != (C,):
        raise PackError(f"tensor {name!r}: scales must have shape ({C},) (got {s.shape})")
    f = get_format(fmt)
    g = f.group(group)
    sc, pl, psize = blob_layout(f, b, C, D, g)
    payload = f.pack(q, b, g, f"tensor {name!r}")
    assert payload.size == psize
    parts = [(0, pack_bits3(b)), (sc, s.view(np.uint8)), (pl, payload)]
    return f.code, g, C, D, parts, pl + psize, sc, pl, psize


def write_packed_model(path, tensors: dict, fmt: str = "weightlet", meta: dict | None = None,
                       group: int = DEFAULT_GROUP, alignment: int = DEFAULT_ALIGNMENT,
                       fmt_of: dict[str, str] | None = None) -> Path:
    """Write a whole model: tensors[name] = (q int8 (C, D), bits (C,), scales float32 (C,)) packed in `fmt`
    (weightlet | int8 | mixed | kquant; `fmt_of[name]` overrides it per tensor, e.g. an INT8 LM head), or a float32
    array (1-D/2-D, stored raw). Atomic. Returns the path."""
    fmt_of = dict(fmt_of or {})
    for f in (fmt, *fmt_of.values()):
        if f not in FORMATS:
            raise PackError(f"unknown packed format {f!r} (one of {', '.join(FORMATS)})")
    if alignment < 64 or alignment & (alignment - 1):
        raise PackError(f"alignment must be a power of two >= 64 (got {alignment})")
    names = list(tensors)
    for n in names:
        raw = n.encode("utf-8")
        if not raw or len(raw) >= NAME_LEN or b"\0" in raw:
            raise PackError(f"tensor name {n!r} must be 1..{NAME_LEN - 1} UTF-8 bytes without NUL")
    meta_all = {"format": fmt, "group": group, **(meta or {})}
    meta_b = json.dumps(meta_all, sort_keys=True, default=json_default).encode("utf-8")
    index_off = HEADER.size
    meta_off = index_off + ENTRY.size * len(names)
    pos = _align(meta_off + len(meta_b), alignment)

    path = Path(path)
    with atomic_open(path) as fh:
        fh.write(b"\0" * pos)                       # header + index + meta, rewritten at the end
        entries = []
        for i, n in enumerate(names):
            code, g, C, D, parts, size, sc, pl, psize = _encode(n, tensors[n], fmt_of.get(n, fmt), group)
            fh.seek(pos)
            crc, at = 0, 0
            for rel, data in parts:                 # sections with zero padding between them
                if rel > at:
                    pad = b"\0" * (rel - at)
                    fh.write(pad)
                    crc = zlib.crc32(pad, crc)
                mv = memoryview(np.ascontiguousarray(data)).cast("B")
                fh.write(mv)
                crc = zlib.crc32(mv, crc)
                at = rel + mv.nbytes
            assert at == size
            entries.append(ENTRY.pack(n.encode("utf-8"), code, g, C, D, pos, size, 0, sc, pl, psize, crc, 0))
            pos = _align(pos + size, alignment)
        end = fh.tell()
        index = b"".join(entries)
        head = HEADER.pack(MAGIC, VERSION, HEADER.size, len(names), alignment, index_off, meta_off, len(meta_b),
                           end, zlib.crc32(meta_b, zlib.crc32(index)), 0)
        head = head[:60] + struct.pack("<I", zlib.crc32(head[:60]))
        fh.seek(0)
        fh.write(head + index + meta_b)
    return path


# ==================================================== reader ==========================================================
def open_regular(path: Path) -> int:
    """fd of a regular file opened read-only; a FIFO, directory, device or missing file -> PackedFileError, without
    blocking (stat first, then open with O_NONBLOCK and check the opened file again)."""
    try:
        st = os.stat(path)
    except OSError as e:
        raise PackedFileError(f"{path}: cannot open packed model file ({e.strerror})") from None
    if not stat.S_ISREG(st.st_mode):
        raise PackedFileError(f"{path}: not a regular file")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as e:
        raise PackedFileError(f"{path}: cannot open packed model file ({e.strerror})") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):      # replaced between stat and open
        os.close(fd)
        raise PackedFileError(f"{path}: not a regular file")
    return fd


def _reject_constant(name: str):
    raise ValueError(f"{name} is not JSON (RFC 8259)")


def _parse_int(s: str) -> int:
    if len(s.lstrip("-")) > MAX_INT_DIGITS:
        raise ValueError(f"integer literal of more than {MAX_INT_DIGITS} digits")
    return int(s)


def _depth(x, limit: int) -> int:
    """Nesting depth of a parsed JSON value (scalars 0), stopping once past `limit`."""
    if isinstance(x, dict):
        items = x.values()
    elif isinstance(x, list):
        items = x
    else:
        return 0
    d = 1
    for v in items:
        d = max(d, 1 + _depth(v, limit))
        if d > limit:
            break
    return d


def parse_meta(meta_b: bytes, fail) -> dict:
    """The container rule for the metadata block: strict UTF-8, RFC 8259 JSON (no NaN / Infinity), a top-level object,
    nested at most MAX_JSON_DEPTH deep, integer literals of at most MAX_INT_DIGITS digits. Calls fail(message)
    otherwise."""
    try:
        text = meta_b.decode("utf-8")
    except UnicodeDecodeError as e:
        return fail(f"not UTF-8 (byte {e.start})")
    try:
        meta = json.loads(text, parse_constant=_reject_constant, parse_int=_parse_int)
    except RecursionError:
        return fail(f"JSON nested deeper than {MAX_JSON_DEPTH}")
    except ValueError as e:
        return fail(f"not valid JSON ({' '.join(str(e).split())})")
    if not isinstance(meta, dict):
        return fail(f"JSON top level must be an object (got {type(meta).__name__})")
    if _depth(meta, MAX_JSON_DEPTH) > MAX_JSON_DEPTH:
        return fail(f"JSON nested deeper than {MAX_JSON_DEPTH}")
    return meta


class PackedFile:
    """Streaming reader: the constructor reads and validates header + index; `read_tensor` preads one tensor blob,
    checks its CRC and layout, and unpacks it (native kernels by default, `backend="numpy"` for the reference)."""

    def __init__(self, path):
        self.path = Path(path)
        self._fd = -1
        self._fd = open_regular(self.path)
        try:
            self._read_index()
        except BaseException:
            os.close(self._fd)
            raise

    # -- context manager --
    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _fail(self, msg: str):
        raise PackedFileError(f"{self.path}: {msg}")

    def _pread(self, n: int, off: int) -> bytes:
        b = os.pread(self._fd, n, off)
        if len(b) != n:
            self._fail(f"truncated file: wanted {n} bytes at offset {off}, got {len(b)}")
        return b

    def _read_index(self) -> None:
        size = os.fstat(self._fd).st_size
        if size < HEADER.size:
            self._fail(f"truncated file: {size} bytes, shorter than the {HEADER.size}-byte header")
        h = self._pread(HEADER.size, 0)
        magic, version, hsize, n, align, index_off, meta_off, meta_size, fsize, index_crc, head_crc = HEADER.unpack(h)
        if magic != MAGIC:
            self._fail("not an EdgeFlow packed file (bad magic at offset 0)")
        if version != VERSION:
            self._fail(f"unsupported file version {version} at offset 8 (this reader reads version {VERSION})")
        if head_crc != zlib.crc32(h[:60]):
            self._fail("header checksum mismatch (offset 60)")
        if hsize != HEADER.size:
            self._fail(f"bad header size {hsize} at offset 12")
        if align < 64 or align & (align - 1):
            self._fail(f"bad alignment {align} at offset 20")
        if fsize != size:
            self._fail(f"truncated or padded file: {size} bytes, header says {fsize} (offset 48)")
        if index_off < HEADER.size or index_off > size or n * ENTRY.size > size - index_off:
            self._fail(f"tensor index ({n} entries at offset {index_off}) out of bounds")
        if meta_off > size or meta_size > size - meta_off:
            self._fail(f"metadata ({meta_size} bytes at offset {meta_off}) out of bounds")
        index = self._pread(n * ENTRY.size, index_off)
        meta_b = self._pread(meta_size, meta_off)
        if zlib.crc32(meta_b, zlib.crc32(index)) != index_crc:
            self._fail(f"tensor index or metadata checksum mismatch (index at offset {index_off}, "
                       f"metadata at offset {meta_off})")
        if index_off != HEADER.size or meta_off != index_off + n * ENTRY.size:
            self._fail(f"non-canonical layout: index at offset {index_off}, metadata at offset {meta_off} (expected "
                       f"{HEADER.size} and {HEADER.size + n * ENTRY.size})")
        self.meta = parse_meta(meta_b, lambda m: self._fail(f"metadata at offset {meta_off}: {m}"))
        self.alignment = align
        self.entries: dict[str, TensorEntry] = {}
        for i in range(n):
            eoff = index_off + i * ENTRY.size
            f = ENTRY.unpack_from(index, i * ENTRY.size)
            raw = f[0]
            if raw[:1] == b"\0" or b"\0" not in raw:
                self._fail(f"tensor #{i}: bad name in index entry at offset {eoff}")
            try:
                name = raw.split(b"\0", 1)[0].decode("utf-8")
            except UnicodeDecodeError:
                self._fail(f"tensor #{i}: name is not UTF-8 (index entry at offset {eoff})")
            e = TensorEntry(i, name, *f[1:12])
            self._check_entry(e, size, eoff)
            if name in self.entries:
                self._fail(f"tensor '{name}' (#{i}): duplicate name in index entry at offset {eoff}")
            self.entries[name] = e
        self._check_layout(size, meta_off + meta_size)

    def _check_layout(self, size: int, meta_end: int) -> None:
        """Canonical placement of every tensor, the file's end, and zero padding in every gap."""
        pos = _align(meta_end, self.alignment)
        gaps = [(meta_end, pos)]
        for e in self.entries.values():
            if e.offset != pos:
                self._tfail(e, f"not at the canonical offset {pos} (the first {self.alignment}-byte boundary after "
                               f"the previous section)")
            pos = _align(e.offset + e.size, self.alignment)
            gaps.append((e.offset + e.size, pos))
        end = gaps[-1][0] if self.entries else pos
        if size != end:
            self._fail(f"file is {size} bytes, its sections end at {end}")
        for a, b in gaps:
            b = min(b, size)
            if b > a and any(self._pread(b - a, a)):
                self._fail(f"non-zero padding between offsets {a} and {b}")

    def _tfail(self, e: TensorEntry, msg: str):
        self._fail(f"tensor '{e.name}' (#{e.index}) at offset {e.offset}: {msg}")

    def _check_entry(self, e: TensorEntry, size: int, eoff: int) -> None:
        if e.fmt not in BY_CODE and e.fmt != F32_CODE:
            self._tfail(e, f"unknown format code {e.fmt} (index entry at offset {eoff})")
        if e.C > MAX_ELEMS or e.D > MAX_ELEMS or (e.D and e.C > MAX_ELEMS // e.D):
            self._tfail(e, f"implausible shape ({e.C}, {e.D})")
        if e.offset % self.alignment:
            self._tfail(e, f"data not aligned to {self.alignment} bytes")
        if e.offset > size or e.size > size - e.offset:
            self._tfail(e, f"data ({e.size} bytes) runs past the end of the {size}-byte file")
        nbits = 0 if e.fmt == F32_CODE else (3 * e.C + 7) // 8
        nsc = 0 if e.fmt == F32_CODE else 4 * e.C
        if (e.bits_off != 0 or e.scales_off < nbits or e.payload_off < e.scales_off or
                e.payload_off - e.scales_off < nsc or e.payload_off > e.size or
                e.payload_size != e.size - e.payload_off):
            self._tfail(e, f"inconsistent section offsets (bits {e.bits_off}, scales {e.scales_off}, payload "
                           f"{e.payload_off}+{e.payload_size}, size {e.size})")
        if e.fmt == F32_CODE and e.group not in (1, 2):
            self._tfail(e, f"bad ndim {e.group} for a float32 tensor")
        if e.fmt == F32_CODE and e.group == 1 and e.D != 1:
            self._tfail(e, f"1-D float32 tensor with D = {e.D} (must be 1)")
        if e.fmt == F32_CODE and e.payload_size != 4 * e.C * e.D:
            self._tfail(e, f"payload is {e.payload_size} bytes, float32 ({e.C}, {e.D}) needs {4 * e.C * e.D}")
        if e.fmt == 1 and e.payload_size != e.C * e.D:
            self._tfail(e, f"payload is {e.payload_size} bytes, int8 ({e.C}, {e.D}) needs {e.C * e.D}")
        if e.fmt == 0 and e.group not in (128, 256, 512):
            self._tfail(e, f"bad weightlet group size {e.group} (128, 256 or 512)")
        if e.fmt == 3 and e.group != 32:
            self._tfail(e, f"bad K-quant group size {e.group} (32)")

    # -- tensors --
    def names(self) -> list[str]:
        return list(self.entries)

    def entry(self, name: str) -> TensorEntry:
        if name not in self.entries:
            raise KeyError(f"{self.path}: no tensor {name!r}")
        return self.entries[name]

    def read_blob(self, name: str) -> np.ndarray:
        """The tensor's bytes, CRC-checked: uint8 (size,), read with one pread."""
        e = self.entry(name)
        blob = np.empty(e.size, dtype=np.uint8)
        got = 0
        while got < e.size:                             # Linux returns at most ~2 GiB per call: loop on short reads
            n = os.preadv(self._fd, [memoryview(blob)[got:]], e.offset + got)
            if n <= 0:
                break
            got += n
        if got != e.size:
            self._tfail(e, f"truncated: read {got} of {e.size} bytes")
        crc = zlib.crc32(blob)
        if crc != e.crc:
            self._tfail(e, f"checksum mismatch (stored {e.crc:08x}, computed {crc:08x})")
        return blob

    def split_blob(self, name: str, blob: np.ndarray):
        """blob -> (bits3 uint8, bits int8 (C,), scales float32 (C,), payload uint8); layout checked."""
        e = self.entry(name)
        if e.fmt == F32_CODE:
            return None, None, None, blob
        bits3 = blob[:(3 * e.C + 7) // 8]
        bits = unpack_bits3(bits3, e.C)
        scales = blob[e.scales_off:e.scales_off + 4 * e.C].view(np.float32)
        payload = blob[e.payload_off:e.payload_off + e.payload_size]
        want = BY_CODE[e.fmt].payload_nbytes(bits, e.D, e.group)
        if want != e.payload_size:
            self._tfail(e, f"payload is {e.payload_size} bytes, shape and bit widths need {want}")
        return bits3, bits, scales, payload

    def read_tensor(self, name: str, backend: str = "native", isa: str | None = None, out: np.ndarray | None = None,
                    threads: int = 1):
        """-> (q int8 (C, D), bits int8 (C,), scales float32 (C,)) or the float32 array of a raw tensor.
        threads > 1 splits the native unpack over channel ranges."""
        e = self.entry(name)
        blob = self.read_blob(name)
        bits3, bits, scales, payload = self.split_blob(name, blob)
        if e.fmt == F32_CODE:
            a = payload.view(np.float32)
            return a.reshape(e.C) if e.group == 1 else a.reshape(e.C, e.D)
        f = BY_CODE[e.fmt]
        if backend == "native":
            q = f.unpack_native(payload, bits3, e.C, e.D, e.group, isa=isa, out=out, threads=threads)
        elif backend == "numpy":
            q = f.unpack_ref(payload, bits, e.D, e.group)
        else:
            raise ValueError(f"backend must be 'native' or 'numpy' (got {backend!r})")
        return q, bits, scales.copy()

    def verify(self) -> None:
        """CRC-check and layout-check every tensor (raises PackedFileError)."""
        for n in self.entries:
            self.split_blob(n, self.read_blob(n))


def read_packed_model(path, backend: str = "native", isa: str | None = None, threads: int = 1) -> dict:
    """Whole file -> {name: (q, bits, scales) or float32 array}; every tensor CRC-checked."""
    with PackedFile(path) as f:
        return {n: f.read_tensor(n, backend=backend, isa=isa, threads=threads) for n in f.names()}


def verify_file(path, cache: Path | None = None) -> bool:
    """Every tensor of the packed file CRC- and layout-checked (`PackedFile.verify`: reads the whole file), once per
    version of the file (`quant.verified`: remembered by path, size, mtime, ctime and inode); PackedFileError when
    it is corrupt. True when the check ran. Readers that take byte ranges without their CRC (the HIL runner's timed
    loads) call this first."""
    from quant.verified import verified_once

    def check(p: Path) -> None:
        with PackedFile(p) as f:
            f.verify()

    return verified_once(path, "efpk-crc32", check, cache)
