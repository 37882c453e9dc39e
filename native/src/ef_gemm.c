/* INT8 GEMM of the W8A8 linear layers (EdgeFlow paper §3.2 / §4.1: per-output-channel INT8 weights, static
 * per-tensor INT8 activations, int32 accumulation on the NPU — here a host core stands in for the NPU).
 *
 *   out[m, n] = sum_k x[m, k] * w[n, k]   x (M, K) int8, w (N, K) int8, out (M, N) int32, n in [n0, n1)
 *
 * Both operands are K-contiguous (the packed weight file stores a linear layer as (out channels, in features)), so
 * every variant is a register-blocked dot-product kernel: a tile of up to 4 rows of x times 4 rows of w keeps 16
 * vector accumulators, each a lane-parallel partial dot product over K; a tile ends with one horizontal reduction
 * of its 16 accumulators. Loop order (all variants): blocks of NB columns of w (NB * KC = 128 KiB, L2-resident),
 * K chunks of KC = 2048 bytes (the first chunk stores, later ones add to out), 4-row tiles of x (4 * KC bytes,
 * L1-resident), 4-column tiles inside the block (w streams from L2). Measured on the EPYC host: 230-310 GOP/s on
 * one core for the SmolLM2-135M layer shapes (docs/hil.md).
 *
 * Exact for ANY int8 inputs (|x * w| <= 2^14, so no int16 / int32 intermediate can overflow) as long as
 * K <= EF_GEMM_KMAX = 2^16 (every sum, the VNNI correction included, stays below 2^31); the quantizer's
 * activations stay in [-127, 127] anyway. Variants (tile_<isa>):
 *   ref      scalar, vectorisation disabled (the reference; golden NumPy: quant/ref_ops.py gemm_i8_i32)
 *   sse2     the scalar loop left to the compiler's baseline auto-vectoriser
 *   avx2     int8 -> int16 sign extension (vpmovsxbw) + vpmaddwd into int32 lanes: 16 MACs per instruction
 *   avx512   AVX-512 VNNI vpdpbusd (u8 x s8 -> int32, 64 MACs per instruction). Signedness: w is made unsigned by
 *            w ^ 0x80 = w + 128, and the extra 128 * sum_k x[m, k] is subtracted once per row (vpdpbusd adds
 *            its four u8 x s8 products into int32 without saturation, so every intermediate is exact).
 *            K tail: masked loads (zeros contribute 0).
 *            Without AVX-512 VNNI on the CPU this level runs the avx2 kernel.
 *   avxvnni  the same scheme on 256-bit registers: VEX AVX-VNNI when the CPU has it, else the EVEX encoding of
 *            AVX-512 VNNI + VL (same instruction semantics); scalar K tail.
 *   neon     vmull_s8 + vpadalq_s16 (int8 products fit int16; pairwise accumulate into int32)
 *   neondot  sdot (vdotq_s32, signed x signed, no correction), target armv8.2-a+dotprod, run-time HWCAP check
 * Design after ggml's q8_0 dot products and oneDNN-style register blocking (no code taken from either).
 */
#include <stdlib.h>
#include <string.h>

#include "ef_compute.h"
#include "ef_simd.h"

#if defined(EF_NEON) && defined(__linux__)
#include <sys/auxv.h>
#ifndef HWCAP_ASIMDDP
#define HWCAP_ASIMDDP (1 << 20)
#endif
#endif

#define EF_INLINE static inline __attribute__((always_inline))
/* store v into *p, or add it to the partial sum of earlier K chunks when add != 0 */
#define EF_PUT(p, v) (*(p) = (add ? *(p) : 0) + (v))
#define EF_TILE 4                         /* rows of x and of w per register tile */
#ifndef EF_BLOCK_KB
#define EF_BLOCK_KB 128                   /* KiB of w per column block (L2-resident while x tiles sweep it) */
#endif
#define EF_BLOCK_BYTES (EF_BLOCK_KB * 1024)
#ifndef EF_KC
#define EF_KC 2048                        /* K chunk (bytes of one x row per pass; multiple of 64) */
#endif
#define EF_GEMV_PF 8                      /* rows of w the AVX-512 GEMV prefetches ahead (measured: ~memcpy speed) */

