"""Per-shard Llama compute at a Voltron plan's precisions (paper §4.2.1 TP shards, §4.2.2 mixed precision): the one
implementation that the distributed workers (`shard_exec.py`) and the single-process reference (`reference.py`) both
run, so the two agree by construction except for the order in which device partial sums are added
(docs/cluster.md "Executable Voltron plans").

Owns: reading single GGUF tensors (`TensorSource`: the dequantized Q4_1 float32 tensors ARE the reference model, as in
`quant/gguf_model.py`), quantizing one shard's slices (`QLinear`), the forward of one ATTN / FFN shard, the per-device
`ShardState` (weights + KV cache of the shards it holds, embeddings + LM head on the main device) and the byte
accounting the memory budget checks.

Precision semantics (per shard, independent of where the shard runs):
  fp16  weights rounded to float16 and stored so; y = x @ float32(w16)^T in float32 NumPy
  int8  per-output-channel symmetric int8 (scale = max|w_row| / 127) → native W8A8 GEMM (`native.compute.linear_w8a8`)
        with a dynamic per-tensor activation scale max|x| / 127 of the shard's own input: the normed residual for
        Q/K/V and gate/up (identical for every shard of a sublayer), the shard's own attention output (O) or SwiGLU
        channels (down) otherwise; the scale covers all tokens of the step (a prefill batch shares one scale)
  int4  per-output-channel symmetric codes in [-7, 7] (scale = max|w_row| / 7) stored as int8 and run by the same W8A8
        kernel: weight-only 4-bit with INT8 activations (W4A8); the nibble packing is not emulated, memory is counted
        at 0.5 byte / weight
  head  token embeddings and LM head (tied in SmolLM2) on the main device at `head_precision` (default INT8, as
        llama.cpp quantizes output.weight; `PlannerConfig.head_precision`): embedding row = codes · row scale
Sums: a shard's O / down output is float32; a device adds its shards' outputs in ascending shard order in float64 and
returns that float64 partial; the coordinator adds the partials of a TP sublayer in device order in float64; the
residual is float32(h) + float32(total) (`residual`). With contiguous shard ranges per device (`shard_map`) the
reference's single float64 sum in shard order differs from the distributed one only by float64 re-association.
KV cache: float32 on the host (the native attention kernel's type), (capacity, 1, head_dim) K and V per ATTN shard;
counted at the nominal FP16 size the modelled devices use (llama.cpp's default KV type,
`planner.voltron.layers.KV_BYTES`) — like INT4, the budget counts the format a device holds, not the host's copy.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import numpy as np

import native.compute as nc
from quant.arch import ModelSpec
from quant.llama import rope_tables

FP16, INT8, INT4 = 0, 1, 2
QMAX = {INT8: 127, INT4: 7}                 # symmetric code range per integer precision
ACT_QMAX = np.float32(127)                  # INT8 activations
WEIGHT_BYTES = {FP16: 2.0, INT8: 1.0, INT4: 0.5}   # nominal bytes / weight at each precision (+ 4 B / channel scale)
KV_ELEM_BYTES = 2                           # nominal FP16 KV cache (the host holds float32; see the module docstring)


# ---- GGUF tensors --------------------------------------------------------------------------------------------------
class TensorSource:
    """Dequantized float32 tensors of one GGUF file, read on demand and cached per process (a worker only ever touches
    the tensors of its own layers; in-process tests share one source between all workers and the reference)."""

    def __init__(self, path: str):
        import gguf

        p = Path(path)
        if not p.is_file():
            raise ValueError(f"model_path: {path} is not a file")
        try:
            reader = gguf.GGUFReader(str(p))
        except Exception as e:                    # gguf raises ValueError, struct / numpy errors
            raise ValueError(f"model_path: {p.name} is not a readable GGUF file ({type(e).__name__}: {e})") from None
        self.path = str(p)
        self._tensors = {t.name: t for t in reader.tensors}
        self._cache: dict[str, np.ndarray] = {}
        self._lock = threading.Lock()

    def get(self, name: str) -> np.ndarray:
        """(out, in) float32 read-only array of tensor `name` (GGUF's reversed shape, as quant.gguf_model)."""
        import gguf

        with self._lock:
            arr = self._cache.get(name)
            if arr is None:
                t = self._tensors.get(name)
                if t is None:
                    raise ValueError(f"model_path: {Path(self.path).name} has no tensor {name}")
                shape = tuple(int(s) for s in reversed(t.shape))
                arr = np.ascontiguousarray(np.asarray(gguf.quants.dequantize(t.data, t.tensor_type),
                                                      dtype=np.float32).reshape(shape))
                arr.flags.writeable = False
                self._cache[name] = arr
            return arr

    def cached_bytes(self) -> int:
        return sum(a.nbytes for a in self._cache.values())

    def release(self) -> None:
        """Drop the dequantized tensors (a worker process calls this after loading its shards)."""
        with self._lock:
            self._cache.clear()


@lru_cache(maxsize=4)
def tensor_source(path: str) -> TensorSource:
    return TensorSource(str(Path(path).resolve()))


# ---- quantized linear ----------------------------------------------------------------------------------------------
@dataclass
class QLinear:
    """One shard's slice of a linear layer at one precision: y (M, N) = x (M, K) @ w^T."""
    precision: int
    w: np.ndarray                          # (N, K) float16 (fp16) | int8 codes (int8, int4)
    scale: np.ndarray | None               # (N,) float32 per-output-channel scale (int8, int4), None for fp16

    @classmethod
    def quantize(cls, w: np.ndarray, precision: int) -> "QLinear":
        """w (N, K) float32 → this precision (see the module docstring)."""
        if precision == FP16:
            return cls(FP16, np.ascontiguousarray(w, dtype=np.float16), None)
        if precision not in QMAX:
            raise ValueError(f"precision: {precision} is not 0 (fp16), 1 (int8) or 2 (int4)")
        q = QMAX[precision]
        amax = np.abs(w).max(axis=1)                                           # (N,)
        scale = (amax / np.float32(q)).astype(np.float32)                      # (N,)
        safe = np.where(scale > 0, scale, np.float32(1))
        codes = np.clip(np.rint(w / safe[:, None]), -q, q).astype(np.int8)     # (N, K)
        return cls(precision, np.ascontiguousarray(codes), scale)

    @property
    def shape(self) -> tuple[int, int]:
        return self.w.shape

    def nominal_bytes(self) -> float:
        return nominal_linear_bytes(*self.w.shape, self.precision)

    def host_bytes(self) -> int:
        return self.w.nbytes + (0 if self.scale is None else self.scale.nbytes)

    def __call__(self, x: np.ndarray, isa: str | None = None) -> np.ndarray:
        """x (M, K) float32 C-contiguous → (M, N) float32."""
        if self.precision == FP16:
            return x @ self.w.astype(np.float32).T
        a = float(np.float32(nc.absmax(x, isa=isa)) / ACT_QMAX)
        return nc.linear_w8a8(x, a, self.w, self.scale, isa=isa)


def nominal_linear_bytes(n_out: int, n_in: int, precision: int) -> float:
    """Bytes of an (n_out, n_in) weight at `precision` (+ float32 per-channel scales for the integer precisions)."""
    return n_out * n_in * WEIGHT_BYTES[precision] + (0 if precision == FP16 else 4 * n_out)


# ---- shard geometry ------------------------------------------------------------------------------------------------
def check_spec(spec: ModelSpec) -> None:
    """The executor runs dense Llama blocks (ATTN = GQA/MHA, FFN = SwiGLU)."""
    if spec.is_moe or spec.sliding_window > 0:
        raise ValueError(f"model {spec.name}: the shard executor runs dense Llama models only (no MoE / sliding "
                         f"window)")
    if spec.n_heads % spec.n_kv_heads:
        raise ValueError(f"model {spec.name}: n_heads {spec.n_heads} not a multiple of n_kv_heads {spec.n_kv_heads}")


def ffn_channels(spec: ModelSpec, n_shards: int) -> int:
    if n_shards < 1 or spec.d_ffn % n_shards:
        raise ValueError(f"ffn shards: {n_shards} does not divide d_ffn {spec.d_ffn}")
    return spec.d_ffn // n_shards


def shard_bytes(spec: ModelSpec, j: int, precision: int, n_ffn_shards: int) -> float:
    """Nominal weight bytes of one shard of sublayer j (ATTN for even j, FFN for odd j)."""
    d, hd = spec.d_model, spec.head_dim
    if j % 2 == 0:
        gq = spec.n_heads // spec.n_kv_heads * hd                           # query rows of one KV group
        return nominal_linear_bytes(gq + 2 * hd, d, precision) + nominal_linear_bytes(d, gq, precision)
    c = ffn_channels(spec, n_ffn_shards)
    return nominal_linear_bytes(2 * c, d, precision) + nominal_linear_bytes(d, c, precision)


def kv_bytes(spec: ModelSpec, capacity: int) -> int:
    """Nominal KV cache bytes of one ATTN shard (K and V, `capacity` tokens, FP16)."""
    return 2 * capacity * spec.head_dim * KV_ELEM_BYTES


def head_bytes(spec: ModelSpec, precision: int) -> float:
    """Main device: embedding table (+ untied LM head) at `precision` and the final norm."""
    n = 1 if spec.tied_embeddings else 2
    return n * nominal_linear_bytes(spec.vocab, spec.d_model, precision) + 4 * spec.d_model


@dataclass
class AttnShard:
    qkv: QLinear            # (gq + 2·hd, d): the group's query rows, then its K rows, then its V rows
    o: QLinear              # (d, gq): the O-projection columns of the group's query heads

    def linears(self) -> tuple[QLinear, QLinear]:
        return self.qkv, self.o


@dataclass
class FfnShard:
    gu: QLinear             # (2c, d): gate rows then up rows of the shard's c channels
    down: QLinear           # (d, c): down-projection columns of those channels

    def linears(self) -> tuple[QLinear, QLinear]:
        return self.gu, self.down


def load_attn_shard(src: TensorSource, spec: ModelSpec, block: int, g: int, precision: int) -> AttnShard:
    hd, grp = spec.head_dim, spec.n_heads // spec.n_kv_heads
    gq = grp * hd
    p = f"blk.{block}."
    wq = src.get(p + "attn_q.weight")[g * gq:(g + 1) * gq]                    # (gq, d)
    wk = src.get(p + "attn_k.weight")[g * hd:(g + 1) * hd]                    # (hd, d)
    wv = src.get(p + "attn_v.weight")[g * hd:(g + 1) * hd]                    # (hd, d)
    wo = src.get(p + "attn_output.weight")[:, g * gq:(g + 1) * gq]            # (d, gq)
    return AttnShard(QLinear.quantize(np.concatenate([wq, wk, wv]), precision),
                     QLinear.quantize(np.ascontiguousarray(wo), precision))


def load_ffn_shard(src: TensorSource, spec: ModelSpec, block: int, s: int, precision: int,
                   n_shards: int) -> FfnShard:
    c = ffn_channels(spec, n_shards)
    p = f"blk.{block}."
    wg = src.get(p + "ffn_gate.weight")[s * c:(s + 1) * c]                    # (c, d)
    wu = src.get(p + "ffn_up.weight")[s * c:(s + 1) * c]                      # (c, d)
    wd = src.get(p + "ffn_down.weight")[:, s * c:(s + 1) * c]                 # (d, c)
    return FfnShard(QLinear.quantize(np.concatenate([wg, wu]), precision),
                    QLinear.quantize(np.ascontiguousarray(wd), precision))


def residual(h: np.ndarray, partial: np.ndarray) -> np.ndarray:
    """h (T, d) float32 + float32(partial (T, d) float64): the one residual add of every executor."""
    return h + partial.astype(np.float32)


# ---- per-device state ----------------------------------------------------------------------------------------------
@dataclass
class Held:
    """The shards of one sublayer held by one executor. For the integer precisions the input-side linears of all
    held shards (Q/K/V, or gate/up) are stacked into one `front` matrix in ascending shard order, run as one W8A8 GEMM:
    the codes, the int32 sums and the per-row dequantization are those of the per-shard GEMMs bit for bit (the
    activation scale is the same max|x_normed| for every shard), it only saves per-call overhead. FP16 keeps one
    float32 matmul per shard (a BLAS call of another shape may round differently)."""
    precision: int
    shards: dict[int, AttnShard | FfnShard] = field(default_factory=dict)    # shard index -> weights
    front: QLinear | None = None           # (Σ rows, d) stacked Q/K/V or gate/up of the shards (integer precisions)

    def stack(self) -> None:
        order = sorted(self.shards)
        fronts = [self.shards[s].linears()[0] for s in order]
        if self.precision == FP16 or len(order) < 2:
            self.front = None
            return
        self.front = QLinear(self.precision, np.concatenate([f.w for f in fronts]),
                             np.concatenate([f.scale for f in fronts]))
        r0 = 0
        for f in fronts:                    # the shards' own front linears become views of the stack (no copy held)
            n = f.w.shape[0]
            f.w, f.scale = self.front.w[r0:r0 + n], self.front.scale[r0:r0 + n]
            r0 += n


class ShardState:
    """Weights and KV cache of the shards one executor holds, and their compute (numpy in, numpy out)."""

    def __init__(self, spec: ModelSpec, src: TensorSource, isa: str | None = None):
        check_spec(spec)
        self.spec, self.src, self.isa = spec, src, isa
        self.held: dict[int, Held] = {}                           # sublayer j -> its shards here
        self.norms: dict[int, np.ndarray] = {}                    # sublayer j -> (d,) RMSNorm gain
        self.kv: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}   # (block, shard) -> K, V (cap, 1, hd)
        self.capacity = 0
        self.ffn_shards = 0
        self.head: QLinear | None = None                          # (V, d) LM head (= embeddings when tied)
        self.embed_table: QLinear | None = None                   # (V, d) token embeddings
        self.out_norm: np.ndarray | None = None                   # (d,)
        self.cos = self.sin = np.zeros((0, spec.head_dim // 2), dtype=np.float32)

    # ---- loading ---------------------------------------------------------------------------------------------------
    def need_bytes(self, items, capacity: int, head_precision: int | None, ffn_shards: int) -> dict[str, float]:
        """Nominal bytes an assignment needs: weights at their precision, KV reserve, head, norms."""
        sp = self.spec
        w = sum(shard_bytes(sp, j, p, ffn_shards) * len(sh) for j, sh, p in items)
        n_attn = sum(len(sh) for j, sh, _ in items if j % 2 == 0)
        kv = n_attn * kv_bytes(sp, capacity)
        head = head_bytes(sp, head_precision) if head_precision is not None else 0.0
        norms = 4 * sp.d_model * len(items)
        return {"weights": float(w), "kv": float(kv), "head": float(head), "norms": float(norms),
                "total": float(w + kv + head + norms)}

    def set(self, items, capacity: int, head_precision: int | None, ffn_shards: int) -> None:
        """Hold exactly `items` [(sublayer j, shard indices, precision)]: shards already held at the same precision
        are kept, others (re)quantized; KV caches of ATTN shards still held are kept (re-allocated with their
        content if the capacity changes), new ones start empty, dropped ones are freed."""
        sp = self.spec
        if capacity < 1:
            raise ValueError(f"kv_capacity: must be >= 1 (got {capacity})")
        if self.ffn_shards and ffn_shards != self.ffn_shards:
            self.held = {j: h for j, h in self.held.items() if j % 2 == 0}    # FFN shard geometry changed
        self.ffn_shards = ffn_shards
        want: dict[int, tuple[int, tuple[int, ...]]] = {}
        for j, sh, p in items:
            j, p = int(j), int(p)
            if not 0 <= j < 2 * sp.n_layers:
                raise ValueError(f"items: sublayer {j} outside 0..{2 * sp.n_layers - 1}")
            n = sp.n_kv_heads if j % 2 == 0 else ffn_shards
            sh = tuple(sorted(int(s) for s in sh))
            if not sh or sh[0] < 0 or sh[-1] >= n or len(set(sh)) != len(sh):
                raise ValueError(f"items: sublayer {j} shards {list(sh)} not distinct indices in 0..{n - 1}")
            want[j] = (p, sh)
        new_held: dict[int, Held] = {}
        for j, (p, sh) in want.items():
            old = self.held.get(j)
            keep = old.shards if old is not None and old.precision == p else {}
            h = Held(p)
            for s in sh:
                if s in keep:
                    h.shards[s] = keep[s]
                elif j % 2 == 0:
                    h.shards[s] = load_attn_shard(self.src, sp, j // 2, s, p)
                else:
                    h.shards[s] = load_ffn_shard(self.src, sp, j // 2, s, p, ffn_shards)
            h.stack()
            new_held[j] = h
            if j not in self.norms:
                kind = "attn_norm" if j % 2 == 0 else "ffn_norm"
                self.norms[j] = np.array(self.src.get(f"blk.{j // 2}.{kind}.weight"), dtype=np.float32)
        self.held = new_held
        self.norms = {j: g for j, g in self.norms.items() if j in want}
        # KV caches of the ATTN shards held
        hd = sp.head_dim
        kv = {}
        for j, (_, sh) in want.items():
            if j % 2:
                continue
            for s in sh:
                key = (j // 2, s)
                k = np.zeros((capacity, 1, hd), dtype=np.float32)
                v = np.zeros((capacity, 1, hd), dtype=np.float32)
                if key in self.kv:
                    ok, ov = self.kv[key]
                    n = min(capacity, ok.shape[0])
                    k[:n], v[:n] = ok[:n], ov[:n]
                kv[key] = (k, v)
        self.kv = kv
        if capacity != self.capacity:
            self.cos, self.sin = rope_tables(capacity, hd, sp.rope_base)     # (cap, hd/2) each
            self.capacity = capacity
        # main device: embeddings, final norm, LM head
        if head_precision is None:
            self.head = self.embed_table = self.out_norm = None
        elif self.embed_table is None or self.embed_table.precision != head_precision:
            self.embed_table = QLinear.quantize(self.src.get("token_embd.weight"), head_precision)
            self.head = (self.embed_table if sp.tied_embeddings
                         else QLinear.quantize(self.src.get("output.weight"), head_precision))
            self.out_norm = np.array(self.src.get("output_norm.weight"), dtype=np.float32)

    # ---- memory ----------------------------------------------------------------------------------------------------
    def memory(self) -> dict[str, float]:
        """Nominal (at precision) and host (actual NumPy arrays) bytes held."""
        lins = [q for h in self.held.values() for sh in h.shards.values() for q in sh.linears()]
        w_nom = sum(q.nominal_bytes() for q in lins)
        w_host = sum(q.host_bytes() for q in lins)
        kv = sum(k.nbytes + v.nbytes for k, v in self.kv.values())
        head_nom = head_host = 0.0
        if self.embed_table is not None:
            tables = [self.embed_table] + ([] if self.head is self.embed_table else [self.head])
            head_nom = sum(t.nominal_bytes() for t in tables) + 4 * self.spec.d_model
            head_host = sum(t.host_bytes() for t in tables) + self.out_norm.nbytes
        norms = sum(g.nbytes for g in self.norms.values())
        return {"weights_nominal": float(w_nom), "weights_host": float(w_host), "kv": float(kv),
                "head_nominal": float(head_nom), "head_host": float(head_host), "norms": float(norms),
                "total_nominal": float(w_nom + kv + head_nom + norms),
                "total_host": float(w_host + kv + head_host + norms),
                "shards": int(sum(len(h.shards) for h in self.held.values()))}

    # ---- compute ---------------------------------------------------------------------------------------------------
    def _attn_shard(self, sw: AttnShard, key: tuple[int, int], qkv: np.ndarray, pos0: int) -> np.ndarray:
        """One KV-head group from its Q/K/V projections qkv (T, gq + 2·hd): RoPE, KV append, attention, O."""
        sp, isa = self.spec, self.isa
        T, hd = qkv.shape[0], sp.head_dim
        gq = sp.n_heads // sp.n_kv_heads * hd
        q = np.ascontiguousarray(qkv[:, :gq]).reshape(T, gq // hd, hd)       # (T, group, hd)
        k = np.ascontiguousarray(qkv[:, gq:gq + hd]).reshape(T, 1, hd)       # (T, 1, hd)
        v = np.ascontiguousarray(qkv[:, gq + hd:]).reshape(T, 1, hd)         # (T, 1, hd)
        cos, sin = self.cos[pos0:pos0 + T], self.sin[pos0:pos0 + T]          # (T, hd/2)
        nc.rope(q, cos, sin, isa=isa)
        nc.rope(k, cos, sin, isa=isa)
        kc, vc = self.kv[key]
        kc[pos0:pos0 + T] = k
        vc[pos0:pos0 + T] = v
        o = nc.attention(q, kc, vc, pos0, isa=isa)                            # (T, gq)
        return sw.o(o, isa)                                                   # (T, d)

    def _ffn_shard(self, sw: FfnShard, gu: np.ndarray) -> np.ndarray:
        """One channel group from its gate/up projections gu (T, 2c): SwiGLU, down."""
        c = gu.shape[1] // 2
        s = nc.silu_mul(np.ascontiguousarray(gu[:, :c]), np.ascontiguousarray(gu[:, c:]), isa=self.isa)   # (T, c)
        return sw.down(s, self.isa)                                           # (T, d)

    def holds(self, j: int) -> bool:
        return j in self.held

    def partial(self, j: int, h: np.ndarray, pos0: int) -> np.ndarray:
        """Sublayer j on the shards held here: RMSNorm of the residual h (T, d) float32, then the sum of the shards'
        outputs in ascending shard order, float64 (T, d)."""
        held = self.held.get(j)
        if held is None:
            raise ValueError(f"sublayer {j}: no shard of it is held here")
        h = _f32(h, self.spec.d_model)
        T = h.shape[0]
        if j % 2 == 0 and not 0 <= pos0 <= self.capacity - T:
            raise ValueError(f"pos0: {pos0} + {T} tokens exceed the KV capacity {self.capacity}")
        xn = nc.rmsnorm(h, self.norms[j], self.spec.norm_eps, isa=self.isa)  # (T, d)
        order = sorted(held.shards)
        if held.front is not None:
            y = held.front(xn, self.isa)                                      # (T, Σ rows), shard blocks in order
            r = y.shape[1] // len(order)
            fronts = [y[:, i * r:(i + 1) * r] for i in range(len(order))]
        else:
            fronts = [held.shards[s].linears()[0](xn, self.isa) for s in order]
        acc = np.zeros(h.shape, dtype=np.float64)                              # (T, d)
        for s, f in zip(order, fronts):
            sw = held.shards[s]
            acc += (self._attn_shard(sw, (j // 2, s), f, pos0) if j % 2 == 0 else self._ffn_shard(sw, f))
        return acc

    def run(self, j0: int, j1: int, h: np.ndarray, pos0: int) -> np.ndarray:
        """Sublayers j0 .. j1-1 in order with their residual adds (all must be held here): h (T, d) → (T, d)."""
        h = _f32(h, self.spec.d_model)
        for j in range(j0, j1):
            h = residual(h, self.partial(j, h, pos0))
        return h

    def embed(self, tokens: np.ndarray) -> np.ndarray:
        """tokens (T,) int → (T, d) float32 embedding rows (dequantized at the head precision)."""
        if self.embed_table is None:
            raise ValueError("embed: this device holds no embeddings (only the main device does)")
        t = np.asarray(tokens).astype(np.int64).ravel()
        if t.size == 0 or t.min() < 0 or t.max() >= self.spec.vocab:
            raise ValueError(f"tokens: must be a non-empty array of ids in 0..{self.spec.vocab - 1}")
        e = self.embed_table
        if e.precision == FP16:
            return e.w[t].astype(np.float32)
        return e.w[t].astype(np.float32) * e.scale[t][:, None]

    def logits(self, h_last: np.ndarray) -> np.ndarray:
        """Final RMSNorm + LM head of the last token: h_last (1, d) float32 → (vocab,) float32."""
        if self.head is None:
            raise ValueError("head: this device holds no LM head (only the main device does)")
        x = nc.rmsnorm(_f32(h_last, self.spec.d_model)[-1:], self.out_norm, self.spec.norm_eps, isa=self.isa)
        return self.head(x, self.isa)[0]

    # ---- KV cache --------------------------------------------------------------------------------------------------
    def export_kv(self, block: int, shard: int, n: int) -> np.ndarray:
        """(2, n, hd) float32: K and V rows 0..n-1 of ATTN shard (block, shard)."""
        k, v = self.kv_arrays(block, shard)
        if not 0 <= n <= k.shape[0]:
            raise ValueError(f"n: {n} outside 0..{k.shape[0]}")
        return np.stack([k[:n, 0], v[:n, 0]])

    def import_kv(self, block: int, shard: int, kv: np.ndarray) -> None:
        k, v = self.kv_arrays(block, shard)
        kv = np.asarray(kv, dtype=np.float32)
        if kv.ndim != 3 or kv.shape[0] != 2 or kv.shape[2] != self.spec.head_dim or kv.shape[1] > k.shape[0]:
            raise ValueError(f"kv: shape {kv.shape} does not fit (2, <= {k.shape[0]}, {self.spec.head_dim})")
        n = kv.shape[1]
        k[:n, 0], v[:n, 0] = kv[0], kv[1]

    def reset_kv(self) -> None:
        for k, v in self.kv.values():
            k.fill(0.0)
            v.fill(0.0)

    def kv_arrays(self, block: int, shard: int) -> tuple[np.ndarray, np.ndarray]:
        key = (int(block), int(shard))
        if key not in self.kv:
            raise ValueError(f"kv: ATTN shard {shard} of block {block} is not held here")
        return self.kv[key]


def _f32(h: np.ndarray, d: int) -> np.ndarray:
    h = np.ascontiguousarray(h, dtype=np.float32)
    if h.ndim != 2 or h.shape[1] != d or h.shape[0] < 1:
        raise ValueError(f"h: shape {h.shape} is not (tokens, d_model={d})")
    return h
