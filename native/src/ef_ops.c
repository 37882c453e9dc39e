/* Float32 CPU ops of a Llama layer for the host hardware-in-the-loop runner (EdgeFlow paper §4.1: the CPU runs
 * norms, RoPE, attention and activations while the NPU runs the INT8 linears; §3.2 W8A8: per-tensor activation
 * quantization and per-channel dequantization around each INT8 GEMM).
 *
 * Each op exists as
 *   <op>_ref   scalar C, vectorisation disabled (the reference; golden NumPy versions in quant/ref_ops.py)
 *   <op>_auto  the same C left to the baseline auto-vectoriser (isa "sse2")
 *   <op>_avx2  AVX2 + FMA (isa "avx2", and "avx512" / "avxvnni": 256-bit is enough for these memory-bound ops)
 *   <op>_neon  Arm NEON (isa "neon" / "neondot")
 * Exact ops (bit-identical to NumPy in every variant): add, quantize (float32 division, rint half-to-even, clamp),
 * dequant (float32 product x_scale * w_scale[n], then times (float)acc), absmax, rope (mul / mul / sub or add, no
 * fused multiply-add: C11 mode compiles with -ffp-contract=off). Float ops within the tolerances of
 * quant/ref_ops.py: rmsnorm (sum of squares in another order), silu_mul and attention (polynomial exp).
 */
#include <math.h> /* INFINITY; sqrt only on other architectures */
#include <stdlib.h>
#include <string.h>

#include "ef_compute.h"
#include "ef_simd.h"

#define EF_INLINE static inline __attribute__((always_inline))
#define EF_NOVEC __attribute__((optimize("no-tree-vectorize")))

enum { LV_REF, LV_AUTO, LV_AVX2, LV_NEON, LV_BAD };

/* No libm: the library (and the static aarch64 test harness) links without -lm. */
/* sqrt as the instruction (sqrtsd / fsqrt), correctly rounded like libm's */
static double ef_sqrt(double v) {
#if defined(EF_X86)
    return _mm_cvtsd_f64(_mm_sqrt_sd(_mm_setzero_pd(), _mm_set_sd(v)));
#elif defined(EF_NEON)
    return vget_lane_f64(vsqrt_f64(vdup_n_f64(v)), 0);
#else
    return sqrt(v);
#endif
}

/* exp(x), scalar: the same range reduction and polynomial as the SIMD exp256 / exp_neon below (Cephes expf) */
EF_NOVEC static float ef_expf(float x) {
    x = x < -87.33f ? -87.33f : (x > 88.37f ? 88.37f : x);
    const float n = __builtin_rintf(x * 1.44269504088896341f);
    float r = x - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * (r * r) + (r + 1.0f);
    union { uint32_t u; float f; } e = {.u = (uint32_t)((int32_t)n + 127) << 23};
    return p * e.f;
}

/* ISA -> implementation level of the float ops */
static int level(int isa) {
    if (isa < 0 || isa >= EF_CISA_COUNT || !(ef_compute_isa_mask() & (1u << isa))) return LV_BAD;
    switch (isa) {
    case EF_ISA_REF: return LV_REF;
    case EF_ISA_SSE2: return LV_AUTO;
    case EF_ISA_AVX2:
    case EF_ISA_AVX512:
    case EF_ISA_AVXVNNI: return LV_AVX2;
    case EF_ISA_NEON:
    case EF_ISA_NEONDOT: return LV_NEON;
    default: return LV_BAD;
    }
}

