/* Unpack kernels of the baseline formats EdgeFlow is compared with (EdgeFlow §4.2 / §6 ablations; docs/packing.md).
 *
 *   - raw INT8: the channel bytes are the int8 weights; unpack is a copy (memcpy is the physical limit).
 *   - INT4/INT8 mixed ("pad each channel to 4 or 8 bits"): B <= 4 -> nibbles of u = q + 8, byte j = u[2j] | u[2j+1]<<4,
 *     ceil(D/2) bytes; B >= 5 -> D raw int8 bytes. Kernels: _ref, SSE2, AVX2 (AVX-512 runs the AVX2 body), NEON.
 *   - K-quant-like compact bit-split (llama.cpp Q*_K style, per-group offsets): groups of 32 weights, each
 *     1 byte int8 group minimum m, then v = q - m in 4*B bytes: B >= 5 -> 16 bytes of low nibbles (byte j =
 *     v[j] & 15 | (v[j+16] & 15) << 4) + the high B-4 bits of every v as one LSB-first bitstream; B <= 4 -> one B-bit
 *     LSB-first bitstream. Weights straddle bytes, so the unpack is a per-weight scalar bit extraction: only _ref
 *     exists (the slow side of the comparison the paper makes).
 * Golden NumPy versions: quant/pack/baselines.py.
 */
#include <string.h>

#include "ef.h"
#include "ef_simd.h"


static int check_range(int isa, int64_t C, int64_t D, int64_t c0, int64_t c1) {
    if (C < 0 || D < 0 || c0 < 0 || c1 > C || c0 > c1) return EF_E_ARG;
    if (isa < 0 || isa >= EF_ISA_COUNT || !(ef_isa_mask() & (1u << isa))) return EF_E_ISA;
    return EF_OK;
}

void ef_memcpy(void *dst, const void *src, uint64_t n) { memcpy(dst, src, (size_t)n); }

/* ======================================== raw INT8 ======================================================== */
int ef_unpack_int8(const uint8_t *data, uint64_t data_len, int64_t C, int64_t D, int8_t *out, int64_t c0, int64_t c1) {
    if (check_range(EF_ISA_REF, C, D, c0, c1)) return EF_E_ARG;
    if ((uint64_t)c1 * (uint64_t)D > data_len) return EF_E_TRUNC;
    memcpy(out + c0 * D, data + c0 * D, (size_t)((c1 - c0) * D));
    return EF_OK;
}

/* ======================================== INT4/INT8 mixed ================================================= */
uint64_t ef_mixed_channel_bytes(int bits, int64_t D) {
    if (bits < 1 || bits > 8 || D < 0) return 0;
    return bits <= 4 ? ((uint64_t)D + 1u) / 2u : (uint64_t)D;
}

__attribute__((optimize("no-tree-vectorize"))) static void nib_ref(const uint8_t *src, int8_t *dst, int64_t D) {
    for (int64_t i = 0; i < D; i++) {
        const unsigned byte = src[i >> 1];
        dst[i] = (int8_t)(uint8_t)(((i & 1) ? byte >> 4 : byte & 15u) - 8u);
    }
}

#ifdef EF_X86
__attribute__((target("sse2"))) static void nib_sse2(const uint8_t *src, int8_t *dst, int64_t D) {
    const __m128i m = _mm_set1_epi8(15), o = _mm_set1_epi8(8);
    int64_t i = 0;
    for (; i + 32 <= D; i += 32) {
        const __m128i x = _mm_loadu_si128((const __m128i *)(src + i / 2));
        const __m128i lo = _mm_and_si128(x, m), hi = _mm_and_si128(_mm_srli_epi16(x, 4), m);
        _mm_storeu_si128((__m128i *)(dst + i), _mm_sub_epi8(_mm_unpacklo_epi8(lo, hi), o));
        _mm_storeu_si128((__m128i *)(dst + i + 16), _mm_sub_epi8(_mm_unpackhi_epi8(lo, hi), o));
    }
    nib_ref(src + i / 2, dst + i, D - i); /* scalar tail (i is even) */
}

__attribute__((target("avx2"))) static void nib_avx2(const uint8_t *src, int8_t *dst, int64_t D) {
    const __m256i m = _mm256_set1_epi8(15), o = _mm256_set1_epi8(8);
    int64_t i = 0;
    for (; i + 64 <= D; i += 64) {
        const __m256i x = _mm256_loadu_si256((const __m256i *)(src + i / 2));
        const __m256i lo = _mm256_and_si256(x, m), hi = _mm256_and_si256(_mm256_srli_epi16(x, 4), m);
        const __m256i a = _mm256_unpacklo_epi8(lo, hi), b = _mm256_unpackhi_epi8(lo, hi); /* per 128-bit lane */
        _mm256_storeu_si256((__m256i *)(dst + i), _mm256_sub_epi8(_mm256_permute2x128_si256(a, b, 0x20), o));
        _mm256_storeu_si256((__m256i *)(dst + i + 32), _mm256_sub_epi8(_mm256_permute2x128_si256(a, b, 0x31), o));
    }
    nib_ref(src + i / 2, dst + i, D - i);
}
#endif

