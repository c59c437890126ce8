/*
 * erlcuda_nif.c: the VM side of one device's shared memory.
 *
 *   submit   validates a job, copies its vectors into an arena region and
 *            publishes a descriptor on the SQ (the caller's scheduler does
 *            the copy; large inputs move to a dirty scheduler first).
 *   completion thread
 *            drains the CQ and sends {erlcuda, Ref, Result} straight to the
 *            process that called launch; no Erlang server is in the path.
 *   reset    answers every job in flight when gpud has died and zeroes the
 *            rings for the next gpud.
 *   close    does the same for good and releases the memory and fds.
 *
 * Locks, in the order they are taken:
 *   life (rwlock)  read by every user of the mapping, written by close;
 *   cq_lock        held by whoever consumes the CQ (the thread, reset);
 *   lock           slots, arena allocator, SQ tail.
 * A job slot's state moves FREE -> INFLIGHT (submit, under lock) ->
 * COMPLETING (CAS by the consumer or cancel) -> FREE (under lock). Only the
 * one that wins the CAS out of INFLIGHT sends a message, so every job gets
 * exactly one answer, or none at all when launch_sync cancelled it first.
 */
#define _GNU_SOURCE
#include <erl_nif.h>

#include <errno.h>
#include <pthread.h>
#include <math.h>
#include <poll.h>
#include <stdint.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "arena.h"
#include "erlcuda_ring.h"
#include "shm.h"

#if defined(__x86_64__) || defined(__i386__)
#define cpu_relax() __builtin_ia32_pause()
#else
#define cpu_relax() __asm__ __volatile__("" ::: "memory")
#endif

/* Above these sizes a submit moves to a dirty scheduler, so a normal
 * scheduler is never held much past ~1 ms: list conversion runs at roughly
 * 100-200 elements/us, memcpy at several GB/s (first touch of arena pages
 * included). */
#define LIST_ELEMS_ON_SCHEDULER 20000u
#define BINARY_BYTES_ON_SCHEDULER (1u << 20)

enum job_state { JOB_FREE = 0, JOB_INFLIGHT, JOB_CANCELLED, JOB_COMPLETING };

/* A vector_add whose binary inputs are at least pipeline_bytes each (option
 * of open/2) is
 * copied into the arena in slices of at least PIPELINE_SLICE_BYTES, each
 * published as soon as it is in (up to PIPELINE_MAX_PARTS descriptors), so
 * the GPU streams the first slices while the next are still being copied:
 * the end-to-end time becomes max(copy, GPU) instead of copy + GPU. */
#define PIPELINE_SLICE_BYTES (8u << 20)
#define PIPELINE_MAX_PARTS 32u

/* A byte range of one arena segment. bytes == 0: none. inl: part of the
 * job slot's own inline area (see INLINE_BYTES), never given back to the
 * allocator. */
struct region {
    uint32_t seg, inl;
    uint64_t off, bytes;
};

/* Each job slot owns INLINE_BYTES of segment 0, carved out once at open, for
 * the inputs and output of a small job (a 1000-element vector_add needs
 * 12000 bytes): such a job never touches the allocator, whose lock and
 * first-fit scan over the free spans grow with the jobs in flight (the
 * throughput bench saw it fall from 153k to 71k jobs/s between 100 and
 * 1000 callers). At most a quarter of segment 0 goes to inline areas, so
 * small arenas (tests) keep their space for regular regions; slots beyond
 * that use the allocator. */
#define INLINE_BYTES (16u << 10)

struct job {
    uint32_t gen;
    int state; /* enum job_state, accessed with __atomic */
    uint32_t kernel;
    int as_binary;
    int zero_copy;   /* deliver the output as a resource binary over its region */
    int out_taken;   /* the output region now belongs to a resource binary */
    ErlNifPid pid;
    ErlNifEnv *env; /* keeps ref and any in-arena input binaries alive */
    ERL_NIF_TERM ref;
    struct region in;  /* copied inputs */
    struct region out; /* the output */
    uint32_t out_len;
    /* A pipelined job (see submit_pipelined) is published as `parts`
     * descriptors over slices of its regions; it is answered once all of
     * them are back. Its extra slots hold no job: each is the ring credit of
     * one extra descriptor, so the SQ never holds more entries than slots. */
    uint32_t parts;      /* descriptors of this job: 1 unless pipelined */
    uint32_t parts_left; /* __atomic: descriptors not yet completed */
    int32_t part_status; /* __atomic: the first non-OK status of a part */
    uint32_t ncredit;
    uint32_t credit[PIPELINE_MAX_PARTS - 1];
};

/* A result binary that stays in the arena: the region is freed when the last
 * reference to the binary is garbage-collected. */
struct region_res {
    struct device *d;
    struct region r;
};

struct counters {
    uint64_t submitted, completed, busy, bogus_cqes, wakeups_sent, cq_sleeps, failed_by_reset,
        dirty_submits, arena_inputs, pipelined;
};

struct device {
    ErlNifRWLock *life;
    /* Held (read) by a pipelined submit from its first published part to
     * its last; reset takes it (write), so it never fails a job whose
     * other parts are still being copied and published. */
    ErlNifRWLock *pipe;
    ErlNifMutex *cq_lock;
    /* Slots, regions and the SQ tail. Taken by every submit and by the
     * completion thread for each drain, for a few hundred nanoseconds: an
     * adaptive mutex spins briefly before sleeping, where enif_mutex (a
     * plain pthread mutex) goes to the kernel at the first contention. */
    pthread_mutex_t lock;
    int lock_ok;
    int closed;
    int unmapped;
    struct shm shm;
    struct arena alloc[EC_MAX_SEGMENTS]; /* one allocator per arena segment */
    uint64_t arena_total, arena_max;     /* bytes in segments; the growth limit */
    uint64_t zero_copy_bytes;            /* vector results this large stay in the arena */
    uint64_t pipeline_bytes;             /* vector_add inputs this large are pipelined */
    uint64_t inline_off;                 /* slot i's inline area: inline_off + i * INLINE_BYTES */
    uint32_t inline_slots;               /* slots 0 .. inline_slots - 1 have one */
    int poison;                          /* fill outputs with NaN before submitting */
    uint64_t exported;                   /* live region_res, __atomic */
    uint32_t id, nslots, spin_us, busy_spin_us;
    struct job *jobs;
    uint32_t *free_stack;
    uint32_t nfree;
    uint32_t in_flight, in_flight_peak; /* written under lock; wait_cq reads in_flight unlocked */
    ErlNifTid thread;
    int thread_started;
    int ctl_efd; /* wakes the completion thread for shutdown */
    int stop;    /* __atomic */
    ErlNifEnv *msg_env; /* the completion thread's */
    struct counters c;  /* __atomic adds */
};

static int dev_lock_init(struct device *d)
{
    pthread_mutexattr_t a;
    if (pthread_mutexattr_init(&a) != 0)
        return -1;
    pthread_mutexattr_settype(&a, PTHREAD_MUTEX_ADAPTIVE_NP);
    int r = pthread_mutex_init(&d->lock, &a);
    pthread_mutexattr_destroy(&a);
    return r;
}

static void dev_lock(struct device *d) { pthread_mutex_lock(&d->lock); }
static void dev_unlock(struct device *d) { pthread_mutex_unlock(&d->lock); }

static ErlNifResourceType *DEVICE_RT;
static ErlNifResourceType *REGION_RT;

static ERL_NIF_TERM ATOM_ok, ATOM_error, ATOM_erlcuda, ATOM_badarg, ATOM_busy, ATOM_closed,
    ATOM_unknown_kernel, ATOM_args, ATOM_arg, ATOM_length_mismatch, ATOM_shape, ATOM_too_large,
    ATOM_nan, ATOM_infinity, ATOM_neg_infinity, ATOM_gpud, ATOM_cancelled, ATOM_sent,
    ATOM_timeout, ATOM_peer, ATOM_true, ATOM_false, ATOM_fault, ATOM_ring_entries,
    ATOM_arena_bytes, ATOM_arena_max_bytes, ATOM_spin_us, ATOM_busy_spin_us, ATOM_zero_copy_bytes, ATOM_pipeline_bytes,
    ATOM_poison_outputs;

#define KERNEL_ATOM_DECL(NAME, ID, ATOM, NIN) static ERL_NIF_TERM ATOM_k_##ATOM;
EC_KERNELS(KERNEL_ATOM_DECL)
#undef KERNEL_ATOM_DECL