/* one register tile: out (mr, nr; row stride N) = x (mr, K) . w (nr, K)^T (+ out when add: later K chunks), rows of
 * x and w ld bytes apart; sx (mr,) = sum_k x[r, k] over these K (the VNNI correction) */
typedef void (*ef_tile_fn)(const int8_t *x, const int8_t *w, int32_t *out, int64_t K, int64_t ld, int64_t N, int mr,
                           int nr,
                           const int32_t *sx, int add);

/* ======================================== ISA selection ==================================================== */
static int has_avx512vnni(void) {
#ifdef EF_X86
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vl") &&
           __builtin_cpu_supports("avx512bw");
#else
    return 0;
#endif
}

static int has_avxvnni_vex(void) {
#ifdef EF_X86
    __builtin_cpu_init();
    return __builtin_cpu_supports("avxvnni") && __builtin_cpu_supports("avx2");
#else
    return 0;
#endif
}

int ef_compute_has_avx512vnni(void) { return has_avx512vnni(); }

uint32_t ef_compute_isa_mask(void) {
    uint32_t m = ef_isa_mask();
    if (has_avxvnni_vex() || has_avx512vnni()) m |= 1u << EF_ISA_AVXVNNI;
#if defined(EF_NEON) && defined(__linux__)
    if (getauxval(AT_HWCAP) & HWCAP_ASIMDDP) m |= 1u << EF_ISA_NEONDOT;
#endif
    return m;
}

int ef_compute_isa_best(void) {
    const uint32_t m = ef_compute_isa_mask();
    if ((m & (1u << EF_ISA_AVX512)) && has_avx512vnni()) return EF_ISA_AVX512;
    if (m & (1u << EF_ISA_AVXVNNI)) return EF_ISA_AVXVNNI;
    if (m & (1u << EF_ISA_NEONDOT)) return EF_ISA_NEONDOT;
    return ef_isa_best();
}

/* ======================================== scalar reference ================================================ */
__attribute__((optimize("no-tree-vectorize"))) static void tile_ref(const int8_t *x, const int8_t *w, int32_t *out,
                                                                     int64_t K, int64_t ld, int64_t N, int mr, int nr,
                                                                     const int32_t *sx, const int add) {
    (void)sx;
    for (int r = 0; r < mr; r++)
        for (int c = 0; c < nr; c++) {
            int32_t s = 0;
            for (int64_t k = 0; k < K; k++) s += (int32_t)x[r * ld + k] * (int32_t)w[c * ld + k];
            EF_PUT(out + r * N + c, s);
        }
}

/* same loop, vectorised by the compiler for the baseline ISA */
static void tile_auto(const int8_t *x, const int8_t *w, int32_t *out, int64_t K, int64_t ld, int64_t N, int mr, int nr,
                      const int32_t *sx, const int add) {
    (void)sx;
    for (int r = 0; r < mr; r++)
        for (int c = 0; c < nr; c++) {
            const int8_t *restrict a = x + r * ld, *restrict b = w + c * ld;
            int32_t s = 0;
            for (int64_t k = 0; k < K; k++) s += (int32_t)a[k] * (int32_t)b[k];
            EF_PUT(out + r * N + c, s);
        }
}

/* scalar dot product of the K tail [k0, K) */
EF_INLINE int32_t dot_tail(const int8_t *a, const int8_t *b, int64_t k0, int64_t K) {
    int32_t s = 0;
    for (int64_t k = k0; k < K; k++) s += (int32_t)a[k] * (int32_t)b[k];
    return s;
}

/* sum_k x[k] (the VNNI correction term), exact in int32 */
EF_INLINE int32_t row_sum(const int8_t *a, int64_t K) {
    int32_t s = 0;
    for (int64_t k = 0; k < K; k++) s += a[k];
    return s;
}