/* ======================================== scalar bodies =================================================== */
/* Written once, instantiated as _ref (EF_NOVEC) and _auto (vectoriser on). */
#define EF_SCALAR_OPS(SUF, ATTR)                                                                                     \
    ATTR static void rmsnorm_##SUF(const float *x, const float *g, float eps, float *out, int64_t d, int64_t r0,     \
                                   int64_t r1) {                                                                     \
        for (int64_t r = r0; r < r1; r++) {                                                                          \
            const float *xr = x + r * d;                                                                             \
            double ss = 0.0; /* (d,) sum of squares, double: the reference rounding is the final one only */         \
            for (int64_t i = 0; i < d; i++) ss += (double)xr[i] * xr[i];                                             \
            const float inv = (float)(1.0 / ef_sqrt(ss / (double)d + (double)eps));                                  \
            for (int64_t i = 0; i < d; i++) out[r * d + i] = xr[i] * inv * g[i];                                     \
        }                                                                                                            \
    }                                                                                                                \
    ATTR static void rope_##SUF(float *x, const float *cs, const float *sn, int64_t T, int64_t H, int64_t hd) {      \
        const int64_t h2 = hd / 2;                                                                                   \
        for (int64_t t = 0; t < T; t++)                                                                              \
            for (int64_t h = 0; h < H; h++) {                                                                        \
                float *v = x + (t * H + h) * hd;                                                                     \
                for (int64_t i = 0; i < h2; i++) {                                                                   \
                    const float a = v[2 * i], b = v[2 * i + 1], c = cs[t * h2 + i], s = sn[t * h2 + i];              \
                    const float ac = a * c, bs = b * s, as = a * s, bc = b * c;                                      \
                    v[2 * i] = ac - bs;                                                                              \
                    v[2 * i + 1] = as + bc;                                                                          \
                }                                                                                                    \
            }                                                                                                        \
    }                                                                                                                \
    ATTR static void silu_mul_##SUF(const float *g, const float *u, float *out, int64_t n) {                         \
        for (int64_t i = 0; i < n; i++) out[i] = g[i] / (1.0f + ef_expf(-g[i])) * u[i];                              \
    }                                                                                                                \
    ATTR static void add_##SUF(const float *a, const float *b, float *out, int64_t n) {                              \
        for (int64_t i = 0; i < n; i++) out[i] = a[i] + b[i];                                                        \
    }                                                                                                                \
    ATTR static void quantize_##SUF(const float *x, float scale, int8_t *out, int64_t n) {                           \
        for (int64_t i = 0; i < n; i++) {                                                                            \
            float q = __builtin_rintf(x[i] / scale);                                                                 \
            q = q > 127.0f ? 127.0f : (q < -127.0f ? -127.0f : q);                                                   \
            out[i] = (int8_t)q;                                                                                      \
        }                                                                                                            \
    }                                                                                                                \
    ATTR static void dequant_##SUF(const int32_t *acc, float xs, const float *ws, float *out, int64_t N, int64_t r0, \
                                   int64_t r1) {                                                                     \
        for (int64_t r = r0; r < r1; r++)                                                                            \
            for (int64_t c = 0; c < N; c++) {                                                                        \
                const float s = xs * ws[c];                                                                          \
                out[r * N + c] = (float)acc[r * N + c] * s;                                                          \
            }                                                                                                        \
    }                                                                                                                \
    ATTR static float absmax_##SUF(const float *x, int64_t n) {                                                      \
        float m = 0.0f;                                                                                              \
        for (int64_t i = 0; i < n; i++) {                                                                            \
            const float a = __builtin_fabsf(x[i]);                                                                   \
            m = a > m ? a : m;                                                                                       \
        }                                                                                                            \
        return m;                                                                                                    \
    }

EF_SCALAR_OPS(ref, EF_NOVEC)
EF_SCALAR_OPS(auto, )

/* Attention for one query row and one head (scalar): scores (L,) scratch. Shared by _ref and _auto. */
#define EF_ATTN_SCALAR(SUF, ATTR)                                                                                    \
    ATTR static void attn_row_##SUF(const float *q, const float *kc, const float *vc, int64_t L, int64_t KVhd,       \
                                    int64_t hd, float scale, float *sc, float *o) {                                  \
        float mx = -INFINITY;                                                                                        \
        for (int64_t j = 0; j < L; j++) {                                                                            \
            float s = 0.0f;                                                                                          \
            for (int64_t i = 0; i < hd; i++) s += q[i] * kc[j * KVhd + i];                                           \
            sc[j] = s * scale;                                                                                       \
            mx = sc[j] > mx ? sc[j] : mx;                                                                            \
        }                                                                                                            \
        float den = 0.0f;                                                                                            \
        for (int64_t j = 0; j < L; j++) den += (sc[j] = ef_expf(sc[j] - mx));                                        \
        for (int64_t i = 0; i < hd; i++) o[i] = 0.0f;                                                                \
        for (int64_t j = 0; j < L; j++)                                                                              \
            for (int64_t i = 0; i < hd; i++) o[i] += sc[j] * vc[j * KVhd + i];                                       \
        const float inv = 1.0f / den;                                                                                \
        for (int64_t i = 0; i < hd; i++) o[i] *= inv;                                                                \
    }
