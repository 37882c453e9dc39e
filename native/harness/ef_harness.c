/* Test / measurement harness for the C kernels outside Python (users never need it):
 *   - tests/native/test_neon_qemu.py cross-compiles it with aarch64-linux-gnu-gcc -static and runs it under
 *     qemu-aarch64 with isas "ref,neon";
 *   - tests/bench/test_unpack_bench.py compiles it natively and runs it under valgrind --tool=callgrind to count
 *     instructions per weight of one ISA (perf counters are not available on this host).
 * Usage: ef_harness in.bin out.bin isa[,isa...]   (ref, sse2, avx2, avx512, neon and the compute-only levels avxvnni,
 * neondot of native/src/ef_compute.h; the unpack kinds run a compute-only level's base ISA: avx2 / neon)
 *
 * Input file (little-endian): u32 n_cases, then per case:
 *   u32 kind (0 weightlet, 1 mixed, 2 kquant, 3 container check, 4 raw int8) | u32 R | u64 C | u64 D |
 *   u64 bits3_len | bits3 bytes | u64 payload_len | payload bytes
 * Output file, per case: kind 0..2, 4 -> for each isa given: i32 rc | C*D int8 output;
 *                        kind 3 -> i32 rc | u32 crc32(payload) | 256-byte NUL-padded message.
 * Compute kernels (tests/native/test_compute_neon_qemu.py): the bits3 bytes hold u64 parameters (a float parameter
 * as its float32 bit pattern), the payload the inputs back to back; output per isa: i32 rc | u64 n | n bytes.
 *   5 gemm      params M K N n0 n1        payload x (M,K) i8, w (N,K) i8        -> out (M,N) i32 (0 outside [n0,n1))
 *   6 quantize  params n scale            payload x (n,) f32                    -> (n,) i8
 *   7 rmsnorm   params M d eps            payload x (M,d), g (d,) f32           -> (M,d) f32
 *   8 rope      params T H hd             payload x (T,H,hd), cos, sin (T,hd/2) -> x rotated
 *   9 attention params cap past m H KV hd payload q (m,H,hd), k, v (cap,KV,hd)  -> (m,H*hd) f32
 *  10 silu_mul  params n                  payload g, u (n,) f32                 -> (n,) f32
 *  11 dequant   params M N x_scale        payload acc (M,N) i32, w_scale (N,)   -> (M,N) f32
 *  12 add       params n                  payload a, b (n,) f32                 -> a+b (n,) f32, absmax(a) f32
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ef.h"
#include "ef_compute.h"

static const char *ISA_NAMES[EF_CISA_COUNT] = {"ref", "sse2", "avx2", "avx512", "neon", "avxvnni", "neondot"};
static const int ISA_BASE[EF_CISA_COUNT] = {0, 1, 2, 3, 4, EF_ISA_AVX2, EF_ISA_NEON}; /* for the unpack kernels */

static float f32_of(uint64_t bits) {
    union { uint32_t u; float f; } v = {.u = (uint32_t)bits};
    return v.f;
}

/* one compute case on one isa: returns rc, *out / *n_out = malloc'ed result bytes */
static int compute_case(uint32_t kind, int isa, const uint64_t *p, const uint8_t *in, uint8_t **out, uint64_t *n_out) {
    uint64_t n = 0;
    int rc = EF_E_ARG;
    switch (kind) {
    case 5: n = p[0] * p[2] * 4; break;
    case 6: n = p[0]; break;
    case 7: n = p[0] * p[1] * 4; break;
    case 8: n = p[0] * p[1] * p[2] * 4; break;
    case 9: n = p[2] * p[3] * p[5] * 4; break;
    case 10: n = p[0] * 4; break;
    case 11: n = p[0] * p[1] * 4; break;
    case 12: n = p[0] * 4 + 4; break;
    default: return EF_E_ARG;
    }
    uint8_t *o = calloc(n + 1, 1);
    const float *f = (const float *)in;
    switch (kind) {
    case 5: rc = ef_gemm_i8_i32(isa, (const int8_t *)in, (const int8_t *)in + p[0] * p[1], (int32_t *)o, p[0], p[1],
                                p[2], p[3], p[4]); break;
    case 6: rc = ef_quantize_f32_i8(isa, f, f32_of(p[1]), (int8_t *)o, p[0]); break;
    case 7: rc = ef_rmsnorm_f32(isa, f, f + p[0] * p[1], f32_of(p[2]), (float *)o, p[0], p[1], 0, p[0]); break;
    case 8:
        memcpy(o, in, n);
        rc = ef_rope_f32(isa, (float *)o, f + n / 4, f + n / 4 + p[0] * p[2] / 2, p[0], p[1], p[2]);
        break;
    case 9: {
        const uint64_t nq = p[2] * p[3] * p[5], nc = p[0] * p[4] * p[5];
        rc = ef_attention_f32(isa, f, f + nq, f + nq + nc, p[0], p[1], p[2], p[3], p[4], p[5], (float *)o, 0, p[3]);
        break;
    }
    case 10: rc = ef_silu_mul_f32(isa, f, f + p[0], (float *)o, p[0]); break;
    case 11: rc = ef_dequant_i32_f32(isa, (const int32_t *)in, f32_of(p[2]), f + p[0] * p[1], (float *)o, p[0],
                                     p[1], 0, p[0]); break;
    case 12: {
        rc = ef_add_f32(isa, f, f + p[0], (float *)o, p[0]);
        const float m = ef_absmax_f32(isa, f, p[0]);
        memcpy(o + p[0] * 4, &m, 4);
        break;
    }
    default: break;
    }
    *out = o;
    *n_out = n;
    return rc;
}

