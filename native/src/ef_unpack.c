/* Weightlet unpack kernels: scalar reference, x86 SSE2 / AVX2 / AVX-512, Arm NEON (EdgeFlow §4.2, Fig. 7-8; docs/packing.md).
 *
 * Layout of one channel (golden NumPy version: quant/pack/weightlet.py):
 *   - D weights, offset-binary codes u = q + 2^(B-1), B in 1..8, cut into groups of R weights (R = 128/256/512 bits,
 *     the SIMD register width the file was packed for). A partial last group of rem = D mod R weights is a short
 *     group with R_t = 8 * ceil(rem/8) (stripes of S_t = R_t/8 weights, same interleave), so a channel takes
 *     B * ceil(D/8) bytes: padding is below 8 weights per channel.
 *   - B is split into weightlets of width w: B = 8 -> {8} (plain bytes); else the binary digits of B, widest first
 *     (7 -> 4,2,1; 5 -> 4,1; 3 -> 2,1). The first width holds the lowest bits of u, the next one the next bits, ...
 *   - A group is 8 stripes of S = R/8 consecutive weights. Width w has w blocks of S bytes (R bits each, one register).
 *     Block k holds stripes k*(8/w) .. k*(8/w) + 8/w - 1; stripe t of the block sits in bits [8-w(t+1), 8-wt) of byte j
 *     (stripe 0 in the top bits, as in Fig. 7: byte j of a 1-bit block = weights j, j+S, j+2S, ... MSB first).
 *   - Group bytes = blocks of the first width, then the next width, ...: B*S bytes per group.
 * The SIMD kernels unpack a short tail group by spreading its blocks into a zeroed full-size group on the stack,
 * running the full-group body and copying the valid part of each stripe back (the tail).
 * Unpack of one stripe (Fig. 8): per width, take the block holding the stripe, shift its bits to their target
 * position (mask), OR the widths together, subtract 2^(B-1). One register op handles S weights, so 5-bit costs
 * ~2 shifts + 2 ANDs + 1 OR + 1 SUB + 1 store per 16 weights at R = 128 (~0.45 instructions per weight).
 *
 * Kernels are named unpack_b<B>_<isa> (SimSIMD style); each unpacks one channel. The SIMD bodies unpack whole
 * groups; a partial last group is unpacked into a stack buffer and copied (the tail). Wider ISAs than the layout's
 * R use lane-variable shifts (vpsrlvd) on a block broadcast to all lanes to unpack 2 (AVX2) or 4 (AVX-512)
 * stripes per instruction.
 */
#include <string.h>

#include "ef.h"
#include "ef_simd.h"

#define EF_INLINE static inline __attribute__((always_inline))
#define EF_MAXR 512

/* ---- layout helpers (all constant-folded once B is a literal) ----------------------------------------------- */
EF_INLINE int nwidths(int B) { return B == 8 ? 1 : ((B >> 2) & 1) + ((B >> 1) & 1) + (B & 1); }
/* i-th weightlet width of B, widest first */
EF_INLINE int width_i(int B, int i) {
    if (B == 8) return 8;
    int seen = 0;
    for (int w = 4; w >= 1; w >>= 1) {
        if (B & w) {
            if (seen == i) return w;
            seen++;
        }
    }
    return 0;
}
/* bit offset in u of the i-th weightlet = sum of the widths before it */
EF_INLINE int offset_i(int B, int i) {
    int o = 0;
    for (int k = 0; k < i; k++) o += width_i(B, k);
    return o;
}
/* first block index (in S-byte blocks) of the i-th width inside a group */
EF_INLINE int blockbase_i(int B, int i) { return offset_i(B, i); }

uint64_t ef_weightlet_channel_bytes(int bits, int64_t D, int R) {
    if (bits < 1 || bits > 8 || D < 0 || (R != 128 && R != 256 && R != 512)) return 0;
    return ((uint64_t)D + 7u) / 8u * (uint64_t)bits; /* full groups R*B/8 + short tail group ceil(rem/8)*B */
}

