/* ef_profile.c — standalone layer-profiling runner: times Voltron sublayer variants with the native kernels on the
 * device it runs on (Voltron paper §4.2.1: the latency regression is fitted on measured profiling runs of "layer
 * type, precision, input token length and the number of tokens accumulated in the KV cache"; docs/cluster.md
 * "Phones over adb"). No Python: `make runner` builds it for this host, `make runner-aarch64` statically for
 * aarch64 (Android phones via `hil/adb.py`, or qemu-aarch64 in the tests).
 *
 * Per variant it builds random weights of one sublayer shard shape at one precision (deterministic seed, weights
 * identical on every build), runs the op sequence of hil/cluster/shard_ops.py and times it:
 *   attn  RMSNorm -> stacked Q/K/V GEMM of the n_held KV-head groups -> per group RoPE, KV append at kv_len,
 *         causal GQA attention over kv_len + n_tokens keys, O GEMM -> float64 sum of the groups
 *   ffn   RMSNorm -> stacked gate/up GEMM of the n_held channel groups (ffn_dim / ffn_shards channels each) ->
 *         per group SiLU(gate) * up, down GEMM -> float64 sum
 *   head  final RMSNorm of the last token -> LM-head GEMV (vocab, d_model)
 * Precisions (shard_ops semantics): 1 int8 = per-output-channel symmetric codes in [-127, 127], W8A8 with a
 * dynamic absmax activation scale; 2 int4 = codes in [-7, 7] on the same kernel (nibble packing not emulated);
 * 0 fp16 = weights rounded to IEEE half (round to nearest even), widened to float32 once at load and run by a
 * portable float32 GEMM (the timed FP16 path is float32 compute on float32 weights, on x86 and on aarch64 alike).
 * Single-threaded; the best compute ISA of the CPU unless --isa forces one.
 *
 * Timing: one warm call, then calls back to back (clock_gettime CLOCK_MONOTONIC) until at least --window seconds
 * and --calls calls; reported: time_s = window / calls (seconds per call), min_s and median_s of the single calls.
 *
 * Checksums (cross-build check):
 *   ck_int    over the integer path: the weight codes (int8 / int4) or half bit patterns (fp16), the float32 bit
 *             patterns of the channel scales, and the int32 results of every integer GEMM of the variant applied
 *             to a probe int8 activation matrix drawn from the seeded generator — identical on every build and ISA
 *             (tests/hil_cluster/test_adb.py reproduces it in NumPy with shard_ops' quantizer).
 *   out_abs   sum |output| (float64) of the warm call: float path, equal across builds within a relative
 *             tolerance (float op order, libm, and activation codes near a rounding tie differ; hil/adb.py
 *             FLOAT_RTOL).
 *
 * Usage: ef_profile [--window S] [--calls N] [--isa NAME] [--seed N] variants.txt out.jsonl
 * Input, one variant per line (blank lines and '#' comments skipped), key=value tokens:
 *   kind=attn|ffn|head precision=0|1|2 n_tokens=N kv_len=N n_held=N d_model=N n_heads=N n_kv_heads=N head_dim=N
 *   ffn_dim=N ffn_shards=N vocab=N [rope_base=F] [norm_eps=F] [id=N]
 * Output, one JSON object per variant line (times in seconds, t0_s / t1_s from the program start).
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ef.h"
#include "ef_compute.h"

static const char *ISA_NAMES[EF_CISA_COUNT] = {"ref", "sse2", "avx2", "avx512", "neon", "avxvnni", "neondot"};
enum { FP16 = 0, INT8 = 1, INT4 = 2 };
static const int QMAX[3] = {0, 127, 7};
#define MAX_CALLS 4096                      /* single-call times kept for min / median */
#define W_AMP 0.0625f                       /* weights uniform in [-W_AMP, W_AMP) (exact: power of two) */
#define CK_MUL 1099511628211ull             /* checksum fold (FNV-1a 64 prime / offset basis) */
#define CK_INIT 1469598103934665603ull
/* generator streams (tags) */
enum { TAG_FRONT = 1, TAG_BACK = 16, TAG_NORM = 200, TAG_H = 201, TAG_K = 202, TAG_V = 203, TAG_PROBE = 300 };