static ERL_NIF_TERM STATUS_ATOMS[EC_STATUS_COUNT];

static const unsigned KERNEL_INPUTS[EC_KERNEL_COUNT] = {
#define KERNEL_NIN(NAME, ID, ATOM, NIN) [ID] = NIN,
    EC_KERNELS(KERNEL_NIN)
#undef KERNEL_NIN
};

static ERL_NIF_TERM make_error(ErlNifEnv *env, ERL_NIF_TERM reason)
{
    return enif_make_tuple2(env, ATOM_error, reason);
}

static ERL_NIF_TERM make_badarg(ErlNifEnv *env, ERL_NIF_TERM what)
{
    return make_error(env, enif_make_tuple2(env, ATOM_badarg, what));
}

/* {error, enomem}-style reason from a negative errno, like file:open/2's. */
static ERL_NIF_TERM make_errno(ErlNifEnv *env, int neg_errno)
{
    const char *name = strerrorname_np(-neg_errno);
    char buf[32];
    size_t i = 0;
    for (; name && name[i] && i < sizeof buf - 1; i++)
        buf[i] = (char)(name[i] >= 'A' && name[i] <= 'Z' ? name[i] - 'A' + 'a' : name[i]);
    buf[i] = 0;
    return make_error(env, enif_make_atom(env, i ? buf : "unknown"));
}

static void count(uint64_t *c, uint64_t n) { __atomic_add_fetch(c, n, __ATOMIC_RELAXED); }

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* ---------------------------------------------------------------- terms -- */

static ERL_NIF_TERM float_term(ErlNifEnv *env, float f)
{
    if (isnan(f))
        return ATOM_nan;
    if (isinf(f))
        return f > 0 ? ATOM_infinity : ATOM_neg_infinity;
    return enif_make_double(env, (double)f);
}

static int term_to_f32(ErlNifEnv *env, ERL_NIF_TERM t, float *out)
{
    double d;
    ErlNifSInt64 i;
    if (enif_get_double(env, t, &d)) {
        *out = (float)d;
        return 1;
    }
    if (enif_get_int64(env, t, &i)) {
        *out = (float)i;
        return 1;
    }
    if (enif_is_identical(t, ATOM_nan)) {
        *out = NAN;
        return 1;
    }
    if (enif_is_identical(t, ATOM_infinity)) {
        *out = INFINITY;
        return 1;
    }
    if (enif_is_identical(t, ATOM_neg_infinity)) {
        *out = -INFINITY;
        return 1;
    }
    return 0;
}

/* One vector argument as given by the caller. */
struct vec {
    ERL_NIF_TERM term;
    int is_binary;
    ErlNifBinary bin;
    ERL_NIF_TERM list;
    uint64_t len; /* elements; valid once known */
    int len_known;
    int in_arena;  /* a binary already in this device's arena: no copy */
    uint64_t addr; /* its arena address when in_arena */
};

/* Classifies a vector argument. Lists are measured only up to `limit` cells
 * so that a normal scheduler never walks a huge list just to learn that it
 * must go dirty. Returns 0 if the term is not a vector. */
static int inspect_vec(ErlNifEnv *env, ERL_NIF_TERM t, uint64_t limit, struct vec *v)
{
    memset(v, 0, sizeof *v);
    v->term = t;
    if (enif_is_binary(env, t)) {
        if (!enif_inspect_binary(env, t, &v->bin) || v->bin.size % sizeof(float) != 0)
            return 0;
        v->is_binary = 1;
        v->len = v->bin.size / sizeof(float);
        v->len_known = 1;
        return 1;
    }
    if (!enif_is_list(env, t))
        return 0;
    v->list = t;
    ERL_NIF_TERM head, tail = t;
    uint64_t n = 0;
    while (n <= limit && enif_get_list_cell(env, tail, &head, &tail))
        n++;
    if (n <= limit) {
        if (!enif_is_empty_list(env, tail))
            return 0; /* improper list */
        v->len = n;
        v->len_known = 1;
    }
    return 1;
}

/* Copies a vector into the arena, converting list elements. Returns 0 if an
 * element is not a number (the region is then partly written; the caller
 * frees it). */
/* Is the binary's data inside one of the device's arena segments (a result
 * of an earlier job, or part of one)? Then the job can name it directly. */
static int find_in_arena(struct device *d, struct vec *v)
{
    const uint8_t *p = v->bin.data;
    if (((uintptr_t)p & 3) != 0)
        return 0;
    for (uint32_t i = 0; i < d->shm.nseg; i++) {
        const struct shm_segment *g = &d->shm.seg[i];
        if (g->base && p >= g->base && (uint64_t)(p - g->base) + v->bin.size <= g->bytes) {
            v->in_arena = 1;
            v->addr = ((uint64_t)i << EC_ADDR_SEGMENT_SHIFT) | (uint64_t)(p - g->base);
            return 1;
        }
    }
    return 0;
}

/* Copies of at least this many bytes are split over several threads: one
 * core's memcpy (~5-10 GB/s) is what bounds a large job from a plain binary
 * (2^26 elements: ~90 ms for two inputs on an H200 host, one thread). */
#define PARALLEL_COPY_BYTES (16u << 20)
#define PARALLEL_COPY_THREADS 8

struct copy_part {
    void *dst;
    const void *src;
    size_t n;
};

static void *copy_part_run(void *arg)
{
    struct copy_part *p = arg;
    memcpy(p->dst, p->src, p->n);
    return NULL;
}

/* Threads a large copy is split over: PARALLEL_COPY_THREADS, or fewer on a
 * machine with fewer cores. */
static uint32_t copy_threads(void)
{
    static long cpus;
    if (cpus == 0)
        cpus = sysconf(_SC_NPROCESSORS_ONLN);
    return cpus > PARALLEL_COPY_THREADS ? PARALLEL_COPY_THREADS : (uint32_t)(cpus > 1 ? cpus : 1);
}

/* memcpy, in up to copy_threads() pieces at once when large. Any thread
 * that cannot be created is done inline: the copy always completes. */
static void copy_bytes(void *dst, const void *src, size_t n)
{
    size_t t = copy_threads();
    if (n < PARALLEL_COPY_BYTES || t < 2) {
        memcpy(dst, src, n);
        return;
    }
    struct copy_part part[PARALLEL_COPY_THREADS];
    ErlNifTid tid[PARALLEL_COPY_THREADS];
    int started[PARALLEL_COPY_THREADS] = {0};
    size_t chunk = (n / t + 4095) & ~(size_t)4095;
    for (size_t i = 0; i < t; i++) {
        size_t off = i * chunk;
        part[i].dst = (char *)dst + off;
        part[i].src = (const char *)src + off;
        part[i].n = off >= n ? 0 : (n - off < chunk ? n - off : chunk);
        if (i > 0 && part[i].n > 0)
            started[i] = enif_thread_create("erlcuda.copy", &tid[i], copy_part_run, &part[i],
                                            NULL) == 0;
    }
    for (size_t i = 0; i < t; i++)
        if (!started[i])
            copy_part_run(&part[i]);
    for (size_t i = 1; i < t; i++)
        if (started[i])
            enif_thread_join(tid[i], NULL);
}

static int copy_vec(ErlNifEnv *env, const struct vec *v, float *dst)
{
    if (v->is_binary) {
        copy_bytes(dst, v->bin.data, v->bin.size);
        return 1;
    }
    ERL_NIF_TERM head, tail = v->list;
    uint64_t i = 0;
    while (enif_get_list_cell(env, tail, &head, &tail)) {
        if (!term_to_f32(env, head, &dst[i++]))
            return 0;
    }
    return 1;
}

static uint8_t *region_ptr(struct device *d, const struct region *r)
{
    return d->shm.seg[r->seg].base + r->off;
}

static uint64_t region_addr(const struct region *r)
{
    return ((uint64_t)r->seg << EC_ADDR_SEGMENT_SHIFT) | r->off;
}

