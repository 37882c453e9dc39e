"""Python binding of the native C kernels (EdgeFlow §4.2 unpack, docs/packing.md; the C sources are in native/src/,
built by setup.py).

Owns: loading `native/_efkernels*.so` with ctypes, zero-copy calls on NumPy arrays (dtype and contiguity checked,
the array memory is passed by pointer; ctypes releases the GIL during each call, so `threads=` splits a tensor's
channel range over threads that really run in parallel), and instruction-set selection: `available_isas()` lists
what this CPU runs, `set_isa(name)` / `with force_isa(name):` pin one ISA for tests and benchmarks, every unpack
call also takes `isa=`. The default is the best available ISA. The C container validator is exposed as
`check_container` (whole file in memory) and `check_container_file` (the streaming path a C runner uses).

The compute kernels of the host runner (INT8 GEMM, float32 Llama ops) are bound in `native/compute.py`; they add two
ISA levels of their own (`COMPUTE_ONLY`: avxvnni, neondot; `available_compute_isas()`), which `set_isa` / `force_isa`
accept too (the unpack kernels then run the level's base ISA).

Kernel names follow `<op>_<dtype>_<backend>` (`unpack_b5_ref`, `unpack_b5_avx2`, `unpack_b5_neon`); the NumPy
reference unpackers that these must match bit-exactly are in `quant/pack/`.
"""
from __future__ import annotations

import contextlib
import ctypes as ct
import glob
import os
import stat
import threading

import numpy as np

ISAS = ("ref", "sse2", "avx2", "avx512", "neon")  # index = enum ef_isa in native/src/ef.h
# ISA levels only the compute kernels have (native/src/ef_compute.h; C values 5, 6) -> the unpack ISA they run
COMPUTE_ONLY = {"avxvnni": "avx2", "neondot": "neon"}
COMPUTE_ISAS = ISAS + tuple(COMPUTE_ONLY)           # index = the isa argument of the ef_compute.h kernels
ERRORS = {-1: "bad argument", -2: "data truncated", -3: "bad magic", -4: "unsupported version", -5: "bad header",
          -6: "bad index", -7: "checksum mismatch", -8: "instruction set not available"}

_LIB = None
_LOCK = threading.Lock()
_FORCED: str | None = None


class NativeError(RuntimeError):
    """A native call failed; the message names the call and the reason (one line)."""


def _load() -> ct.CDLL:
    global _LIB
    if _LIB is not None:
        return _LIB
    with _LOCK:
        if _LIB is not None:
            return _LIB
        here = os.path.dirname(os.path.abspath(__file__))
        found = sorted(glob.glob(os.path.join(here, "_efkernels*.so")))
        if not found:
            raise NativeError("native kernels are not built (no native/_efkernels*.so): run "
                              "`pip install -e .` (or `make setup`) to compile them")
        lib = ct.CDLL(found[0])
        u8p, i8p = ct.c_void_p, ct.c_void_p
        i64, u64, i32, u32 = ct.c_int64, ct.c_uint64, ct.c_int, ct.c_uint32
        sig = {
            "ef_isa_mask": (u32, []),
            "ef_isa_best": (i32, []),
            "ef_weightlet_channel_bytes": (u64, [i32, i64, i32]),
            "ef_mixed_channel_bytes": (u64, [i32, i64]),
            "ef_kquant_channel_bytes": (u64, [i32, i64]),
            "ef_unpack_channel": (i32, [i32, i32, u8p, i8p, i64, i32]),
            "ef_unpack_weightlet": (i32, [i32, u8p, i64, i64, i32, u8p, u64, i8p, i64, i64]),
            "ef_unpack_mixed": (i32, [i32, u8p, i64, i64, u8p, u64, i8p, i64, i64]),
            "ef_unpack_kquant": (i32, [i32, u8p, i64, i64, u8p, u64, i8p, i64, i64]),
            "ef_unpack_int8": (i32, [u8p, u64, i64, i64, i8p, i64, i64]),
            "ef_memcpy": (None, [ct.c_void_p, ct.c_void_p, u64]),
            "ef_read_pieces": (i64, [i32, i64, ct.c_void_p, ct.c_void_p, ct.c_void_p, i64, ct.c_void_p,
                                     ct.POINTER(i64)]),
            "ef_crc32": (u32, [u32, u8p, u64]),
            "ef_container_check": (i32, [u8p, u64, i32, ct.c_char_p, i32]),
            "ef_container_head_bytes": (i64, [u8p, u64, u64, ct.c_char_p, i32]),
            "ef_container_check_index": (i32, [u8p, u64, u64, ct.c_char_p, i32]),
            "ef_container_check_tensor": (i32, [u8p, u64, u32, u8p, u64, i32, ct.c_char_p, i32]),
            "ef_container_gap": (i32, [u8p, u64, u32, ct.POINTER(u64), ct.POINTER(u64)]),
            "ef_container_check_gap": (i32, [u8p, u64, u32, u8p, u64, ct.c_char_p, i32]),
            "ef_unpack_blob": (i32, [i32, u8p, u64, u32, u8p, u64, i8p, i64, i64, ct.c_void_p]),
            "ef_container_tensor": (i32, [u8p, u64, u32, ct.c_char_p, ct.POINTER(u32), ct.POINTER(u32),
                                          ct.POINTER(u64), ct.POINTER(u64), ct.POINTER(u64), ct.POINTER(u64)]),
        }
        for name, (res, args) in sig.items():
            f = getattr(lib, name)
            f.restype, f.argtypes = res, args
        _LIB = lib
        return lib


