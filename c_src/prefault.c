#define _GNU_SOURCE
#include "prefault.h"
#include "profile.h"

#include <errno.h>
#include <signal.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23 /* Linux 5.14; older headers lack it */
#endif

/* One chunk. Returns 0, or -1 when the kernel refuses (memory is short:
 * gpud's registration will then fail or succeed on its own, no worse). */
static int populate(struct prefault *p, uint8_t *base, uint64_t bytes, uint64_t page)
{
    if (!p->touch) {
        if (madvise(base, bytes, MADV_POPULATE_WRITE) == 0)
            return 0;
        if (errno != EINVAL)
            return -1;
        p->touch = 1; /* a kernel before 5.14 */
    }
    for (uint64_t off = 0; off < bytes; off += page)
        (void)*(volatile uint8_t *)(base + off);
    return 0;
}

static void run_range(struct prefault *p, uint8_t *base, uint64_t bytes)
{
    uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
    /* madvise wants a page-aligned start; the page below is mapped too
     * (segment 0 follows the rings in the same mapping). */
    uint64_t lead = (uint64_t)(uintptr_t)base & (page - 1);
    base -= lead;
    bytes += lead;
    for (uint64_t off = 0; off < bytes; off += PREFAULT_CHUNK) {
        if (__atomic_load_n(&p->stop, __ATOMIC_ACQUIRE))
            break;
        uint64_t len = bytes - off < PREFAULT_CHUNK ? bytes - off : PREFAULT_CHUNK;
        int64_t t0 = mono_ns();
        int r = populate(p, base + off, len, page);
        __atomic_add_fetch(&p->busy_ns, (uint64_t)(mono_ns() - t0), __ATOMIC_RELAXED);
        if (r < 0)
            break;
        __atomic_add_fetch(&p->done_bytes, len, __ATOMIC_RELAXED);
    }
}

static void *prefault_thread(void *arg)
{
    struct prefault *p = arg;
    pthread_mutex_lock(&p->mx);
    for (;;) {
        while (!p->stop && p->next == p->n)
            pthread_cond_wait(&p->cv, &p->mx);
        if (p->stop)
            break;
        uint8_t *base = p->q[p->next].base;
        uint64_t bytes = p->q[p->next].bytes;
        p->next++;
        pthread_mutex_unlock(&p->mx);
        run_range(p, base, bytes);
        pthread_mutex_lock(&p->mx);
    }
    pthread_mutex_unlock(&p->mx);
    return NULL;
}

int prefault_start(struct prefault *p)
{
    memset(p, 0, sizeof *p);
    int e = pthread_mutex_init(&p->mx, NULL);
    if (e != 0)
        return -e;
    if ((e = pthread_cond_init(&p->cv, NULL)) != 0) {
        pthread_mutex_destroy(&p->mx);
        return -e;
    }
    /* The thread takes no signal: the VM's own threads handle them. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &old);
    e = pthread_create(&p->tid, NULL, prefault_thread, p);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (e != 0) {
        pthread_cond_destroy(&p->cv);
        pthread_mutex_destroy(&p->mx);
        return -e;
    }
    pthread_setname_np(p->tid, "erlcuda.pfault");
    p->started = 1;
    return 0;
}

void prefault_add(struct prefault *p, void *base, uint64_t bytes)
{
    if (!p->started || bytes == 0)
        return;
    pthread_mutex_lock(&p->mx);
    if (!p->stop && p->n < EC_MAX_SEGMENTS) {
        p->q[p->n].base = base;
        p->q[p->n].bytes = bytes;
        p->n++;
        pthread_cond_signal(&p->cv);
    }
    pthread_mutex_unlock(&p->mx);
}

void prefault_stop(struct prefault *p)
{
    if (!p->started)
        return;
    pthread_mutex_lock(&p->mx);
    __atomic_store_n(&p->stop, 1, __ATOMIC_RELEASE);
    pthread_cond_signal(&p->cv);
    pthread_mutex_unlock(&p->mx);
    pthread_join(p->tid, NULL);
    pthread_cond_destroy(&p->cv);
    pthread_mutex_destroy(&p->mx);
    p->started = 0;
}
