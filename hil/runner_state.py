"""Per-run state of the host HIL runner (docs/hil.md "Runner"): weight buffers filled by the loaders, unpacked INT8
tensors, the KV cache, RoPE tables and the activations of every prompt chunk.

Owns the memory a cold start works in, allocated before t0 except the weight buffers (allocated by the load task
that fills them, as a real runtime does):
- `WeightStore`: page-aligned blob buffers on fresh pages (`fresh_empty`, as in a new process, carved from 64 MiB
  mappings, with transparent huge pages when `huge_pages` is on: `FreshArena`; one per container
  tensor, filled piece by piece by load tasks: llama.cpp plans split a layer's byte range over several reader
  tasks; packed blobs are staging buffers reused once unpacked), the optional "NPU buffer" copy, and the unpacked
  (C, D) INT8 weights + per-channel scales. A tensor that no unpack task of the plan unpacks (INT8 files need none;
  CPU frameworks dequantize inside their matmuls; the LM head) is unpacked by the compute task that first uses it.
- `ChunkState`: the activation buffers of one prompt chunk (m tokens after `past` earlier ones), reused layer after
  layer (a chunk's layer l+1 starts only after every op of its layer l: the DAG of planner.pipeline.dag).
- `RunState`: the chunks, the per-layer KV cache (prompt, KV, hd) float32 and the RoPE tables (prompt, hd/2).
"""
from __future__ import annotations

import bisect
import contextlib
import mmap
import threading
from dataclasses import dataclass, field
from typing import Iterator

import numpy as np

import native
from hil.packed_index import FileIndex
from native.compute import aligned as _al
from native.compute import aligned_copy
from quant.arch import ModelSpec
from quant.llama import rope_tables
from quant.pack.formats import BY_CODE, F32_CODE

PAGE = 4096   # B, buffer alignment (direct-I/O / page size)
# The runner's native GEMM helpers (native.compute.GemmPool), the same in the calibration that times 2-thread GEMMs: a
# helper polls for the next GEMM this long after its part, as ggml's pool does, and is pinned to another CPU than its
# caller's. Measured on the host (16x576x1536, weights cycled through DRAM; docs/hil.md): 1 thread 157-167 us; 2 threads
# with helpers that sleep at once 131-159 us (a sleeping helper was woken ~50 us late, or queued by the kernel behind
# its caller on the caller's own core), polling and pinned 85 us with <= 30 us between GEMMs; beyond the poll window the
# helper sleeps and the wake-up costs again (300 us apart: 152-169 us).
POOL_SPIN_US = 100.0
POOL_PIN = True


def gemm_pool(helpers: int):
    """A native GEMM pool with the runner's settings (POOL_SPIN_US, POOL_PIN)."""
    import native.compute as nc

    return nc.GemmPool(helpers, spin_us=POOL_SPIN_US, pin=POOL_PIN)


def aligned_empty(nbytes: int, align: int = PAGE) -> np.ndarray:
    """uint8 (nbytes,) buffer whose first byte is `align`-aligned (not initialised: no page is touched)."""
    raw = np.empty(nbytes + align, dtype=np.uint8)
    start = (-raw.ctypes.data) % align
    return raw[start:start + nbytes]