static ERL_NIF_TERM result_term(ErlNifEnv *env, struct device *d, struct job *j)
{
    const float *out = (const float *)region_ptr(d, &j->out);
    if (j->kernel == EC_KERNEL_REDUCE || j->kernel == EC_KERNEL_DOT_PRODUCT)
        return float_term(env, out[0]);
    if (j->zero_copy) {
        struct region_res *rr = enif_alloc_resource(REGION_RT, sizeof *rr);
        if (rr) {
            rr->d = d;
            rr->r = j->out;
            enif_keep_resource(d);
            __atomic_add_fetch(&d->exported, 1, __ATOMIC_ACQ_REL);
            j->out_taken = 1;
            ERL_NIF_TERM bin =
                enif_make_resource_binary(env, rr, out, (size_t)j->out_len * sizeof(float));
            enif_release_resource(rr);
            return bin;
        }
    }
    if (j->as_binary) {
        ERL_NIF_TERM bin;
        unsigned char *p = enif_make_new_binary(env, (size_t)j->out_len * sizeof(float), &bin);
        if (p)
            memcpy(p, out, (size_t)j->out_len * sizeof(float));
        return bin;
    }
    ERL_NIF_TERM list = enif_make_list(env, 0);
    for (uint64_t i = j->out_len; i > 0; i--)
        list = enif_make_list_cell(env, float_term(env, out[i - 1]), list);
    return list;
}

/* --------------------------------------------------------------- device -- */

static struct device *get_device(ErlNifEnv *env, ERL_NIF_TERM t)
{
    void *p;
    return enif_get_resource(env, t, DEVICE_RT, &p) ? p : NULL;
}

/* Returns a finished job's region and slot. Caller holds d->lock. */
static void free_region_locked(struct device *d, struct region *r)
{
    if (r->bytes && !r->inl)
        arena_free(&d->alloc[r->seg], r->off, r->bytes);
    r->bytes = 0;
    r->inl = 0;
}

/* Unmaps the arena once the device is closed and no result binary points
 * into it any more. Caller holds d->lock. */
static void maybe_unmap_locked(struct device *d)
{
    if (d->closed && !d->unmapped && __atomic_load_n(&d->exported, __ATOMIC_ACQUIRE) == 0) {
        shm_unmap(&d->shm);
        d->unmapped = 1;
    }
}

static void release_job_locked(struct device *d, uint32_t idx)
{
    struct job *j = &d->jobs[idx];
    free_region_locked(d, &j->in);
    if (!j->out_taken)
        free_region_locked(d, &j->out);
    j->out.bytes = 0;
    enif_clear_env(j->env);
    __atomic_store_n(&j->state, JOB_FREE, __ATOMIC_RELEASE);
    d->free_stack[d->nfree++] = idx;
    for (uint32_t i = 0; i < j->ncredit; i++)
        d->free_stack[d->nfree++] = j->credit[i];
    /* read by wait_cq */
    __atomic_store_n(&d->in_flight, d->in_flight - 1 - j->ncredit, __ATOMIC_RELAXED);
    j->ncredit = 0;
    __atomic_store_n(&j->parts, 1, __ATOMIC_RELAXED);
}

/* Takes ownership of an in-flight job for answering it. Returns 1 when the
 * caller must send the answer, 0 when launch_sync already cancelled it (no
 * message wanted), -1 when the job is not in flight (a bogus or duplicate
 * completion: ignore it). */
static int claim_job(struct device *d, uint32_t idx, uint32_t gen)
{
    struct job *j = &d->jobs[idx];
    int expect = JOB_INFLIGHT;
    if (__atomic_compare_exchange_n(&j->state, &expect, JOB_COMPLETING, 0, __ATOMIC_ACQ_REL,
                                    __ATOMIC_ACQUIRE)) {
        if (j->gen == gen)
            return 1;
        __atomic_store_n(&j->state, JOB_INFLIGHT, __ATOMIC_RELEASE);
        return -1;
    }
    if (expect == JOB_CANCELLED &&
        __atomic_compare_exchange_n(&j->state, &expect, JOB_COMPLETING, 0, __ATOMIC_ACQ_REL,
                                    __ATOMIC_ACQUIRE)) {
        if (j->gen == gen)
            return 0;
        __atomic_store_n(&j->state, JOB_CANCELLED, __ATOMIC_RELEASE);
    }
    return -1;
}

static void send_answer(ErlNifEnv *caller_env, ErlNifEnv *msg_env, struct job *j,
                        ERL_NIF_TERM result)
{
    ERL_NIF_TERM msg =
        enif_make_tuple3(msg_env, ATOM_erlcuda, enif_make_copy(msg_env, j->ref), result);
    enif_send(caller_env, &j->pid, msg_env, msg);
    enif_clear_env(msg_env);
}

/* Answers the job of one CQE; sets *release to its slot once answered (or
 * cancelled), to be freed with release_jobs; leaves it alone otherwise. */
static void handle_cqe(struct device *d, ErlNifEnv *caller_env, const struct ec_cqe *cqe,
                       int64_t *release)
{
    uint32_t idx = (uint32_t)cqe->user_data;
    uint32_t gen = (uint32_t)(cqe->user_data >> 32);
    if (idx >= d->nslots) {
        count(&d->c.bogus_cqes, 1);
        return;
    }
    struct job *j = &d->jobs[idx];
    int32_t status = cqe->status;
    int st = __atomic_load_n(&j->state, __ATOMIC_ACQUIRE);
    if ((st == JOB_INFLIGHT || st == JOB_CANCELLED) && __atomic_load_n(&j->gen, __ATOMIC_RELAXED) == gen &&
        __atomic_load_n(&j->parts, __ATOMIC_RELAXED) > 1) {
        /* One part of a pipelined job: only the last one answers it. */
        if (status != EC_STATUS_OK) {
            int32_t ok = EC_STATUS_OK;
            __atomic_compare_exchange_n(&j->part_status, &ok, status, 0, __ATOMIC_RELAXED,
                                        __ATOMIC_RELAXED);
        }
        if (__atomic_sub_fetch(&j->parts_left, 1, __ATOMIC_ACQ_REL) > 0)
            return;
        status = __atomic_load_n(&j->part_status, __ATOMIC_RELAXED);
    }
    int claim = claim_job(d, idx, gen);
    if (claim < 0) {
        count(&d->c.bogus_cqes, 1);
        return;
    }
    if (claim == 1) {
        ErlNifEnv *m = d->msg_env;
        ERL_NIF_TERM result;
        if (status == EC_STATUS_OK) {
            result = enif_make_tuple2(m, ATOM_ok, result_term(m, d, j));
        } else {
            ERL_NIF_TERM why = status > 0 && status < (int32_t)EC_STATUS_COUNT
                                   ? STATUS_ATOMS[status]
                                   : enif_make_int(m, status);
            result = make_error(m, enif_make_tuple2(m, ATOM_gpud, why));
        }
        send_answer(caller_env, m, j, result);
    }
    count(&d->c.completed, 1);
    *release = idx;
}

/* Frees the slots of answered jobs: one hold of the lock for many, which
 * submitters contend for. */
static void release_jobs(struct device *d, const uint32_t *idx, uint32_t n)
{
    if (n == 0)
        return;
    dev_lock(d);
    for (uint32_t i = 0; i < n; i++)
        release_job_locked(d, idx[i]);
    dev_unlock(d);
}

/* Consumes every CQE present. Caller holds cq_lock. A hostile tail can claim
 * at most nslots entries: more cannot be legitimate. */
static uint32_t drain_cq(struct device *d, ErlNifEnv *caller_env)
{
    struct ec_header *h = d->shm.hdr;
    uint32_t head = __atomic_load_n(&h->cq_head, __ATOMIC_RELAXED);
    uint32_t tail = __atomic_load_n(&h->cq_tail, __ATOMIC_ACQUIRE);
    uint32_t n = tail - head;
    if (n > d->nslots) {
        count(&d->c.bogus_cqes, n - d->nslots);
        n = d->nslots;
    }
    uint32_t done[64], ndone = 0;
    for (uint32_t i = 0; i < n; i++) {
        struct ec_cqe cqe;
        memcpy(&cqe, &d->shm.cq[(head + i) & (d->nslots - 1)], sizeof cqe);
        /* Room for gpud at once, so a job can be completed before this drain
         * ends. */
        __atomic_store_n(&h->cq_head, head + i + 1, __ATOMIC_RELEASE);
        int64_t idx = -1;
        handle_cqe(d, caller_env, &cqe, &idx);
        if (idx >= 0)
            done[ndone++] = (uint32_t)idx;
        if (ndone == sizeof done / sizeof done[0]) {
            release_jobs(d, done, ndone);
            ndone = 0;
        }
    }
    release_jobs(d, done, ndone);
    return n;
}

static int cq_pending(struct device *d)
{
    struct ec_header *h = d->shm.hdr;
    return __atomic_load_n(&h->cq_tail, __ATOMIC_ACQUIRE) !=
           __atomic_load_n(&h->cq_head, __ATOMIC_RELAXED);
}

