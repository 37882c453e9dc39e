/* ef_pool.c — a persistent pool of native helper threads that split one INT8 GEMM's output columns (the host HIL
 * runner's multi-threaded CPU matmuls; docs/hil.md "Runner"). A native runtime keeps its GEMM threads alive and
 * hands them work without its interpreter: here the caller computes the first column range itself and the helpers
 * the others, woken through one condition variable; the caller waits for them on a second one. Nothing in the
 * split needs Python, so a helper never waits for the interpreter lock (a Python thread pool would take it to pick
 * up each work item and again to publish its result).
 *
 * Column ranges: [n0, n1) cut into `threads` contiguous parts as n0 + n * k / threads (the same cuts as
 * hil.calibrate.split); each part runs ef_gemm_i8_i32, so the result is bit-identical to one call over [n0, n1).
 * One job at a time per pool: concurrent callers are serialized by the pool's job lock.
 */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdlib.h>

#include "ef_compute.h"

#define EF_POOL_MAX 64     /* helper threads at most */
#define EF_POOL_SPIN 20000 /* polls of the caller before it sleeps (~20-100 us) */

static inline void ef_pause(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

struct ef_pool {
    pthread_mutex_t job_lock; /* one job at a time */
    pthread_mutex_t mu;
    pthread_cond_t go;        /* helpers: a new generation of work (or stop) */
    pthread_cond_t done;      /* caller: every helper part finished */
    pthread_t th[EF_POOL_MAX];
    int helpers, started, stop;
    unsigned long gen;        /* job generation; a helper works once per generation */
    int parts;                /* parts of the current job (caller = part 0, helper i = part i + 1 < parts) */
    int pending;              /* helper parts not finished yet */
    int rc;                   /* first non-zero return code of a part */
    /* the current job */
    int isa;
    const int8_t *x, *w;
    int32_t *out;
    int64_t M, K, N, n0, n1;
};

typedef struct {
    struct ef_pool *p;
    int idx; /* 0-based helper index: runs part idx + 1 */
} helper_arg;

static int64_t cut(int64_t n0, int64_t n1, int k, int parts) { return n0 + (n1 - n0) * k / parts; }

static int run_part(struct ef_pool *p, int part) {
    return ef_gemm_i8_i32(p->isa, p->x, p->w, p->out, p->M, p->K, p->N, cut(p->n0, p->n1, part, p->parts),
                          cut(p->n0, p->n1, part + 1, p->parts));
}

static void *helper_main(void *arg) {
    struct ef_pool *p = ((helper_arg *)arg)->p;
    int idx = ((helper_arg *)arg)->idx;
    free(arg);
    unsigned long seen = 0;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->stop && p->gen == seen) pthread_cond_wait(&p->go, &p->mu);
        if (p->stop) break;
        seen = p->gen;
        if (idx + 1 >= p->parts) continue; /* this job has fewer parts than helpers */
        pthread_mutex_unlock(&p->mu);
        int rc = run_part(p, idx + 1);
        pthread_mutex_lock(&p->mu);
        if (rc != EF_OK && p->rc == EF_OK) p->rc = rc;
        if (__atomic_sub_fetch(&p->pending, 1, __ATOMIC_RELEASE) == 0) pthread_cond_signal(&p->done);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

void ef_pool_destroy(struct ef_pool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    p->stop = 1;
    pthread_cond_broadcast(&p->go);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < p->started; i++) pthread_join(p->th[i], NULL);
    pthread_cond_destroy(&p->done);
    pthread_cond_destroy(&p->go);
    pthread_mutex_destroy(&p->mu);
    pthread_mutex_destroy(&p->job_lock);
    free(p);
}

struct ef_pool *ef_pool_create(int helpers) {
    if (helpers < 0 || helpers > EF_POOL_MAX) return NULL;
    struct ef_pool *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    pthread_mutex_init(&p->job_lock, NULL);
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->go, NULL);
    pthread_cond_init(&p->done, NULL);
    p->helpers = helpers;
    for (int i = 0; i < helpers; i++) {
        helper_arg *a = malloc(sizeof *a);
        if (!a) break;
        a->p = p;
        a->idx = i;
        if (pthread_create(&p->th[i], NULL, helper_main, a) != 0) {
            free(a);
            break;
        }
        p->started++;
    }
    if (p->started != helpers) {
        ef_pool_destroy(p);
        return NULL;
    }
    return p;
}

int ef_pool_helpers(const struct ef_pool *p) { return p ? p->helpers : -1; }

int ef_pool_gemm_i8_i32(struct ef_pool *p, int threads, int isa, const int8_t *x, const int8_t *w, int32_t *out,
                        int64_t M, int64_t K, int64_t N, int64_t n0, int64_t n1) {
    if (!p || threads < 1 || n0 < 0 || n1 < n0 || n1 > N) return EF_E_ARG;
    int parts = threads <= p->helpers + 1 ? threads : p->helpers + 1;
    if (n1 - n0 < parts) parts = (int)(n1 - n0 > 0 ? n1 - n0 : 1);
    if (parts <= 1) return ef_gemm_i8_i32(isa, x, w, out, M, K, N, n0, n1);
    pthread_mutex_lock(&p->job_lock);
    pthread_mutex_lock(&p->mu);
    p->isa = isa;
    p->x = x;
    p->w = w;
    p->out = out;
    p->M = M;
    p->K = K;
    p->N = N;
    p->n0 = n0;
    p->n1 = n1;
    p->parts = parts;
    p->pending = parts - 1;
    p->rc = EF_OK;
    p->gen++;
    pthread_cond_broadcast(&p->go);
    pthread_mutex_unlock(&p->mu);
    int rc = run_part(p, 0);
    /* the helpers' parts end about when the caller's does: poll briefly before sleeping (a sleeping caller's core
     * goes idle and waking it costs a cross-core interrupt, tens of microseconds in a virtual machine) */
    for (int spin = 0; spin < EF_POOL_SPIN && __atomic_load_n(&p->pending, __ATOMIC_ACQUIRE) > 0; spin++) ef_pause();
    pthread_mutex_lock(&p->mu);
    while (p->pending > 0) pthread_cond_wait(&p->done, &p->mu);
    if (rc == EF_OK) rc = p->rc;
    pthread_mutex_unlock(&p->mu);
    pthread_mutex_unlock(&p->job_lock);
    return rc;
}