/* ---- deterministic generator and checksums --------------------------------------------------------------- */
static uint64_t mix64(uint64_t z) { /* splitmix64 finaliser */
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static uint64_t stream_key(uint64_t seed, uint64_t tag) { return mix64(seed ^ (tag * 0xD1B54A32D192ED03ull)); }
/* element i of stream `key` */
static uint64_t draw(uint64_t key, uint64_t i) { return mix64(key + (i + 1) * 0x9E3779B97F4A7C15ull); }
/* uniform float in [-amp, amp): 24 random bits, exact in float32 */
static float draw_f32(uint64_t key, uint64_t i, float amp) {
    return (float)((int64_t)(draw(key, i) >> 40) - 8388608) * (amp / 8388608.0f);
}
static void fill_f32(float *x, int64_t n, uint64_t key, float amp, float offset) {
    for (int64_t i = 0; i < n; i++) x[i] = offset + draw_f32(key, (uint64_t)i, amp);
}
/* position-weighted sum mod 2^64 of n signed values (v_i * (2i + 1)), folded into c */
static uint64_t ck_fold(uint64_t c, const int64_t *v, int64_t n) {
    uint64_t s = 0;
    for (int64_t i = 0; i < n; i++) s += (uint64_t)v[i] * (2 * (uint64_t)i + 1);
    return c * CK_MUL + s;
}
#define CK_ARRAY(c, type, p, n)                                                                                     \
    do {                                                                                                            \
        int64_t *t_ = malloc(((size_t)(n) + 1) * sizeof(int64_t));                                                  \
        for (int64_t i_ = 0; i_ < (n); i_++) t_[i_] = (int64_t)((const type *)(p))[i_];                            \
        (c) = ck_fold((c), t_, (n));                                                                                \
        free(t_);                                                                                                   \
    } while (0)

/* ---- IEEE half (round to nearest even; after F. Giesen's float_to_half_fast3_rtne) -------------------------- */
static uint16_t f32_to_f16(float f) {
    uint32_t x, sign;
    memcpy(&x, &f, 4);
    sign = x & 0x80000000u;
    x ^= sign;
    uint16_t o;
    if (x >= 0x47800000u) {                 /* >= 65536: inf (or nan) */
        o = x > 0x7f800000u ? 0x7e00 : 0x7c00;
    } else if (x < 0x38800000u) {           /* < 2^-14: subnormal half or zero, rounded by a float add */
        const uint32_t magic_u = (uint32_t)((127 - 15) + (23 - 10) + 1) << 23;
        float magic, fx;
        memcpy(&magic, &magic_u, 4);
        memcpy(&fx, &x, 4);
        fx += magic;
        memcpy(&x, &fx, 4);
        o = (uint16_t)(x - magic_u);
    } else {
        const uint32_t odd = (x >> 13) & 1;
        x += ((uint32_t)(15 - 127) << 23) + 0xfff + odd;
        o = (uint16_t)(x >> 13);
    }
    return (uint16_t)(o | (sign >> 16));
}
static float f16_to_f32(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ff;
    uint32_t b;
    float f;
    if (e == 0) {
        f = ldexpf((float)m, -24);          /* zero or subnormal, exact */
        return sign ? -f : f;
    }
    b = sign | (e == 31 ? 0x7f800000u | (m << 13) : ((e + 112) << 23) | (m << 13));
    memcpy(&f, &b, 4);
    return f;
}

/* ---- linear layer: y (M, N) = x (M, K) . w^T at one precision ------------------------------------------------ */
typedef struct {
    int precision;
    int64_t N, K;
    int8_t *codes;       /* (N, K) int8 / int4 codes, or NULL */
    float *scale;        /* (N,) per-output-channel scale, or NULL */
    uint16_t *half;      /* (N, K) fp16 bit patterns (kept for the checksum), or NULL */
    float *wf;           /* (N, K) fp16 weights widened to float32 (the timed fp16 operand), or NULL */
} Linear;

/* weights of stream `tag` quantized as shard_ops.QLinear.quantize; folds the integer path into *ck */
static Linear linear_make(int precision, int64_t N, int64_t K, uint64_t seed, uint64_t tag, uint64_t *ck) {
    Linear L = {precision, N, K, NULL, NULL, NULL, NULL};
    float *w = malloc((size_t)(N * K) * sizeof(float));                      /* (N, K) */
    fill_f32(w, N * K, stream_key(seed, tag), W_AMP, 0.0f);
    if (precision == FP16) {
        L.half = malloc((size_t)(N * K) * sizeof(uint16_t));
        L.wf = w;
        for (int64_t i = 0; i < N * K; i++) {
            L.half[i] = f32_to_f16(w[i]);
            L.wf[i] = f16_to_f32(L.half[i]);
        }
        CK_ARRAY(*ck, uint16_t, L.half, N * K);
        return L;
    }
    const float q = (float)QMAX[precision];
    L.codes = malloc((size_t)(N * K));
    L.scale = malloc((size_t)N * sizeof(float));
    for (int64_t n = 0; n < N; n++) {
        const float *r = w + n * K;
        float amax = 0.0f;
        for (int64_t k = 0; k < K; k++) amax = fabsf(r[k]) > amax ? fabsf(r[k]) : amax;
        L.scale[n] = amax / q;
        const float safe = L.scale[n] > 0.0f ? L.scale[n] : 1.0f;
        for (int64_t k = 0; k < K; k++) {
            float c = rintf(r[k] / safe);
            L.codes[n * K + k] = (int8_t)(c > q ? q : c < -q ? -q : c);
        }
    }
    free(w);
    CK_ARRAY(*ck, int8_t, L.codes, N * K);
    CK_ARRAY(*ck, uint32_t, L.scale, N);    /* float32 bit patterns */
    return L;
}

static void linear_free(Linear *L) {
    free(L->codes);
    free(L->scale);
    free(L->half);
    free(L->wf);
}

/* integer path of the checksum: this layer's GEMM on a probe (M, K) int8 matrix of codes in [-127, 127] */
static uint64_t linear_probe(const Linear *L, int isa, int64_t M, uint64_t seed, uint64_t ck) {
    if (L->precision == FP16) return ck;
    int8_t *x8 = malloc((size_t)(M * L->K));
    int32_t *acc = malloc((size_t)(M * L->N) * sizeof(int32_t));
    const uint64_t key = stream_key(seed, TAG_PROBE);
    for (int64_t i = 0; i < M * L->K; i++) x8[i] = (int8_t)((int64_t)((draw(key, (uint64_t)i) >> 32) % 255) - 127);
    ef_gemm_i8_i32(isa, x8, L->codes, acc, M, L->K, L->N, 0, L->N);
    CK_ARRAY(ck, int32_t, acc, M * L->N);
    free(x8);
    free(acc);
    return ck;
}

/* scratch buffers of one variant, sized for its largest linear */
typedef struct {
    int8_t *x8;          /* (M, K) activation codes */
    int32_t *acc;        /* (M, N) int32 sums */
} Scratch;

/* hot loop of the fp16 path: y (M, N) = x (M, K) . wf^T, float32, 8 partial sums per dot product */
static void gemm_f32(const float *x, const float *w, float *y, int64_t M, int64_t K, int64_t N) {
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < N; n++) {
            const float *a = x + m * K, *b = w + n * K;
            float s[8] = {0};
            int64_t k = 0;
            for (; k + 8 <= K; k += 8)
                for (int j = 0; j < 8; j++) s[j] += a[k + j] * b[k + j];
            float t = ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
            for (; k < K; k++) t += a[k] * b[k];
            y[m * N + n] = t;
        }
}