/* ======================================== scalar reference ================================================ */
/* One group: g (B*S bytes) -> out (R,) int8. Plain loops; vectorisation is disabled so _ref stays scalar. */
__attribute__((optimize("no-tree-vectorize"))) static void group_ref(int B, const uint8_t *g, int8_t *out, int R) {
    const int S = R / 8;
    const uint8_t off8 = (uint8_t)(1u << (B - 1));
    for (int s = 0; s < 8; s++) {
        for (int j = 0; j < S; j++) {
            unsigned u = 0;
            for (int i = 0; i < nwidths(B); i++) {
                const int w = width_i(B, i), per = 8 / w, k = s / per, t = s % per;
                const unsigned byte = g[(blockbase_i(B, i) + k) * S + j];
                u |= ((byte >> (8 - w * (t + 1))) & ((1u << w) - 1u)) << offset_i(B, i);
            }
            out[s * S + j] = (int8_t)(uint8_t)(u - off8);
        }
    }
}

__attribute__((optimize("no-tree-vectorize"))) static void channel_ref(int B, const uint8_t *src, int8_t *dst,
                                                                        int64_t D, int R) {
    const int64_t full = D / R;
    const int64_t gbytes = (int64_t)B * (R / 8);
    for (int64_t g = 0; g < full; g++) group_ref(B, src + g * gbytes, dst + g * R, R);
    const int64_t rem = D - full * R;
    if (rem) { /* short group: R_t = 8 * ceil(rem / 8) */
        int8_t tmp[EF_MAXR];
        group_ref(B, src + full * gbytes, tmp, (int)((rem + 7) / 8 * 8));
        memcpy(dst + full * R, tmp, (size_t)rem);
    }
}

#define EF_DEF_REF(B) \
    void unpack_b##B##_ref(const uint8_t *src, int8_t *dst, int64_t D, int R) { channel_ref(B, src, dst, D, R); }
EF_DEF_REF(1)
EF_DEF_REF(2)
EF_DEF_REF(3)
EF_DEF_REF(4)
EF_DEF_REF(5)
EF_DEF_REF(6)
EF_DEF_REF(7)
EF_DEF_REF(8)

/* Channel driver shared by the SIMD variants: GROUP(B, g, out, R) unpacks one full group; R is a literal. */
#define EF_CHANNEL_BODY(GROUP, B, R)                                             \
    do {                                                                         \
        const int64_t full = D / (R);                                            \
        const int64_t gbytes = (int64_t)(B) * ((R) / 8);                         \
        for (int64_t g = 0; g < full; g++) GROUP(B, src + g * gbytes, dst + g * (R), R); \
        const int64_t rem = D - full * (R);                                      \
        if (rem) { /* short tail group, stripes of St bytes: spread into a full group */ \
            const int St = (int)((rem + 7) / 8);                                 \
            uint8_t gin[EF_MAXR] __attribute__((aligned(64)));                   \
            int8_t tmp[EF_MAXR] __attribute__((aligned(64)));                    \
            memset(gin, 0, (size_t)(B) * ((R) / 8));                             \
            for (int b = 0; b < (B); b++) memcpy(gin + b * ((R) / 8), src + full * gbytes + b * St, (size_t)St); \
            GROUP(B, gin, tmp, R);                                               \
            for (int s = 0; s < 8 && s * St < rem; s++)                          \
                memcpy(dst + full * (R) + s * St, tmp + s * ((R) / 8),           \
                       (size_t)(rem - s * St < St ? rem - s * St : St));         \
        }                                                                        \
    } while (0)

/* ============================================ x86 ========================================================== */
#ifdef EF_X86

/* ---- SSE2: 16-byte chunks of a stripe, uniform shifts; any R ---- */
__attribute__((target("sse2"))) EF_INLINE void group_sse2(const int B, const uint8_t *restrict g,
                                                           int8_t *restrict out, const int R) {
    const int S = R / 8;
    const __m128i offs = _mm_set1_epi8((char)(1u << (B - 1)));
    for (int c = 0; c < S; c += 16) {
        __m128i blk[8];
#pragma GCC unroll 8
        for (int b = 0; b < B; b++) blk[b] = _mm_loadu_si128((const __m128i *)(g + b * S + c));
#pragma GCC unroll 8
        for (int s = 0; s < 8; s++) {
            __m128i acc = _mm_setzero_si128();
#pragma GCC unroll 3
            for (int i = 0; i < nwidths(B); i++) {
                const int w = width_i(B, i), off = offset_i(B, i), per = 8 / w, k = s / per, t = s % per;
                const int sh = (8 - w * (t + 1)) - off; /* >0: right shift */
                __m128i x = blk[blockbase_i(B, i) + k];
                if (sh > 0) x = _mm_srli_epi16(x, sh);
                if (sh < 0) x = _mm_slli_epi16(x, -sh);
                if (w != 8) x = _mm_and_si128(x, _mm_set1_epi8((char)(((1u << w) - 1u) << off)));
                acc = i == 0 ? x : _mm_or_si128(acc, x);
            }
            _mm_storeu_si128((__m128i *)(out + s * S + c), _mm_sub_epi8(acc, offs));
        }
    }
}