# ---- instruction sets ----------------------------------------------------------------------------------------------
def available_isas() -> list[str]:
    """ISAs compiled in and supported by this CPU, scalar reference first."""
    m = _load().ef_isa_mask()
    return [n for i, n in enumerate(ISAS) if m & (1 << i)]


def available_compute_isas() -> list[str]:
    """ISAs of the compute kernels (native/compute.py) this build and CPU run: available_isas() plus the
    compute-only levels (avxvnni: 256-bit VNNI GEMM; neondot: NEON sdot GEMM)."""
    f = _load().ef_compute_isa_mask
    f.restype, f.argtypes = ct.c_uint32, []
    m = f()
    return [n for i, n in enumerate(COMPUTE_ISAS) if m & (1 << i)]


def best_isa() -> str:
    return ISAS[_load().ef_isa_best()]


def set_isa(name: str | None) -> None:
    """Force every later call to one ISA (None = best available again)."""
    global _FORCED
    if name is not None:
        _isa_index(name)
    _FORCED = name


def get_isa() -> str:
    return _FORCED if _FORCED is not None else best_isa()


@contextlib.contextmanager
def force_isa(name: str):
    """`with force_isa("sse2"): ...` runs the block on one ISA and restores the previous choice on exit."""
    global _FORCED
    prev = _FORCED
    set_isa(name)
    try:
        yield
    finally:
        _FORCED = prev


def _isa_index(name: str | None) -> int:
    name = get_isa() if name is None else name
    if name in COMPUTE_ONLY:                 # a compute-only level forced: unpack runs its base ISA
        if name not in available_compute_isas():
            raise NativeError(f"isa {name!r} is not available on this CPU (available: "
                              f"{', '.join(available_compute_isas())})")
        name = COMPUTE_ONLY[name]
    if name not in ISAS:
        raise ValueError(f"unknown isa {name!r} (one of {', '.join(COMPUTE_ISAS)})")
    if name not in available_isas():
        raise NativeError(f"isa {name!r} is not available on this CPU (available: {', '.join(available_isas())})")
    return ISAS.index(name)


# ---- array plumbing --------------------------------------------------------------------------------------------------
def _in(a, name: str) -> np.ndarray:
    """Read-only input: bytes-like or uint8 array, C-contiguous, passed by pointer (no copy)."""
    if isinstance(a, (bytes, bytearray, memoryview)):
        a = np.frombuffer(a, dtype=np.uint8)
    if not isinstance(a, np.ndarray) or a.dtype not in (np.uint8, np.int8) or not a.flags.c_contiguous:
        raise TypeError(f"{name} must be a C-contiguous uint8/int8 array or bytes (got "
                        f"{type(a).__name__} {getattr(a, 'dtype', '')})")
    return a


def _out(out, shape: tuple[int, ...]) -> np.ndarray:
    if out is None:
        return np.empty(shape, dtype=np.int8)
    if (not isinstance(out, np.ndarray) or out.dtype != np.int8 or out.shape != shape
            or not out.flags.c_contiguous or not out.flags.writeable):
        raise TypeError(f"out must be a writable C-contiguous int8 array of shape {shape}")
    return out


def _check(rc: int, what: str) -> None:
    if rc != 0:
        raise NativeError(f"{what}: {ERRORS.get(rc, f'error {rc}')}")


def _ptr(a: np.ndarray) -> int:
    return a.ctypes.data


# ---- unpack ----------------------------------------------------------------------------------------------------------
def weightlet_channel_bytes(bits: int, D: int, R: int = 128) -> int:
    return int(_load().ef_weightlet_channel_bytes(int(bits), int(D), int(R)))


