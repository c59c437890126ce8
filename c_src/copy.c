/*
 * copy.c: large copies into the arena, over one pool of threads.
 *
 * Copies of at least PARALLEL_COPY_BYTES are split over several threads: one
 * core's memcpy (~5-10 GB/s) is what bounds a large job from a plain binary
 * (2^26 elements: ~90 ms for two inputs on an H200 host, one thread). The
 * pipelined submit (pipeline.c) spreads its slices over the same threads.
 *
 * The threads are made once, when the library loads, and sleep on a
 * condition variable while there is nothing to copy: creating and joining
 * threads for every copy cost a clone() and an exit per thread per copy.
 * A copy is a set of numbered pieces. Its caller queues it, wakes as many
 * threads as may help, and takes pieces itself; each helper takes pieces
 * until none is left. So a copy never waits for a thread to be free (with
 * every thread busy, or none started, its caller does all of it), and at
 * most copy_threads() pieces of one copy run at once, as when each copy
 * made its own threads.
 */
#define _GNU_SOURCE
#include "device_state.h"
#include "copy.h"

#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#define PARALLEL_COPY_BYTES (16u << 20)
/* By default the pool has as many threads as there are cores, up to 16;
 * the app env copy_threads sets another number (erlcuda_nif:init/0). On the
 * H200 host (16 cores, 2026-12-03) a bare 256 MiB copy ran at 6.3 GB/s on
 * one thread, 34.4 on 8 and 42.1 on 16 (torch). Who uses how many, as
 * measured there that day:
 *   - a copy split into pieces that finish together (copy_bytes, the
 *     pipelined puts, elementwise jobs and reductions) runs at most
 *     SPREAD_COPY_THREADS pieces at once: 16 gained nothing over 8,
 *     interleaved 8 16 8 16 in one run (put of 256 MiB 32.9, 33.2, 33.8,
 *     28.5 GB/s; vector_add 2^26 from binaries 18.3, 18.4, 17.0, 19.2 ms;
 *     today's figures: buffers.put.256MiB and
 *     large.vector_add.binaries.n67108864 in bench/results/h200.json): the
 *     copy competes with the DMA for the host's memory bandwidth;
 *   - a matmul's pipeline, whose pieces are copied one after another by
 *     every thread (pipeline.c), runs on all of them: 16 against 8 took
 *     8192^3 from binaries from 39.4 / 43.0 ms to 38.3 / 38.4, and 4096^3
 *     from 8.4 / 8.6 to 7.4 / 7.4 (today's figure: matmul.end_to_end.n8192). */
#define PARALLEL_COPY_THREADS 16
#define PARALLEL_COPY_THREADS_MAX 64
/* Copies into the arena at least this large use streaming stores. */
#define STREAM_MIN_BYTES (1u << 20)

/* Threads a large copy is split over, fixed when the pool starts
 * (copy_pool_hold). */
static uint32_t THREADS = 1;
/* The nice value of the pool's threads (the app env copy_nice), fixed when
 * the pool starts. A large copy keeps up to SPREAD_COPY_THREADS cores busy
 * for milliseconds; at a higher nice value the scheduler's threads, gpud's
 * loop and the completion thread get a core first, so a small job's
 * answer does not wait a time slice behind a copy. The copy's caller (a
 * scheduler) keeps its own priority. */
static int NICE;

uint32_t copy_threads(void) { return THREADS; }

/* wanted, or (0) the cores up to PARALLEL_COPY_THREADS. */
static uint32_t pick_threads(uint32_t wanted)
{
    if (wanted > 0)
        return wanted < PARALLEL_COPY_THREADS_MAX ? wanted : PARALLEL_COPY_THREADS_MAX;
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    return cpus > PARALLEL_COPY_THREADS ? PARALLEL_COPY_THREADS : (uint32_t)(cpus > 1 ? cpus : 1);
}

/* One copy in progress: piece(arg, i) for i in 0 .. pieces - 1. */
struct copy_task {
    void (*piece)(void *arg, uint32_t i);
    void *arg;
    uint32_t pieces;
    uint32_t next;        /* __atomic: the next piece to take */
    uint32_t helpers;     /* pool threads inside the task; under the pool lock */
    uint32_t max_helpers; /* how many may be */
    struct copy_task *link;
};