#define EF_DEF_SSE2(B)                                                                                     \
    __attribute__((target("sse2"))) void unpack_b##B##_sse2(const uint8_t *src, int8_t *dst, int64_t D, int R) { \
        if (R == 128) EF_CHANNEL_BODY(group_sse2, B, 128);                                                 \
        else if (R == 256) EF_CHANNEL_BODY(group_sse2, B, 256);                                            \
        else EF_CHANNEL_BODY(group_sse2, B, 512);                                                          \
    }

/* ---- AVX2 ---- */
/* R = 128: two stripes per register. Width-8 blocks of stripes 2p, 2p+1 are adjacent (one 32-byte load); narrower
 * widths hold both stripes in one block, broadcast to both lanes and shifted by a per-lane count. */
__attribute__((target("avx2"))) EF_INLINE void group_avx2_r128(const int B, const uint8_t *restrict g,
                                                                int8_t *restrict out) {
    const __m256i offs = _mm256_set1_epi8((char)(1u << (B - 1)));
    __m256i bb[8];
    if (B != 8) {
#pragma GCC unroll 8
        for (int b = 0; b < B; b++) bb[b] = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(g + b * 16)));
    }
#pragma GCC unroll 4
    for (int p = 0; p < 4; p++) {
        __m256i acc = _mm256_setzero_si256();
        if (B == 8) {
            acc = _mm256_loadu_si256((const __m256i *)(g + 32 * p));
        } else {
#pragma GCC unroll 3
            for (int i = 0; i < nwidths(B); i++) {
                const int w = width_i(B, i), off = offset_i(B, i), per = 8 / w;
                const int s0 = 2 * p, s1 = 2 * p + 1, k = s0 / per; /* per >= 2: both in block k */
                const int sh0 = (8 - w * (s0 % per + 1)) - off, sh1 = (8 - w * (s1 % per + 1)) - off;
                __m256i x = bb[blockbase_i(B, i) + k];
                if (sh0 > 0 || sh1 > 0)
                    x = _mm256_srlv_epi32(x, _mm256_setr_epi32(sh0 > 0 ? sh0 : 0, sh0 > 0 ? sh0 : 0, sh0 > 0 ? sh0 : 0,
                                                               sh0 > 0 ? sh0 : 0, sh1 > 0 ? sh1 : 0, sh1 > 0 ? sh1 : 0,
                                                               sh1 > 0 ? sh1 : 0, sh1 > 0 ? sh1 : 0));
                if (sh0 < 0 || sh1 < 0)
                    x = _mm256_sllv_epi32(x, _mm256_setr_epi32(sh0 < 0 ? -sh0 : 0, sh0 < 0 ? -sh0 : 0, sh0 < 0 ? -sh0 : 0,
                                                               sh0 < 0 ? -sh0 : 0, sh1 < 0 ? -sh1 : 0, sh1 < 0 ? -sh1 : 0,
                                                               sh1 < 0 ? -sh1 : 0, sh1 < 0 ? -sh1 : 0));
                x = _mm256_and_si256(x, _mm256_set1_epi8((char)(((1u << w) - 1u) << off)));
                acc = i == 0 ? x : _mm256_or_si256(acc, x);
            }
        }
        _mm256_storeu_si256((__m256i *)(out + 32 * p), _mm256_sub_epi8(acc, offs));
    }
}

/* R >= 256: 32-byte chunks of a stripe, uniform shifts */
__attribute__((target("avx2"))) EF_INLINE void group_avx2_wide(const int B, const uint8_t *restrict g,
                                                                int8_t *restrict out, const int R) {
    const int S = R / 8;
    const __m256i offs = _mm256_set1_epi8((char)(1u << (B - 1)));
    for (int c = 0; c < S; c += 32) {
        __m256i blk[8];
#pragma GCC unroll 8
        for (int b = 0; b < B; b++) blk[b] = _mm256_loadu_si256((const __m256i *)(g + b * S + c));
#pragma GCC unroll 8
        for (int s = 0; s < 8; s++) {
            __m256i acc = _mm256_setzero_si256();
#pragma GCC unroll 3
            for (int i = 0; i < nwidths(B); i++) {
                const int w = width_i(B, i), off = offset_i(B, i), per = 8 / w, k = s / per, t = s % per;
                const int sh = (8 - w * (t + 1)) - off;
                __m256i x = blk[blockbase_i(B, i) + k];
                if (sh > 0) x = _mm256_srli_epi16(x, sh);
                if (sh < 0) x = _mm256_slli_epi16(x, -sh);
                if (w != 8) x = _mm256_and_si256(x, _mm256_set1_epi8((char)(((1u << w) - 1u) << off)));
                acc = i == 0 ? x : _mm256_or_si256(acc, x);
            }
            _mm256_storeu_si256((__m256i *)(out + s * S + c), _mm256_sub_epi8(acc, offs));
        }
    }
}