static void linear_apply(const Linear *L, int isa, const float *x, int64_t M, float *y, Scratch *s) {
    if (L->precision == FP16) {
        gemm_f32(x, L->wf, y, M, L->K, L->N);
        return;
    }
    const float a = ef_absmax_f32(isa, x, M * L->K) / 127.0f;                /* dynamic per-tensor scale */
    ef_quantize_f32_i8(isa, x, a, s->x8, M * L->K);
    ef_gemm_i8_i32(isa, s->x8, L->codes, s->acc, M, L->K, L->N, 0, L->N);
    ef_dequant_i32_f32(isa, s->acc, a, L->scale, y, M, L->N, 0, M);
}

/* ---- one variant -------------------------------------------------------------------------------------------- */
typedef struct {
    int id, kind, precision;                /* kind: 0 attn, 1 ffn, 2 head */
    int64_t n_tokens, kv_len, n_held;
    int64_t d_model, n_heads, n_kv_heads, head_dim, ffn_dim, ffn_shards, vocab;
    double rope_base, norm_eps;
} Variant;

typedef struct {
    Variant v;
    int isa;
    int64_t T, gq, c, rows;                 /* tokens, query width of a KV group, FFN channels / shard, front rows
                                               per shard */
    Linear front, back[64], head;           /* front: stacked Q/K/V or gate/up of the held shards; back: O / down */
    float *g;                               /* (d,) RMSNorm gain */
    float *h, *xn, *y;                      /* (T, d) input, normed input; (T, n_held * rows) or (1, vocab) out */
    float *kc, *vc, *cos, *sin;             /* (n_held, cap, hd) KV caches; (cap, hd/2) RoPE tables */
    float *q, *k, *vv, *o, *gb, *ub, *part; /* per-shard scratch */
    double *acc;                            /* (T, d) float64 sum of the shards */
    Scratch s;
} Job;