EF_ATTN_SCALAR(ref, EF_NOVEC)
EF_ATTN_SCALAR(auto, )

#ifdef EF_X86
/* ======================================== AVX2 + FMA ====================================================== */
#define EF_TAVX2 __attribute__((target("avx2,fma")))

/* exp(x), 8 lanes, Cephes-style: x = n ln2 + r, |r| <= ln2/2, degree-6 polynomial, 2^n through the exponent bits.
 * Relative error ~2 ulp for x in [-87, 88]; below -87.3 returns 0 (no denormals), above 88.3 clamps. */
EF_TAVX2 EF_INLINE __m256 exp256(__m256 x) {
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.33f)), _mm256_set1_ps(88.37f));
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

EF_TAVX2 EF_INLINE float hsum256(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

EF_TAVX2 static void rmsnorm_avx2(const float *x, const float *g, float eps, float *out, int64_t d, int64_t r0,
                                  int64_t r1) {
    for (int64_t r = r0; r < r1; r++) {
        const float *xr = x + r * d;
        __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
        int64_t i = 0;
        for (; i + 16 <= d; i += 16) {
            const __m256 v0 = _mm256_loadu_ps(xr + i), v1 = _mm256_loadu_ps(xr + i + 8);
            a0 = _mm256_fmadd_ps(v0, v0, a0);
            a1 = _mm256_fmadd_ps(v1, v1, a1);
        }
        float ss = hsum256(_mm256_add_ps(a0, a1));
        for (; i < d; i++) ss += xr[i] * xr[i];
        const float inv = (float)(1.0 / ef_sqrt((double)ss / (double)d + (double)eps));
        const __m256 iv = _mm256_set1_ps(inv);
        for (i = 0; i + 8 <= d; i += 8)
            _mm256_storeu_ps(out + r * d + i,
                             _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(xr + i), iv), _mm256_loadu_ps(g + i)));
        for (; i < d; i++) out[r * d + i] = xr[i] * inv * g[i];
    }
}

EF_TAVX2 static void rope_avx2(float *x, const float *cs, const float *sn, int64_t T, int64_t H, int64_t hd) {
    const int64_t h2 = hd / 2;
    const __m256i dup = _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3);
    for (int64_t t = 0; t < T; t++)
        for (int64_t h = 0; h < H; h++) {
            float *v = x + (t * H + h) * hd;
            int64_t i = 0;
            for (; i + 4 <= h2; i += 4) { /* 4 pairs: [a b a b ...] * [c c ...] -/+ [b a b a ...] * [s s ...] */
                const __m256 xv = _mm256_loadu_ps(v + 2 * i);
                const __m256 c = _mm256_permutevar8x32_ps(_mm256_castps128_ps256(_mm_loadu_ps(cs + t * h2 + i)), dup);
                const __m256 s = _mm256_permutevar8x32_ps(_mm256_castps128_ps256(_mm_loadu_ps(sn + t * h2 + i)), dup);
                const __m256 sw = _mm256_permute_ps(xv, 0xB1);   /* swap within pairs */
                _mm256_storeu_ps(v + 2 * i, _mm256_addsub_ps(_mm256_mul_ps(xv, c), _mm256_mul_ps(sw, s)));
            }
            for (; i < h2; i++) {
                const float a = v[2 * i], b = v[2 * i + 1], c = cs[t * h2 + i], s = sn[t * h2 + i];
                const float ac = a * c, bs = b * s, as = a * s, bc = b * c;
                v[2 * i] = ac - bs;
                v[2 * i + 1] = as + bc;
            }
        }
}

