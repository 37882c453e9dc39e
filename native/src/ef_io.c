/* Batched positional reads for the host runner's loader threads (hil/runner.py, docs/hil.md "Runner").
 *
 * A load task reads several byte ranges of the model file (one per tensor, or pieces of one tensor) and may copy
 * each into a second ("NPU") buffer. Done from Python, each range is one os.preadv per request and the thread
 * re-takes the interpreter lock after every one: with five runner threads on two cores each re-take that finds the
 * lock held is a blocking hand-off (a futex wake-up, on this VM often onto a halted vCPU). Here the whole task is one
 * call without the lock: for every piece, pread in requests of at most `request` bytes into dst[i], then, if
 * copy[i] is not NULL, memcpy into copy[i] — the same system calls and copies, in the same order.
 */
#define _XOPEN_SOURCE 700
#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#include "ef.h"

int64_t ef_read_pieces(int fd, int64_t n, void *const *dst, const int64_t *off, const int64_t *len,
                       int64_t request, void *const *copy, int64_t *err) {
    *err = 0;
    if (fd < 0 || n < 0 || request <= 0) {
        *err = EINVAL;
        return 0;
    }
    for (int64_t i = 0; i < n; i++) {
        if (len[i] < 0 || off[i] < 0 || (len[i] > 0 && dst[i] == NULL)) {
            *err = EINVAL;
            return i;
        }
        uint8_t *p = (uint8_t *)dst[i];
        int64_t got = 0;
        while (got < len[i]) {
            int64_t want = len[i] - got < request ? len[i] - got : request;
            ssize_t k = pread(fd, p + got, (size_t)want, (off_t)(off[i] + got));
            if (k < 0 && errno == EINTR) continue;
            if (k <= 0) {                       /* error (errno) or end of file (0: a short read) */
                *err = k < 0 ? errno : 0;
                return i;
            }
            got += k;
        }
        if (copy != NULL && copy[i] != NULL && len[i] > 0) memcpy(copy[i], p, (size_t)len[i]);
    }
    return n;
}