class FreshArena:
    """Fresh pages carved from anonymous mappings of `chunk` bytes that ask for transparent huge pages
    (MADV_HUGEPAGE), as a runtime that allocates its weight memory in a few large buffers does (ggml's backend
    buffers, MNN's memory pool). Nothing is reused: a buffer's pages are untouched until its first write, and a chunk
    is unmapped when the last array carved from it is garbage collected. With huge pages one fault maps (and zeroes)
    2 MiB instead of 4 KiB; where the kernel has no transparent huge pages (or `huge=False`), the pages fault 4 KiB at a
    time as before. Thread-safe (loaders and unpackers allocate concurrently)."""

    def __init__(self, chunk: int = 64 << 20, huge: bool = True) -> None:
        self.chunk, self.huge = int(chunk), bool(huge)
        self._lock = threading.Lock()
        self._cur: np.ndarray | None = None
        self._off = 0

    def _map(self, nbytes: int) -> np.ndarray:
        m = mmap.mmap(-1, int(nbytes), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        if self.huge and hasattr(mmap, "MADV_HUGEPAGE"):
            try:
                m.madvise(mmap.MADV_HUGEPAGE)
            except OSError:          # kernel without transparent huge pages: 4 KiB faults
                pass
        return np.frombuffer(m, dtype=np.uint8)

    def empty(self, nbytes: int) -> np.ndarray:
        """uint8 (nbytes,) page-aligned buffer on untouched pages."""
        if nbytes <= 0:
            return np.empty(0, dtype=np.uint8)
        size = -(-int(nbytes) // PAGE) * PAGE
        if size > self.chunk // 2:                 # large tensors get a mapping of their own
            return self._map(size)[:nbytes]
        with self._lock:
            if self._cur is None or self._off + size > self._cur.size:
                self._cur, self._off = self._map(self.chunk), 0
            buf = self._cur[self._off:self._off + nbytes]
            self._off += size
        return buf


HUGE_PAGES_DEFAULT = True   # the runner's fresh memory asks for transparent huge pages unless told otherwise
_ARENA = FreshArena(huge=HUGE_PAGES_DEFAULT)


def huge_pages_enabled() -> bool:
    """Whether `fresh_empty` asks for transparent huge pages now."""
    return _ARENA.huge


@contextlib.contextmanager
def huge_pages(on: bool) -> Iterator[None]:
    """`fresh_empty` asks for transparent huge pages (`on`, the default) or maps 4 KiB pages only inside the block,
    from an arena of its own; the previous arena is current again after it. The calibration and the runs of one
    profile use the same setting (`huge_pages` in conf/calibrate.yaml and conf/validate.yaml, hil.host)."""
    global _ARENA
    before, _ARENA = _ARENA, FreshArena(huge=bool(on))
    try:
        yield
    finally:
        _ARENA = before


def fresh_empty(nbytes: int) -> np.ndarray:
    """uint8 (nbytes,) page-aligned buffer on pages fresh from the OS (`FreshArena`: untouched until written, never
    recycled), freed when the arrays on its mapping are garbage collected.

    A cold start runs in a new process, whose weight memory is all fresh pages: every page faults on its first write.
    The runner lives in a long-lived process; through malloc (`aligned_empty`) some of its buffers came from recycled
    heap memory (glibc raises its mmap threshold after each free of a mapped chunk, up to 32 MiB, and keeps freed heap
    pages), so the number of page faults of a run depended on what the process did before: 17-30 k minor faults per
    SmolLM2 EdgeFlow run through malloc, 50 k (stable) with fresh mappings. The calibration measures first touch on
    these buffers too (hil.calibrate)."""
    return _ARENA.empty(nbytes)


@dataclass
class _Blob:
    buf: np.ndarray                 # uint8 (size,), page-aligned: bytes as read from the file
    base: np.ndarray | None = None  # the staging buffer `buf` is the head of (None: `buf` is its own buffer)
    npu: np.ndarray | None = None   # uint8 (size,): the "NPU buffer" copy (load tasks with copy_bytes / duration_s)
    landed: int = 0                 # B of the blob read so far
    copied: int = 0                 # B of the blob copied into `npu` so far


class WeightStore:
    """Blob buffers and unpacked weights of one run. Thread-safe: one lock for the dicts, unpack outside it."""

    def __init__(self, ix: FileIndex, isa: str | None) -> None:
        self.ix = ix
        self.unpack_isa = isa if isa in native.ISAS else None   # compute-only levels (avxvnni, ...) unpack by default
        self.lock = threading.Lock()
        self.blobs: dict[str, _Blob] = {}
        self.ready: dict[str, object] = {}          # name -> (q (C, D) int8, scales (C,) f32) | float32 array
        self.ptr: dict[str, tuple[int, ...]] = {}   # name -> addresses of its ready arrays ((q, scales) | (a,))
        self.name_locks: dict[str, threading.Lock] = {}
        self.lazy_unpacked: list[str] = []          # tensors unpacked by the compute task that used them
        self.events: dict[str, threading.Event] = {}  # name -> set when every byte of the blob was read
        self.staging: list[np.ndarray] = []         # free staging buffers (packed blobs already unpacked), by size
        self.staging_reused = 0                     # blob buffers taken from the staging pool (no fresh memory)

    # ---- loads -------------------------------------------------------------------------------------------------
    @staticmethod
    def _staged(fmt: int) -> bool:
        """A packed-format blob is a staging buffer: unpacked to INT8, then no longer needed (INT8 and float32 blobs
        are the weights themselves)."""
        return fmt not in (1, F32_CODE)

    def blob(self, name: str) -> _Blob:
        """The blob buffer of `name`, allocated on first use. A packed blob takes the smallest free staging buffer
        that holds it, released by an earlier unpack (a loader's buffer pool: memory already touched, no page faults,
        no unmap; best fit, since per-tensor bit widths give blobs of many sizes)."""
        with self.lock:
            b = self.blobs.get(name)
            if b is None:
                e = self.ix.entries[name]
                base = None
                if self._staged(e.fmt):
                    i = bisect.bisect_left(self.staging, e.size, key=lambda x: x.size)
                    if i < len(self.staging):
                        base = self.staging.pop(i)
                        self.staging_reused += 1
                buf = fresh_empty(e.size) if base is None else base[:e.size]
                b = self.blobs[name] = _Blob(buf, base=base)
            return b

    def npu_buffer(self, name: str) -> np.ndarray:
        with self.lock:
            b = self.blobs[name]
            if b.npu is None:
                b.npu = fresh_empty(b.buf.size)
            return b.npu

    def arrived(self, name: str) -> threading.Event:
        """Event set once every byte of `name`'s blob is in memory."""
        with self.lock:
            ev = self.events.get(name)
            if ev is None:
                ev = self.events[name] = threading.Event()
            return ev

    def landed(self, name: str, nbytes: int, copied: bool) -> None:
        with self.lock:
            b = self.blobs[name]
            b.landed += nbytes
            b.copied += nbytes if copied else 0
            done = b.landed >= self.ix.entries[name].size
        if done:
            self.arrived(name).set()

    def complete_blob(self, name: str) -> np.ndarray:
        """The whole blob (the NPU copy when every byte was copied). Raises if not all of it was read yet."""
        with self.lock:
            b = self.blobs.get(name)
            size = self.ix.entries[name].size
            if b is None or b.landed < size:
                got = 0 if b is None else b.landed
                raise RuntimeError(f"tensor {name!r} used after {got} of its {size} bytes were read "
                                   f"(a plan dependency is missing)")
            return b.npu if b.copied >= size else b.buf

    # ---- unpack ------------------------------------------------------------------------------------------------
    def unpack(self, name: str, threads: int = 1) -> None:
        """Unpack `name` from its loaded blob: INT8 (C, D) + scales (an INT8 blob: zero-copy views)."""
        e = self.ix.entries[name]
        blob = self.complete_blob(name)
        if e.fmt == F32_CODE:
            a = blob[:e.payload_size].view(np.float32)
            val: object = a if e.group == 1 else a.reshape(e.C, e.D)
        else:
            scales = blob[e.scales_off:e.scales_off + 4 * e.C].view(np.float32)
            payload = blob[e.payload_off:e.payload_off + e.payload_size]
            if e.fmt == 1:                                       # int8: the payload IS the (C, D) array
                q = payload.view(np.int8).reshape(e.C, e.D)
            else:
                bits3 = blob[:(3 * e.C + 7) // 8]
                out = fresh_empty(e.C * e.D).view(np.int8).reshape(e.C, e.D)   # the INT8 weights: fresh pages
                q = BY_CODE[e.fmt].unpack_native(payload, bits3, e.C, e.D, e.group, isa=self.unpack_isa, out=out,
                                                 threads=threads)
                scales = scales.copy()
            val = (q, scales)
        with self.lock:
            self.ready.setdefault(name, val)
            if self._staged(e.fmt):                              # the packed bytes are no longer needed
                old = self.blobs[name]
                free = old.buf if old.base is None else old.base
                bisect.insort(self.staging, free, key=lambda x: x.size)
                self.blobs[name] = _Blob(np.empty(0, np.uint8), None, e.size, e.size)

    def fault_in(self, name: str, blob: np.ndarray) -> None:
        """A float32 tensor read directly by the compute task that needs it (before its load task ran)."""
        e = self.ix.entries[name]
        a = blob[:e.payload_size].view(np.float32)
        with self.lock:
            self.ready.setdefault(name, a if e.group == 1 else a.reshape(e.C, e.D))

    def ptrs(self, name: str, threads: int = 1) -> tuple[int, ...]:
        """Addresses of `get(name)`'s arrays: (q, scales) of a weight, (a,) of a float32 tensor (cached)."""
        p = self.ptr.get(name)
        if p is None:
            v = self.get(name, threads)
            p = tuple(a.ctypes.data for a in v) if isinstance(v, tuple) else (v.ctypes.data,)
            self.ptr[name] = p
        return p

    def get(self, name: str, threads: int = 1):
        """The unpacked tensor; unpacked here (on the caller's thread) when no unpack task did it."""
        v = self.ready.get(name)
        if v is not None:
            return v
        with self.lock:
            lk = self.name_locks.setdefault(name, threading.Lock())
        with lk:
            if name not in self.ready:
                self.unpack(name, threads)
                with self.lock:
                    self.lazy_unpacked.append(name)
        return self.ready[name]


@dataclass
class ChunkState:
    """Activations of one prompt chunk: m tokens at positions past..past+m-1. float32 unless noted."""
    m: int
    past: int
    x: np.ndarray                  # (m, d) residual stream
    h: np.ndarray                  # (m, d) normed input of the attention / FFN block
    x8: list[np.ndarray]           # 3 x (m * max(d, q),) int8 flat: quantized linear inputs (per distinct act scale)
    x8f: np.ndarray                # (m, f) int8 quantized input of ffn_down
    acc: dict[str, np.ndarray]     # linear kind -> (m, C) int32 GEMM output
    q: np.ndarray                  # (m, H, hd)
    k: np.ndarray                  # (m, KV, hd)
    v: np.ndarray                  # (m, KV, hd)
    o: np.ndarray                  # (m, H*hd) attention output
    y: np.ndarray                  # (m, d) block output before the residual add
    g: np.ndarray                  # (m, f) gate
    u: np.ndarray                  # (m, f) up
    s: np.ndarray                  # (m, f) silu(gate), then silu(gate) * up
    ones: np.ndarray               # (m, f) 1.0 (silu alone through the fused silu_mul kernel)


@dataclass
class RunState:
    spec: ModelSpec
    chunks: list[ChunkState]
    kcache: list[np.ndarray]       # per layer (prompt, KV, hd) float32
    vcache: list[np.ndarray]
    cos: np.ndarray                # (prompt, hd/2) float32
    sin: np.ndarray
    hf: np.ndarray                 # (1, d) final-normed last token
    head_x8: np.ndarray            # (1, d) int8
    head_acc: np.ndarray           # (1, vocab) int32
    logits: np.ndarray             # (1, vocab) float32
    extra: dict = field(default_factory=dict)


def chunk_state(spec: ModelSpec, m: int, past: int) -> ChunkState:
    """One chunk's activation buffers, zero-filled, each starting on a cache line (`native.compute.aligned`: a GEMM
    or attention operand off a 64-byte boundary runs up to 1.3x slower, docs/hil.md "Operand alignment")."""
    d, qd, kv, f = spec.d_model, spec.q_dim, spec.kv_dim, spec.d_ffn
    H, KV, hd = spec.n_heads, spec.n_kv_heads, spec.head_dim
    f32, i32 = np.float32, np.int32
    acc = {"attn_q": _al((m, qd), i32), "attn_k": _al((m, kv), i32), "attn_v": _al((m, kv), i32),
           "attn_output": _al((m, d), i32), "ffn_gate": _al((m, f), i32), "ffn_up": _al((m, f), i32),
           "ffn_down": _al((m, d), i32)}
    ones = _al((m, f), f32)
    ones[...] = 1.0
    return ChunkState(m, past, _al((m, d), f32), _al((m, d), f32),
                      [_al((m * max(d, qd),), np.int8) for _ in range(3)], _al((m, f), np.int8), acc,
                      _al((m, H, hd), f32), _al((m, KV, hd), f32), _al((m, KV, hd), f32), _al((m, qd), f32),
                      _al((m, d), f32), _al((m, f), f32), _al((m, f), f32), _al((m, f), f32), ones)


def run_state(spec: ModelSpec, sizes: list[int]) -> RunState:
    """Every buffer of the compute side, allocated (zero-filled: pages touched; cache-line aligned) before t0."""
    T = sum(sizes)
    chunks, past = [], 0
    for m in sizes:
        chunks.append(chunk_state(spec, m, past))
        past += m
    cache = (T, spec.n_kv_heads, spec.head_dim)
    cos, sin = rope_tables(T, spec.head_dim, spec.rope_base)
    tables = [aligned_copy(t.astype(np.float32)) for t in (cos, sin)]
    d = spec.d_model
    return RunState(spec, chunks, [_al(cache, np.float32) for _ in range(spec.n_layers)],
                    [_al(cache, np.float32) for _ in range(spec.n_layers)], *tables, _al((1, d), np.float32),
                    _al((1, d), np.int8), _al((1, spec.vocab), np.int32), _al((1, spec.vocab), np.float32))