EF_TAVX2 static void silu_mul_avx2(const float *g, const float *u, float *out, int64_t n) {
    int64_t i = 0;
    const __m256 one = _mm256_set1_ps(1.0f), sign = _mm256_set1_ps(-0.0f);
    for (; i + 8 <= n; i += 8) {
        const __m256 gv = _mm256_loadu_ps(g + i);
        const __m256 e = exp256(_mm256_xor_ps(gv, sign));
        _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_div_ps(gv, _mm256_add_ps(one, e)), _mm256_loadu_ps(u + i)));
    }
    for (; i < n; i++) out[i] = g[i] / (1.0f + ef_expf(-g[i])) * u[i];
}

EF_TAVX2 static void add_avx2(const float *a, const float *b, float *out, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, _mm256_add_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i)));
    for (; i < n; i++) out[i] = a[i] + b[i];
}

EF_TAVX2 static void quantize_avx2(const float *x, float scale, int8_t *out, int64_t n) {
    const __m256 sv = _mm256_set1_ps(scale), hi = _mm256_set1_ps(127.0f), lo = _mm256_set1_ps(-127.0f);
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        __m256i q[4];
        for (int k = 0; k < 4; k++) {
            __m256 v = _mm256_round_ps(_mm256_div_ps(_mm256_loadu_ps(x + i + 8 * k), sv),
                                       _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            q[k] = _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(v, lo), hi));
        }
        /* packs work per 128-bit lane: [q0 lo, q1 lo | q0 hi, q1 hi] -> fix the order with one permute */
        const __m256i p01 = _mm256_packs_epi32(q[0], q[1]), p23 = _mm256_packs_epi32(q[2], q[3]);
        const __m256i b = _mm256_packs_epi16(p01, p23);
        _mm256_storeu_si256((__m256i *)(out + i),
                            _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
    }
    for (; i < n; i++) {
        float q = __builtin_rintf(x[i] / scale);
        q = q > 127.0f ? 127.0f : (q < -127.0f ? -127.0f : q);
        out[i] = (int8_t)q;
    }
}

EF_TAVX2 static void dequant_avx2(const int32_t *acc, float xs, const float *ws, float *out, int64_t N, int64_t r0,
                                  int64_t r1) {
    const __m256 xv = _mm256_set1_ps(xs);
    for (int64_t r = r0; r < r1; r++) {
        int64_t c = 0;
        for (; c + 8 <= N; c += 8) {
            const __m256 s = _mm256_mul_ps(xv, _mm256_loadu_ps(ws + c));
            const __m256 a = _mm256_cvtepi32_ps(_mm256_loadu_si256((const __m256i *)(acc + r * N + c)));
            _mm256_storeu_ps(out + r * N + c, _mm256_mul_ps(a, s));
        }
        for (; c < N; c++) {
            const float s = xs * ws[c];
            out[r * N + c] = (float)acc[r * N + c] * s;
        }
    }
}

EF_TAVX2 static float absmax_avx2(const float *x, int64_t n) {
    const __m256 mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    __m256 m0 = _mm256_setzero_ps(), m1 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        m0 = _mm256_max_ps(m0, _mm256_and_ps(_mm256_loadu_ps(x + i), mask));
        m1 = _mm256_max_ps(m1, _mm256_and_ps(_mm256_loadu_ps(x + i + 8), mask));
    }
    float t[8], m = 0.0f;
    _mm256_storeu_ps(t, _mm256_max_ps(m0, m1));
    for (int k = 0; k < 8; k++) m = t[k] > m ? t[k] : m;
    for (; i < n; i++) m = __builtin_fabsf(x[i]) > m ? __builtin_fabsf(x[i]) : m;
    return m;
}

EF_TAVX2 static float dot_avx2(const float *a, const float *b, int64_t n) {
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
    }
    for (; i + 8 <= n; i += 8) s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    float s = hsum256(_mm256_add_ps(s0, s1));
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