/* Waits for completions: spins for spin_us (the next job of a caller that
 * just got its answer usually follows within microseconds), and for up to
 * busy_spin_us while jobs are in flight (a GPU job of tens of microseconds
 * then costs no eventfd write in gpud and no thread wake-up here: ~10 us of
 * a one-in-flight round trip); then sleeps on the CQ eventfd under the
 * NEED_WAKEUP protocol of erlcuda_ring.h. */
static void wait_cq(struct device *d)
{
    struct ec_header *h = d->shm.hdr;
    int64_t start = now_ns();
    int64_t idle_until = start + (int64_t)d->spin_us * 1000;
    int64_t busy_until = start + (int64_t)d->busy_spin_us * 1000;
    for (;;) {
        for (int i = 0; i < 64; i++) {
            if (cq_pending(d) || __atomic_load_n(&d->stop, __ATOMIC_RELAXED))
                return;
            cpu_relax();
        }
        int64_t now = now_ns();
        if (now >= idle_until &&
            (now >= busy_until || __atomic_load_n(&d->in_flight, __ATOMIC_RELAXED) == 0))
            break;
    }
    __atomic_fetch_or(&h->cq_flags, EC_NEED_WAKEUP, __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    if (!cq_pending(d)) {
        struct pollfd p[2] = {{.fd = d->shm.cq_efd, .events = POLLIN},
                              {.fd = d->ctl_efd, .events = POLLIN}};
        count(&d->c.cq_sleeps, 1);
        while (poll(p, 2, -1) < 0 && errno == EINTR)
            ;
        if (p[0].revents & POLLIN)
            shm_drain(d->shm.cq_efd);
    }
    __atomic_fetch_and(&h->cq_flags, ~EC_NEED_WAKEUP, __ATOMIC_RELAXED);
}

static void *completion_thread(void *arg)
{
    struct device *d = arg;
    while (!__atomic_load_n(&d->stop, __ATOMIC_ACQUIRE)) {
        if (!cq_pending(d)) {
            wait_cq(d);
            continue;
        }
        enif_mutex_lock(d->cq_lock);
        drain_cq(d, NULL);
        enif_mutex_unlock(d->cq_lock);
    }
    return NULL;
}

/* Answers every job still in flight with {error, Reason}. The caller holds
 * cq_lock (or the completion thread is gone), so no CQE races this, and
 * d->lock, so no submit publishes until the rings are consistent again. */
static void fail_in_flight_locked(struct device *d, ErlNifEnv *caller_env, ERL_NIF_TERM reason)
{
    ErlNifEnv *m = enif_alloc_env();
    for (uint32_t i = 0; i < d->nslots; i++) {
        struct job *j = &d->jobs[i];
        int st = __atomic_load_n(&j->state, __ATOMIC_ACQUIRE);
        if (st == JOB_FREE)
            continue;
        int claim = claim_job(d, i, j->gen);
        if (claim < 0)
            continue;
        if (claim == 1)
            send_answer(caller_env, m, j, make_error(m, enif_make_copy(m, reason)));
        release_job_locked(d, i);
        count(&d->c.failed_by_reset, 1);
    }
    enif_free_env(m);
}

static void stop_thread(struct device *d)
{
    if (!d->thread_started)
        return;
    __atomic_store_n(&d->stop, 1, __ATOMIC_RELEASE);
    shm_signal(d->ctl_efd);
    enif_thread_join(d->thread, NULL);
    d->thread_started = 0;
}

/* Ends the device for good: no submit after this, every job in flight is
 * answered with {error, Reason}, the mapping and every fd are released, so
 * nothing of the device outlives it. Idempotent. */
static void device_close(struct device *d, ErlNifEnv *caller_env, ERL_NIF_TERM reason)
{
    enif_rwlock_rwlock(d->life);
    if (d->closed) {
        enif_rwlock_rwunlock(d->life);
        return;
    }
    d->closed = 1;
    stop_thread(d);
    if (d->shm.hdr) {
        drain_cq(d, caller_env);
        dev_lock(d);
        fail_in_flight_locked(d, caller_env, reason);
        dev_unlock(d);
    }
    shm_close_fds(&d->shm);
    dev_lock(d);
    maybe_unmap_locked(d);
    dev_unlock(d);
    if (d->ctl_efd >= 0)
        close(d->ctl_efd);
    d->ctl_efd = -1;
    enif_rwlock_rwunlock(d->life);
}

static void device_dtor(ErlNifEnv *env, void *obj)
{
    struct device *d = obj;
    if (d->life) {
        device_close(d, env, ATOM_closed);
        enif_rwlock_destroy(d->life);
    }
    if (d->pipe)
        enif_rwlock_destroy(d->pipe);
    if (d->cq_lock)
        enif_mutex_destroy(d->cq_lock);
    if (d->lock_ok)
        pthread_mutex_destroy(&d->lock);
    if (d->msg_env)
        enif_free_env(d->msg_env);
    if (d->jobs) {
        for (uint32_t i = 0; i < d->nslots; i++)
            if (d->jobs[i].env)
                enif_free_env(d->jobs[i].env);
        enif_free(d->jobs);
    }
    if (d->free_stack)
        enif_free(d->free_stack);
    for (uint32_t i = 0; i < EC_MAX_SEGMENTS; i++)
        arena_destroy(&d->alloc[i]);
    if (!d->unmapped)
        shm_unmap(&d->shm); /* exported regions hold the device: none are left */
}

static void region_dtor(ErlNifEnv *env, void *obj)
{
    struct region_res *rr = obj;
    struct device *d = rr->d;
    (void)env;
    dev_lock(d);
    free_region_locked(d, &rr->r);
    __atomic_sub_fetch(&d->exported, 1, __ATOMIC_ACQ_REL);
    maybe_unmap_locked(d);
    dev_unlock(d);
    enif_release_resource(d);
}

/* ------------------------------------------------------------------ NIFs -- */

static int get_opt_u64(ErlNifEnv *env, ERL_NIF_TERM map, ERL_NIF_TERM key, ErlNifUInt64 *v)
{
    ERL_NIF_TERM t;
    return enif_get_map_value(env, map, key, &t) && enif_get_uint64(env, t, v);
}

/* open(Device, #{ring_entries, arena_bytes, arena_max_bytes, spin_us, busy_spin_us,
 *               pipeline_bytes,
 *               zero_copy_bytes, poison_outputs}) -> {ok, Handle} | {error, Reason} */
static ERL_NIF_TERM nif_open(ErlNifEnv *env, int argc, const ERL_NIF_TERM argv[])
{
    unsigned dev;
    ErlNifUInt64 entries, arena_bytes, arena_max, spin, busy_spin, zero_copy, pipeline;
    ERL_NIF_TERM poison;
    (void)argc;
    if (!enif_get_uint(env, argv[0], &dev) || !enif_is_map(env, argv[1]) ||
        !get_opt_u64(env, argv[1], ATOM_ring_entries, &entries) ||
        !get_opt_u64(env, argv[1], ATOM_arena_bytes, &arena_bytes) ||
        !get_opt_u64(env, argv[1], ATOM_arena_max_bytes, &arena_max) ||
        !get_opt_u64(env, argv[1], ATOM_spin_us, &spin) ||
        !get_opt_u64(env, argv[1], ATOM_busy_spin_us, &busy_spin) ||
        !get_opt_u64(env, argv[1], ATOM_zero_copy_bytes, &zero_copy) ||
        !get_opt_u64(env, argv[1], ATOM_pipeline_bytes, &pipeline) ||
        !enif_get_map_value(env, argv[1], ATOM_poison_outputs, &poison) ||
        entries < 2 || entries > (1u << 20) || (entries & (entries - 1)) != 0 ||
        arena_bytes < 4096 || arena_bytes > (UINT64_C(1) << EC_ADDR_SEGMENT_SHIFT) ||
        arena_max < arena_bytes || spin > 1000000 || busy_spin > 1000000)
        return enif_make_badarg(env);

    struct device *d = enif_alloc_resource(DEVICE_RT, sizeof *d);
    memset(d, 0, sizeof *d);
    d->ctl_efd = -1;
    d->shm.memfd = d->shm.sq_efd = d->shm.cq_efd = d->shm.listen_fd = d->shm.conn_fd = -1;
    ERL_NIF_TERM handle = enif_make_resource(env, d);
    enif_release_resource(d); /* the term owns it now; the dtor cleans up on any failure */

    d->id = dev;
    d->nslots = (uint32_t)entries;
    d->spin_us = (uint32_t)spin;
    /* Spinning while jobs are in flight needs a core of its own: on a
     * 2-core machine it doubled the p99 round trip of the CPU backend
     * (erlcuda_bench:busy_spin/0: 142 -> 271 us), so below 4 cores the
     * completion thread spins spin_us only. */
    d->busy_spin_us = sysconf(_SC_NPROCESSORS_ONLN) >= 4 ? (uint32_t)busy_spin : 0;
    d->arena_max = arena_max;
    d->zero_copy_bytes = zero_copy;
    d->pipeline_bytes = pipeline;
    d->poison = enif_is_identical(poison, ATOM_true);
    d->life = enif_rwlock_create("erlcuda.life");
    d->pipe = enif_rwlock_create("erlcuda.pipe");
    d->cq_lock = enif_mutex_create("erlcuda.cq");
    d->lock_ok = dev_lock_init(d) == 0;
    d->msg_env = enif_alloc_env();
    d->jobs = enif_alloc(entries * sizeof *d->jobs);
    d->free_stack = enif_alloc(entries * sizeof *d->free_stack);
    if (!d->life || !d->pipe || !d->cq_lock || !d->lock_ok || !d->msg_env || !d->jobs || !d->free_stack)
        return make_error(env, enif_make_atom(env, "enomem"));
    memset(d->jobs, 0, entries * sizeof *d->jobs);
    for (uint32_t i = 0; i < entries; i++) {
        d->jobs[i].env = enif_alloc_env();
        d->jobs[i].parts = 1;
        if (!d->jobs[i].env)
            return make_error(env, enif_make_atom(env, "enomem"));
        d->free_stack[i] = entries - 1 - i;
    }
    d->nfree = entries;

    int err = shm_create(&d->shm, dev, d->nslots, arena_bytes);
    if (err < 0)
        return make_errno(env, err);
    if (arena_init(&d->alloc[0], d->shm.seg[0].bytes) < 0)
        return make_error(env, enif_make_atom(env, "enomem"));
    d->arena_total = d->shm.seg[0].bytes;
    /* The first inline_slots slots (the free stack hands out low indices
     * first) get inline areas, within a quarter of segment 0. */
    uint64_t fit = d->shm.seg[0].bytes / 4 / INLINE_BYTES;
    uint32_t nin = fit < d->nslots ? (uint32_t)fit : d->nslots;
    if (nin > 0 && arena_alloc(&d->alloc[0], (uint64_t)nin * INLINE_BYTES, &d->inline_off) == 0)
        d->inline_slots = nin;
    d->ctl_efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (d->ctl_efd < 0)
        return make_errno(env, -errno);
    ErlNifThreadOpts *o = enif_thread_opts_create("erlcuda.completion");
    err = enif_thread_create("erlcuda.completion", &d->thread, completion_thread, d, o);
    enif_thread_opts_destroy(o);
    if (err != 0)
        return make_errno(env, -err);
    d->thread_started = 1;
    return enif_make_tuple2(env, ATOM_ok, handle);
}

/* socket_name(Handle) -> binary() */
static ERL_NIF_TERM nif_socket_name(ErlNifEnv *env, int argc, const ERL_NIF_TERM argv[])
{
    struct device *d = get_device(env, argv[0]);
    (void)argc;
    if (!d)
        return enif_make_badarg(env);
    ERL_NIF_TERM t;
    size_t n = strlen(d->shm.sock_name);
    memcpy(enif_make_new_binary(env, n, &t), d->shm.sock_name, n);
    return t;
}

/* accept(Handle, OsPid, TimeoutMs) -> ok | {error, Reason}; dirty IO */
static ERL_NIF_TERM nif_accept(ErlNifEnv *env, int argc, const ERL_NIF_TERM argv[])
{
    struct device *d = get_device(env, argv[0]);
    int pid, timeout;
    (void)argc;
    if (!d || !enif_get_int(env, argv[1], &pid) || !enif_get_int(env, argv[2], &timeout))
        return enif_make_badarg(env);
    enif_rwlock_rlock(d->life);
    int err = d->closed ? -EBADF : shm_accept_peer(&d->shm, pid, timeout);
    if (err >= 0) {
        /* Under the lock: a segment added meanwhile is either in the list sent
         * now or sent on the new connection by shm_add_segment. */
        dev_lock(d);
        err = shm_handover(&d->shm, err, d->id);
        dev_unlock(d);
    }
    enif_rwlock_runlock(d->life);
    if (err == -ETIMEDOUT)
        return make_error(env, ATOM_timeout);
    if (err == -EPERM)
        return make_error(env, ATOM_peer);
    return err < 0 ? make_errno(env, err) : ATOM_ok;
}

/* reset(Handle, Reason) -> ok; dirty IO. Called once gpud has exited: real
 * completions still in the CQ are delivered, every other job in flight gets
 * {error, Reason}, and the rings start again from zero. */
static ERL_NIF_TERM nif_reset(ErlNifEnv *env, int argc, const ERL_NIF_TERM argv[])
{
    struct device *d = get_device(env, argv[0]);
    (void)argc;
    if (!d)
        return enif_make_badarg(env);
    enif_rwlock_rlock(d->life);
    if (!d->closed) {
        enif_rwlock_rwlock(d->pipe);
        enif_mutex_lock(d->cq_lock);
        drain_cq(d, env);
        /* One hold of the lock from failing the jobs in flight to zeroing the
         * rings: a descriptor published in between would be wiped out and its
         * job never answered. */
        dev_lock(d);
        fail_in_flight_locked(d, env, argv[1]);
        shm_reset_rings(&d->shm);
        shm_disconnect(&d->shm);
        dev_unlock(d);
        enif_mutex_unlock(d->cq_lock);
        enif_rwlock_rwunlock(d->pipe);
    }
    enif_rwlock_runlock(d->life);
    return ATOM_ok;
}

/* close(Handle) -> ok; dirty IO */
static ERL_NIF_TERM nif_close(ErlNifEnv *env, int argc, const ERL_NIF_TERM argv[])
{
    struct device *d = get_device(env, argv[0]);
    (void)argc;
    if (!d)
        return enif_make_badarg(env);
    device_close(d, env, ATOM_closed);
    return ATOM_ok;
}

/* cancel(Handle, Ref) -> cancelled | sent. `cancelled`: no message will come.
 * `sent`: the answer is in the mailbox or on its way. */
static ERL_NIF_TERM nif_cancel(ErlNifEnv *env, int argc, const ERL_NIF_TERM argv[])
{
    struct device *d = get_device(env, argv[0]);
    (void)argc;
    if (!d || !enif_is_ref(env, argv[1]))
        return enif_make_badarg(env);
    ERL_NIF_TERM res = ATOM_sent;
    dev_lock(d);
    for (uint32_t i = 0; i < d->nslots; i++) {
        struct job *j = &d->jobs[i];
        int st = __atomic_load_n(&j->state, __ATOMIC_ACQUIRE);
        if (st == JOB_FREE || !enif_is_identical(j->ref, argv[1]))
            continue;
        int expect = JOB_INFLIGHT;
        if (__atomic_compare_exchange_n(&j->state, &expect, JOB_CANCELLED, 0, __ATOMIC_ACQ_REL,
                                        __ATOMIC_ACQUIRE))
            res = ATOM_cancelled;
        break;
    }
    dev_unlock(d);
    return res;
}

static ERL_NIF_TERM kernel_atom(uint32_t k)
{
    switch (k) {
#define KERNEL_CASE(NAME, ID, ATOM, NIN) \
    case ID:                             \
        return ATOM_k_##ATOM;
        EC_KERNELS(KERNEL_CASE)
#undef KERNEL_CASE
    }
    return 0;
}

static uint32_t kernel_id(ERL_NIF_TERM atom)
{
#define KERNEL_MATCH(NAME, ID, ATOM, NIN) \
    if (enif_is_identical(atom, ATOM_k_##ATOM)) \
        return ID;
    EC_KERNELS(KERNEL_MATCH)
#undef KERNEL_MATCH
    return 0;
}

/* A checked job: what submit has learned from the arguments. */
struct job_spec {
    uint32_t kernel;
    unsigned nin;
    struct vec in[2];
    uint64_t m, n, k;
    uint64_t out_len;
};

static ERL_NIF_TERM submit_impl(ErlNifEnv *env, int argc, const ERL_NIF_TERM argv[], int dirty);

static ERL_NIF_TERM submit_dirty(ErlNifEnv *env, int argc, const ERL_NIF_TERM argv[])
{
    return submit_impl(env, argc, argv, 1);
}

static ERL_NIF_TERM nif_submit(ErlNifEnv *env, int argc, const ERL_NIF_TERM argv[])
{
    return submit_impl(env, argc, argv, 0);
}

/* Parses Args for the kernel. Returns 0 and fills spec, 1 when the job is too
 * large for a normal scheduler, or sets *err and returns -1. */
static int parse_args(ErlNifEnv *env, struct device *d, ERL_NIF_TERM args, int dirty,
                      struct job_spec *s, ERL_NIF_TERM *err)
{
    ERL_NIF_TERM cell[5], head, tail = args;
    unsigned want = s->nin + (s->kernel == EC_KERNEL_MATMUL ? 3 : 0), got = 0;
    while (got < 5 && enif_get_list_cell(env, tail, &head, &tail))
        cell[got++] = head;
    if (got != want || !enif_is_empty_list(env, tail)) {
        *err = make_badarg(env, ATOM_args);
        return -1;
    }
    uint64_t list_limit = dirty ? UINT64_MAX : LIST_ELEMS_ON_SCHEDULER;
    uint64_t list_elems = 0, bin_bytes = 0;
    int too_big = 0;
    for (unsigned i = 0; i < s->nin; i++) {
        if (!inspect_vec(env, cell[i], list_limit, &s->in[i])) {
            *err = make_badarg(env, enif_make_tuple2(env, ATOM_arg, enif_make_uint(env, i + 1)));
            return -1;
        }
        if (!s->in[i].len_known)
            too_big = 1;
        else if (s->in[i].is_binary && !find_in_arena(d, &s->in[i]))
            bin_bytes += s->in[i].bin.size;
        else
            list_elems += s->in[i].len;
    }
    if (!dirty && (too_big || list_elems > LIST_ELEMS_ON_SCHEDULER ||
                   bin_bytes > BINARY_BYTES_ON_SCHEDULER))
        return 1;
    for (unsigned i = 0; i < s->nin; i++) {
        if (s->in[i].len > UINT32_MAX) {
            *err = make_badarg(env, ATOM_too_large);
            return -1;
        }
    }
    switch (s->kernel) {
    case EC_KERNEL_VECTOR_ADD:
    case EC_KERNEL_DOT_PRODUCT:
        if (s->in[0].len != s->in[1].len) {
            *err = make_badarg(env, ATOM_length_mismatch);
            return -1;
        }
        s->out_len = s->kernel == EC_KERNEL_VECTOR_ADD ? s->in[0].len : 1;
        break;
    case EC_KERNEL_REDUCE:
        s->out_len = 1;
        break;
    case EC_KERNEL_MATMUL: {
        ErlNifUInt64 dim[3];
        for (unsigned i = 0; i < 3; i++) {
            if (!enif_get_uint64(env, cell[2 + i], &dim[i]) || dim[i] > UINT32_MAX) {
                *err = make_badarg(
                    env, enif_make_tuple2(env, ATOM_arg, enif_make_uint(env, 3 + i)));
                return -1;
            }
        }
        s->m = dim[0];
        s->n = dim[1];
        s->k = dim[2];
        /* Each factor < 2^32, so the products fit in 64 bits. */
        if (s->m * s->k != s->in[0].len || s->k * s->n != s->in[1].len) {
            *err = make_badarg(env, ATOM_shape);
            return -1;
        }
        if (s->m * s->n > UINT32_MAX) {
            *err = make_badarg(env, ATOM_too_large);
            return -1;
        }
        s->out_len = s->m * s->n;
        break;
    }
    }
    return 0;
}

/* Allocates `bytes` in some segment, adding a segment while the arena is
 * below its limit. Caller holds d->lock. Returns 0 or -1 (busy). */
static int region_alloc_locked(struct device *d, uint64_t bytes, struct region *r)
{
    r->bytes = bytes;
    r->inl = 0;
    for (uint32_t i = 0; i < d->shm.nseg; i++) {
        if (arena_alloc(&d->alloc[i], bytes, &r->off) == 0) {
            r->seg = i;
            return 0;
        }
    }
    /* Grow by at least the first segment's size, so growth is rare. */
    uint64_t grow = arena_round(bytes);
    if (grow < d->shm.seg[0].bytes)
        grow = d->shm.seg[0].bytes;
    if (d->arena_total + grow > d->arena_max)
        grow = arena_round(bytes);
    if (d->arena_total + grow > d->arena_max || d->shm.nseg >= EC_MAX_SEGMENTS)
        return -1;
    int seg = shm_add_segment(&d->shm, grow);
    if (seg < 0)
        return -1;
    if (arena_init(&d->alloc[seg], d->shm.seg[seg].bytes) < 0)
        return -1; /* the segment stays, unused: never corrupt */
    d->arena_total += d->shm.seg[seg].bytes;
    r->seg = (uint32_t)seg;
    return arena_alloc(&d->alloc[seg], bytes, &r->off);
}

/* Takes a slot and the job's input and output regions. Returns the slot
 * index, or -1 (busy). */
/* Reserves a slot and the job's regions, plus `credits` extra slots for the
 * extra descriptors of a pipelined job. `keep_out`: the output will outlive
 * the job (a zero-copy result binary), so it cannot be in the slot's inline
 * area. */
static int64_t reserve_job(struct device *d, uint64_t in_bytes, uint64_t out_bytes,
                           uint32_t credits, int keep_out)
{
    struct region in = {0, 0, 0, 0}, out = {0, 0, 0, 0};
    dev_lock(d);
    if (d->nfree <= credits) {
        dev_unlock(d);
        return -1;
    }
    uint32_t top = d->free_stack[d->nfree - 1];
    if (!keep_out && in_bytes + out_bytes <= INLINE_BYTES && top < d->inline_slots) {
        uint64_t base = d->inline_off + (uint64_t)top * INLINE_BYTES;
        in = (struct region){.seg = 0, .inl = 1, .off = base, .bytes = in_bytes};
        out = (struct region){.seg = 0, .inl = 1, .off = base + in_bytes, .bytes = out_bytes};
    } else if (region_alloc_locked(d, out_bytes, &out) != 0) {
        dev_unlock(d);
        return -1;
    } else if (in_bytes > 0 && region_alloc_locked(d, in_bytes, &in) != 0) {
        free_region_locked(d, &out);
        dev_unlock(d);
        return -1;
    }
    int64_t idx = d->free_stack[--d->nfree];
    struct job *j = &d->jobs[idx];
    j->in = in;
    j->out = out;
    j->out_taken = 0;
    j->ncredit = credits;
    for (uint32_t i = 0; i < credits; i++)
        j->credit[i] = d->free_stack[--d->nfree];
    /* read by wait_cq */
    __atomic_store_n(&d->in_flight, d->in_flight + 1 + credits, __ATOMIC_RELAXED);
    if (d->in_flight > d->in_flight_peak)
        d->in_flight_peak = d->in_flight;
    dev_unlock(d);
    return idx;
}

static void unreserve_job(struct device *d, uint32_t idx)
{
    dev_lock(d);
    release_job_locked(d, idx);
    dev_unlock(d);
}

/* Publishes the job's descriptor and wakes gpud if it sleeps. */
static void publish(struct device *d, uint32_t idx, const struct ec_sqe *sqe)
{
    struct ec_header *h = d->shm.hdr;
    dev_lock(d);
    /* INFLIGHT before the descriptor is visible: a completion can only follow. */
    __atomic_store_n(&d->jobs[idx].state, JOB_INFLIGHT, __ATOMIC_RELEASE);
    uint32_t tail = __atomic_load_n(&h->sq_tail, __ATOMIC_RELAXED);
    d->shm.sq[tail & (d->nslots - 1)] = *sqe;
    __atomic_store_n(&h->sq_tail, tail + 1, __ATOMIC_RELEASE);
    dev_unlock(d);
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    if (__atomic_load_n(&h->sq_flags, __ATOMIC_RELAXED) & EC_NEED_WAKEUP) {
        shm_signal(d->shm.sq_efd);
        count(&d->c.wakeups_sent, 1);
    }
}

/* How many descriptors a job is published as: more than 1 only for a
 * vector_add of two binaries of at least pipeline_bytes not in the arena. */
static uint32_t pipeline_parts(const struct device *d, const struct job_spec *s)
{
    uint64_t bytes = s->out_len * sizeof(float);
    if (s->kernel != EC_KERNEL_VECTOR_ADD || bytes < d->pipeline_bytes || bytes == 0 || !s->in[0].is_binary ||
        !s->in[1].is_binary || s->in[0].in_arena || s->in[1].in_arena)
        return 1;
    uint64_t parts = (bytes + PIPELINE_SLICE_BYTES - 1) / PIPELINE_SLICE_BYTES;
    return parts > PIPELINE_MAX_PARTS ? PIPELINE_MAX_PARTS : (uint32_t)parts;
}

struct pipeline {
    struct device *d;
    uint32_t idx, parts;
    struct ec_sqe whole;     /* the job's descriptor over all of its regions */
    const uint8_t *src[2];   /* the binaries */
    uint8_t *dst[2];         /* their places in the arena */
    uint64_t slice;          /* elements per part (the last one may have fewer) */
    uint32_t next;           /* __atomic: the next part to copy */
};

/* Copies parts of both inputs into the arena and publishes each part's
 * descriptor as soon as its slices are in; run by several threads at once. */
static void *pipeline_run(void *arg)
{
    struct pipeline *p = arg;
    uint64_t len = p->whole.out_len;
    for (;;) {
        uint32_t c = __atomic_fetch_add(&p->next, 1, __ATOMIC_RELAXED);
        if (c >= p->parts)
            return NULL;
        uint64_t first = (uint64_t)c * p->slice;
        uint64_t n = len - first < p->slice ? len - first : p->slice;
        for (int i = 0; i < 2; i++)
            memcpy(p->dst[i] + first * sizeof(float), p->src[i] + first * sizeof(float),
                   n * sizeof(float));
        struct ec_sqe sqe = p->whole;
        sqe.in0 += first * sizeof(float);
        sqe.in1 += first * sizeof(float);
        sqe.out += first * sizeof(float);
        sqe.in0_len = sqe.in1_len = sqe.out_len = (uint32_t)n;
        publish(p->d, p->idx, &sqe);
    }
}

/* Publishes job idx as `parts` descriptors over consecutive slices, copying
 * the inputs with up to PARALLEL_COPY_THREADS threads; the GPU starts on the
 * first slices while the others are copied. Returns when all are published
 * (the binaries are only valid during the NIF call). */
static void submit_pipelined(struct device *d, uint32_t idx, const struct ec_sqe *whole,
                             const uint8_t *src[2], uint8_t *dst[2], uint32_t parts)
{
    struct job *j = &d->jobs[idx];
    /* Slices of whole pages: every part's addresses stay aligned. */
    uint64_t slice = (whole->out_len + parts - 1) / parts;
    slice = (slice + 1023) & ~(uint64_t)1023;
    parts = (uint32_t)((whole->out_len + slice - 1) / slice);
    __atomic_store_n(&j->part_status, EC_STATUS_OK, __ATOMIC_RELAXED);
    __atomic_store_n(&j->parts_left, parts, __ATOMIC_RELAXED);
    __atomic_store_n(&j->parts, parts, __ATOMIC_RELEASE);
    struct pipeline p = {.d = d, .idx = idx, .parts = parts, .whole = *whole,
                         .src = {src[0], src[1]}, .dst = {dst[0], dst[1]}, .slice = slice,
                         .next = 0};
    uint32_t t = copy_threads();
    if (t > parts)
        t = parts;
    ErlNifTid tid[PARALLEL_COPY_THREADS];
    int started[PARALLEL_COPY_THREADS] = {0};
    for (uint32_t i = 1; i < t; i++)
        started[i] = enif_thread_create("erlcuda.copy", &tid[i], pipeline_run, &p, NULL) == 0;
    pipeline_run(&p); /* this thread too; it also finishes whatever a missing thread left */
    for (uint32_t i = 1; i < t; i++)
        if (started[i])
            enif_thread_join(tid[i], NULL);
}

/* submit(Handle, Kernel, Args, Flags) -> {ok, Ref} | {error, Reason}.
 * Flags: 0, or `fault` (only a gpud built for fault injection accepts it). */
static ERL_NIF_TERM submit_impl(ErlNifEnv *env, int argc, const ERL_NIF_TERM argv[], int dirty)
{
    struct device *d = get_device(env, argv[0]);
    if (!d)
        return enif_make_badarg(env);
    uint32_t flags = enif_is_identical(argv[3], ATOM_fault) ? EC_FLAG_FAULT : 0;
    struct job_spec s;
    memset(&s, 0, sizeof s);
    s.kernel = enif_is_atom(env, argv[1]) ? kernel_id(argv[1]) : 0;
    if (s.kernel == 0)
        return make_error(env, enif_make_tuple2(env, ATOM_unknown_kernel, argv[1]));
    s.nin = KERNEL_INPUTS[s.kernel];

    /* The mapping is read from parse_args on (arena lookups): hold it. */
    enif_rwlock_rlock(d->life);
    if (d->closed) {
        enif_rwlock_runlock(d->life);
        return make_error(env, ATOM_closed);
    }
    ERL_NIF_TERM err;
    int r = parse_args(env, d, argv[2], dirty, &s, &err);
    if (r != 0) {
        enif_rwlock_runlock(d->life);
        if (r < 0)
            return err;
        count(&d->c.dirty_submits, 1);
        return enif_schedule_nif(env, "submit_dirty", ERL_NIF_DIRTY_JOB_CPU_BOUND, submit_dirty,
                                 argc, argv);
    }

    /* Inputs not in the arena yet share one region; the output has its own,
     * which a large binary result keeps after the job. */
    uint64_t in_off[2] = {0, 0}, in_bytes = 0;
    for (unsigned i = 0; i < s.nin; i++) {
        if (s.in[i].in_arena)
            continue;
        in_off[i] = in_bytes;
        in_bytes += arena_round(s.in[i].len * sizeof(float));
    }
    uint64_t out_bytes = arena_round(s.out_len * sizeof(float));
    if (in_bytes > d->arena_max || out_bytes > d->arena_max) {
        enif_rwlock_runlock(d->life);
        return make_badarg(env, ATOM_too_large);
    }
    /* A binary vector result this large stays in the arena as the answer. */
    int zero_copy = s.in[0].is_binary && s.kernel != EC_KERNEL_REDUCE &&
                    s.kernel != EC_KERNEL_DOT_PRODUCT &&
                    s.out_len * sizeof(float) >= d->zero_copy_bytes;
    uint32_t parts = flags == 0 ? pipeline_parts(d, &s) : 1;
    int64_t idx = reserve_job(d, in_bytes, out_bytes, parts - 1, zero_copy);
    if (idx < 0 && parts > 1) {
        parts = 1; /* not enough free slots for the extra descriptors: one is fine */
        idx = reserve_job(d, in_bytes, out_bytes, 0, zero_copy);
    }
    if (idx < 0) {
        enif_rwlock_runlock(d->life);
        count(&d->c.busy, 1);
        return make_error(env, ATOM_busy);
    }
    struct job *j = &d->jobs[idx];
    uint64_t addr[2] = {0, 0};
    for (unsigned i = 0; i < s.nin; i++) {
        if (s.in[i].in_arena) {
            /* Keeps the binary, and so its region, alive while gpud reads it. */
            enif_make_copy(j->env, s.in[i].term);
            addr[i] = s.in[i].addr;
            count(&d->c.arena_inputs, 1);
            continue;
        }
        addr[i] = region_addr(&j->in) + in_off[i];
        if (parts > 1)
            continue; /* binaries, copied slice by slice by submit_pipelined */
        if (!copy_vec(env, &s.in[i], (float *)(region_ptr(d, &j->in) + in_off[i]))) {
            unreserve_job(d, (uint32_t)idx);
            enif_rwlock_runlock(d->life);
            return make_badarg(env, enif_make_tuple2(env, ATOM_arg, enif_make_uint(env, i + 1)));
        }
    }
    if (d->poison)
        memset(region_ptr(d, &j->out), 0xff, s.out_len * sizeof(float)); /* all NaN */
    ERL_NIF_TERM ref = enif_make_ref(env);
    j->gen++;
    j->kernel = s.kernel;
    j->as_binary = s.in[0].is_binary;
    j->zero_copy = zero_copy;
    j->ref = enif_make_copy(j->env, ref);
    enif_self(env, &j->pid);
    j->out_len = (uint32_t)s.out_len;

    struct ec_sqe sqe = {
        .user_data = ((uint64_t)j->gen << 32) | (uint64_t)idx,
        .kernel = s.kernel,
        .flags = flags,
        .in0 = addr[0],
        .in1 = addr[1],
        .out = region_addr(&j->out),
        .in0_len = (uint32_t)s.in[0].len,
        .in1_len = s.nin > 1 ? (uint32_t)s.in[1].len : 0,
        .out_len = (uint32_t)s.out_len,
        .m = (uint32_t)s.m,
        .n = (uint32_t)s.n,
        .k = (uint32_t)s.k,
    };
    if (parts > 1) {
        const uint8_t *src[2] = {s.in[0].bin.data, s.in[1].bin.data};
        uint8_t *dst[2] = {region_ptr(d, &j->in) + in_off[0], region_ptr(d, &j->in) + in_off[1]};
        enif_rwlock_rlock(d->pipe);
        submit_pipelined(d, (uint32_t)idx, &sqe, src, dst, parts);
        enif_rwlock_runlock(d->pipe);
        count(&d->c.pipelined, 1);
    } else {
        publish(d, (uint32_t)idx, &sqe);
    }
    enif_rwlock_runlock(d->life);
    count(&d->c.submitted, 1);
    return enif_make_tuple2(env, ATOM_ok, ref);
}

static void put(ErlNifEnv *env, ERL_NIF_TERM *map, const char *key, uint64_t v)
{
    enif_make_map_put(env, *map, enif_make_atom(env, key), enif_make_uint64(env, v), map);
}

static uint64_t load64(const uint64_t *p) { return __atomic_load_n(p, __ATOMIC_RELAXED); }

/* stats(Handle) -> map() */
static ERL_NIF_TERM nif_stats(ErlNifEnv *env, int argc, const ERL_NIF_TERM argv[])
{
    struct device *d = get_device(env, argv[0]);
    (void)argc;
    if (!d)
        return enif_make_badarg(env);
    ERL_NIF_TERM m = enif_make_new_map(env);
    put(env, &m, "submitted", load64(&d->c.submitted));
    put(env, &m, "completed", load64(&d->c.completed));
    put(env, &m, "busy", load64(&d->c.busy));
    put(env, &m, "bogus_completions", load64(&d->c.bogus_cqes));
    put(env, &m, "sq_wakeups", load64(&d->c.wakeups_sent));
    put(env, &m, "cq_sleeps", load64(&d->c.cq_sleeps));
    put(env, &m, "failed_by_restart", load64(&d->c.failed_by_reset));
    put(env, &m, "dirty_submits", load64(&d->c.dirty_submits));
    put(env, &m, "arena_inputs", load64(&d->c.arena_inputs));
    put(env, &m, "pipelined", load64(&d->c.pipelined));
    put(env, &m, "slots", d->nslots);

    enif_rwlock_rlock(d->life);
    dev_lock(d);
    put(env, &m, "in_flight", d->in_flight);
    put(env, &m, "in_flight_peak", d->in_flight_peak);
    uint64_t used = 0;
    for (uint32_t i = 0; i < d->shm.nseg; i++)
        used += d->alloc[i].used;
    put(env, &m, "arena_bytes", d->arena_total);
    put(env, &m, "arena_max_bytes", d->arena_max);
    /* Regions of the allocator; the slots' inline areas are counted apart. */
    uint64_t inline_all = (uint64_t)d->inline_slots * INLINE_BYTES;
    put(env, &m, "arena_used", used - inline_all);
    put(env, &m, "arena_inline_bytes", inline_all);
    put(env, &m, "arena_segments", d->shm.nseg);
    put(env, &m, "result_binaries", __atomic_load_n(&d->exported, __ATOMIC_RELAXED));
    dev_unlock(d);
    if (!d->closed) {
        const struct ec_stats *g = &d->shm.hdr->stats;
        put(env, &m, "jobs_ok", load64(&g->jobs_ok));
        put(env, &m, "jobs_failed", load64(&g->jobs_failed));
        put(env, &m, "batches", load64(&g->batches));
        put(env, &m, "launches", load64(&g->launches));
        put(env, &m, "bad_descriptors", load64(&g->bad_descriptors));
        put(env, &m, "max_batch", load64(&g->max_batch));
        put(env, &m, "gpud_sleeps", load64(&g->sleeps));
        put(env, &m, "gpud_work_ns", load64(&g->work_ns));
        ERL_NIF_TERM hist = enif_make_list(env, 0);
        for (unsigned i = EC_BATCH_HIST_BUCKETS; i > 0; i--)
            hist = enif_make_list_cell(env, enif_make_uint64(env, load64(&g->batch_hist[i - 1])),
                                       hist);
        enif_make_map_put(env, m, enif_make_atom(env, "batch_hist"), hist, &m);
    }
    enif_rwlock_runlock(d->life);
    enif_make_map_put(env, m, enif_make_atom(env, "closed"), d->closed ? ATOM_true : ATOM_false,
                      &m);
    return m;
}

/* kernels() -> [{Atom, Id, VectorInputs}]: the kernel table, for Erlang. */
static ERL_NIF_TERM nif_kernels(ErlNifEnv *env, int argc, const ERL_NIF_TERM argv[])
{
    (void)argc;
    (void)argv;
    ERL_NIF_TERM list = enif_make_list(env, 0);
    for (uint32_t k = EC_KERNEL_COUNT - 1; k > 0; k--)
        list = enif_make_list_cell(
            env,
            enif_make_tuple3(env, kernel_atom(k), enif_make_uint(env, k),
                             enif_make_uint(env, KERNEL_INPUTS[k])),
            list);
    return list;
}

static int load(ErlNifEnv *env, void **priv, ERL_NIF_TERM info)
{
    (void)priv;
    (void)info;
#define A(name) ATOM_##name = enif_make_atom(env, #name)
    A(ok);
    A(error);
    A(erlcuda);
    A(badarg);
    A(busy);
    A(closed);
    A(unknown_kernel);
    A(args);
    A(arg);
    A(length_mismatch);
    A(shape);
    A(too_large);
    A(nan);
    A(infinity);
    A(neg_infinity);
    A(gpud);
    A(cancelled);
    A(sent);
    A(timeout);
    A(peer);
    A(true);
    A(false);
    A(fault);
    A(ring_entries);
    A(arena_bytes);
    A(arena_max_bytes);
    A(spin_us);
    A(busy_spin_us);
    A(pipeline_bytes);
    A(zero_copy_bytes);
    A(poison_outputs);
#undef A
#define KERNEL_ATOM_INIT(NAME, ID, ATOM, NIN) ATOM_k_##ATOM = enif_make_atom(env, #ATOM);
    EC_KERNELS(KERNEL_ATOM_INIT)
#undef KERNEL_ATOM_INIT
#define STATUS_ATOM_INIT(NAME, CODE, ATOM) STATUS_ATOMS[CODE] = enif_make_atom(env, #ATOM);
    EC_STATUSES(STATUS_ATOM_INIT)
#undef STATUS_ATOM_INIT
    /* members counts the callbacks set, from the top of the struct: with 0
     * the VM would never call the destructor. */
    ErlNifResourceTypeInit init = {.dtor = device_dtor, .members = 1};
    DEVICE_RT = enif_init_resource_type(env, "erlcuda_device", &init,
                                        ERL_NIF_RT_CREATE | ERL_NIF_RT_TAKEOVER, NULL);
    ErlNifResourceTypeInit rinit = {.dtor = region_dtor, .members = 1};
    REGION_RT = enif_init_resource_type(env, "erlcuda_region", &rinit,
                                        ERL_NIF_RT_CREATE | ERL_NIF_RT_TAKEOVER, NULL);
    return DEVICE_RT && REGION_RT ? 0 : -1;
}

static int upgrade(ErlNifEnv *env, void **priv, void **old_priv, ERL_NIF_TERM info)
{
    (void)old_priv;
    return load(env, priv, info);
}

static ErlNifFunc nif_funcs[] = {
    {"open", 2, nif_open, 0},
    {"socket_name", 1, nif_socket_name, 0},
    {"accept", 3, nif_accept, ERL_NIF_DIRTY_JOB_IO_BOUND},
    {"reset", 2, nif_reset, ERL_NIF_DIRTY_JOB_IO_BOUND},
    {"close", 1, nif_close, ERL_NIF_DIRTY_JOB_IO_BOUND},
    {"cancel", 2, nif_cancel, 0},
    {"submit", 4, nif_submit, 0},
    {"stats", 1, nif_stats, 0},
    {"kernels", 0, nif_kernels, 0},
};

ERL_NIF_INIT(erlcuda_nif, nif_funcs, load, NULL, upgrade, NULL)