#ifdef EF_X86
/* ======================================== AVX2 (vpmaddwd) ================================================= */
/* 8 int32 lanes of each of 4 accumulators -> [sum a0, sum a1, sum a2, sum a3] */
__attribute__((target("avx2"))) EF_INLINE __m128i hsum4_256(__m256i a0, __m256i a1, __m256i a2, __m256i a3) {
    const __m128i s0 = _mm_add_epi32(_mm256_castsi256_si128(a0), _mm256_extracti128_si256(a0, 1));
    const __m128i s1 = _mm_add_epi32(_mm256_castsi256_si128(a1), _mm256_extracti128_si256(a1, 1));
    const __m128i s2 = _mm_add_epi32(_mm256_castsi256_si128(a2), _mm256_extracti128_si256(a2, 1));
    const __m128i s3 = _mm_add_epi32(_mm256_castsi256_si128(a3), _mm256_extracti128_si256(a3, 1));
    return _mm_hadd_epi32(_mm_hadd_epi32(s0, s1), _mm_hadd_epi32(s2, s3));
}

/* MR x NR tile, 16 k per step: acc[r][c] += madd(sext(x_r), sext(w_c)) */
__attribute__((target("avx2"))) EF_INLINE void tile_avx2_body(const int8_t *x, const int8_t *w, int32_t *out,
                                                                int64_t K, int64_t ld, int64_t N, const int MR,
                                                                const int NR, const int32_t *sx, const int add) {
    (void)sx;
    __m256i acc[EF_TILE][EF_TILE];
    for (int r = 0; r < EF_TILE; r++)
        for (int c = 0; c < EF_TILE; c++) acc[r][c] = _mm256_setzero_si256();
    const int64_t Kv = K & ~(int64_t)15;
    for (int64_t k = 0; k < Kv; k += 16) {
        __m256i xv[EF_TILE], wv[EF_TILE];
        for (int r = 0; r < MR; r++) xv[r] = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(x + r * ld + k)));
        for (int c = 0; c < NR; c++) wv[c] = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(w + c * ld + k)));
        for (int r = 0; r < MR; r++)
            for (int c = 0; c < NR; c++) acc[r][c] = _mm256_add_epi32(acc[r][c], _mm256_madd_epi16(xv[r], wv[c]));
    }
    for (int r = 0; r < MR; r++) {
        int32_t s[4];
        _mm_storeu_si128((__m128i *)s, hsum4_256(acc[r][0], acc[r][1], acc[r][2], acc[r][3]));
        for (int c = 0; c < NR; c++) EF_PUT(out + r * N + c, s[c] + dot_tail(x + r * ld, w + c * ld, Kv, K));
    }
}

/* ==================================== 256-bit VNNI (vpdpbusd ymm) ========================================= */
/* body shared by the VEX (AVX-VNNI) and EVEX (AVX-512 VNNI + VL) encodings; DP(acc, u8, s8) is the instruction */
#define EF_VNNI256_BODY(DP)                                                                                          \
    __m256i acc[EF_TILE][EF_TILE];                                                                                   \
    for (int r = 0; r < EF_TILE; r++)                                                                                \
        for (int c = 0; c < EF_TILE; c++) acc[r][c] = _mm256_setzero_si256();                                        \
    const __m256i flip = _mm256_set1_epi8((char)0x80);                                                               \
    const int64_t Kv = K & ~(int64_t)31;                                                                             \
    for (int64_t k = 0; k < Kv; k += 32) {                                                                           \
        __m256i xv[EF_TILE], wv[EF_TILE];                                                                            \
        for (int r = 0; r < MR; r++) xv[r] = _mm256_loadu_si256((const __m256i *)(x + r * ld + k));                  \
        for (int c = 0; c < NR; c++)                                                                                 \
            wv[c] = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(w + c * ld + k)), flip);                   \
        for (int r = 0; r < MR; r++)                                                                                 \
            for (int c = 0; c < NR; c++) acc[r][c] = DP(acc[r][c], wv[c], xv[r]);                                    \
    }                                                                                                                \
    for (int r = 0; r < MR; r++) {                                                                                   \
        int32_t s[4];                                                                                                \
        _mm_storeu_si128((__m128i *)s, hsum4_256(acc[r][0], acc[r][1], acc[r][2], acc[r][3]));                       \
        const int32_t corr = 128 * (sx[r] - row_sum(x + r * ld + Kv, K - Kv)); /* (w+128).x, vector part */          \
        for (int c = 0; c < NR; c++) EF_PUT(out + r * N + c, s[c] - corr + dot_tail(x + r * ld, w + c * ld, Kv, K)); \
    }

