/*
 * erlcuda_nif.h: private to the NIF's own files (not the shared-memory
 * contract: that is erlcuda_ring.h). The NIF is split by concern into
 * floors; a file calls only files on the floors below its own:
 *
 *   erlcuda_nif.c  the entry table, load/upgrade/unload, thin entry functions
 *   device.c       a device's life: open, accept (the handshake), reset
 *                  (gpud restarted), close, the destructors
 *   stats.c        the stats map
 *   launch.c       a launch (submit) and a module's load or unload
 *   complete.c     completion: the completion thread, the answers, failing
 *                  the jobs in flight, cancel, await_spin
 *   buffers.c      device buffers: put, get, free
 *   pipeline.c     the pipelined submit: a large job from binaries published
 *                  in parts as its inputs are copied in
 *   submit.c       the ring producer: slots, regions, the SQ push
 *   slot_cache.c   per-thread caches of free slots
 *   args.c         terms in: a call's Args checked against its kernel's
 *                  signature, vectors into the arena, buffers as terms
 *   results.c      terms out: a finished job's outputs
 *   kernels.c      the kernels: built-in rows, users' kernels, kernels/0
 *   signature.c    the signature language's reader (signature.h; a leaf)
 *   atoms.h        every atom; with erlcuda_ring.h, the bottom floor
 *   copy.c, arena.c, shm.c, prefault.c   leaves that call no other file
 *
 * (device.c and stats.c share a floor, as slot_cache.c and submit.c do.)
 * This header holds the structures they share, inline helpers every floor
 * uses, and each file's functions, declared bottom floor first.
 *
 * Locks, in the order they are taken:
 *   life (rwlock)  read by every user of the mapping, written by close;
 *   pipe (rwlock)  read by a pipelined submit while it publishes, written
 *                  by reset;
 *   cq_lock        held by whoever takes entries off the CQ (a completion
 *                  thread, for a chunk; reset);
 *   drain (rwlock) read by the completion thread or a scheduler (reap_cq)
 *                  while it answers the entries it took, written by reset;
 *   lock           slots, arena allocator;
 *   sq_lock        the SQ tail, and what a publish checks (buffers' epoch
 *                  and freed flags, module generations).
 * (The copy pool's lock is a leaf: nothing else is taken under it.)
 *
 * A job slot's state moves FREE -> INFLIGHT (sq_push_locked, under sq_lock) ->
 * COMPLETING (CAS by the consumer or cancel) -> FREE (under lock). Only the
 * one that wins the CAS out of INFLIGHT sends a message, so every job gets
 * exactly one answer, or none at all when launch_sync cancelled it first.
 */
#ifndef ERLCUDA_NIF_H
#define ERLCUDA_NIF_H

#include <erl_nif.h>

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "arena.h"
#include "atoms.h"
#include "erlcuda_ring.h"
#include "prefault.h"
#include "signature.h"
#include "profile.h"
#include "shm.h"
#include "slot_cache.h"

enum job_state { JOB_FREE = 0, JOB_INFLIGHT, JOB_CANCELLED, JOB_COMPLETING };

/* A completion thread takes at most this many CQEs at a time (then answers
 * them outside cq_lock). */
#define CQ_CHUNK 64u
/* A submit on a scheduler answers at most this many completed jobs
 * (reap_cq), so a submit stays a short NIF call. */
#define REAP_MAX 16u

/* A pipelined job (see pipeline.c) is published as at most this many
 * descriptors. */
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

/* The arena grows ahead of demand once its regions use more than this
 * fraction of it (submit.c, grow_ahead_locked): early enough that a
 * stream of jobs as large as a quarter of the arena does not catch up
 * with the registration of the next segment. */
#define ARENA_HIGH_WATER_NUM 3u
#define ARENA_HIGH_WATER_DEN 4u

/* An output of a job: its element type, length, byte offset in the job's
 * output region, and whether it is given back as a number. */
struct out_spec {
    uint8_t type, scalar;
    uint32_t len;
    uint64_t off;
};

/* A job slot. Its first fields are the slot's own and outlive its jobs:
 * other threads read them without the lock (a completion for a slot that
 * was freed meanwhile reads state, gen and parts before it claims the
 * slot), so they are only ever stored atomically. Every field from
 * JOB_FIRST_FIELD on is the job's: clear_slot zeroes all of them at once,
 * so a field added there cannot carry one job's state into the next one
 * (a free that reused the slot of a 2^26-element output once built that
 * whole output as its answer: 25 ms a call). */