#ifdef EF_NEON
static void nib_neon(const uint8_t *src, int8_t *dst, int64_t D) {
    const uint8x16_t m = vdupq_n_u8(15), o = vdupq_n_u8(8);
    int64_t i = 0;
    for (; i + 32 <= D; i += 32) {
        const uint8x16_t x = vld1q_u8(src + i / 2);
        const uint8x16x2_t z = vzipq_u8(vandq_u8(x, m), vshrq_n_u8(x, 4));
        vst1q_s8(dst + i, vreinterpretq_s8_u8(vsubq_u8(z.val[0], o)));
        vst1q_s8(dst + i + 16, vreinterpretq_s8_u8(vsubq_u8(z.val[1], o)));
    }
    nib_ref(src + i / 2, dst + i, D - i);
}
#endif

int ef_unpack_mixed(int isa, const uint8_t *bits3, int64_t C, int64_t D, const uint8_t *data, uint64_t data_len,
                    int8_t *out, int64_t c0, int64_t c1) {
    const int rc = check_range(isa, C, D, c0, c1);
    if (rc) return rc;
    void (*nib)(const uint8_t *, int8_t *, int64_t) = nib_ref;
#ifdef EF_X86
    if (isa == EF_ISA_SSE2) nib = nib_sse2;
    if (isa == EF_ISA_AVX2 || isa == EF_ISA_AVX512) nib = nib_avx2;
#endif
#ifdef EF_NEON
    if (isa == EF_ISA_NEON) nib = nib_neon;
#endif
    uint64_t off = 0;
    for (int64_t c = 0; c < c0; c++) off += ef_mixed_channel_bytes(ef_bits_at(bits3, c), D);
    for (int64_t c = c0; c < c1; c++) {
        const int B = ef_bits_at(bits3, c);
        const uint64_t n = ef_mixed_channel_bytes(B, D);
        if (off + n > data_len) return EF_E_TRUNC;
        if (B <= 4) nib(data + off, out + c * D, D);
        else memcpy(out + c * D, data + off, (size_t)D);
        off += n;
    }
    return EF_OK;
}

/* ======================================== K-quant-like ==================================================== */
#define KQ_GROUP 32

uint64_t ef_kquant_channel_bytes(int bits, int64_t D) {
    if (bits < 1 || bits > 8 || D < 0) return 0;
    return ((uint64_t)D + KQ_GROUP - 1) / KQ_GROUP * (1u + 4u * (uint64_t)bits);
}

/* nb-bit field j of an LSB-first bitstream */
static inline unsigned stream_get(const uint8_t *s, int j, int nb) {
    const int p = j * nb, byte = p >> 3, sh = p & 7;
    unsigned v = (unsigned)s[byte] >> sh;
    if (sh + nb > 8) v |= (unsigned)s[byte + 1] << (8 - sh);
    return v & ((1u << nb) - 1u);
}

__attribute__((optimize("no-tree-vectorize"))) static void kquant_channel_ref(int B, const uint8_t *src, int8_t *dst,
                                                                               int64_t D) {
    const int64_t G = (D + KQ_GROUP - 1) / KQ_GROUP;
    const int gbytes = 1 + 4 * B;
    for (int64_t g = 0; g < G; g++) {
        const uint8_t *p = src + g * gbytes;
        const int m = (int8_t)p[0];
        const int n = (int)((D - g * KQ_GROUP) < KQ_GROUP ? (D - g * KQ_GROUP) : KQ_GROUP);
        int8_t *o = dst + g * KQ_GROUP;
        if (B >= 5) {
            const uint8_t *ql = p + 1, *qh = p + 17;
            for (int j = 0; j < n; j++) {
                const unsigned lo = j < 16 ? (ql[j] & 15u) : (ql[j - 16] >> 4);
                o[j] = (int8_t)(uint8_t)((int)(lo | (stream_get(qh, j, B - 4) << 4)) + m);
            }
        } else {
            for (int j = 0; j < n; j++) o[j] = (int8_t)(uint8_t)((int)stream_get(p + 1, j, B) + m);
        }
    }
}

int ef_unpack_kquant(int isa, const uint8_t *bits3, int64_t C, int64_t D, const uint8_t *data, uint64_t data_len,
                     int8_t *out, int64_t c0, int64_t c1) {
    const int rc = check_range(isa, C, D, c0, c1);
    if (rc) return rc;
    uint64_t off = 0;
    for (int64_t c = 0; c < c0; c++) off += ef_kquant_channel_bytes(ef_bits_at(bits3, c), D);
    for (int64_t c = c0; c < c1; c++) {
        const int B = ef_bits_at(bits3, c);
        const uint64_t n = ef_kquant_channel_bytes(B, D);
        if (off + n > data_len) return EF_E_TRUNC;
        kquant_channel_ref(B, data + off, out + c * D, D);
        off += n;
    }
    return EF_OK;
}