EF_TAVX2 static void attn_row_avx2(const float *q, const float *kc, const float *vc, int64_t L, int64_t KVhd,
                                   int64_t hd, float scale, float *sc, float *o) {
    float mx = -INFINITY;
    for (int64_t j = 0; j < L; j++) {              /* scores: one dot product per key */
        sc[j] = dot_avx2(q, kc + j * KVhd, hd) * scale;
        mx = sc[j] > mx ? sc[j] : mx;
    }
    const __m256 mv = _mm256_set1_ps(mx);
    __m256 dv = _mm256_setzero_ps();
    int64_t j = 0;
    for (; j + 8 <= L; j += 8) {                   /* p = exp(s - max), sum */
        const __m256 e = exp256(_mm256_sub_ps(_mm256_loadu_ps(sc + j), mv));
        _mm256_storeu_ps(sc + j, e);
        dv = _mm256_add_ps(dv, e);
    }
    float den = hsum256(dv);
    for (; j < L; j++) den += (sc[j] = ef_expf(sc[j] - mx));
    for (int64_t i = 0; i < hd; i++) o[i] = 0.0f;
    for (j = 0; j < L; j++) {                      /* o += p_j v_j */
        const __m256 p = _mm256_set1_ps(sc[j]);
        const float *v = vc + j * KVhd;
        int64_t i = 0;
        for (; i + 8 <= hd; i += 8)
            _mm256_storeu_ps(o + i, _mm256_fmadd_ps(p, _mm256_loadu_ps(v + i), _mm256_loadu_ps(o + i)));
        for (; i < hd; i++) o[i] += sc[j] * v[i];
    }
    const __m256 inv = _mm256_set1_ps(1.0f / den);
    int64_t i = 0;
    for (; i + 8 <= hd; i += 8) _mm256_storeu_ps(o + i, _mm256_mul_ps(_mm256_loadu_ps(o + i), inv));
    for (; i < hd; i++) o[i] *= 1.0f / den;
}
#endif /* EF_X86 */

#ifdef EF_NEON
/* ======================================== NEON ============================================================ */
/* exp(x), 4 lanes, same scheme and constants as exp256 */
EF_INLINE float32x4_t exp_neon(float32x4_t x) {
    x = vminq_f32(vmaxq_f32(x, vdupq_n_f32(-87.33f)), vdupq_n_f32(88.37f));
    const float32x4_t n = vrndnq_f32(vmulq_f32(x, vdupq_n_f32(1.44269504088896341f)));
    float32x4_t r = vfmsq_f32(x, n, vdupq_n_f32(0.693359375f));
    r = vfmsq_f32(r, n, vdupq_n_f32(-2.12194440e-4f));
    float32x4_t p = vdupq_n_f32(1.9875691500e-4f);
    p = vfmaq_f32(vdupq_n_f32(1.3981999507e-3f), p, r);
    p = vfmaq_f32(vdupq_n_f32(8.3334519073e-3f), p, r);
    p = vfmaq_f32(vdupq_n_f32(4.1665795894e-2f), p, r);
    p = vfmaq_f32(vdupq_n_f32(1.6666665459e-1f), p, r);
    p = vfmaq_f32(vdupq_n_f32(5.0000001201e-1f), p, r);
    p = vfmaq_f32(vaddq_f32(r, vdupq_n_f32(1.0f)), p, vmulq_f32(r, r));
    const int32x4_t e = vshlq_n_s32(vaddq_s32(vcvtq_s32_f32(n), vdupq_n_s32(127)), 23);
    return vmulq_f32(p, vreinterpretq_f32_s32(e));
}

static void rmsnorm_neon(const float *x, const float *g, float eps, float *out, int64_t d, int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; r++) {
        const float *xr = x + r * d;
        float32x4_t a0 = vdupq_n_f32(0.0f), a1 = vdupq_n_f32(0.0f);
        int64_t i = 0;
        for (; i + 8 <= d; i += 8) {
            const float32x4_t v0 = vld1q_f32(xr + i), v1 = vld1q_f32(xr + i + 4);
            a0 = vfmaq_f32(a0, v0, v0);
            a1 = vfmaq_f32(a1, v1, v1);
        }
        float ss = vaddvq_f32(vaddq_f32(a0, a1));
        for (; i < d; i++) ss += xr[i] * xr[i];
        const float inv = (float)(1.0 / ef_sqrt((double)ss / (double)d + (double)eps));
        for (i = 0; i + 4 <= d; i += 4)
            vst1q_f32(out + r * d + i, vmulq_f32(vmulq_n_f32(vld1q_f32(xr + i), inv), vld1q_f32(g + i)));
        for (; i < d; i++) out[r * d + i] = xr[i] * inv * g[i];
    }
}