__attribute__((target("avx2,avxvnni"))) EF_INLINE void tile_avxvnni_body(const int8_t *x, const int8_t *w,
                                                                           int32_t *out, int64_t K, int64_t ld,
                                                                           int64_t N, const int MR, const int NR,
                                                                           const int32_t *sx, const int add) {
    EF_VNNI256_BODY(_mm256_dpbusd_avx_epi32)
}

__attribute__((target("avx2,avx512f,avx512vl,avx512vnni"))) EF_INLINE void tile_vnni256_body(
    const int8_t *x, const int8_t *w, int32_t *out, int64_t K, int64_t ld, int64_t N, const int MR, const int NR,
    const int32_t *sx, const int add) {
    EF_VNNI256_BODY(_mm256_dpbusd_epi32)
}

/* ==================================== AVX-512 VNNI (vpdpbusd zmm) ========================================= */
#define EF_T512V __attribute__((target("avx2,avx512f,avx512bw,avx512vl,avx512vnni")))

/* acc[r][c] (16 lanes each, r, c < 4) -> zmm whose element 4r + c = sum of acc[r][c] */
EF_T512V EF_INLINE __m512i hsum16_512(__m512i a[EF_TILE][EF_TILE]) {
    __m512i R[EF_TILE];
    for (int r = 0; r < EF_TILE; r++) {
        const __m512i s01 = _mm512_add_epi32(_mm512_shuffle_i64x2(a[r][0], a[r][1], 0x44),
                                             _mm512_shuffle_i64x2(a[r][0], a[r][1], 0xEE));   /* 256-bit folds */
        const __m512i s23 = _mm512_add_epi32(_mm512_shuffle_i64x2(a[r][2], a[r][3], 0x44),
                                             _mm512_shuffle_i64x2(a[r][2], a[r][3], 0xEE));
        R[r] = _mm512_add_epi32(_mm512_shuffle_i64x2(s01, s23, 0x88),
                                _mm512_shuffle_i64x2(s01, s23, 0xDD));   /* 128-bit lane c: 4 partials of c */
    }
    const __m512i t0 = _mm512_add_epi32(_mm512_unpacklo_epi32(R[0], R[1]), _mm512_unpackhi_epi32(R[0], R[1]));
    const __m512i t1 = _mm512_add_epi32(_mm512_unpacklo_epi32(R[2], R[3]), _mm512_unpackhi_epi32(R[2], R[3]));
    const __m512i z = _mm512_add_epi32(_mm512_unpacklo_epi64(t0, t1), _mm512_unpackhi_epi64(t0, t1)); /* 4c + r */
    const __m512i tr = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    return _mm512_permutexvar_epi32(tr, z);
}