def unpack_channel(bits: int, src, D: int, R: int = 128, isa: str | None = None, out=None) -> np.ndarray:
    """One weightlet channel (unpack_b<bits>_<isa>): src bytes -> (D,) int8."""
    src = _in(src, "src")
    need = weightlet_channel_bytes(bits, D, R)
    if src.nbytes < need:
        raise NativeError(f"unpack_b{bits}: src has {src.nbytes} bytes, needs {need}")
    out = _out(out, (int(D),))
    _check(_load().ef_unpack_channel(_isa_index(isa), int(bits), _ptr(src), _ptr(out), int(D), int(R)),
           f"unpack_b{bits}_{get_isa() if isa is None else isa}")
    return out


def _range(C: int, c0: int, c1: int | None) -> tuple[int, int]:
    c1 = C if c1 is None else c1
    if not 0 <= c0 <= c1 <= C:
        raise ValueError(f"channel range [{c0}, {c1}) outside [0, {C})")
    return c0, c1


def _run(call, c0: int, c1: int, threads: int, what: str) -> None:
    """call(a, b) -> rc unpacks channels [a, b); with threads > 1 the range is split into contiguous slices that run
    in parallel (ctypes releases the GIL during each call)."""
    if threads < 1:
        raise ValueError(f"threads must be >= 1 (got {threads})")
    n = c1 - c0
    if threads == 1 or n < 2:
        _check(call(c0, c1), what)
        return
    from concurrent.futures import ThreadPoolExecutor

    cuts = [c0 + n * k // threads for k in range(threads + 1)]
    with ThreadPoolExecutor(threads) as ex:
        rcs = list(ex.map(lambda k: call(cuts[k], cuts[k + 1]), range(threads)))
    for rc in rcs:
        _check(rc, what)


def _unpack_tensor(fn: str, extra: tuple, payload, bits3, C: int, D: int, isa, out, c0, c1, threads) -> np.ndarray:
    """Shared body of the per-format tensor unpackers: checks, then `fn`(isa, bits3, C, D, *extra, payload, len, out,
    a, b) over the channel range (split over threads)."""
    payload, bits3 = _in(payload, "payload"), _in(bits3, "bits3")
    _need_bits3(bits3, C)
    out = _out(out, (int(C), int(D)))
    c0, c1 = _range(C, c0, c1)
    i, call = _isa_index(isa), getattr(_load(), fn)
    _run(lambda a, b: call(i, _ptr(bits3), int(C), int(D), *extra, _ptr(payload), payload.nbytes, _ptr(out), a, b),
         c0, c1, threads, fn[3:])
    return out


def unpack_weightlet(payload, bits3, C: int, D: int, R: int = 128, isa: str | None = None, out=None,
                     c0: int = 0, c1: int | None = None, threads: int = 1) -> np.ndarray:
    """Weightlet tensor: payload + packed 3-bit widths -> (C, D) int8 (rows c0..c1-1 written when out is given)."""
    return _unpack_tensor("ef_unpack_weightlet", (int(R),), payload, bits3, C, D, isa, out, c0, c1, threads)


def unpack_mixed(payload, bits3, C: int, D: int, isa: str | None = None, out=None, c0: int = 0,
                 c1: int | None = None, threads: int = 1) -> np.ndarray:
    """INT4/INT8 mixed baseline -> (C, D) int8."""
    return _unpack_tensor("ef_unpack_mixed", (), payload, bits3, C, D, isa, out, c0, c1, threads)


def unpack_kquant(payload, bits3, C: int, D: int, isa: str | None = None, out=None, c0: int = 0,
                  c1: int | None = None, threads: int = 1) -> np.ndarray:
    """K-quant-like baseline; scalar in every ISA by design (the isa argument only checks availability)."""
    return _unpack_tensor("ef_unpack_kquant", (), payload, bits3, C, D, isa, out, c0, c1, threads)


def unpack_int8(payload, C: int, D: int, out=None, c0: int = 0, c1: int | None = None) -> np.ndarray:
    payload = _in(payload, "payload")
    out = _out(out, (int(C), int(D)))
    c0, c1 = _range(C, c0, c1)
    _check(_load().ef_unpack_int8(_ptr(payload), payload.nbytes, int(C), int(D), _ptr(out), c0, c1), "unpack_int8")
    return out


def memcpy(dst: np.ndarray, src: np.ndarray) -> None:
    """memcpy of src into dst (same nbytes), through the same ctypes path as the kernels (benchmark baseline)."""
    if (dst.nbytes != src.nbytes or not dst.flags.c_contiguous or not src.flags.c_contiguous
            or not dst.flags.writeable):
        raise ValueError("memcpy needs two C-contiguous arrays of the same size, dst writable")
    _load().ef_memcpy(_ptr(dst), _ptr(src), src.nbytes)


def read_pieces(fd: int, dsts: list[np.ndarray], offsets: list[int], request: int,
                copies: list[np.ndarray | None] | None = None, path: object = "file") -> int:
    """Fill each `dsts[i]` (C-contiguous, writable) from file offset `offsets[i]` of `fd` in pread requests of at most
    `request` bytes, then copy it into `copies[i]` (same size) where that is not None — one native call for all of
    them, without the interpreter lock (native/src/ef_io.c). Returns the bytes read; raises OSError on a read error
    or a short read (the file ends before a piece), naming `path` and the offset."""
    n = len(dsts)
    if len(offsets) != n or (copies is not None and len(copies) != n):
        raise ValueError("read_pieces: dsts, offsets and copies need the same length")
    if request <= 0:
        raise ValueError(f"read_pieces: request must be > 0 (got {request})")
    # plain int64 arrays (a ctypes array type made per call would be a reference cycle the collector has to free)
    tab = np.zeros((4, max(n, 1)), np.int64)            # rows: destination, offset, length, copy address
    tab[1, :n] = offsets
    for i, d in enumerate(dsts):
        if not d.flags.c_contiguous or not d.flags.writeable:
            raise ValueError("read_pieces: every destination must be a C-contiguous writable array")
        tab[0, i], tab[2, i] = d.ctypes.data, d.nbytes
        c = None if copies is None else copies[i]
        if c is not None:
            if c.nbytes != d.nbytes or not c.flags.c_contiguous or not c.flags.writeable:
                raise ValueError("read_pieces: a copy buffer must be C-contiguous, writable and as large as its piece")
            tab[3, i] = c.ctypes.data
    base, row = tab.ctypes.data, tab.strides[0]
    err = ct.c_int64(0)
    done = _load().ef_read_pieces(int(fd), n, base, base + row, base + 2 * row, int(request),
                                  base + 3 * row if copies is not None else None, ct.byref(err))
    if done < n:
        code = int(err.value)
        what = os.strerror(code) if code else "short read (end of file)"
        msg = f"{path}: {what} reading {int(tab[2, done])} bytes at offset {offsets[done]}"
        raise OSError(code, msg) if code else OSError(msg)
    return int(tab[2, :n].sum())


def _need_bits3(bits3: np.ndarray, C: int) -> None:
    if bits3.nbytes < (3 * int(C) + 7) // 8:
        raise NativeError(f"bits3 has {bits3.nbytes} bytes, {C} channels need {(3 * int(C) + 7) // 8}")


# ---- container -----------------------------------------------------------------------------------------------------
def crc32(buf, crc: int = 0) -> int:
    """CRC32 (zlib polynomial; equals zlib.crc32)."""
    b = _in(buf, "buf")
    return int(_load().ef_crc32(crc, _ptr(b), b.nbytes))


def check_container(buf, verify_crc: bool = True) -> tuple[int, str]:
    """Validate a whole packed model file held in memory with the C reader: (0, "") or (EF_E_* code, message)."""
    b = _in(buf, "buf")
    err = ct.create_string_buffer(512)
    rc = _load().ef_container_check(_ptr(b), b.nbytes, int(bool(verify_crc)), err, len(err))
    return int(rc), err.value.decode("utf-8", "replace")


def check_container_file(path, verify_crc: bool = True) -> tuple[int, str]:
    """Validate a packed model file the way a streaming C reader does (header, then index + metadata, then per tensor
    the zero padding before it and one pread of its blob), using only the C checks: (0, "") or (EF_E_* code, message).
    A missing file, a directory or a FIFO gives (EF_E_ARG, message) without blocking."""
    lib = _load()
    err = ct.create_string_buffer(512)
    try:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode):
            return -1, f"{path}: not a regular file"
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as e:
        return -1, f"{path}: cannot open packed model file ({e.strerror})"
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return -1, f"{path}: not a regular file"
        size = os.fstat(fd).st_size
        head = np.frombuffer(os.pread(fd, 64, 0), dtype=np.uint8)
        need = lib.ef_container_head_bytes(_ptr(head), head.nbytes, size, err, len(err))
        if need < 0:
            return int(need), err.value.decode("utf-8", "replace")
        head = np.frombuffer(os.pread(fd, int(need), 0), dtype=np.uint8)
        rc = lib.ef_container_check_index(_ptr(head), head.nbytes, size, err, len(err))
        if rc:
            return int(rc), err.value.decode("utf-8", "replace")
        n = int(head[16:20].view("<u4")[0])
        fmt, grp, C, D, off, nb = ct.c_uint32(), ct.c_uint32(), *(ct.c_uint64() for _ in range(4))
        g0, gn = ct.c_uint64(), ct.c_uint64()
        for i in range(n + 1):
            _check(lib.ef_container_gap(_ptr(head), head.nbytes, i, ct.byref(g0), ct.byref(gn)), f"padding #{i}")
            gap = np.frombuffer(os.pread(fd, gn.value, g0.value), dtype=np.uint8)
            rc = lib.ef_container_check_gap(_ptr(head), head.nbytes, i, _ptr(gap) if gap.size else None, gap.nbytes,
                                            err, len(err))
            if rc:
                return int(rc), err.value.decode("utf-8", "replace")
            if i == n:
                break
            lib.ef_container_tensor(_ptr(head), head.nbytes, i, None, ct.byref(fmt), ct.byref(grp), ct.byref(C),
                                    ct.byref(D), ct.byref(off), ct.byref(nb))
            blob = np.frombuffer(os.pread(fd, nb.value, off.value), dtype=np.uint8)
            rc = lib.ef_container_check_tensor(_ptr(head), head.nbytes, i, _ptr(blob) if blob.size else None,
                                               blob.nbytes, int(bool(verify_crc)), err, len(err))
            if rc:
                return int(rc), err.value.decode("utf-8", "replace")
        return 0, ""
    finally:
        os.close(fd)


