/* ef_simd.h — private to the kernel sources: which SIMD instruction sets this translation unit can compile.
 * x86: every variant is compiled (per-function target attributes) and chosen at run time; aarch64: NEON. */
#ifndef EF_SIMD_H
#define EF_SIMD_H

#if defined(__x86_64__) || defined(__i386__)
#define EF_X86 1
#include <immintrin.h>
#endif
#if defined(__aarch64__)
#define EF_NEON 1
#include <arm_neon.h>
#endif

#endif /* EF_SIMD_H */