static const char *KINDS[3] = {"attn", "ffn", "head"};

static void job_build(Job *J, uint64_t seed, uint64_t *ck) {
    const Variant *v = &J->v;
    const int64_t d = v->d_model, hd = v->head_dim, T = v->kind == 2 ? 1 : v->n_tokens;
    J->T = T;
    J->gq = v->n_heads / v->n_kv_heads * hd;
    J->c = v->ffn_dim / v->ffn_shards;
    int64_t kmax = d, nmax;
    if (v->kind == 2) {
        J->head = linear_make(v->precision, v->vocab, d, seed, TAG_FRONT, ck);
        *ck = linear_probe(&J->head, J->isa, 1, seed, *ck);
        nmax = v->vocab;
    } else {
        J->rows = v->kind == 0 ? J->gq + 2 * hd : 2 * J->c;
        const int64_t kb = v->kind == 0 ? J->gq : J->c;                     /* back linear: (d, kb) */
        J->front = linear_make(v->precision, v->n_held * J->rows, d, seed, TAG_FRONT, ck);
        *ck = linear_probe(&J->front, J->isa, T, seed, *ck);
        for (int64_t i = 0; i < v->n_held; i++) {
            J->back[i] = linear_make(v->precision, d, kb, seed, TAG_BACK + (uint64_t)i, ck);
            *ck = linear_probe(&J->back[i], J->isa, T, seed, *ck);
        }
        kmax = kb > d ? kb : d;
        nmax = v->n_held * J->rows > d ? v->n_held * J->rows : d;
    }
    J->g = malloc((size_t)d * sizeof(float));
    fill_f32(J->g, d, stream_key(seed, TAG_NORM), 0.125f, 1.0f);
    J->h = malloc((size_t)(v->n_tokens * d) * sizeof(float));
    fill_f32(J->h, v->n_tokens * d, stream_key(seed, TAG_H), 1.0f, 0.0f);
    J->xn = malloc((size_t)(T * d) * sizeof(float));
    J->y = malloc((size_t)(T * nmax) * sizeof(float));
    J->s.x8 = malloc((size_t)(T * kmax));
    J->s.acc = malloc((size_t)(T * nmax) * sizeof(int32_t));
    J->acc = calloc((size_t)(T * d), sizeof(double));
    J->part = malloc((size_t)(T * d) * sizeof(float));
    if (v->kind == 0) {                     /* KV caches with kv_len filled rows, RoPE tables */
        const int64_t cap = v->kv_len + T, n = v->n_held * cap * hd;
        J->kc = malloc((size_t)n * sizeof(float));
        J->vc = malloc((size_t)n * sizeof(float));
        fill_f32(J->kc, n, stream_key(seed, TAG_K), 1.0f, 0.0f);
        fill_f32(J->vc, n, stream_key(seed, TAG_V), 1.0f, 0.0f);
        J->cos = malloc((size_t)(cap * hd / 2) * sizeof(float));
        J->sin = malloc((size_t)(cap * hd / 2) * sizeof(float));
        for (int64_t p = 0; p < cap; p++)
            for (int64_t i = 0; i < hd / 2; i++) {
                const double ang = (double)p * pow(v->rope_base, -(double)(2 * i) / (double)hd);
                J->cos[p * hd / 2 + i] = (float)cos(ang);
                J->sin[p * hd / 2 + i] = (float)sin(ang);
            }
        J->q = malloc((size_t)(T * J->gq) * sizeof(float));
        J->k = malloc((size_t)(T * hd) * sizeof(float));
        J->vv = malloc((size_t)(T * hd) * sizeof(float));
        J->o = malloc((size_t)(T * J->gq) * sizeof(float));
    } else if (v->kind == 1) {
        J->gb = malloc((size_t)(T * J->c) * sizeof(float));
        J->ub = malloc((size_t)(T * J->c) * sizeof(float));
    }
}