struct copy_pool {
    ErlNifMutex *lock;
    ErlNifCond *work;         /* a task was queued, or stop */
    ErlNifCond *left;         /* a helper left a task */
    struct copy_task *queue;  /* tasks whose caller still takes pieces */
    int stop;
    uint32_t nthreads;
    ErlNifTid tid[PARALLEL_COPY_THREADS_MAX];
};

/* The pool, shared by every instance of this library that is loaded: an
 * upgrade that loads the same file runs load again on the same statics, so
 * the pool is held once per instance and stopped with the last (load,
 * upgrade and unload never run concurrently). */
static struct copy_pool *POOL;
static unsigned POOL_HOLDS;

static void take_pieces(struct copy_task *t)
{
    for (;;) {
        uint32_t i = __atomic_fetch_add(&t->next, 1, __ATOMIC_RELAXED);
        if (i >= t->pieces)
            return;
        t->piece(t->arg, i);
    }
}

static int task_wants_help(const struct copy_task *t)
{
    return t->helpers < t->max_helpers && __atomic_load_n(&t->next, __ATOMIC_RELAXED) < t->pieces;
}

static void *pool_thread(void *arg)
{
    struct copy_pool *p = arg;
    /* Linux: setpriority on a thread id sets that thread's nice value. A
     * value the process may not take (lower than its own without
     * CAP_SYS_NICE) is refused and the thread keeps the process's. */
    if (NICE != 0)
        (void)setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), NICE);
    enif_mutex_lock(p->lock);
    while (!p->stop) {
        struct copy_task *t = p->queue;
        while (t && !task_wants_help(t))
            t = t->link;
        if (!t) {
            enif_cond_wait(p->work, p->lock);
            continue;
        }
        t->helpers++;
        enif_mutex_unlock(p->lock);
        take_pieces(t);
        enif_mutex_lock(p->lock);
        /* The caller may be waiting for the last helper; its task lives on
         * its stack, so t is not touched after this. */
        if (--t->helpers == 0)
            enif_cond_broadcast(p->left);
    }
    enif_mutex_unlock(p->lock);
    return NULL;
}

static void pool_free(struct copy_pool *p)
{
    if (p->lock)
        enif_mutex_destroy(p->lock);
    if (p->work)
        enif_cond_destroy(p->work);
    if (p->left)
        enif_cond_destroy(p->left);
    enif_free(p);
}

static void pool_stop(struct copy_pool *p)
{
    enif_mutex_lock(p->lock);
    p->stop = 1;
    enif_cond_broadcast(p->work);
    enif_mutex_unlock(p->lock);
    for (uint32_t i = 0; i < p->nthreads; i++)
        enif_thread_join(p->tid[i], NULL);
    pool_free(p);
}

/* A pool of copy_threads() threads, or NULL when there is nothing to split
 * over (one core) or no memory; any thread that cannot be created is left
 * out: copies then run on fewer threads, or on their callers alone. */
static struct copy_pool *pool_start(void)
{
    uint32_t n = copy_threads();
    if (n < 2)
        return NULL;
    struct copy_pool *p = enif_alloc(sizeof *p);
    if (!p)
        return NULL;
    memset(p, 0, sizeof *p);
    p->lock = enif_mutex_create("erlcuda.copy_pool");
    p->work = enif_cond_create("erlcuda.copy_work");
    p->left = enif_cond_create("erlcuda.copy_left");
    if (!p->lock || !p->work || !p->left) {
        pool_free(p);
        return NULL;
    }
    for (uint32_t i = 0; i < n; i++) {
        if (enif_thread_create("erlcuda.copy", &p->tid[p->nthreads], pool_thread, p, NULL) == 0)
            p->nthreads++;
    }
    return p;
}

void copy_pool_hold(uint32_t wanted, int nice)
{
    if (POOL_HOLDS++ == 0) {
        THREADS = pick_threads(wanted);
        NICE = nice < -20 ? -20 : nice > 19 ? 19 : nice;
        POOL = pool_start();
    }
}

void copy_pool_release(void)
{
    if (POOL_HOLDS == 0 || --POOL_HOLDS > 0)
        return;
    if (POOL)
        pool_stop(POOL);
    POOL = NULL;
}