static void rope_neon(float *x, const float *cs, const float *sn, int64_t T, int64_t H, int64_t hd) {
    const int64_t h2 = hd / 2;
    for (int64_t t = 0; t < T; t++)
        for (int64_t h = 0; h < H; h++) {
            float *v = x + (t * H + h) * hd;
            int64_t i = 0;
            for (; i + 4 <= h2; i += 4) { /* de-interleave 4 pairs, rotate, re-interleave */
                const float32x4x2_t ab = vld2q_f32(v + 2 * i);
                const float32x4_t c = vld1q_f32(cs + t * h2 + i), s = vld1q_f32(sn + t * h2 + i);
                float32x4x2_t o;
                o.val[0] = vsubq_f32(vmulq_f32(ab.val[0], c), vmulq_f32(ab.val[1], s));
                o.val[1] = vaddq_f32(vmulq_f32(ab.val[0], s), vmulq_f32(ab.val[1], c));
                vst2q_f32(v + 2 * i, o);
            }
            for (; i < h2; i++) {
                const float a = v[2 * i], b = v[2 * i + 1], c = cs[t * h2 + i], s = sn[t * h2 + i];
                const float ac = a * c, bs = b * s, as = a * s, bc = b * c;
                v[2 * i] = ac - bs;
                v[2 * i + 1] = as + bc;
            }
        }
}

static void silu_mul_neon(const float *g, const float *u, float *out, int64_t n) {
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
        const float32x4_t gv = vld1q_f32(g + i);
        const float32x4_t e = exp_neon(vnegq_f32(gv));
        vst1q_f32(out + i, vmulq_f32(vdivq_f32(gv, vaddq_f32(vdupq_n_f32(1.0f), e)), vld1q_f32(u + i)));
    }
    for (; i < n; i++) out[i] = g[i] / (1.0f + ef_expf(-g[i])) * u[i];
}

static void add_neon(const float *a, const float *b, float *out, int64_t n) {
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) vst1q_f32(out + i, vaddq_f32(vld1q_f32(a + i), vld1q_f32(b + i)));
    for (; i < n; i++) out[i] = a[i] + b[i];
}

static void quantize_neon(const float *x, float scale, int8_t *out, int64_t n) {
    const float32x4_t sv = vdupq_n_f32(scale), hi = vdupq_n_f32(127.0f), lo = vdupq_n_f32(-127.0f);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        int32x4_t q[2];
        for (int k = 0; k < 2; k++) {
            const float32x4_t v = vrndnq_f32(vdivq_f32(vld1q_f32(x + i + 4 * k), sv));
            q[k] = vcvtq_s32_f32(vminq_f32(vmaxq_f32(v, lo), hi));
        }
        vst1_s8(out + i, vmovn_s16(vcombine_s16(vmovn_s32(q[0]), vmovn_s32(q[1]))));
    }
    for (; i < n; i++) {
        float q = __builtin_rintf(x[i] / scale);
        q = q > 127.0f ? 127.0f : (q < -127.0f ? -127.0f : q);
        out[i] = (int8_t)q;
    }
}

static void dequant_neon(const int32_t *acc, float xs, const float *ws, float *out, int64_t N, int64_t r0,
                         int64_t r1) {
    for (int64_t r = r0; r < r1; r++) {
        int64_t c = 0;
        for (; c + 4 <= N; c += 4) {
            const float32x4_t s = vmulq_n_f32(vld1q_f32(ws + c), xs);
            vst1q_f32(out + r * N + c, vmulq_f32(vcvtq_f32_s32(vld1q_s32(acc + r * N + c)), s));
        }
        for (; c < N; c++) {
            const float s = xs * ws[c];
            out[r * N + c] = (float)acc[r * N + c] * s;
        }
    }
}