static void job_free(Job *J) {
    if (J->v.kind == 2) linear_free(&J->head);
    else {
        linear_free(&J->front);
        for (int64_t i = 0; i < J->v.n_held; i++) linear_free(&J->back[i]);
    }
    void *bufs[] = {J->g, J->h, J->xn, J->y, J->s.x8, J->s.acc, J->acc, J->part, J->kc, J->vc, J->cos, J->sin,
                    J->q, J->k, J->vv, J->o, J->gb, J->ub};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
}

/* copy columns [c0, c0 + w) of src (T, ld) into dst (T, w) */
static void cols(float *dst, const float *src, int64_t T, int64_t ld, int64_t c0, int64_t w) {
    for (int64_t t = 0; t < T; t++) memcpy(dst + t * w, src + t * ld + c0, (size_t)w * sizeof(float));
}

/* one call of the variant (the timed unit); the output stays in J->acc (attn, ffn) or J->y (head) */
static void job_call(Job *J) {
    const Variant *v = &J->v;
    const int64_t d = v->d_model, hd = v->head_dim, T = J->T, isa = J->isa;
    if (v->kind == 2) {
        ef_rmsnorm_f32(isa, J->h + (v->n_tokens - 1) * d, J->g, (float)v->norm_eps, J->xn, 1, d, 0, 1);
        linear_apply(&J->head, isa, J->xn, 1, J->y, &J->s);
        return;
    }
    ef_rmsnorm_f32(isa, J->h, J->g, (float)v->norm_eps, J->xn, T, d, 0, T);
    linear_apply(&J->front, isa, J->xn, T, J->y, &J->s);                    /* (T, n_held * rows) */
    memset(J->acc, 0, (size_t)(T * d) * sizeof(double));
    const int64_t ld = v->n_held * J->rows, cap = v->kv_len + T, pos0 = v->kv_len;
    for (int64_t i = 0; i < v->n_held; i++) {
        const int64_t c0 = i * J->rows;
        if (v->kind == 0) {
            float *kc = J->kc + i * cap * hd, *vc = J->vc + i * cap * hd;
            cols(J->q, J->y, T, ld, c0, J->gq);                             /* (T, group, hd) */
            cols(J->k, J->y, T, ld, c0 + J->gq, hd);                        /* (T, 1, hd) */
            cols(J->vv, J->y, T, ld, c0 + J->gq + hd, hd);
            ef_rope_f32(isa, J->q, J->cos + pos0 * hd / 2, J->sin + pos0 * hd / 2, T, J->gq / hd, hd);
            ef_rope_f32(isa, J->k, J->cos + pos0 * hd / 2, J->sin + pos0 * hd / 2, T, 1, hd);
            memcpy(kc + pos0 * hd, J->k, (size_t)(T * hd) * sizeof(float));
            memcpy(vc + pos0 * hd, J->vv, (size_t)(T * hd) * sizeof(float));
            ef_attention_f32(isa, J->q, kc, vc, cap, pos0, T, J->gq / hd, 1, hd, J->o, 0, J->gq / hd);
            linear_apply(&J->back[i], isa, J->o, T, J->part, &J->s);        /* (T, d) */
        } else {
            cols(J->gb, J->y, T, ld, c0, J->c);                             /* (T, c) gate */
            cols(J->ub, J->y, T, ld, c0 + J->c, J->c);                      /* (T, c) up */
            ef_silu_mul_f32(isa, J->gb, J->ub, J->gb, T * J->c);
            linear_apply(&J->back[i], isa, J->gb, T, J->part, &J->s);       /* (T, d) */
        }
        for (int64_t e = 0; e < T * d; e++) J->acc[e] += J->part[e];
    }
}

