/* EdgeFlow native kernels: public C API (EdgeFlow §4.2, Fig. 7 and 8; docs/packing.md).
 *
 * Three things live behind this header:
 *   1. unpack kernels for the weightlet format, bit widths 1..8, per ISA (ef_unpack.c);
 *   2. unpack kernels for the baseline formats: raw INT8, INT4/INT8 mixed, K-quant-like (ef_baselines.c);
 *   3. CRC32 and the model-file (container) validator (ef_container.c).
 *
 * Integer convention (fixed by quant/quantize.py): channel i has B_i bits (1..8) and signed ints
 * q in [-(2^(B-1)), 2^(B-1)-1]. Every format stores the offset-binary code u = q + 2^(B-1) in [0, 2^B);
 * unpacking to INT8 is mask / shift / OR, then subtract 2^(B-1) (mod 256, so B = 8 works too).
 *
 * The byte layouts are documented in quant/pack/weightlet.py, quant/pack/baselines.py and
 * quant/pack/container.py; the NumPy references there are the golden outputs these kernels must match bit-exactly.
 */
#ifndef EF_H
#define EF_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- instruction sets ------------------------------------------------------------------------------------- */
enum ef_isa {
    EF_ISA_REF = 0,     /* portable scalar C, the reference */
    EF_ISA_SSE2 = 1,
    EF_ISA_AVX2 = 2,
    EF_ISA_AVX512 = 3,  /* AVX-512 F + BW */
    EF_ISA_NEON = 4,
    EF_ISA_COUNT = 5
};

/* bit i set <=> ISA i is compiled in AND supported by this CPU */
uint32_t ef_isa_mask(void);
/* the best available ISA */
int ef_isa_best(void);
const char *ef_isa_name(int isa);

/* ---- error codes ------------------------------------------------------------------------------------------ */
#define EF_OK 0
#define EF_E_ARG (-1)       /* bad argument (size, group, isa) */
#define EF_E_TRUNC (-2)     /* buffer shorter than the layout needs */
#define EF_E_MAGIC (-3)
#define EF_E_VERSION (-4)
#define EF_E_HEADER (-5)    /* header checksum / field out of range */
#define EF_E_INDEX (-6)     /* index checksum / entry out of range */
#define EF_E_CHECKSUM (-7)  /* tensor checksum mismatch */
#define EF_E_ISA (-8)       /* requested ISA not available */

/* Bits B (1..8) of channel c from a packed 3-bit width array (code B-1 at bit 3c, LSB-first); shared by every
 * reader. Reads byte (3c)/8 and, when the code straddles a byte, the next one: both lie inside ceil(3C/8) bytes. */
static inline int ef_bits_at(const uint8_t *bits3, uint64_t c) {
    const uint64_t bit = c * 3u;
    const unsigned lo = bits3[bit >> 3], hi = (bit & 7) > 5 ? bits3[(bit >> 3) + 1] : 0u;
    return (int)((((lo | (hi << 8)) >> (bit & 7)) & 7u) + 1u);
}

/* ---- weightlet format ------------------------------------------------------------------------------------- */
/* Bytes one channel of D weights at B bits occupies: ceil(D / R) groups * R * B / 8. */
uint64_t ef_weightlet_channel_bytes(int bits, int64_t D, int R);

/* Unpack one channel: src (ef_weightlet_channel_bytes) -> dst (D,) int8.  R in {128, 256, 512}. */
int ef_unpack_channel(int isa, int bits, const uint8_t *src, int8_t *dst, int64_t D, int R);

/* Unpack channels [c0, c1) of a (C, D) tensor.
 *   bits3: packed 3-bit codes (B-1), channel i at bit 3*i, LSB-first; ceil(3C/8) bytes
 *   data:  the concatenated channels, data_len bytes (checked against the layout)
 *   out:   (C, D) int8, row-major; only rows c0..c1-1 are written */
int ef_unpack_weightlet(int isa, const uint8_t *bits3, int64_t C, int64_t D, int R,
                        const uint8_t *data, uint64_t data_len, int8_t *out, int64_t c0, int64_t c1);

/* Per-bit-width kernels (one channel), e.g. unpack_b5_ref / unpack_b5_avx2 / unpack_b5_neon. */
typedef void (*ef_unpack_fn)(const uint8_t *src, int8_t *dst, int64_t D, int R);
ef_unpack_fn ef_unpack_kernel(int isa, int bits);

