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
 *
 * Two things keep the parts really parallel on a machine whose idle cores halt (measured on the 2-vCPU host VM,
 * docs/hil.md "Runner"): a helper that slept was woken ~50 us after the caller posted a 16x576x1536 job (a halted
 * vCPU is woken by a cross-core interrupt, a VM exit), and the kernel's wake-up placement often put it on the
 * caller's own busy core instead (the two parts then ran one after the other, the other core idle). So, as ggml's
 * thread pool does, a helper polls for the next job for `spin_ns` after its part before it sleeps (ef_pool_set_spin;
 * 0 = sleep at once), and with pinning on (ef_pool_set_pin) the caller pins helper i to the (i+1)-th allowed CPU
 * after its own whenever it posts a job from another CPU than the last time, so a woken helper never queues behind
 * its caller.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <time.h>

#include "ef_compute.h"

#define EF_POOL_MAX 64     /* helper threads at most */
#define EF_POOL_SPIN 20000 /* polls of the caller before it sleeps (~20-100 us) */
#define EF_POOL_THREAD_NAME "ef-gemm" /* name of every helper thread (at most 15 characters) */

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
    int sleeping;             /* helpers waiting on `go` (the caller signals only then) */
    long spin_ns;             /* a helper polls for the next job this long before it sleeps */
    int pin;                  /* pin the helpers to other CPUs than the caller's */
    int pinned_for;           /* the caller CPU the helpers are pinned away from (-1: not pinned) */
    cpu_set_t allowed;        /* the process's CPUs when the pool was made */
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

static long now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long)ts.tv_sec * 1000000000L + ts.tv_nsec;
}

/* Pin helper i to the (i+1)-th allowed CPU after `cpu` (cyclically), so no helper shares the caller's CPU while
 * another one is allowed. Under p->mu. */
static void pin_helpers(struct ef_pool *p, int cpu) {
    int n = CPU_COUNT(&p->allowed);
    if (n < 2 || cpu < 0 || !CPU_ISSET(cpu, &p->allowed)) return;
    int cpus[CPU_SETSIZE], k = 0, me = 0;
    for (int c = 0; c < CPU_SETSIZE && k < n; c++)
        if (CPU_ISSET(c, &p->allowed)) {
            if (c == cpu) me = k;
            cpus[k++] = c;
        }
    for (int i = 0; i < p->started; i++) {
        cpu_set_t one;
        CPU_ZERO(&one);
        CPU_SET(cpus[(me + 1 + i % (n - 1)) % n], &one);
        pthread_setaffinity_np(p->th[i], sizeof one, &one);
    }
    p->pinned_for = cpu;
}

static void *helper_main(void *arg) {
    struct ef_pool *p = ((helper_arg *)arg)->p;
    int idx = ((helper_arg *)arg)->idx;
    free(arg);
    unsigned long seen = 0;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        long spin = p->spin_ns;
        if (spin > 0 && !p->stop && p->gen == seen) {  /* poll for the next job without the lock, then sleep */
            pthread_mutex_unlock(&p->mu);
            long t0 = now_ns();
            for (int k = 0; __atomic_load_n(&p->gen, __ATOMIC_ACQUIRE) == seen &&
                            !__atomic_load_n(&p->stop, __ATOMIC_ACQUIRE); k++) {
                ef_pause();
                if ((k & 63) == 63 && now_ns() - t0 >= spin) break;
            }
            pthread_mutex_lock(&p->mu);
        }
        p->sleeping++;
        while (!p->stop && p->gen == seen) pthread_cond_wait(&p->go, &p->mu);
        p->sleeping--;
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
    __atomic_store_n(&p->stop, 1, __ATOMIC_RELEASE);
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
    p->pinned_for = -1;
    if (sched_getaffinity(0, sizeof p->allowed, &p->allowed) != 0) CPU_ZERO(&p->allowed);
    for (int i = 0; i < helpers; i++) {
        helper_arg *a = malloc(sizeof *a);
        if (!a) break;
        a->p = p;
        a->idx = i;
        if (pthread_create(&p->th[i], NULL, helper_main, a) != 0) {
            free(a);
            break;
        }
        pthread_setname_np(p->th[i], EF_POOL_THREAD_NAME);   /* /proc/<pid>/task/<tid>/comm: tests count them */
        p->started++;
    }
    if (p->started != helpers) {
        ef_pool_destroy(p);
        return NULL;
    }
    return p;
}

int ef_pool_helpers(const struct ef_pool *p) { return p ? p->helpers : -1; }

int ef_pool_set_spin(struct ef_pool *p, long spin_ns) {
    if (!p || spin_ns < 0) return EF_E_ARG;
    pthread_mutex_lock(&p->mu);
    p->spin_ns = spin_ns;
    pthread_mutex_unlock(&p->mu);
    return EF_OK;
}

int ef_pool_set_pin(struct ef_pool *p, int pin) {
    if (!p) return EF_E_ARG;
    pthread_mutex_lock(&p->mu);
    p->pin = pin != 0;
    if (!p->pin && p->pinned_for >= 0) {           /* back to every allowed CPU */
        for (int i = 0; i < p->started; i++) pthread_setaffinity_np(p->th[i], sizeof p->allowed, &p->allowed);
        p->pinned_for = -1;
    }
    pthread_mutex_unlock(&p->mu);
    return EF_OK;
}

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
    if (p->pin) {
        int cpu = sched_getcpu();
        if (cpu != p->pinned_for) pin_helpers(p, cpu);
    }
    __atomic_store_n(&p->gen, p->gen + 1, __ATOMIC_RELEASE);   /* polling helpers see it at once */
    if (p->sleeping) pthread_cond_broadcast(&p->go);
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