struct job {
    /* The slot's own. */
    uint32_t gen;
    int state;      /* enum job_state, accessed with __atomic */
    ErlNifEnv *env; /* keeps ref and any in-arena input binaries alive */
    /* A pipelined job (see pipeline.c) is published as `parts`
     * descriptors over slices of its regions; it is answered once all of
     * them are back. Its extra slots hold no job: each is the ring credit of
     * one extra descriptor, so the SQ never holds more entries than slots. */
    uint32_t parts;      /* __atomic: descriptors of this job: 1 unless pipelined */
    uint32_t parts_left; /* __atomic: descriptors not yet completed */
    int32_t part_status; /* __atomic: the first non-OK status of a part */
    /* The job's (JOB_FIRST_FIELD to the end). */
    uint32_t kernel;
    int out_buf;          /* the output is a new device buffer: buf_term, in env */
    ERL_NIF_TERM buf_term;
    uint8_t type;   /* enum ec_type of the output (the first, for a kernel) */
    uint8_t output; /* OUTPUT_KERNEL or a NIF-private kind */
    uint8_t nout;   /* a kernel's outputs (0: only io arguments) */
    struct out_spec outs[EC_MAX_OUTPUTS];
    int form;       /* enum vec_form of the first vector argument: the result's */
    int zero_copy;   /* deliver the output as a resource binary over its region */
    int out_taken;   /* the output region now belongs to a resource binary */
    ErlNifPid pid;
    ERL_NIF_TERM ref;
    struct region in;  /* copied inputs */
    struct region out; /* the output */
    uint32_t out_len;
    uint32_t ncredit;
    uint32_t credit[PIPELINE_MAX_PARTS - 1];
    int64_t t_pub; /* a timed submit's publish (mono_ns, profile.h), else 0 */
};
#define JOB_FIRST_FIELD kernel

/* A result binary that stays in the arena: the region is freed when the last
 * reference to the binary is garbage-collected. */
struct region_res {
    struct device *d;
    struct region r;
};

/* A device buffer (see erlcuda_ring.h, EC_FLAG_*_BUF), the Erlang term of
 * which is this resource. `id` is the device's, assigned here (never reused
 * while the VM lives); `epoch` the device's restart count when it was made:
 * once gpud restarts, every older buffer is lost. `freed` (__atomic) goes 0
 * -> 1 once, by free/1 or the destructor, whichever is first; the one that
 * sets it queues the free for gpud. The destructor never blocks: it takes
 * only freeq_lock, a leaf. */
struct buffer_res {
    struct device *d;
    uint64_t id;
    uint32_t epoch;
    uint32_t len;
    uint8_t type;
    int freed;
};

/* The NIF's counters of a device, X(field, stats key) (stats.c). */
#define NIF_COUNTERS(X)                                                                          \
    X(submitted, submitted) X(completed, completed) X(busy, busy)                               \
    X(bogus_cqes, bogus_completions) X(wakeups_sent, sq_wakeups) X(cq_sleeps, cq_sleeps)        \
    X(failed_by_reset, failed_by_restart) X(dirty_submits, dirty_submits)                       \
    X(arena_inputs, arena_inputs) X(pipelined, pipelined) X(buffer_frees, buffer_frees)         \
    X(reaped, reaped) X(cached_reserves, cached_reserves) X(sync_spins, sync_spins)             \
    X(sync_spin_answers, sync_spin_answers) X(arena_grown_ahead, arena_grown_ahead)             \
    X(arena_grown_on_miss, arena_grown_on_miss) X(result_bytes, result_bytes)

