"""Packed weight files (EdgeFlow §4.2; docs/packing.md): the SIMD-friendly weightlet format, the baseline formats
(raw INT8, INT4/INT8 mixed, K-quant-like), NumPy reference unpackers, and the model-file container.

Entry points for other packages:
  write_packed_model(path, {name: (q int8 (C, D), bits (C,), scales float32 (C,)) | float32 array}, fmt, meta)
  read_packed_model(path) -> {name: (q, bits, scales) | float32 array}   (unpacks with the native kernels)
  PackedFile(path)        streaming per-tensor reader (read_blob / read_tensor / verify)
  verify_file(path)       every CRC checked, once per version of the file (for readers that skip per-read CRCs)
  packed_nbytes(bits, D, fmt)  bytes on flash of one tensor (for the cold-start simulator)
Native kernels: native/ (C, per-ISA); the NumPy references here are their golden outputs.
"""
from quant.pack.container import (
    PackedFile,
    PackedFileError,
    TensorEntry,
    read_packed_model,
    verify_file,
    write_packed_model,
)
from quant.pack.formats import FORMATS, Format, get_format, packed_nbytes
from quant.pack.layout import PackError, pack_bits3, unpack_bits3

__all__ = ["FORMATS", "Format", "PackError", "PackedFile", "PackedFileError", "TensorEntry", "get_format",
           "pack_bits3", "packed_nbytes", "read_packed_model", "unpack_bits3", "verify_file",
           "write_packed_model"]