#define EF_GROUP_AVX2(B, g, out, R) \
    do {                            \
        if ((R) == 128) group_avx2_r128(B, g, out); \
        else group_avx2_wide(B, g, out, R);         \
    } while (0)

#define EF_DEF_AVX2(B)                                                                                     \
    __attribute__((target("avx2"))) void unpack_b##B##_avx2(const uint8_t *src, int8_t *dst, int64_t D, int R) { \
        if (R == 128) EF_CHANNEL_BODY(EF_GROUP_AVX2, B, 128);                                              \
        else if (R == 256) EF_CHANNEL_BODY(EF_GROUP_AVX2, B, 256);                                         \
        else EF_CHANNEL_BODY(EF_GROUP_AVX2, B, 512);                                                       \
    }

/* ---- AVX-512 (F + BW) ---- */
#define EF_T512 __attribute__((target("avx512f,avx512bw,avx2")))
/* R = 128: four stripes per register, per-lane shift counts on broadcast blocks */
EF_T512 EF_INLINE __m512i lane_counts(int a, int b, int c, int d) {
    return _mm512_setr_epi32(a, a, a, a, b, b, b, b, c, c, c, c, d, d, d, d);
}
EF_T512 EF_INLINE void group_avx512_r128(const int B, const uint8_t *restrict g, int8_t *restrict out) {
    const __m512i offs = _mm512_set1_epi8((char)(1u << (B - 1)));
#pragma GCC unroll 2
    for (int q = 0; q < 2; q++) {
        __m512i acc = _mm512_setzero_si512();
        if (B == 8) {
            acc = _mm512_loadu_si512((const void *)(g + 64 * q));
        } else {
#pragma GCC unroll 3
            for (int i = 0; i < nwidths(B); i++) {
                const int w = width_i(B, i), off = offset_i(B, i), per = 8 / w, base = blockbase_i(B, i);
                __m512i x;
                if (w == 4) { /* stripes 4q..4q+3 live in blocks 2q (lanes 0,1) and 2q+1 (lanes 2,3) */
                    const __m512i y = _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(g + (base + 2 * q) * 16)));
                    x = _mm512_shuffle_i64x2(y, y, _MM_SHUFFLE(1, 1, 0, 0));
                } else { /* w = 1, 2: all four stripes in one block */
                    x = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(g + (base + (4 * q) / per) * 16)));
                }
                int sh[4], any_r = 0, any_l = 0;
                for (int l = 0; l < 4; l++) {
                    sh[l] = (8 - w * ((4 * q + l) % per + 1)) - off;
                    any_r |= sh[l] > 0;
                    any_l |= sh[l] < 0;
                }
                if (any_r)
                    x = _mm512_srlv_epi32(x, lane_counts(sh[0] > 0 ? sh[0] : 0, sh[1] > 0 ? sh[1] : 0,
                                                         sh[2] > 0 ? sh[2] : 0, sh[3] > 0 ? sh[3] : 0));
                if (any_l)
                    x = _mm512_sllv_epi32(x, lane_counts(sh[0] < 0 ? -sh[0] : 0, sh[1] < 0 ? -sh[1] : 0,
                                                         sh[2] < 0 ? -sh[2] : 0, sh[3] < 0 ? -sh[3] : 0));
                x = _mm512_and_si512(x, _mm512_set1_epi8((char)(((1u << w) - 1u) << off)));
                acc = i == 0 ? x : _mm512_or_si512(acc, x);
            }
        }
        _mm512_storeu_si512((void *)(out + 64 * q), _mm512_sub_epi8(acc, offs));
    }
}