struct counters {
#define NIF_COUNTER_FIELD(FIELD, KEY) uint64_t FIELD;
    NIF_COUNTERS(NIF_COUNTER_FIELD)
#undef NIF_COUNTER_FIELD
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
    /* The SQ tail: a lock of its own, so publishing does not wait for slot
     * reservations and releases (the H200 profile with reaping: 67-74% of
     * the lock's acquisitions waited, 6-11 us on average, with reserve and
     * publish each holding it once per job). Adaptive like `lock`. */
    pthread_mutex_t sq_lock;
    int sq_lock_ok;
    int closed;
    int unmapped;
    struct shm shm;
    struct arena alloc[EC_MAX_SEGMENTS]; /* one allocator per arena segment */
    uint64_t arena_total, arena_max;     /* bytes in segments; the growth limit */
    uint64_t zero_copy_bytes;            /* vector results this large stay in the arena */
    uint64_t pipeline_bytes;             /* binary inputs this large are pipelined (pipeline.c) */
    uint64_t inline_off;                 /* slot i's inline area: inline_off + i * INLINE_BYTES */
    uint32_t inline_slots;               /* slots 0 .. inline_slots - 1 have one */
    int poison;                          /* fill outputs with NaN before submitting */
    /* Faults the arena's segments in ahead of gpud's registration
     * (prefault.h); started by open when asked, stopped by close before
     * anything is unmapped. */
    struct prefault prefault;
    uint64_t exported;                   /* live region_res, __atomic */
    uint32_t id, nslots, spin_us, busy_spin_us;
    uint32_t sync_spin_us; /* await_spin's budget; 0: never spin */
    struct job *jobs;
    uint32_t *free_stack;
    uint32_t nfree;
    struct slot_caches caches;          /* free inline slots per thread (slot_cache.h) */
    uint32_t in_flight, in_flight_peak; /* __atomic adds (the caches skip the lock); read unlocked */
    ErlNifTid thread;
    int thread_started;
    /* Read by a thread answering CQEs it took off the CQ (the completion
     * thread, a scheduler in reap_cq), written by reset. */
    ErlNifRWLock *drain;
    int ctl_efd; /* wakes the completion thread for shutdown */
    int stop;    /* __atomic */
    ErlNifEnv *msg_env; /* the completion thread's */
    struct counters c;  /* __atomic adds */
    struct prof prof;   /* sampled timings: profile.h */
    /* Device buffers. epoch: gpud restarts so far (__atomic; changed under
     * lock by reset); next_buf_id under lock. Ids of freed buffers wait in
     * freeq (under freeq_lock, a leaf taken last) until a free descriptor
     * carries them (flush_frees). */
    uint32_t epoch;
    uint64_t next_buf_id;
    ErlNifMutex *freeq_lock;
    uint64_t *freeq;
    uint32_t nfreeq, freeq_cap; /* nfreeq read __atomic without the lock */
};

/* One vector argument as given by the caller. */
/* The form a vector argument came in, and so the form of a vector result. */
enum vec_form { FORM_LIST, FORM_BINARY, FORM_TYPED };

struct vec {
    ERL_NIF_TERM term;
    int is_binary;
    int typed;          /* came as {Type, Binary} */
    uint8_t type;       /* enum ec_type (f32 for lists and bare binaries) */
    ERL_NIF_TERM bin_term; /* the binary itself (inside the tuple when typed) */
    ErlNifBinary bin;
    ERL_NIF_TERM list;
    uint64_t len; /* elements; valid once known */
    int len_known;
    struct buffer_res *buf; /* a device buffer: no copy, its id is named */
    int in_arena;  /* a binary already in this device's arena: no copy */
    uint64_t addr; /* its arena address when in_arena */
};

/* A kernel as the NIF uses it: a row of the table (erlcuda_ring.h), made
 * once at load, or a user's kernel, made once when its module is loaded
 * (make_user_kernel in kernels.c) and kept in a KERNEL_RT resource that
 * every launch of it passes. Either way its signature is a struct sig
 * (signature.h), and parse_args checks a call against it alone. Never
 * written after it is made: submits on every scheduler read it at once. */
struct kernel_info {
    ERL_NIF_TERM atom; /* built-ins: the name */
    struct sig sig;
    /* Users' kernels: the length in their `blocks` rule, checked as an
     * output's is (has_blocks 0: none to check). */
    struct sig_len blocks;
    int has_blocks;
    unsigned shape;    /* built-ins: an EC_SHAPE_*; users' kernels: SHAPE_USER */
    uint32_t types;    /* the set T ranges over (EC_TYPE_BIT mask); 0: no T */
    const char *entry;
    const char *args_text, *outs_text; /* built-ins: the row's signature */
    /* Users' kernels only (user != 0): the id, the module slot and the
     * generation it was loaded as (a submit checks it is still the live
     * one). */
    int user;
    uint32_t id, slot, gen;
};

/* A user's launch options, which differ from call to call of one kernel:
 * EC_OPT_* in `given`, the others 0 where not given. */
struct launch_opts {
    uint32_t given, grid, block, shared_bytes;
};

/* A user's kernel's shape, past the table's: its job travels as an
 * ec_job_args record (EC_FLAG_ARGS). */
#define SHAPE_USER EC_SHAPE_COUNT
/* What a finished job answers (struct job.output): the kernel's outputs, or
 * NIF-private kinds below. */