def tensor_entry(head, idx: int) -> dict:
    """Fields of index entry #idx read by the C reader from `head` (the file's first bytes: header + index + metadata),
    after `ef_container_check_index` validated them: {name, fmt, group, C, D, offset, size}."""
    head = _in(head, "head")
    lib = _load()
    err = ct.create_string_buffer(512)
    declared = int(head[48:56].view("<u8")[0]) if head.nbytes >= 64 else head.nbytes   # header's file_size
    rc = lib.ef_container_check_index(_ptr(head), head.nbytes, declared, err, len(err))
    if rc:
        raise NativeError(f"packed file head: {err.value.decode('utf-8', 'replace')}")
    name = ct.create_string_buffer(96)
    fmt, grp, C, D, off, nb = ct.c_uint32(), ct.c_uint32(), *(ct.c_uint64() for _ in range(4))
    _check(lib.ef_container_tensor(_ptr(head), head.nbytes, int(idx), name, ct.byref(fmt), ct.byref(grp),
                                   ct.byref(C), ct.byref(D), ct.byref(off), ct.byref(nb)), f"tensor #{idx}")
    return dict(name=name.value.decode("utf-8", "replace"), fmt=fmt.value, group=grp.value, C=C.value, D=D.value,
                offset=off.value, size=nb.value)