EF_T512V EF_INLINE void tile_vnni512_body(const int8_t *x, const int8_t *w, int32_t *out, int64_t K, int64_t ld,
                                          int64_t N,
                                          const int MR, const int NR, const int32_t *sx, const int add) {
    __m512i acc[EF_TILE][EF_TILE];
    for (int r = 0; r < EF_TILE; r++)
        for (int c = 0; c < EF_TILE; c++) acc[r][c] = _mm512_setzero_si512();
    const __m512i flip = _mm512_set1_epi8((char)0x80);
    int64_t k = 0;
    for (; k + 64 <= K; k += 64) {
        __m512i xv[EF_TILE], wv[EF_TILE];
        if (MR == 1) /* GEMV: the weights stream from DRAM once; prefetch 2 tiles ahead (no fault past the end) */
            for (int c = 0; c < NR; c++) _mm_prefetch((const char *)(w + (EF_GEMV_PF + c) * ld + k), _MM_HINT_T0);
        for (int r = 0; r < MR; r++) xv[r] = _mm512_loadu_si512((const void *)(x + r * ld + k));
        for (int c = 0; c < NR; c++) wv[c] = _mm512_xor_si512(_mm512_loadu_si512((const void *)(w + c * ld + k)), flip);
        for (int r = 0; r < MR; r++)
            for (int c = 0; c < NR; c++) acc[r][c] = _mm512_dpbusd_epi32(acc[r][c], wv[c], xv[r]);
    }
    if (k < K) { /* masked tail: x and w lanes beyond K load as 0; (0 ^ 0x80) * 0 = 0 */
        const __mmask64 mk = (__mmask64)(~0ULL >> (64 - (K - k)));
        __m512i xv[EF_TILE], wv[EF_TILE];
        for (int r = 0; r < MR; r++) xv[r] = _mm512_maskz_loadu_epi8(mk, x + r * ld + k);
        for (int c = 0; c < NR; c++) wv[c] = _mm512_xor_si512(_mm512_maskz_loadu_epi8(mk, w + c * ld + k), flip);
        for (int r = 0; r < MR; r++)
            for (int c = 0; c < NR; c++) acc[r][c] = _mm512_dpbusd_epi32(acc[r][c], wv[c], xv[r]);
    }
    const __m512i tot = hsum16_512(acc);                   /* element 4r + c */
    int32_t corr[EF_TILE] = {0, 0, 0, 0};
    for (int r = 0; r < MR; r++) corr[r] = 128 * sx[r];      /* (w + 128) . x = w . x + 128 sum x */
    const __m512i cv = _mm512_permutexvar_epi32(_mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3),
                                                _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)corr)));
    const __m512i res = _mm512_sub_epi32(tot, cv);
    const __mmask8 mc = (__mmask8)((1u << NR) - 1u);
    /* out row r (nr valid columns) = 128-bit lane r, plus the partial sum already there when add */
#define EF_ADD_ROW(r)                                                                                                \
    if (MR > r) {                                                                                                    \
        __m128i v = _mm512_extracti32x4_epi32(res, r);                                                               \
        if (add) v = _mm_add_epi32(v, _mm_maskz_loadu_epi32(mc, out + r * N));                                       \
        _mm_mask_storeu_epi32(out + r * N, mc, v);                                                                   \
    }
    EF_ADD_ROW(0)
    EF_ADD_ROW(1)
    EF_ADD_ROW(2)
    EF_ADD_ROW(3)
#undef EF_ADD_ROW
}
#endif /* EF_X86 */

#ifdef EF_NEON
/* ======================================== NEON ============================================================ */
EF_INLINE void tile_neon_body(const int8_t *x, const int8_t *w, int32_t *out, int64_t K, int64_t ld, int64_t N,
                              const int MR,
                              const int NR, const int32_t *sx, const int add) {
    (void)sx;
    int32x4_t acc[EF_TILE][EF_TILE];
    for (int r = 0; r < EF_TILE; r++)
        for (int c = 0; c < EF_TILE; c++) acc[r][c] = vdupq_n_s32(0);
    const int64_t Kv = K & ~(int64_t)15;
    for (int64_t k = 0; k < Kv; k += 16) {
        int8x16_t xv[EF_TILE], wv[EF_TILE];
        for (int r = 0; r < MR; r++) xv[r] = vld1q_s8(x + r * ld + k);
        for (int c = 0; c < NR; c++) wv[c] = vld1q_s8(w + c * ld + k);
        for (int r = 0; r < MR; r++)
            for (int c = 0; c < NR; c++) {
                acc[r][c] = vpadalq_s16(acc[r][c], vmull_s8(vget_low_s8(xv[r]), vget_low_s8(wv[c])));
                acc[r][c] = vpadalq_s16(acc[r][c], vmull_high_s8(xv[r], wv[c]));
            }
    }
    for (int r = 0; r < MR; r++)
        for (int c = 0; c < NR; c++)
            EF_PUT(out + r * N + c, vaddvq_s32(acc[r][c]) + dot_tail(x + r * ld, w + c * ld, Kv, K));
}