#define OUTPUT_KERNEL 0u
/* A NIF-private output kind: a control descriptor (load or unload a
 * module), answered `ok` or {error, {module, Why}}; Why comes back in the
 * job's output region, at most CONTROL_MSG_BYTES. */
#define OUTPUT_CONTROL 0xffu
#define CONTROL_MSG_BYTES 1024u
/* A put: answered {ok, Buf} (the job's buf_term). */
#define OUTPUT_PUT 0xfeu
/* A free descriptor: answered to nobody. */
#define OUTPUT_FREE 0xfdu

/* A checked job: what submit has learned from the arguments. Vector
 * arguments (v, io) are in[0 .. nin) in slot order, the outputs
 * outs[0 .. nout), the s and d arguments param[0 .. sig.nparams) as
 * ec_job_args holds them; a built-in's are packed into `p` as well. */
struct job_spec {
    const struct kernel_info *ki;
    uint32_t kernel;
    unsigned nin;
    struct vec in[EC_MAX_VECTORS];
    uint8_t type;  /* T: the built-ins' element type of every vector */
    unsigned elem; /* bytes of T */
    int form;      /* enum vec_form of the first vector: the results' */
    unsigned shape;
    unsigned nout;
    struct out_spec outs[EC_MAX_OUTPUTS];
    uint64_t param[EC_MAX_PARAMS];
    union ec_params p;
    uint64_t out_len; /* outs[0].len: a built-in's one output */
};

/* -------------------------------------------------------- small helpers -- */

static inline void timed_lock(struct device *d, pthread_mutex_t *m)
{
    if (!prof_timing) {
        pthread_mutex_lock(m);
        return;
    }
    /* A timed submit (profile.h): did it wait for the lock, and how long? */
    prof_add(&d->prof.submit[PS_LOCKS], 1);
    if (pthread_mutex_trylock(m) == 0)
        return;
    int64_t t0 = mono_ns();
    pthread_mutex_lock(m);
    prof_add(&d->prof.submit[PS_LOCK_WAITS], 1);
    prof_add(&d->prof.submit[PS_LOCK_WAIT_NS], (uint64_t)(mono_ns() - t0));
}

static inline void dev_lock(struct device *d) { timed_lock(d, &d->lock); }
static inline void sq_lock(struct device *d) { timed_lock(d, &d->sq_lock); }
static inline void sq_unlock(struct device *d) { pthread_mutex_unlock(&d->sq_lock); }
static inline void dev_unlock(struct device *d) { pthread_mutex_unlock(&d->lock); }

/* A spin-wait's pause. */
#if defined(__x86_64__) || defined(__i386__)
#define cpu_relax() __builtin_ia32_pause()
#else
#define cpu_relax() __asm__ __volatile__("" ::: "memory")
#endif

static inline void count(uint64_t *c, uint64_t n) { __atomic_add_fetch(c, n, __ATOMIC_RELAXED); }

/* Jobs (ring entries) in flight: up by n, and the peak with it. */
static inline void in_flight_add(struct device *d, uint32_t n)
{
    uint32_t f = __atomic_add_fetch(&d->in_flight, n, __ATOMIC_RELAXED);
    if (f > __atomic_load_n(&d->in_flight_peak, __ATOMIC_RELAXED))
        __atomic_store_n(&d->in_flight_peak, f, __ATOMIC_RELAXED); /* a peak, not a count: a lost race is harmless */
}

static inline ERL_NIF_TERM make_error(ErlNifEnv *env, ERL_NIF_TERM reason)
{
    return enif_make_tuple2(env, ATOM_error, reason);
}

static inline ERL_NIF_TERM make_badarg(ErlNifEnv *env, ERL_NIF_TERM what)
{
    return make_error(env, enif_make_tuple2(env, ATOM_badarg, what));
}

static inline uint8_t *region_ptr(struct device *d, const struct region *r)
{
    return d->shm.seg[r->seg].base + r->off;
}

static inline uint64_t region_addr(const struct region *r)
{
    return ((uint64_t)r->seg << EC_ADDR_SEGMENT_SHIFT) | r->off;
}

/* Can buffer b be named by a job of device d now? The one rule, read when a
 * job is parsed (buffer_unusable) and again under sq_lock when it is
 * published (submit.c). */