/* R = 512: 64-byte stripes, uniform shifts */
EF_T512 EF_INLINE void group_avx512_r512(const int B, const uint8_t *restrict g, int8_t *restrict out) {
    const int S = 64;
    const __m512i offs = _mm512_set1_epi8((char)(1u << (B - 1)));
    __m512i blk[8];
#pragma GCC unroll 8
    for (int b = 0; b < B; b++) blk[b] = _mm512_loadu_si512((const void *)(g + b * S));
#pragma GCC unroll 8
    for (int s = 0; s < 8; s++) {
        __m512i acc = _mm512_setzero_si512();
#pragma GCC unroll 3
        for (int i = 0; i < nwidths(B); i++) {
            const int w = width_i(B, i), off = offset_i(B, i), per = 8 / w, k = s / per, t = s % per;
            const int sh = (8 - w * (t + 1)) - off;
            __m512i x = blk[blockbase_i(B, i) + k];
            if (sh > 0) x = _mm512_srli_epi16(x, (unsigned)sh);
            if (sh < 0) x = _mm512_slli_epi16(x, (unsigned)-sh);
            if (w != 8) x = _mm512_and_si512(x, _mm512_set1_epi8((char)(((1u << w) - 1u) << off)));
            acc = i == 0 ? x : _mm512_or_si512(acc, x);
        }
        _mm512_storeu_si512((void *)(out + s * S), _mm512_sub_epi8(acc, offs));
    }
}

#define EF_GROUP_AVX512(B, g, out, R)                     \
    do {                                                  \
        if ((R) == 128) group_avx512_r128(B, g, out);     \
        else if ((R) == 512) group_avx512_r512(B, g, out); \
        else group_avx2_wide(B, g, out, R);               \
    } while (0)

#define EF_DEF_AVX512(B)                                                                            \
    EF_T512 void unpack_b##B##_avx512(const uint8_t *src, int8_t *dst, int64_t D, int R) {          \
        if (R == 128) EF_CHANNEL_BODY(EF_GROUP_AVX512, B, 128);                                     \
        else if (R == 256) EF_CHANNEL_BODY(EF_GROUP_AVX512, B, 256);                                \
        else EF_CHANNEL_BODY(EF_GROUP_AVX512, B, 512);                                              \
    }

EF_DEF_SSE2(1) EF_DEF_SSE2(2) EF_DEF_SSE2(3) EF_DEF_SSE2(4) EF_DEF_SSE2(5) EF_DEF_SSE2(6) EF_DEF_SSE2(7) EF_DEF_SSE2(8)
EF_DEF_AVX2(1) EF_DEF_AVX2(2) EF_DEF_AVX2(3) EF_DEF_AVX2(4) EF_DEF_AVX2(5) EF_DEF_AVX2(6) EF_DEF_AVX2(7) EF_DEF_AVX2(8)
EF_DEF_AVX512(1) EF_DEF_AVX512(2) EF_DEF_AVX512(3) EF_DEF_AVX512(4)
EF_DEF_AVX512(5) EF_DEF_AVX512(6) EF_DEF_AVX512(7) EF_DEF_AVX512(8)
#endif /* EF_X86 */

/* ============================================ NEON ========================================================= */
#ifdef EF_NEON
/* 16-byte chunks of a stripe; NEON shifts bytes natively (vshlq_u8 with a negative count shifts right). */
EF_INLINE void group_neon(const int B, const uint8_t *restrict g, int8_t *restrict out, const int R) {
    const int S = R / 8;
    const uint8x16_t offs = vdupq_n_u8((uint8_t)(1u << (B - 1)));
    for (int c = 0; c < S; c += 16) {
        uint8x16_t blk[8];
#pragma GCC unroll 8
        for (int b = 0; b < B; b++) blk[b] = vld1q_u8(g + b * S + c);
#pragma GCC unroll 8
        for (int s = 0; s < 8; s++) {
            uint8x16_t acc = vdupq_n_u8(0);
#pragma GCC unroll 3
            for (int i = 0; i < nwidths(B); i++) {
                const int w = width_i(B, i), off = offset_i(B, i), per = 8 / w, k = s / per, t = s % per;
                const int sh = (8 - w * (t + 1)) - off;
                uint8x16_t x = blk[blockbase_i(B, i) + k];
                if (sh != 0) x = vshlq_u8(x, vdupq_n_s8((int8_t)-sh));
                if (w != 8) x = vandq_u8(x, vdupq_n_u8((uint8_t)(((1u << w) - 1u) << off)));
                acc = i == 0 ? x : vorrq_u8(acc, x);
            }
            vst1q_s8(out + s * S + c, vreinterpretq_s8_u8(vsubq_u8(acc, offs)));
        }
    }
}

