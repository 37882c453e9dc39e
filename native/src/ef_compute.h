/* ef_compute.h — native compute kernels of the host hardware-in-the-loop runner (EdgeFlow paper §3.2 / §4.1:
 * W8A8 linear layers on the NPU stand-in, float32 Llama ops on the CPU; docs/hil.md "Native compute kernels").
 *
 * Conventions (golden NumPy versions: quant/ref_ops.py):
 *   - every array is C-contiguous row-major; shapes are given next to each parameter;
 *   - integer kernels (gemm, quantize, dequant, add, absmax) are bit-exact with the references, float kernels
 *     (rmsnorm, rope, attention, silu_mul) agree within the named tolerances of quant/ref_ops.py;
 *   - `isa` is an enum ef_isa value (ef.h) or one of the compute-only values below; every call returns EF_OK,
 *     EF_E_ARG (bad size / range) or EF_E_ISA (ISA not compiled in / not supported by this CPU).
 *
 * ISA levels of the compute kernels (the unpack kernels know only enum ef_isa):
 *   ref     scalar C (vectorisation disabled) — the reference every variant is tested against
 *   sse2    portable C left to the compiler's baseline (SSE2) auto-vectoriser
 *   avx2    AVX2 + FMA; GEMM sign-extends int8 to int16 and uses vpmaddwd (exact)
 *   avx512  AVX-512 F/BW (float ops); GEMM uses AVX-512 VNNI vpdpbusd when the CPU has it, else the avx2 GEMM
 *   neon    Arm NEON; GEMM with vmull_s8 + vpadalq_s16 (exact)
 *   avxvnni AVX-VNNI (256-bit vpdpbusd) GEMM; float ops as avx2                       (compute-only level)
 *   neondot NEON + dotprod (sdot) GEMM; float ops as neon                             (compute-only level)
 */
#ifndef EF_COMPUTE_H
#define EF_COMPUTE_H

#include <stdint.h>

#include "ef.h"

#ifdef __cplusplus
extern "C" {
#endif

#define EF_ISA_AVXVNNI 5 /* compute kernels only */
#define EF_ISA_NEONDOT 6 /* compute kernels only */
#define EF_CISA_COUNT 7

/* bit i set <=> compute ISA i is compiled in and supported by this CPU */
uint32_t ef_compute_isa_mask(void);
/* the fastest available compute ISA (avx512 only when the CPU has AVX-512 VNNI) */
int ef_compute_isa_best(void);
/* 1 if the avx512 level runs the VNNI GEMM on this CPU (else it runs the avx2 GEMM) */
int ef_compute_has_avx512vnni(void);

/* ---- INT8 GEMM (EdgeFlow §4.1 W8A8 on the NPU) -------------------------------------------------------------- */
/* out[m, n] = sum_k x[m, k] * w[n, k] exactly in int32, for every row m and the columns n0 <= n < n1 (other
 * columns of out are not touched: threads split N with disjoint [n0, n1)). K <= EF_GEMM_KMAX (no int32 overflow).
 *   x:   (M, K) int8 (the quantizer keeps it in [-127, 127]; every int8 value is computed exactly)
 *   w:   (N, K) int8
 *   out: (M, N) int32                                                                                         */
#define EF_GEMM_KMAX 65536
int ef_gemm_i8_i32(int isa, const int8_t *x, const int8_t *w, int32_t *out, int64_t M, int64_t K, int64_t N,
                   int64_t n0, int64_t n1);

/* ---- float32 ops of a Llama layer (CPU side) --------------------------------------------------------------- */
/* rows r0 <= r < r1 of out (M, d) = x / sqrt(mean(x^2) + eps) * g;  x (M, d), g (d,) */
int ef_rmsnorm_f32(int isa, const float *x, const float *g, float eps, float *out, int64_t M, int64_t d,
                   int64_t r0, int64_t r1);
/* in place, adjacent pairs (x[2i], x[2i+1]) of every head rotated by (cos, sin)[t, i]; x (T, H, hd), cos/sin
 * (T, hd/2), hd even */
int ef_rope_f32(int isa, float *x, const float *cos, const float *sin, int64_t T, int64_t H, int64_t hd);
/* causal grouped-query attention for heads h0 <= h < h1: query i (absolute position past + i) sees keys
 * 0..past+i of KV head h / (H / KV); scores scaled by 1/sqrt(hd), softmax with the max subtracted.
 *   q (m, H, hd); kcache, vcache (ctx_cap, KV, hd) with rows 0..past+m-1 filled; out (m, H*hd) head-major  */
int ef_attention_f32(int isa, const float *q, const float *kcache, const float *vcache, int64_t ctx_cap,
                     int64_t past, int64_t m, int64_t H, int64_t KV, int64_t hd, float *out, int64_t h0, int64_t h1);
/* out[i] = g[i] / (1 + exp(-g[i])) * u[i], n elements */
int ef_silu_mul_f32(int isa, const float *g, const float *u, float *out, int64_t n);
/* out[i] = a[i] + b[i] (out may alias a or b) */
int ef_add_f32(int isa, const float *a, const float *b, float *out, int64_t n);
/* out[i] = clamp(rint(x[i] / scale), -127, 127) (float32 division, round half to even); scale <= 0 -> zeros */
int ef_quantize_f32_i8(int isa, const float *x, float scale, int8_t *out, int64_t n);
/* rows r0 <= r < r1: out[m, n] = (float)acc[m, n] * (x_scale * w_scale[n]) (the product in float32);
 * acc (M, N) int32, w_scale (N,), out (M, N) float32 */
int ef_dequant_i32_f32(int isa, const int32_t *acc, float x_scale, const float *w_scale, float *out, int64_t M,
                       int64_t N, int64_t r0, int64_t r1);
/* max |x[i]| over n elements (0 for n = 0); returns it, or -1 for a bad isa / n < 0 */
float ef_absmax_f32(int isa, const float *x, int64_t n);

/* ---- GEMM thread pool (ef_pool.c) ------------------------------------------------------------------------------ */
/* `helpers` persistent native threads that split one GEMM's columns with the calling thread (NULL on failure). */
typedef struct ef_pool ef_pool;
ef_pool *ef_pool_create(int helpers);
void ef_pool_destroy(ef_pool *p);
int ef_pool_helpers(const ef_pool *p);
/* a helper polls for the next job `spin_ns` after its part before it sleeps (0: sleeps at once, the default) */
int ef_pool_set_spin(ef_pool *p, long spin_ns);
/* pin != 0: helpers are pinned to other CPUs than the posting caller's (re-pinned when the caller moved) */
int ef_pool_set_pin(ef_pool *p, int pin);
/* ef_gemm_i8_i32 over columns [n0, n1) split into min(threads, helpers + 1, n1 - n0) contiguous parts: the caller
 * runs the first, helpers the others; returns when all are done (the first non-zero return code of a part). */
int ef_pool_gemm_i8_i32(ef_pool *p, int threads, int isa, const int8_t *x, const int8_t *w, int32_t *out, int64_t M,
                        int64_t K, int64_t N, int64_t n0, int64_t n1);

#ifdef __cplusplus
}
#endif
#endif /* EF_COMPUTE_H */
