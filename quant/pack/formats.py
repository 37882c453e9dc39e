"""The packed formats behind one contract (docs/packing.md): bytes per channel, NumPy pack, NumPy reference unpack and
native unpack. One subclass per format; `FORMATS[name]` selects one (the container stores `Format.code`).

Native unpack goes through native/ (C kernels, zero-copy on NumPy arrays); the NumPy reference is the golden output.
"""
from __future__ import annotations

import numpy as np

import native
from quant.pack import baselines, weightlet
from quant.pack.layout import bits3_nbytes


class Format:
    """Contract of a packed weight format for a (C, D) int8 tensor with per-channel bits."""
    name: str = ""
    code: int = -1

    def group(self, group: int) -> int:
        """The group size stored in the index (0 if the format has none)."""
        return 0

    def channel_nbytes(self, bits, D: int, group: int) -> np.ndarray:
        """(C,) payload bytes per channel."""
        raise NotImplementedError

    def pack(self, q: np.ndarray, bits, group: int, what: str) -> np.ndarray:
        raise NotImplementedError

    def unpack_ref(self, payload: np.ndarray, bits, D: int, group: int) -> np.ndarray:
        raise NotImplementedError

    def unpack_native(self, payload, bits3, C: int, D: int, group: int, isa=None, out=None, c0=0, c1=None,
                      threads: int = 1):
        raise NotImplementedError

    def payload_nbytes(self, bits, D: int, group: int) -> int:
        return int(self.channel_nbytes(bits, D, group).sum())


class Weightlet(Format):
    name, code = "weightlet", 0

    def group(self, group: int) -> int:
        return weightlet.check_group(group)

    def channel_nbytes(self, bits, D, group):
        return weightlet.channel_nbytes(bits, D, group)

    def pack(self, q, bits, group, what):
        return weightlet.pack(q, bits, group, what)

    def unpack_ref(self, payload, bits, D, group):
        return weightlet.unpack_ref(payload, bits, D, group)

    def unpack_native(self, payload, bits3, C, D, group, isa=None, out=None, c0=0, c1=None, threads=1):
        return native.unpack_weightlet(payload, bits3, C, D, group, isa=isa, out=out, c0=c0, c1=c1, threads=threads)


class Int8(Format):
    name, code = "int8", 1

    def channel_nbytes(self, bits, D, group):
        return baselines.int8_channel_nbytes(bits, D)

    def pack(self, q, bits, group, what):
        return baselines.int8_pack(q, bits, what)

    def unpack_ref(self, payload, bits, D, group):
        return baselines.int8_unpack_ref(payload, bits, D)

    def unpack_native(self, payload, bits3, C, D, group, isa=None, out=None, c0=0, c1=None, threads=1):
        return native.unpack_int8(payload, C, D, out=out, c0=c0, c1=c1)


class Mixed(Format):
    name, code = "mixed", 2

    def channel_nbytes(self, bits, D, group):
        return baselines.mixed_channel_nbytes(bits, D)

    def pack(self, q, bits, group, what):
        return baselines.mixed_pack(q, bits, what)

    def unpack_ref(self, payload, bits, D, group):
        return baselines.mixed_unpack_ref(payload, bits, D)

    def unpack_native(self, payload, bits3, C, D, group, isa=None, out=None, c0=0, c1=None, threads=1):
        return native.unpack_mixed(payload, bits3, C, D, isa=isa, out=out, c0=c0, c1=c1, threads=threads)


class KQuant(Format):
    name, code = "kquant", 3

    def group(self, group: int) -> int:
        return baselines.KQ_GROUP

    def channel_nbytes(self, bits, D, group):
        return baselines.kquant_channel_nbytes(bits, D)

    def pack(self, q, bits, group, what):
        return baselines.kquant_pack(q, bits, what)

    def unpack_ref(self, payload, bits, D, group):
        return baselines.kquant_unpack_ref(payload, bits, D)

    def unpack_native(self, payload, bits3, C, D, group, isa=None, out=None, c0=0, c1=None, threads=1):
        return native.unpack_kquant(payload, bits3, C, D, isa=isa, out=out, c0=c0, c1=c1, threads=threads)


FORMATS: dict[str, Format] = {f.name: f for f in (Weightlet(), Int8(), Mixed(), KQuant())}
F32_CODE = 4  # container code of an unquantized float32 tensor (norms, smoothing scales)
BY_CODE = {f.code: f for f in FORMATS.values()}


def get_format(fmt: str) -> Format:
    if fmt not in FORMATS:
        raise ValueError(f"unknown packed format {fmt!r} (one of {', '.join(FORMATS)})")
    return FORMATS[fmt]


def _align(x: int, a: int) -> int:
    return -(-x // a) * a


SECTION_ALIGN = 64  # bytes; scales and payload sections start on a 64-byte boundary inside a tensor blob


def blob_layout(fmt: Format, bits, C: int, D: int, group: int) -> tuple[int, int, int]:
    """(scales_off, payload_off, payload_size) of a tensor blob: [bits3][pad][scales f32 (C,)][pad][payload]."""
    sc = _align(bits3_nbytes(C), SECTION_ALIGN)
    pl = _align(sc + 4 * C, SECTION_ALIGN)
    return sc, pl, fmt.payload_nbytes(bits, D, group)


def packed_nbytes(bits, D: int, fmt: str = "weightlet", group: int = weightlet.DEFAULT_GROUP,
                  with_metadata: bool = True) -> int:
    """Bytes a (C, D) tensor with per-channel `bits` (C,) takes on flash in format `fmt`.

    with_metadata=True: the whole tensor blob (packed 3-bit widths + float32 scales + payload, sections 64-byte
    aligned) as written in the container, excluding the file-level alignment padding between tensors (< alignment).
    with_metadata=False: the weight payload only.
    """
    f = get_format(fmt)
    b = np.asarray(bits, dtype=np.int64).ravel()
    sc, pl, size = blob_layout(f, b, b.size, int(D), f.group(group))
    return pl + size if with_metadata else size