static float absmax_neon(const float *x, int64_t n) {
    float32x4_t m = vdupq_n_f32(0.0f);
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) m = vmaxq_f32(m, vabsq_f32(vld1q_f32(x + i)));
    float r = vmaxvq_f32(m);
    for (; i < n; i++) r = __builtin_fabsf(x[i]) > r ? __builtin_fabsf(x[i]) : r;
    return r;
}

static void attn_row_neon(const float *q, const float *kc, const float *vc, int64_t L, int64_t KVhd, int64_t hd,
                          float scale, float *sc, float *o) {
    float mx = -INFINITY;
    for (int64_t j = 0; j < L; j++) {
        const float *k = kc + j * KVhd;
        float32x4_t s4 = vdupq_n_f32(0.0f);
        int64_t i = 0;
        for (; i + 4 <= hd; i += 4) s4 = vfmaq_f32(s4, vld1q_f32(q + i), vld1q_f32(k + i));
        float s = vaddvq_f32(s4);
        for (; i < hd; i++) s += q[i] * k[i];
        sc[j] = s * scale;
        mx = sc[j] > mx ? sc[j] : mx;
    }
    float32x4_t d4 = vdupq_n_f32(0.0f);
    int64_t j = 0;
    for (; j + 4 <= L; j += 4) {
        const float32x4_t e = exp_neon(vsubq_f32(vld1q_f32(sc + j), vdupq_n_f32(mx)));
        vst1q_f32(sc + j, e);
        d4 = vaddq_f32(d4, e);
    }
    float den = vaddvq_f32(d4);
    for (; j < L; j++) den += (sc[j] = ef_expf(sc[j] - mx));
    for (int64_t i = 0; i < hd; i++) o[i] = 0.0f;
    for (j = 0; j < L; j++) {
        const float *v = vc + j * KVhd;
        int64_t i = 0;
        for (; i + 4 <= hd; i += 4) vst1q_f32(o + i, vfmaq_n_f32(vld1q_f32(o + i), vld1q_f32(v + i), sc[j]));
        for (; i < hd; i++) o[i] += sc[j] * v[i];
    }
    const float inv = 1.0f / den;
    for (int64_t i = 0; i < hd; i++) o[i] *= inv;
}
#endif /* EF_NEON */