def unpack_blob(head, idx: int, blob, C: int, D: int, isa: str | None = None, out=None, c0: int = 0,
                c1: int | None = None, threads: int = 1, verify_crc: bool = True) -> np.ndarray:
    """Tensor #idx of a packed file, any format, unpacked by the C container path a native runner uses:
    head = the file's first bytes (header + index + metadata), blob = the tensor's bytes -> (C, D) int8.
    The head and the blob are validated by the C reader first (index checksum and bounds, blob length, CRC, payload
    size), and (C, D) must equal the index entry's shape: the kernels write C*D bytes into `out`."""
    head, blob = _in(head, "head"), _in(blob, "blob")
    e = tensor_entry(head, idx)
    if (int(C), int(D)) != (e["C"], e["D"]):
        raise ValueError(f"unpack_blob #{idx} ({e['name']}): shape ({C}, {D}) differs from the index's "
                         f"({e['C']}, {e['D']})")
    err = ct.create_string_buffer(512)
    lib = _load()
    rc = lib.ef_container_check_tensor(_ptr(head), head.nbytes, int(idx), _ptr(blob) if blob.size else None,
                                       blob.nbytes, int(bool(verify_crc)), err, len(err))
    if rc:
        raise NativeError(f"unpack_blob #{idx}: {ERRORS.get(rc, rc)}: {err.value.decode('utf-8', 'replace')}")
    out = _out(out, (int(C), int(D)))
    c0, c1 = _range(C, c0, c1)
    i = _isa_index(isa)
    _run(lambda a, b: lib.ef_unpack_blob(i, _ptr(head), head.nbytes, int(idx), _ptr(blob), blob.nbytes, _ptr(out),
                                         a, b, None), c0, c1, threads, f"unpack_blob #{idx}")
    return out