enum buffer_state { BUF_LIVE, BUF_OTHER_DEVICE, BUF_FREED, BUF_LOST };
static inline enum buffer_state buffer_state(const struct device *d, const struct buffer_res *b)
{
    if (b->d != d)
        return BUF_OTHER_DEVICE;
    if (__atomic_load_n(&b->freed, __ATOMIC_ACQUIRE))
        return BUF_FREED;
    if (b->epoch != __atomic_load_n(&d->epoch, __ATOMIC_RELAXED))
        return BUF_LOST;
    return BUF_LIVE;
}

/* ---------------------------------------------------- copy.c: the copies --
 * A leaf, like arena.c, shm.c and prefault.c: it calls no other file. */

/* Starts the copy pool of `threads` threads (0: the default; the first
 * holder decides) or takes another hold of it; called by load/upgrade.
 * Never fails: without threads a copy runs on its caller. */
void copy_pool_hold(uint32_t threads);
/* Drops a hold; the last one stops the threads and waits for them. Called
 * by unload, when no code of this library instance can run any more. */
void copy_pool_release(void);
/* memcpy into the arena, over the copy pool when large (copy_streaming). */
void copy_bytes(void *dst, const void *src, size_t n);
/* memcpy into the arena; large copies with streaming stores, fenced before
 * it returns (the caller may publish the bytes at once). */
void copy_streaming(void *dst, const void *src, size_t n);
/* Calls piece(arg, i) for every i in 0 .. pieces - 1, in that order of
 * start, on the caller and pool threads, `threads` at once at most (0: as
 * many as the pool has, copy_threads()); returns when all have returned. */
void copy_pieces(void (*piece)(void *arg, uint32_t i), void *arg, uint32_t pieces, uint32_t threads);
/* The copy pool's threads, the caller's included. */
uint32_t copy_threads(void);
/* Pieces that finish together run at most this many at once (copy.c). */
#define SPREAD_COPY_THREADS 8u

/* ------------------------------------------------ args.c: term conversion --
 * Everything else knows the kernels and their arguments only through these
 * (and struct job_spec / struct vec, which submit reads). */

/* The resource type of a result binary that stays in the arena. */
extern ErlNifResourceType *REGION_RT;
/* The resource type of a device buffer (struct buffer_res). */
extern ErlNifResourceType *BUFFER_RT;
/* Parses the Args of kernel s->kernel (the caller sets it, from kernel_id)
 * into s, s->nin included. Returns 0 when s is filled, 1 when the job is too
 * large for a normal scheduler (only when !dirty), or -1 with *err set to the
 * {error, _} answer. Reads the mapping (arena lookups): the caller holds
 * d->life. */
int parse_args(ErlNifEnv *env, struct device *d, ERL_NIF_TERM args, int dirty,
               struct job_spec *s, ERL_NIF_TERM *err);
/* Parses one vector (not a buffer) for put: 0, 1 to go dirty (only when
 * !dirty), or -1 with *err set. */
int parse_vector(ErlNifEnv *env, ERL_NIF_TERM t, int dirty, struct vec *v, ERL_NIF_TERM *err);
/* Writes a vector argument to dst (v->len elements of its type; lists as f32). Returns 0 if a
 * list element is not a number (dst is then partly written). */
int copy_vec(ErlNifEnv *env, const struct vec *v, void *dst);
/* Bytes per element of an enum ec_type. */
unsigned type_bytes(uint8_t type);
/* A number (or nan, infinity, neg_infinity) as a double. */
int term_to_double(ErlNifEnv *env, ERL_NIF_TERM t, double *out);
/* The buffer a term is, or NULL. */
struct buffer_res *get_buffer(ErlNifEnv *env, ERL_NIF_TERM t);
/* Makes a new buffer of device d (a fresh id, the current epoch): its
 * resource term in env, or 0 when out of memory. */
ERL_NIF_TERM new_buffer(ErlNifEnv *env, struct device *d, uint8_t type, uint32_t len);
/* Why buffer b cannot be used on device d now ({buffer, freed | lost |
 * {device, D}}), or 0 when it can (buffer_state). */
ERL_NIF_TERM buffer_unusable(ErlNifEnv *env, struct device *d, struct buffer_res *b);

/* ------------------------------------------ results.c: term conversion out */

/* A double as a term: a float, or nan, infinity, neg_infinity. */
ERL_NIF_TERM float_term(ErlNifEnv *env, double f);
/* The answer of a finished kernel job, built in env: `ok` (no outputs),
 * its one output, or a tuple of them; (j->zero_copy) a single output as a
 * resource binary over the output region. */