/* ======================================== public entry points ============================================== */
#ifdef EF_X86
#define EF_X86_CASE(CALL) case LV_AVX2: CALL; break;
#else
#define EF_X86_CASE(CALL)
#endif
#ifdef EF_NEON
#define EF_NEON_CASE(CALL) case LV_NEON: CALL; break;
#else
#define EF_NEON_CASE(CALL)
#endif
/* run NAME_<level>(ARGS) for the level of `isa`; EF_E_ISA when unavailable */
#define EF_DISPATCH(NAME, ARGS)                                                                                      \
    switch (level(isa)) {                                                                                            \
    case LV_REF: NAME##_ref ARGS; break;                                                                             \
    case LV_AUTO: NAME##_auto ARGS; break;                                                                           \
    EF_X86_CASE(NAME##_avx2 ARGS)                                                                                    \
    EF_NEON_CASE(NAME##_neon ARGS)                                                                                   \
    default: return EF_E_ISA;                                                                                        \
    }

int ef_rmsnorm_f32(int isa, const float *x, const float *g, float eps, float *out, int64_t M, int64_t d, int64_t r0,
                   int64_t r1) {
    if (level(isa) == LV_BAD) return EF_E_ISA;
    if (M < 0 || d < 1 || r0 < 0 || r0 > r1 || r1 > M || !(eps >= 0.0f)) return EF_E_ARG;
    EF_DISPATCH(rmsnorm, (x, g, eps, out, d, r0, r1))
    return EF_OK;
}

int ef_rope_f32(int isa, float *x, const float *cos, const float *sin, int64_t T, int64_t H, int64_t hd) {
    if (level(isa) == LV_BAD) return EF_E_ISA;
    if (T < 0 || H < 0 || hd < 2 || hd % 2) return EF_E_ARG;
    EF_DISPATCH(rope, (x, cos, sin, T, H, hd))
    return EF_OK;
}

int ef_attention_f32(int isa, const float *q, const float *kcache, const float *vcache, int64_t ctx_cap,
                     int64_t past, int64_t m, int64_t H, int64_t KV, int64_t hd, float *out, int64_t h0, int64_t h1) {
    const int lv = level(isa);
    if (lv == LV_BAD) return EF_E_ISA;
    if (m < 0 || past < 0 || H < 1 || KV < 1 || H % KV || hd < 1 || past + m > ctx_cap || h0 < 0 || h0 > h1 ||
        h1 > H)
        return EF_E_ARG;
    const int64_t L = past + m, group = H / KV, KVhd = KV * hd;
    float stack[1024];
    float *sc = L <= 1024 ? stack : malloc((size_t)L * sizeof(float));   /* (L,) scores of one row */
    if (!sc) return EF_E_ARG;
    const float scale = (float)(1.0 / ef_sqrt((double)hd));
    for (int64_t i = 0; i < m; i++)
        for (int64_t h = h0; h < h1; h++) {
            const float *qi = q + (i * H + h) * hd;
            const float *kc = kcache + (h / group) * hd, *vc = vcache + (h / group) * hd;
            float *o = out + i * H * hd + h * hd;
            const int64_t n = past + i + 1;                  /* causal: keys 0..past+i */
            switch (lv) {
            case LV_REF: attn_row_ref(qi, kc, vc, n, KVhd, hd, scale, sc, o); break;
            case LV_AUTO: attn_row_auto(qi, kc, vc, n, KVhd, hd, scale, sc, o); break;
#ifdef EF_X86
            case LV_AVX2: attn_row_avx2(qi, kc, vc, n, KVhd, hd, scale, sc, o); break;
#endif
#ifdef EF_NEON
            case LV_NEON: attn_row_neon(qi, kc, vc, n, KVhd, hd, scale, sc, o); break;
#endif
            default: break;
            }
        }
    if (sc != stack) free(sc);
    return EF_OK;
}

int ef_silu_mul_f32(int isa, const float *g, const float *u, float *out, int64_t n) {
    if (level(isa) == LV_BAD) return EF_E_ISA;
    if (n < 0) return EF_E_ARG;
    EF_DISPATCH(silu_mul, (g, u, out, n))
    return EF_OK;
}

int ef_add_f32(int isa, const float *a, const float *b, float *out, int64_t n) {
    if (level(isa) == LV_BAD) return EF_E_ISA;
    if (n < 0) return EF_E_ARG;
    EF_DISPATCH(add, (a, b, out, n))
    return EF_OK;
}

int ef_quantize_f32_i8(int isa, const float *x, float scale, int8_t *out, int64_t n) {
    if (level(isa) == LV_BAD) return EF_E_ISA;
    if (n < 0) return EF_E_ARG;
    if (!(scale > 0.0f)) { /* scale <= 0 (or NaN): the tensor was all zeros at calibration */
        if (n) memset(out, 0, (size_t)n);
        return EF_OK;
    }
    EF_DISPATCH(quantize, (x, scale, out, n))
    return EF_OK;
}

int ef_dequant_i32_f32(int isa, const int32_t *acc, float x_scale, const float *w_scale, float *out, int64_t M,
                       int64_t N, int64_t r0, int64_t r1) {
    if (level(isa) == LV_BAD) return EF_E_ISA;
    if (M < 0 || N < 0 || r0 < 0 || r0 > r1 || r1 > M) return EF_E_ARG;
    EF_DISPATCH(dequant, (acc, x_scale, w_scale, out, N, r0, r1))
    return EF_OK;
}

float ef_absmax_f32(int isa, const float *x, int64_t n) {
    if (level(isa) == LV_BAD || n < 0) return -1.0f;
    switch (level(isa)) {
    case LV_REF: return absmax_ref(x, n);
    case LV_AUTO: return absmax_auto(x, n);
#ifdef EF_X86
    case LV_AVX2: return absmax_avx2(x, n);
#endif
#ifdef EF_NEON
    case LV_NEON: return absmax_neon(x, n);
#endif
    default: return -1.0f;
    }
}