#define EF_TDOT __attribute__((target("arch=armv8.2-a+dotprod")))
EF_TDOT EF_INLINE void tile_neondot_body(const int8_t *x, const int8_t *w, int32_t *out, int64_t K, int64_t ld,
                                         int64_t N,
                                         const int MR, const int NR, const int32_t *sx, const int add) {
    (void)sx;
    int32x4_t acc[EF_TILE][EF_TILE];
    for (int r = 0; r < EF_TILE; r++)
        for (int c = 0; c < EF_TILE; c++) acc[r][c] = vdupq_n_s32(0);
    const int64_t Kv = K & ~(int64_t)15;
    for (int64_t k = 0; k < Kv; k += 16) {
        int8x16_t xv[EF_TILE], wv[EF_TILE];
        for (int r = 0; r < MR; r++) xv[r] = vld1q_s8(x + r * ld + k);
        for (int c = 0; c < NR; c++) wv[c] = vld1q_s8(w + c * ld + k);
        for (int r = 0; r < MR; r++)
            for (int c = 0; c < NR; c++) acc[r][c] = vdotq_s32(acc[r][c], xv[r], wv[c]);
    }
    for (int r = 0; r < MR; r++)
        for (int c = 0; c < NR; c++)
            EF_PUT(out + r * N + c, vaddvq_s32(acc[r][c]) + dot_tail(x + r * ld, w + c * ld, Kv, K));
}
#endif /* EF_NEON */

/* ======================================== tile tables ===================================================== */
/* One function per (mr, nr) in 1..4 x 1..4 so MR / NR are compile-time constants inside the bodies. */
#define EF_TILE_ARGS const int8_t *x, const int8_t *w, int32_t *o, int64_t K, int64_t ld, int64_t N
#define EF_TILES(NAME, BODY, ATTR)                                                                                   \
    ATTR static void NAME##_11(EF_TILE_ARGS, const int32_t *sx, const int add) {                                    \
        BODY(x, w, o, K, ld, N, 1, 1, sx, add);                                                                     \
    }                                                                                                               \
    ATTR static void NAME##_14(EF_TILE_ARGS, const int32_t *sx, const int add) {                                    \
        BODY(x, w, o, K, ld, N, 1, 4, sx, add);                                                                     \
    }                                                                                                               \
    ATTR static void NAME##_any(EF_TILE_ARGS, int mr, int nr, const int32_t *sx, const int add) {                    \
        if (mr == 4 && nr == 4) { BODY(x, w, o, K, ld, N, 4, 4, sx, add); return; }  /* the hot tile */              \
        if (nr == 4) {                                                                                              \
            for (int r = 0; r < mr; r++) NAME##_14(x + r * ld, w, o + r * N, K, ld, N, sx + r, add);                \
            return;                                                                                                 \
        }                                                                                                           \
        for (int r = 0; r < mr; r++) /* ragged column edge: 1 x 1 tiles (at most 3 columns) */                       \
            for (int c = 0; c < nr; c++) NAME##_11(x + r * ld, w + c * ld, o + r * N + c, K, ld, N, sx + r, add);    \
    }