ERL_NIF_TERM result_term(ErlNifEnv *env, struct device *d, struct job *j);

/* ---------------------------------------------- kernels.c: the kernels --- */

/* Parses the built-in rows; called by load/upgrade, after atoms_load.
 * Returns -1 when a row does not parse (a build that cannot load). */
int kernels_load(ErlNifEnv *env);
/* The built-in kernel an atom names, or NULL when it names none. */
const struct kernel_info *builtin_kernel(ErlNifEnv *env, ERL_NIF_TERM kernel);
/* user_kernel(Row) -> {ok, Kernel} | {error, Why}: a user's kernel as
 * erlcuda_modules describes it when its module is loaded, {Id, Slot, Gen,
 * Args, Outs, Blocks, Types}, read and checked into a KERNEL_RT resource.
 * {error, Why}: the blocks length does not read against the signature (Why:
 * the reader's message); badarg for a row that is not one. */
ERL_NIF_TERM make_user_kernel(ErlNifEnv *env, ERL_NIF_TERM row);
extern ErlNifResourceType *KERNEL_RT;
/* A launch's user kernel, {Kernel, {Given, Grid, Block, SharedBytes}}:
 * *ki points into Kernel's resource, alive while the term is. Returns 0
 * when the term is not one. */
int user_kernel(ErlNifEnv *env, ERL_NIF_TERM t, const struct kernel_info **ki,
                struct launch_opts *o);
/* The live generation of module slot `slot` (0: none); set by
 * erlcuda_nif:module_gen/2. A submit of a user's kernel publishes only while
 * its generation is live, checked under sq_lock (publish_checked). */
uint32_t module_gen(uint32_t slot);
void set_module_gen(uint32_t slot, uint32_t gen);
/* kernels(): one map per built-in (name, id, args, outputs, types, shape,
 * entry, accumulate). */
ERL_NIF_TERM kernels_term(ErlNifEnv *env);
/* signature(Args, Outs) -> {ok, ArgMaps, OutMaps, UsesT} | {error, Why}:
 * a user's manifest line read as the NIF reads it. */
ERL_NIF_TERM signature_term(ErlNifEnv *env, ERL_NIF_TERM args, ERL_NIF_TERM outs);

/* ------------------------------------------- submit.c: the ring producer --
 * Slots, regions and the SQ. */

/* Returns a region to its segment's allocator. Caller holds d->lock. */
void free_region_locked(struct device *d, struct region *r);
/* Allocates a region of `bytes` (growing the arena). Caller holds d->lock.
 * 0 or -1. */
int region_alloc_locked(struct device *d, uint64_t bytes, struct region *r);
/* A slot and regions for a job (see submit.c): the slot, -1 busy, -2 never. */
int64_t reserve_job(struct device *d, uint64_t in_bytes, uint64_t out_bytes, uint32_t credits,
                    int keep_out);
/* Gives back a slot reserved but not published. */
void unreserve_job(struct device *d, uint32_t idx);
/* A slot's job fields back to free; the caller puts the slot (and its
 * credits) where free slots go. */
void clear_slot(struct device *d, struct job *j);
/* Frees slot idx (its regions unless exported, its credits); its env must
 * be clear already. Caller holds d->lock. */
void free_slot_locked(struct device *d, uint32_t idx);
/* Frees job idx's env, regions (unless exported) and slots. Caller holds
 * d->lock. */
void release_job_locked(struct device *d, uint32_t idx);
/* The one SQ write: slot idx INFLIGHT, its descriptor at the tail, then the
 * tail stored with release, as erlcuda_ring.h orders it. Caller holds sq_lock; no wake-up. */
void sq_push_locked(struct device *d, uint32_t idx, const struct ec_sqe *sqe);
/* Publishes one descriptor of slot idx (sq_push_locked) and wakes gpud. */
void publish(struct device *d, uint32_t idx, const struct ec_sqe *sqe);
/* publish, unless an input buffer of s (may be NULL) was freed or lost
 * since it was checked (-2), or s's kernel is a user's whose module
 * generation was retired (-1): then nothing is published. */
int publish_checked(struct device *d, uint32_t idx, const struct ec_sqe *sqe,
                    const struct job_spec *s);
/* Wakes gpud if it sleeps, after a publish. */
void wake_gpud(struct device *d);

/* ------------------------------------- pipeline.c: the pipelined submit --
 * A large job from binaries published as several descriptors (parts) as its
 * inputs are copied in; see pipeline.c for how each shape is split. */