/* ---- baseline formats ------------------------------------------------------------------------------------- */
/* INT4/INT8 mixed: B <= 4 -> nibbles (u = q + 8, byte j = u[2j] | u[2j+1] << 4), ceil(D/2) bytes; else D raw int8. */
uint64_t ef_mixed_channel_bytes(int bits, int64_t D);
int ef_unpack_mixed(int isa, const uint8_t *bits3, int64_t C, int64_t D,
                    const uint8_t *data, uint64_t data_len, int8_t *out, int64_t c0, int64_t c1);

/* K-quant-like compact bit-split: groups of 32 weights, per group 1 byte int8 min m + 4*B bytes of v = q - m
 * (B >= 5: 16 bytes of low nibbles (byte j = v[j] & 15 | (v[j+16] & 15) << 4) + a (B-4)-bit LSB-first bitstream of
 *  v >> 4; B <= 4: one B-bit LSB-first bitstream). Only a scalar kernel: irregular bit extraction is the point. */
uint64_t ef_kquant_channel_bytes(int bits, int64_t D);
int ef_unpack_kquant(int isa, const uint8_t *bits3, int64_t C, int64_t D,
                     const uint8_t *data, uint64_t data_len, int8_t *out, int64_t c0, int64_t c1);

/* Raw INT8: a copy (the physical limit is memcpy of the same bytes). */
int ef_unpack_int8(const uint8_t *data, uint64_t data_len, int64_t C, int64_t D, int8_t *out, int64_t c0, int64_t c1);

/* memcpy, exposed so the benchmark times the limit through the same call path */
void ef_memcpy(void *dst, const void *src, uint64_t n);

/* Batched positional reads (ef_io.c): piece i = len[i] bytes at file offset off[i] into dst[i], in pread requests of
 * at most `request` bytes, then memcpy into copy[i] when copy != NULL and copy[i] != NULL. Returns the number of
 * pieces completed (n on success); on failure *err = errno (0: the file ended before the piece, a short read). */
int64_t ef_read_pieces(int fd, int64_t n, void *const *dst, const int64_t *off, const int64_t *len,
                       int64_t request, void *const *copy, int64_t *err);

/* ---- container -------------------------------------------------------------------------------------------- */
uint32_t ef_crc32(uint32_t crc, const uint8_t *buf, uint64_t len);

/* Validate a whole model file held in memory (header, version, index bounds/alignment, every tensor's CRC when
 * verify_crc != 0). Returns EF_OK or an EF_E_* code; err gets a one-line message naming the tensor and offset. */
int ef_container_check(const uint8_t *buf, uint64_t len, int verify_crc, char *err, int errlen);

/* Streaming reader (per-layer reads, e.g. the native runner): read the first 64 bytes, ask how many bytes the header,
 * index and metadata span (ef_container_head_bytes: > 0, or an EF_E_* code), read that many, validate them
 * (ef_container_check_index; file_size = the file's size), then per tensor pread its blob (offset/size from
 * ef_container_tensor) and validate it (ef_container_check_tensor: length, CRC, payload size vs bit widths). */
int64_t ef_container_head_bytes(const uint8_t *head, uint64_t avail, uint64_t file_size, char *err, int errlen);
int ef_container_check_index(const uint8_t *head, uint64_t avail, uint64_t file_size, char *err, int errlen);
int ef_container_check_tensor(const uint8_t *head, uint64_t avail, uint32_t idx, const uint8_t *blob,
                              uint64_t blob_len, int verify_crc, char *err, int errlen);

/* Unpack rows [c0, c1) of tensor `idx` from its blob (read with one pread and checked with ef_container_check_tensor)
 * into out (C, D) int8, whatever its format; *scales (if non-NULL) points at the blob's float32 (C,) scales.
 * Float32 tensors return EF_E_ARG (nothing to unpack). */
int ef_unpack_blob(int isa, const uint8_t *head, uint64_t avail, uint32_t idx, const uint8_t *blob, uint64_t blob_len,
                   int8_t *out, int64_t c0, int64_t c1, const float **scales);

/* Fields of tensor `idx` of a file already validated by ef_container_check. Returns EF_OK / EF_E_ARG. */
int ef_container_tensor(const uint8_t *buf, uint64_t len, uint32_t idx, char *name96, uint32_t *fmt,
                        uint32_t *group, uint64_t *C, uint64_t *D, uint64_t *offset, uint64_t *size);

#ifdef __cplusplus
}
#endif
#endif /* EF_H */