#define EF_DEF_NEON(B)                                                                       \
    void unpack_b##B##_neon(const uint8_t *src, int8_t *dst, int64_t D, int R) {             \
        if (R == 128) EF_CHANNEL_BODY(group_neon, B, 128);                                   \
        else if (R == 256) EF_CHANNEL_BODY(group_neon, B, 256);                              \
        else EF_CHANNEL_BODY(group_neon, B, 512);                                            \
    }
EF_DEF_NEON(1) EF_DEF_NEON(2) EF_DEF_NEON(3) EF_DEF_NEON(4) EF_DEF_NEON(5) EF_DEF_NEON(6) EF_DEF_NEON(7) EF_DEF_NEON(8)
#endif /* EF_NEON */

/* ============================================ dispatch ===================================================== */
#define EF_ROW(ISA) \
    { unpack_b1_##ISA, unpack_b2_##ISA, unpack_b3_##ISA, unpack_b4_##ISA, unpack_b5_##ISA, unpack_b6_##ISA, unpack_b7_##ISA, unpack_b8_##ISA }
static const ef_unpack_fn KERNELS[EF_ISA_COUNT][8] = {
    EF_ROW(ref),
#ifdef EF_X86
    EF_ROW(sse2), EF_ROW(avx2), EF_ROW(avx512),
#else
    {0}, {0}, {0},
#endif
#ifdef EF_NEON
    EF_ROW(neon),
#else
    {0},
#endif
};

uint32_t ef_isa_mask(void) {
    uint32_t m = 1u << EF_ISA_REF;
#ifdef EF_X86
    __builtin_cpu_init();
    if (__builtin_cpu_supports("sse2")) m |= 1u << EF_ISA_SSE2;
    if (__builtin_cpu_supports("avx2")) m |= 1u << EF_ISA_AVX2;
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw")) m |= 1u << EF_ISA_AVX512;
#endif
#ifdef EF_NEON
    m |= 1u << EF_ISA_NEON;
#endif
    return m;
}

int ef_isa_best(void) {
    const uint32_t m = ef_isa_mask();
    for (int i = EF_ISA_COUNT - 1; i > 0; i--)
        if (m & (1u << i)) return i;
    return EF_ISA_REF;
}

const char *ef_isa_name(int isa) {
    static const char *names[EF_ISA_COUNT] = {"ref", "sse2", "avx2", "avx512", "neon"};
    return (isa >= 0 && isa < EF_ISA_COUNT) ? names[isa] : "?";
}

ef_unpack_fn ef_unpack_kernel(int isa, int bits) {
    if (isa < 0 || isa >= EF_ISA_COUNT || bits < 1 || bits > 8) return 0;
    if (!(ef_isa_mask() & (1u << isa))) return 0;
    return KERNELS[isa][bits - 1];
}

int ef_unpack_channel(int isa, int bits, const uint8_t *src, int8_t *dst, int64_t D, int R) {
    if (R != 128 && R != 256 && R != 512) return EF_E_ARG;
    if (bits < 1 || bits > 8 || D < 0) return EF_E_ARG;
    ef_unpack_fn f = ef_unpack_kernel(isa, bits);
    if (!f) return EF_E_ISA;
    f(src, dst, D, R);
    return EF_OK;
}


int ef_unpack_weightlet(int isa, const uint8_t *bits3, int64_t C, int64_t D, int R, const uint8_t *data,
                        uint64_t data_len, int8_t *out, int64_t c0, int64_t c1) {
    if (R != 128 && R != 256 && R != 512) return EF_E_ARG;
    if (C < 0 || D < 0 || c0 < 0 || c1 > C || c0 > c1) return EF_E_ARG;
    if (isa < 0 || isa >= EF_ISA_COUNT || !(ef_isa_mask() & (1u << isa))) return EF_E_ISA;
    const uint64_t per_bit = ((uint64_t)D + 7u) / 8u; /* bytes per channel per bit of width */
    uint64_t off = 0;
    for (int64_t c = 0; c < c0; c++) off += per_bit * (uint64_t)ef_bits_at(bits3, c);
    for (int64_t c = c0; c < c1; c++) {
        const int B = ef_bits_at(bits3, c);
        const uint64_t n = per_bit * (uint64_t)B;
        if (off + n > data_len) return EF_E_TRUNC;
        KERNELS[isa][B - 1](data + off, out + c * D, D, R);
        off += n;
    }
    return EF_OK;
}