/* How a job is split. parts == 1: not pipelined. */
struct pipe_plan {
    uint32_t parts;     /* descriptors (a matmul's slices of the put of B included) */
    uint32_t pieces;    /* slices copied and published as kernel jobs */
    uint64_t slice;     /* elements (a matmul: rows of A) per piece; the last may have fewer */
    uint64_t out_elems; /* the output region's elements: out_len, or a reduction's partials */
    uint32_t b_pieces;  /* a matmul: slices of B, each put on its own */
    uint64_t b_slice;   /* and their elements; the last may have fewer */
};
/* The plan for checked job s (parts == 1 unless it is worth pipelining). */
void pipeline_plan(const struct device *d, const struct job_spec *s, struct pipe_plan *p);
/* Back to one descriptor (not enough free slots for the parts). */
void pipeline_unplan(const struct job_spec *s, struct pipe_plan *p);
/* Copies job idx's inputs into `dst` (per vector) and publishes its parts
 * from `whole`, its descriptor over all of its regions; returns when all are
 * published (the binaries are only valid during the NIF call). Caller holds
 * d->life and d->pipe (read). Returns 0, or -1 with nothing published (the
 * VM is out of memory). */
int submit_pipelined(struct device *d, uint32_t idx, const struct ec_sqe *whole,
                     const struct job_spec *s, uint8_t *dst[2], const struct pipe_plan *plan);
/* How many parts a put of `bytes` from a binary is published as: 1 below
 * the device's pipeline_bytes, else one per slice (as an elementwise job's),
 * at most PIPELINE_MAX_PARTS. */
uint32_t pipeline_put_parts(const struct device *d, uint64_t bytes);
/* Copies a put's binary src -> dst (whole->in0_len elements) in `parts`
 * slices over the copy pool, publishing each as a slice of the buffer
 * (EC_CONTROL_PUT, byte offset in p.u64[0]) as soon as it is in, so gpud's
 * copies to the device overlap this copy. Slot idx holds parts - 1 credit
 * slots. Returns when all are published; caller holds d->life (read). */
void submit_put_pipelined(struct device *d, uint32_t idx, const struct ec_sqe *whole,
                          const uint8_t *src, uint8_t *dst, uint32_t parts);
/* Completes the answer of a pipelined job of `parts` descriptors once all
 * are back and OK: a reduction's partials are added into its result. */
void pipeline_finish(struct device *d, struct job *j, uint32_t parts);

/* ---------------------------------------------- buffers.c: device buffers -- */

/* put(Handle, Vector): a put descriptor; {ok, Ref}, then {erlcuda, Ref,
 * {ok, Buf} | {error, Reason}}. Returns 1 to go dirty (when !dirty). */
int submit_put(ErlNifEnv *env, struct device *d, const ERL_NIF_TERM argv[], int dirty,
               ERL_NIF_TERM ref, ERL_NIF_TERM *result);
/* get(Buf): a get descriptor; {ok, Ref}, then {erlcuda, Ref, {ok, Vector}}. */
ERL_NIF_TERM submit_get(ErlNifEnv *env, struct buffer_res *b, ERL_NIF_TERM buf, ERL_NIF_TERM ref);
/* Queues buffer b's free (once; never blocks: the destructor calls it). */
void queue_free(struct buffer_res *b);
/* Publishes queued frees as free descriptors, as far as slots and arena
 * allow. Caller holds d->life (read) and not d->lock. */
void flush_frees(struct device *d);
/* free(Buf): queue_free, then flush_frees while the device is open. */
void buffer_free(struct buffer_res *b);
/* buffer_info(Buf): {Device, Type, Len, live | freed | lost}. */
ERL_NIF_TERM buffer_info(ErlNifEnv *env, struct buffer_res *b);
/* BUFFER_RT's destructor: queues the free and wakes the completion thread
 * to send it. */
void buffer_dtor(ErlNifEnv *env, void *obj);

/* ----------------------------------------------- complete.c: completion -- */

/* Starts the device's completion thread. Returns 0 or an errno value. */
int start_completion_thread(struct device *d);
/* Stops it and waits for it, if it runs. */
void stop_completion_thread(struct device *d);
/* Consumes every CQE present and answers their jobs. Caller holds cq_lock
 * (or the completion thread is gone). Returns the CQEs consumed. */
uint32_t drain_cq(struct device *d, ErlNifEnv *caller_env);
/* Answers up to REAP_MAX completed jobs on the calling scheduler thread
 * (with its own erts allocator instance), if the CQ has some and nobody
 * else is taking them. Called by submits; the caller holds d->life (read). */