/* ---- input parsing --------------------------------------------------------------------------------------------- */
static int parse_line(char *line, Variant *v, char *err, size_t nerr) {
    static const char *KEYS[] = {"n_tokens", "kv_len", "n_held", "d_model", "n_heads", "n_kv_heads", "head_dim",
                                 "ffn_dim", "ffn_shards", "vocab"};
    int64_t *dst[] = {&v->n_tokens, &v->kv_len, &v->n_held, &v->d_model, &v->n_heads, &v->n_kv_heads,
                      &v->head_dim, &v->ffn_dim, &v->ffn_shards, &v->vocab};
    int seen = 0, have_kind = 0, have_prec = 0;
    v->rope_base = 10000.0;
    v->norm_eps = 1e-5;
    for (char *tok = strtok(line, " \t\r\n"); tok; tok = strtok(NULL, " \t\r\n")) {
        char *eq = strchr(tok, '=');
        if (!eq) return snprintf(err, nerr, "token '%s' is not key=value", tok), -1;
        *eq = 0;
        const char *key = tok, *val = eq + 1;
        char *end;
        if (!strcmp(key, "kind")) {
            v->kind = !strcmp(val, "attn") ? 0 : !strcmp(val, "ffn") ? 1 : !strcmp(val, "head") ? 2 : -1;
            if (v->kind < 0) return snprintf(err, nerr, "kind: '%s' is not attn, ffn or head", val), -1;
            have_kind = 1;
            continue;
        }
        if (!strcmp(key, "rope_base") || !strcmp(key, "norm_eps")) {
            const double f = strtod(val, &end);
            if (*end || !(f > 0)) return snprintf(err, nerr, "%s: '%s' is not a positive number", key, val), -1;
            *(key[0] == 'r' ? &v->rope_base : &v->norm_eps) = f;
            continue;
        }
        const long long n = strtoll(val, &end, 10);
        if (*end || end == val || n < 0) return snprintf(err, nerr, "%s: '%s' is not an integer >= 0", key, val), -1;
        if (!strcmp(key, "precision")) {
            if (n > 2) return snprintf(err, nerr, "precision: %lld is not 0 (fp16), 1 (int8) or 2 (int4)", n), -1;
            v->precision = (int)n, have_prec = 1;
            continue;
        }
        if (!strcmp(key, "id")) {
            v->id = (int)n;
            continue;
        }
        int k = 0;
        while (k < 10 && strcmp(key, KEYS[k])) k++;
        if (k == 10) return snprintf(err, nerr, "unknown key '%s'", key), -1;
        *dst[k] = n, seen |= 1 << k;
    }
    if (!have_kind || !have_prec) return snprintf(err, nerr, "kind and precision are required"), -1;
    for (int k = 0; k < 10; k++)
        if (!(seen & (1 << k))) return snprintf(err, nerr, "%s is required", KEYS[k]), -1;
    if (v->n_tokens < 1 || v->d_model < 1 || v->n_heads < 1 || v->n_kv_heads < 1 || v->n_heads % v->n_kv_heads ||
        v->head_dim < 2 || v->head_dim % 2 || v->ffn_shards < 1 || v->ffn_dim % v->ffn_shards || v->vocab < 1)
        return snprintf(err, nerr, "inconsistent shape (n_heads %% n_kv_heads, ffn_dim %% ffn_shards, even "
                                   "head_dim, sizes >= 1)"), -1;
    const int64_t total = v->kind == 0 ? v->n_kv_heads : v->kind == 1 ? v->ffn_shards : 1;
    if (v->n_held < 1 || v->n_held > total || v->n_held > 64)
        return snprintf(err, nerr, "n_held: %lld outside 1..%lld", (long long)v->n_held,
                        (long long)(total < 64 ? total : 64)), -1;
    return 0;
}