#ifdef EF_X86
EF_TILES(tile_avx2, tile_avx2_body, __attribute__((target("avx2"))))
EF_TILES(tile_avxvnni, tile_avxvnni_body, __attribute__((target("avx2,avxvnni"))))
EF_TILES(tile_vnni256, tile_vnni256_body, __attribute__((target("avx2,avx512f,avx512vl,avx512vnni"))))
EF_TILES(tile_vnni512, tile_vnni512_body, EF_T512V)
#endif
#ifdef EF_NEON
EF_TILES(tile_neon, tile_neon_body, )
EF_TILES(tile_neondot, tile_neondot_body, EF_TDOT)
#endif

/* The tile kernel of one ISA, or NULL when it is not available on this CPU / build. */
static ef_tile_fn tile_kernel(int isa) {
    if (isa < 0 || isa >= EF_CISA_COUNT || !(ef_compute_isa_mask() & (1u << isa))) return NULL;
    switch (isa) {
    case EF_ISA_REF: return tile_ref;
    case EF_ISA_SSE2: return tile_auto;
#ifdef EF_X86
    case EF_ISA_AVX2: return tile_avx2_any;
    case EF_ISA_AVX512: return has_avx512vnni() ? tile_vnni512_any : tile_avx2_any;
    case EF_ISA_AVXVNNI: return has_avxvnni_vex() ? tile_avxvnni_any : tile_vnni256_any;
#endif
#ifdef EF_NEON
    case EF_ISA_NEON: return tile_neon_any;
    case EF_ISA_NEONDOT: return tile_neondot_any;
#endif
    default: return NULL;
    }
}

/* ======================================== driver ========================================================== */
int ef_gemm_i8_i32(int isa, const int8_t *x, const int8_t *w, int32_t *out, int64_t M, int64_t K, int64_t N,
                   int64_t n0, int64_t n1) {
    const ef_tile_fn tile = tile_kernel(isa);
    if (!tile) return EF_E_ISA;
    if (M < 0 || K < 0 || K > EF_GEMM_KMAX || N < 0 || n0 < 0 || n0 > n1 || n1 > N) return EF_E_ARG;
    if (M == 0 || n0 == n1) return EF_OK;
    if ((!x || !w || !out)) return EF_E_ARG;
    if (K == 0) {
        for (int64_t m = 0; m < M; m++) memset(out + m * N + n0, 0, (size_t)(n1 - n0) * sizeof(int32_t));
        return EF_OK;
    }
    const int need_sx = isa == EF_ISA_AVX512 || isa == EF_ISA_AVXVNNI;
    const int64_t kc = K < EF_KC ? K : EF_KC;               /* K chunk: a 4-row x tile of kc bytes stays in L1 */
    int64_t nb = EF_BLOCK_BYTES / kc;                        /* columns per L2 block of w (nb x kc bytes) */
    nb = nb < EF_TILE ? EF_TILE : nb / EF_TILE * EF_TILE;
    for (int64_t b0 = n0; b0 < n1; b0 += nb) {              /* column block of w: L2-resident */
        const int64_t b1 = b0 + nb < n1 ? b0 + nb : n1;
        for (int64_t k0 = 0; k0 < K; k0 += kc) {            /* K chunk: partial sums accumulate in out */
            const int64_t kl = K - k0 < kc ? K - k0 : kc;
            for (int64_t m = 0; m < M; m += EF_TILE) {     /* 4 rows of x: L1-resident */
                const int mr = (int)(M - m < EF_TILE ? M - m : EF_TILE);
                int32_t sx[EF_TILE];                       /* sum over the chunk of x[m + r, k]: VNNI correction */
                for (int r = 0; r < mr; r++) sx[r] = need_sx ? row_sum(x + (m + r) * K + k0, kl) : 0;
                for (int64_t n = b0; n < b1; n += EF_TILE) { /* hot loop: one register tile */
                    const int nr = (int)(b1 - n < EF_TILE ? b1 - n : EF_TILE);
                    tile(x + m * K + k0, w + n * K + k0, out + m * N + n, kl, K, N, mr, nr, sx, k0 > 0);
                }
            }
        }
    }
    return EF_OK;
}