static int rd(FILE *f, void *p, size_t n) { return fread(p, 1, n, f) == n ? 0 : -1; }

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: %s in.bin out.bin isa[,isa...]\n", argv[0]);
        return 2;
    }
    FILE *in = fopen(argv[1], "rb"), *out = fopen(argv[2], "wb");
    if (!in || !out) {
        fprintf(stderr, "cannot open files\n");
        return 2;
    }
    int isas[EF_CISA_COUNT], nisa = 0;
    for (char *tok = strtok(argv[3], ","); tok && nisa < EF_CISA_COUNT; tok = strtok(NULL, ",")) {
        int found = -1;
        for (int i = 0; i < EF_CISA_COUNT; i++)
            if (strcmp(tok, ISA_NAMES[i]) == 0) found = i;
        if (found < 0 || !(ef_compute_isa_mask() & (1u << found))) {
            fprintf(stderr, "isa %s not available in this build / on this CPU\n", tok);
            return 3;
        }
        isas[nisa++] = found;
    }
    uint32_t n;
    if (rd(in, &n, 4)) return 4;
    for (uint32_t k = 0; k < n; k++) {
        uint32_t kind, R;
        uint64_t C, D, nb3, npl;
        if (rd(in, &kind, 4) || rd(in, &R, 4) || rd(in, &C, 8) || rd(in, &D, 8) || rd(in, &nb3, 8)) return 4;
        uint8_t *b3 = malloc(nb3 + 1);
        if (rd(in, b3, nb3) || rd(in, &npl, 8)) return 4;
        uint8_t *pl = malloc(npl + 1);
        if (rd(in, pl, npl)) return 4;
        if (kind >= 5) {
            uint64_t p[8] = {0};
            memcpy(p, b3, nb3 < sizeof p ? nb3 : sizeof p);
            for (int i = 0; i < nisa; i++) {
                uint8_t *o = NULL;
                uint64_t no = 0;
                int32_t rc = compute_case(kind, isas[i], p, pl, &o, &no);
                fwrite(&rc, 4, 1, out);
                fwrite(&no, 8, 1, out);
                fwrite(o, 1, no, out);
                free(o);
            }
        } else if (kind == 3) {
            char msg[256];
            memset(msg, 0, sizeof msg);
            int32_t rc = ef_container_check(pl, npl, 1, msg, sizeof msg);
            uint32_t crc = ef_crc32(0, pl, npl);
            fwrite(&rc, 4, 1, out);
            fwrite(&crc, 4, 1, out);
            fwrite(msg, 1, sizeof msg, out);
        } else {
            int8_t *o = malloc(C * D + 1);
            for (int i = 0; i < nisa; i++) {
                memset(o, 0x55, C * D);
                const int isa = ISA_BASE[isas[i]];
                int32_t rc = kind == 0   ? ef_unpack_weightlet(isa, b3, C, D, R, pl, npl, o, 0, C)
                             : kind == 1 ? ef_unpack_mixed(isa, b3, C, D, pl, npl, o, 0, C)
                             : kind == 2 ? ef_unpack_kquant(isa, b3, C, D, pl, npl, o, 0, C)
                                         : ef_unpack_int8(pl, npl, C, D, o, 0, C);
                fwrite(&rc, 4, 1, out);
                fwrite(o, 1, C * D, out);
            }
            free(o);
        }
        free(b3);
        free(pl);
    }
    fclose(out);
    fclose(in);
    return 0;
}
