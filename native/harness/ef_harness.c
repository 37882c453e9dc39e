/* Test / measurement harness for the C kernels outside Python (users never need it):
 *   - tests/native/test_neon_qemu.py cross-compiles it with aarch64-linux-gnu-gcc -static and runs it under
 *     qemu-aarch64 with isas "ref,neon";
 *   - tests/bench/test_unpack_bench.py compiles it natively and runs it under valgrind --tool=callgrind to count
 *     instructions per weight of one ISA (perf counters are not available on this host).
 * Usage: ef_harness in.bin out.bin isa[,isa...]   (isa names as in ef_isa_name: ref, sse2, avx2, avx512, neon)
 *
 * Input file (little-endian): u32 n_cases, then per case:
 *   u32 kind (0 weightlet, 1 mixed, 2 kquant, 3 container check, 4 raw int8) | u32 R | u64 C | u64 D |
 *   u64 bits3_len | bits3 bytes | u64 payload_len | payload bytes
 * Output file, per case: kind 0..2, 4 -> for each isa given: i32 rc | C*D int8 output;
 *                        kind 3 -> i32 rc | u32 crc32(payload) | 256-byte NUL-padded message.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ef.h"

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
    int isas[EF_ISA_COUNT], nisa = 0;
    for (char *tok = strtok(argv[3], ","); tok && nisa < EF_ISA_COUNT; tok = strtok(NULL, ",")) {
        int found = -1;
        for (int i = 0; i < EF_ISA_COUNT; i++)
            if (strcmp(tok, ef_isa_name(i)) == 0) found = i;
        if (found < 0 || !(ef_isa_mask() & (1u << found))) {
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
        if (kind == 3) {
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
                int32_t rc = kind == 0   ? ef_unpack_weightlet(isas[i], b3, C, D, R, pl, npl, o, 0, C)
                             : kind == 1 ? ef_unpack_mixed(isas[i], b3, C, D, pl, npl, o, 0, C)
                             : kind == 2 ? ef_unpack_kquant(isas[i], b3, C, D, pl, npl, o, 0, C)
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