void copy_pieces(void (*piece)(void *arg, uint32_t i), void *arg, uint32_t pieces, uint32_t threads)
{
    struct copy_pool *p = POOL;
    if (threads == 0 || threads > copy_threads())
        threads = copy_threads();
    uint32_t at_once = threads < pieces ? threads : pieces;
    struct copy_task t = {.piece = piece, .arg = arg, .pieces = pieces, .next = 0,
                          .helpers = 0, .max_helpers = at_once > 0 ? at_once - 1 : 0,
                          .link = NULL};
    if (!p || p->nthreads == 0 || t.max_helpers == 0) {
        take_pieces(&t);
        return;
    }
    if (t.max_helpers > p->nthreads)
        t.max_helpers = p->nthreads;
    enif_mutex_lock(p->lock);
    struct copy_task **q = &p->queue;
    while (*q)
        q = &(*q)->link;
    *q = &t;
    for (uint32_t i = 0; i < t.max_helpers; i++)
        enif_cond_signal(p->work);
    enif_mutex_unlock(p->lock);

    take_pieces(&t);

    /* Every piece is taken: out of the queue, so no helper joins any more,
     * then wait for those still copying theirs. */
    enif_mutex_lock(p->lock);
    for (q = &p->queue; *q != &t; q = &(*q)->link)
        ;
    *q = t.link;
    while (t.helpers > 0)
        enif_cond_wait(p->left, p->lock);
    enif_mutex_unlock(p->lock);
}

/* Large copies into the arena use non-temporal (streaming) stores: the
 * destination is read next by the device's DMA or by gpud, not by this
 * core, so the stores skip the cache and the read-for-ownership of each
 * destination line that a plain store pays (a 2-core EPYC VM, 8 MiB
 * pieces, one thread: 14-16 GB/s against glibc memcpy's 7-10). */
void copy_streaming(void *dst, const void *src, size_t n)
{
#if defined(__SSE2__)
    if (n < STREAM_MIN_BYTES) {
        memcpy(dst, src, n);
        return;
    }
    uint8_t *d = dst;
    const uint8_t *s = src;
    size_t head = (16 - ((uintptr_t)d & 15)) & 15;
    memcpy(d, s, head);
    d += head;
    s += head;
    n -= head;
    size_t body = n & ~(size_t)63;
    for (size_t i = 0; i < body; i += 64) {
        __m128i a = _mm_loadu_si128((const __m128i *)(const void *)(s + i));
        __m128i b = _mm_loadu_si128((const __m128i *)(const void *)(s + i + 16));
        __m128i c = _mm_loadu_si128((const __m128i *)(const void *)(s + i + 32));
        __m128i e = _mm_loadu_si128((const __m128i *)(const void *)(s + i + 48));
        _mm_stream_si128((__m128i *)(void *)(d + i), a);
        _mm_stream_si128((__m128i *)(void *)(d + i + 16), b);
        _mm_stream_si128((__m128i *)(void *)(d + i + 32), c);
        _mm_stream_si128((__m128i *)(void *)(d + i + 48), e);
    }
    /* Streaming stores are weakly ordered: without this fence the release
     * store that publishes the descriptor (or the job) could become
     * visible before them, and gpud would read stale bytes. */
    _mm_sfence();
    memcpy(d + body, s + body, n - body);
#else
    memcpy(dst, src, n);
#endif
}

struct byte_copy {
    char *dst;
    const char *src;
    size_t n, chunk;
};

static void byte_copy_piece(void *arg, uint32_t i)
{
    struct byte_copy *b = arg;
    size_t off = (size_t)i * b->chunk;
    if (off < b->n)
        copy_streaming(b->dst + off, b->src + off, b->n - off < b->chunk ? b->n - off : b->chunk);
}

/* memcpy, in up to SPREAD_COPY_THREADS pieces at once when large. */
void copy_bytes(void *dst, const void *src, size_t n)
{
    size_t t = copy_threads() < SPREAD_COPY_THREADS ? copy_threads() : SPREAD_COPY_THREADS;
    if (n < PARALLEL_COPY_BYTES || t < 2) {
        copy_streaming(dst, src, n);
        return;
    }
    struct byte_copy b = {.dst = dst, .src = src, .n = n,
                          .chunk = (n / t + 4095) & ~(size_t)4095};
    copy_pieces(byte_copy_piece, &b, (uint32_t)t, (uint32_t)t);
}