void reap_cq(struct device *d, ErlNifEnv *caller_env);
/* The {error, _} answer of a gpud status other than OK. */
ERL_NIF_TERM status_error(ErlNifEnv *env, int32_t status);

/* The last small job this scheduler thread submitted with the caller's
 * reference (launch_sync's): set by a submit that published one inline job,
 * cleared by any other submit. ref_hash tells await_spin it is the job
 * awaited: an entry left by a job whose await ran on another thread (its
 * process moved) must not be spun for. */
struct last_submit {
    struct device *d;
    uint32_t idx, gen;
    ErlNifPid pid;
    ErlNifUInt64 ref_hash;
};
extern __thread struct last_submit last_submit;
/* Jobs in flight on the device above which await_spin does not spin: the
 * caller's scheduler is then better spent on other processes. */
#define SYNC_SPIN_MAX_IN_FLIGHT 2u
/* await_spin(Handle, Ref) -> answered | waiting. Spins on the calling
 * scheduler, up to the device's sync_spin_us, until the job the calling
 * process just submitted with reference Ref (last_submit) is answered,
 * taking CQEs itself meanwhile: the answer is then in the caller's mailbox
 * without a completion thread's enif_send waking a sleeping scheduler. */
ERL_NIF_TERM await_spin(ErlNifEnv *env, struct device *d, ERL_NIF_TERM ref);
/* Answers every job still in flight with {error, Reason}. The caller holds
 * cq_lock (or the completion thread is gone), and d->lock. */
void fail_in_flight_locked(struct device *d, ErlNifEnv *caller_env, ERL_NIF_TERM reason);
/* Cancels the job in flight whose ref is `ref`. Returns 1 when no answer
 * will be sent, 0 when it is in the mailbox or on its way. */
int cancel_job(struct device *d, ERL_NIF_TERM ref);

/* ------------------------------------------------------ launch.c: launch --
 * submit(Handle, Kernel, Args, Flags) on device d. Returns 0 with *result
 * the answer, or 1 when the job must move to a dirty scheduler (only when
 * !dirty): the caller reschedules it. */
int submit_job(ErlNifEnv *env, struct device *d, const ERL_NIF_TERM argv[], int dirty,
               ERL_NIF_TERM ref, ERL_NIF_TERM *result);
/* module_op(Handle, load | unload, Slot, Path): a control descriptor, in
 * order with the jobs around it; {ok, Ref}, then {erlcuda, Ref, ok} or
 * {erlcuda, Ref, {error, {module, Why}}}. */
ERL_NIF_TERM submit_control(ErlNifEnv *env, struct device *d, const ERL_NIF_TERM argv[]);

/* ------------------------------------------- device.c: a device's life -- */

/* The resource type of a device (struct device). */
extern ErlNifResourceType *DEVICE_RT;
/* The device a term is, or NULL. */
struct device *get_device(ErlNifEnv *env, ERL_NIF_TERM t);
/* open(Device, Opts) -> {ok, Handle} | {error, Reason} (erlcuda_nif.c). */
ERL_NIF_TERM device_open(ErlNifEnv *env, ERL_NIF_TERM device, ERL_NIF_TERM opts);
/* The abstract socket name gpud is given, as a binary. */
ERL_NIF_TERM device_socket_name(ErlNifEnv *env, struct device *d);
/* Accepts gpud (OS pid `pid`) within timeout ms and hands it the memory:
 * ok | {error, timeout | peer | Errno}. */
ERL_NIF_TERM device_accept(ErlNifEnv *env, struct device *d, int pid, int timeout);
/* gpud has exited: jobs it answered are answered, every other job in
 * flight gets {error, Reason}, buffers are lost, the rings start again. */
void device_reset(ErlNifEnv *env, struct device *d, ERL_NIF_TERM reason);
/* Ends the device for good, every job in flight answered {error, Reason};
 * idempotent. */
void device_close(struct device *d, ErlNifEnv *caller_env, ERL_NIF_TERM reason);
/* DEVICE_RT's and REGION_RT's destructors. */
void device_dtor(ErlNifEnv *env, void *obj);
void region_dtor(ErlNifEnv *env, void *obj);

/* ------------------------------------------------- stats.c: the stats map -- */

/* stats(Handle): the device's counters, the profile's sums and gpud's. */
ERL_NIF_TERM stats_term(ErlNifEnv *env, struct device *d);

#endif