/* ---- timing and output ------------------------------------------------------------------------------------------ */
static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
static int cmp_d(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void run_variant(const Variant *v, int isa, uint64_t seed, double window, int min_calls, double t_start,
                        FILE *out) {
    static double dts[MAX_CALLS];
    Job J;
    memset(&J, 0, sizeof J);
    J.v = *v;
    J.isa = isa;
    uint64_t ck = CK_INIT;
    job_build(&J, seed, &ck);
    job_call(&J);                                                            /* warm: page in, first output */
    double out_abs = 0.0;
    if (v->kind == 2)
        for (int64_t e = 0; e < v->vocab; e++) out_abs += fabs((double)J.y[e]);
    else
        for (int64_t e = 0; e < J.T * v->d_model; e++) out_abs += fabs(J.acc[e]);
    int calls = 0;
    const double t0 = now_s();
    double t = t0;
    while (calls < min_calls || t - t0 < window) {
        job_call(&J);
        const double t1 = now_s();
        if (calls < MAX_CALLS) dts[calls] = t1 - t;
        calls++;
        t = t1;
    }
    const int kept = calls < MAX_CALLS ? calls : MAX_CALLS;
    qsort(dts, (size_t)kept, sizeof(double), cmp_d);
    const double med = kept % 2 ? dts[kept / 2] : 0.5 * (dts[kept / 2 - 1] + dts[kept / 2]);
    fprintf(out,
            "{\"id\": %d, \"kind\": \"%s\", \"precision\": %d, \"n_tokens\": %lld, \"kv_len\": %lld, \"n_held\": "
            "%lld, \"isa\": \"%s\", \"calls\": %d, \"time_s\": %.9g, \"min_s\": %.9g, \"median_s\": %.9g, "
            "\"window_s\": %.9g, \"t0_s\": %.9f, \"t1_s\": %.9f, \"ck_int\": \"%016llx\", \"out_abs\": %.17g}\n",
            v->id, KINDS[v->kind], v->precision, (long long)v->n_tokens, (long long)v->kv_len, (long long)v->n_held,
            ISA_NAMES[isa], calls, (t - t0) / calls, dts[0], med, t - t0, t0 - t_start, t - t_start,
            (unsigned long long)ck, out_abs);
    fflush(out);
    job_free(&J);
}

int main(int argc, char **argv) {
    const double t_start = now_s();
    double window = 0.2;
    int min_calls = 3, isa = ef_compute_isa_best();
    uint64_t seed = 0;
    int a = 1;
    for (; a + 1 < argc && !strncmp(argv[a], "--", 2); a += 2) {
        const char *opt = argv[a], *val = argv[a + 1];
        if (!strcmp(opt, "--window")) window = atof(val);
        else if (!strcmp(opt, "--calls")) min_calls = atoi(val);
        else if (!strcmp(opt, "--seed")) seed = strtoull(val, NULL, 10);
        else if (!strcmp(opt, "--isa")) {
            isa = -1;
            for (int i = 0; i < EF_CISA_COUNT; i++)
                if (!strcmp(val, ISA_NAMES[i])) isa = i;
            if (isa < 0 || !(ef_compute_isa_mask() & (1u << isa))) {
                fprintf(stderr, "error: --isa: %s is not available in this build / on this CPU\n", val);
                return 2;
            }
        } else {
            fprintf(stderr, "error: unknown option %s\n", opt);
            return 2;
        }
    }
    if (argc - a != 2 || window < 0 || min_calls < 1) {
        fprintf(stderr, "usage: %s [--window S] [--calls N] [--isa NAME] [--seed N] variants.txt out.jsonl\n",
                argv[0]);
        return 2;
    }
    FILE *in = fopen(argv[a], "r");
    if (!in) {
        fprintf(stderr, "error: %s: cannot open\n", argv[a]);
        return 2;
    }
    Variant *vs = NULL;
    int nv = 0, lineno = 0;
    char line[1024], err[256];
    while (fgets(line, sizeof line, in)) {         /* parse everything before any work */
        lineno++;
        char *p = line + strspn(line, " \t\r\n");
        if (!*p || *p == '#') continue;
        vs = realloc(vs, (size_t)(nv + 1) * sizeof(Variant));
        memset(&vs[nv], 0, sizeof(Variant));
        vs[nv].id = nv;
        if (parse_line(p, &vs[nv], err, sizeof err)) {
            fprintf(stderr, "error: %s:%d: %s\n", argv[a], lineno, err);
            return 2;
        }
        nv++;
    }
    fclose(in);
    FILE *out = fopen(argv[a + 1], "w");
    if (!out) {
        fprintf(stderr, "error: %s: cannot write\n", argv[a + 1]);
        return 2;
    }
    for (int i = 0; i < nv; i++) run_variant(&vs[i], isa, seed, window, min_calls, t_start, out);
    fclose(out);
    free(vs);
    return 0;
}
