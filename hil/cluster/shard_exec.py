"""One device's executor of a Voltron plan (paper §4.2.1 hybrid MP/TP, §4.2.2 mixed precision, §4.3 pruning): the
object a cluster worker process serves over RPC, or that tests call in-process (docs/cluster.md "Executable Voltron
plans").

Owns `ShardWorker`: it loads exactly its shards (`load(assignment)`, the JSON of `ShardMap.assignment`) at their
planned precisions (semantics in `shard_ops.py`), refuses an assignment whose nominal bytes — weights at their
precision, the float32 KV cache reserved for `kv_capacity` tokens of every ATTN shard it holds, the embeddings / LM
head / final norm on the main device — exceed `budget_bytes` (a `BudgetError`, nothing loaded), owns the KV cache of
its ATTN shards, and computes:
  attn(block, h, pos0)        TP: this device's float64 partial O-projection output for its KV-head groups
  ffn(block, h)               TP: its float64 partial down-projection output for its channel groups
  run_sublayers(j0, j1, h, p) MP: whole sublayers j0..j1-1 (RMSNorm + shards + residual), one round trip per segment
  run_layers(l0, l1, h, p)    the same for whole blocks (sublayers 2·l0 .. 2·l1-1)
  embed(tokens) / head(h)     main device only: embedding rows / final norm + LM head of the last token
  export_kv / import_kv / drop_kv / reset / memory / release_source
`attn` / `ffn` take the residual stream h, not the normed activations: every member applies the (d-float) RMSNorm
itself, so a TP sublayer costs one round trip per member and the coordinator holds no weights. Arguments are NumPy
arrays and JSON-able scalars only (the RPC of hil/cluster calls methods by name with arrays as raw frames).
"""
from __future__ import annotations

import json

import numpy as np

from hil.cluster.shard_ops import ShardState, tensor_source
from quant.arch import ModelSpec


class BudgetError(ValueError):
    """An assignment needs more bytes than the device's budget (one line with the breakdown)."""


class ShardWorker:
    """Executor of device `device_index`'s shards of a model read from the GGUF file `model_path`."""

    def __init__(self, model_path: str, spec: ModelSpec, device_index: int, budget_bytes: float,
                 isa: str | None = None):
        if device_index < 0:
            raise ValueError(f"device_index: must be >= 0 (got {device_index})")
        if not budget_bytes > 0:
            raise ValueError(f"budget_bytes: must be > 0 (got {budget_bytes})")
        self.spec = spec
        self.device = int(device_index)
        self.budget = float(budget_bytes)
        self.src = tensor_source(str(model_path))
        self.state = ShardState(spec, self.src, isa)
        self.assignment: dict | None = None

    # ---- plan --------------------------------------------------------------------------------------------------------
    def load(self, assignment: str) -> dict:
        """Hold exactly the shards of `assignment` (JSON of `ShardMap.assignment`); returns `memory()`."""
        try:
            doc = json.loads(assignment)
            items = [(int(j), tuple(int(s) for s in sh), int(p)) for j, sh, p in doc["items"]]
            cap = int(doc["kv_capacity"])
            head = doc.get("head_precision")
            ffn_shards = int(doc["ffn_shards"])
        except (TypeError, ValueError, KeyError) as e:
            raise ValueError(f"assignment: malformed ({type(e).__name__}: {e})") from None
        if doc.get("model") != self.spec.name:
            raise ValueError(f"assignment: model {doc.get('model')!r} != this worker's {self.spec.name!r}")
        if int(doc.get("device", -1)) != self.device:
            raise ValueError(f"assignment: for device {doc.get('device')}, this worker is device {self.device}")
        if self.device == 0 and head is None:
            raise ValueError("assignment: the main device (0) needs head_precision")
        if self.device != 0 and head is not None:
            raise ValueError(f"assignment: head_precision given to device {self.device} (main device only)")
        need = self.state.need_bytes(items, cap, head, ffn_shards)
        if need["total"] > self.budget:
            raise BudgetError(f"device {self.device}: assignment needs {need['total'] / 1e6:.2f} MB (weights "
                              f"{need['weights'] / 1e6:.2f} at planned precision + KV {need['kv'] / 1e6:.2f} for "
                              f"{cap} tokens + head {need['head'] / 1e6:.2f}) > budget_bytes "
                              f"{self.budget / 1e6:.2f} MB")
        self.state.set(items, cap, head, ffn_shards)
        self.assignment = doc
        return self.memory()

    def memory(self) -> dict:
        """Bytes held (nominal at precision, and host arrays) and the budget."""
        m = self.state.memory()
        m["budget"] = self.budget
        m["device"] = self.device
        m["source_cache"] = float(self.src.cached_bytes())
        return m

    def release_source(self) -> None:
        """Free the dequantized GGUF tensors cached while loading (call in a worker process after `load`)."""
        self.src.release()

    # ---- compute -----------------------------------------------------------------------------------------------------
    def attn(self, layer: int, h: np.ndarray, pos0: int) -> np.ndarray:
        """(T, d) float64 partial O-projection output of this device's KV-head groups of block `layer`."""
        return self.state.partial(2 * int(layer), h, int(pos0))

    def ffn(self, layer: int, h: np.ndarray) -> np.ndarray:
        """(T, d) float64 partial down-projection output of this device's channel groups of block `layer`."""
        return self.state.partial(2 * int(layer) + 1, h, 0)

    def run_sublayers(self, j0: int, j1: int, h: np.ndarray, pos0: int) -> np.ndarray:
        """MP segment: sublayers j0..j1-1 (each wholly held here) with residual adds; h (T, d) → (T, d) float32."""
        j0, j1 = int(j0), int(j1)
        missing = [j for j in range(j0, j1) if not self.state.holds(j)]
        if j1 <= j0 or missing:
            raise ValueError(f"run_sublayers: [{j0}, {j1}) is empty or has sublayers not held here: {missing[:4]}")
        return self.state.run(j0, j1, h, int(pos0))

    def run_layers(self, l0: int, l1: int, h: np.ndarray, pos0: int) -> np.ndarray:
        """MP segment of whole blocks l0..l1-1 (norm + attn + residual + norm + ffn + residual each)."""
        return self.run_sublayers(2 * int(l0), 2 * int(l1), h, pos0)

    def embed(self, tokens: np.ndarray) -> np.ndarray:
        return self.state.embed(tokens)

    def head(self, h: np.ndarray) -> np.ndarray:
        return self.state.logits(h)

    # ---- KV cache ----------------------------------------------------------------------------------------------------
    def export_kv(self, layer: int, shard: int, n: int) -> np.ndarray:
        return self.state.export_kv(int(layer), int(shard), int(n))

    def import_kv(self, layer: int, shard: int, kv: np.ndarray) -> None:
        self.state.import_kv(int(layer), int(shard), kv)

    def drop_kv(self, layer: int, shard: int) -> None:
        """Forget the cached rows of one ATTN shard (its memory stays reserved until the next `load`)."""
        k, v = self.state.kv_arrays(int(layer), int(shard))
        k.fill(0.0)
        v.fill(0.0)

    def reset(self) -> None:
        """New conversation: clear every KV cache held here."""
        self.state.reset_kv()
