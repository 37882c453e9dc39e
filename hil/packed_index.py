"""What the HIL runner and the plan binder need to know about one packed model file (docs/hil.md "Runner").

Owns: the file's index (tensor entries: format, shape, byte ranges of the blob sections), its metadata (activation
scales), the byte ranges a plan is bound to (`entries`, `embed_row_bytes`, `bind_to_file`), the per-channel bit
widths of the linear layers (`file_bits`, for `ColdStartInputs.bits_override`: the plan's unpack work then follows the
real file), and the model shapes the file implies (checked against the `ModelSpec` the caller gives).
Reading the index touches only the file's first pages (header + tensor table + metadata); the runner reads it before
it evicts the file, so the cold start itself reads every weight byte from disk.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from planner.pipeline.bind import bind_plan
from planner.plan import Plan
from quant.arch import ModelSpec
from quant.pack import PackedFile
from quant.pack.container import TensorEntry
from quant.pack.formats import BY_CODE, F32_CODE
from quant.pack.layout import bits3_nbytes, unpack_bits3

EMBED = "token_embd.weight"


@dataclass
class FileIndex:
    path: Path
    entries: dict[str, TensorEntry]
    meta: dict
    embed_row_payload: int        # B of one embedding row's payload (all rows 8-bit: equal sizes)

    @property
    def act_scales(self) -> dict[str, float]:
        return {k: float(v) for k, v in self.meta.get("act_scales", {}).items()}

    def byte_ranges(self) -> dict[str, tuple[int, int]]:
        """name -> (offset B, size B) of every tensor blob."""
        return {n: (e.offset, e.size) for n, e in self.entries.items()}

    @property
    def embed_row_bytes(self) -> int:
        """B the embedding load reads per prompt token: one row's payload + its float32 scale."""
        return self.embed_row_payload + 4


def read_index(path: str | Path) -> FileIndex:
    """Header, tensor index and metadata of a packed file (validated by `PackedFile`)."""
    with PackedFile(path) as f:
        entries, meta = dict(f.entries), dict(f.meta)
    e = entries.get(EMBED)
    if e is None or e.fmt == F32_CODE:
        raise ValueError(f"{path}: no INT8 tensor {EMBED!r} (the packed runtime needs the per-row INT8 embedding)")
    row = int(BY_CODE[e.fmt].channel_nbytes(np.array([8]), e.D, e.group)[0])
    if row * e.C != e.payload_size:
        raise ValueError(f"{path}: tensor {EMBED!r} is not stored with 8 bits per row ({e.payload_size} payload bytes "
                         f"for {e.C} rows of {row})")
    if not isinstance(meta.get("act_scales"), dict):
        raise ValueError(f"{path}: metadata has no act_scales (write the file with quant.export.write_pack)")
    return FileIndex(Path(path), entries, meta, row)


def check_spec(ix: FileIndex, spec: ModelSpec) -> None:
    """Raise ValueError naming the first tensor whose shape in the file differs from what `spec` says."""
    want = {EMBED: (spec.vocab, spec.d_model), "output_norm.weight": (spec.d_model, 1)}
    for i in range(spec.n_layers):
        for kind, (c, d) in spec.linear_shapes().items():
            want[f"blk.{i}.{kind}.weight"] = (c, d)
        want[f"blk.{i}.attn_norm.weight"] = (spec.d_model, 1)
        want[f"blk.{i}.ffn_norm.weight"] = (spec.d_model, 1)
    for n, shape in want.items():
        e = ix.entries.get(n)
        if e is None:
            raise ValueError(f"{ix.path}: no tensor {n!r} (model {spec.name})")
        if (e.C, e.D) != shape:
            raise ValueError(f"{ix.path}: tensor {n!r} has shape ({e.C}, {e.D}), model {spec.name} needs {shape}")


def bind_to_file(plan: Plan, ix: FileIndex) -> Plan:
    """`plan` bound to the byte ranges of this file (planner.pipeline.bind)."""
    return bind_plan(plan, ix.byte_ranges(), ix.embed_row_bytes)


def file_bits(path: str | Path, spec: ModelSpec) -> dict[str, np.ndarray]:
    """Per-channel bit widths of the linear layers: kind -> (n_layers, C) int8 (reads only the 3-bit width arrays)."""
    ix = read_index(path)
    check_spec(ix, spec)
    out: dict[str, np.ndarray] = {}
    fd = os.open(ix.path, os.O_RDONLY)
    try:
        for kind in spec.linear_shapes():
            rows = []
            for i in range(spec.n_layers):
                e = ix.entries[f"blk.{i}.{kind}.weight"]
                n = bits3_nbytes(e.C)
                rows.append(unpack_bits3(np.frombuffer(os.pread(fd, n, e.offset), np.uint8), e.C))
            out[kind] = np.stack(rows).astype(np.int8)
    finally:
        os.close(fd)
    return out
