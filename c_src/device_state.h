/*
 * device_state.h: the state the NIF's files share (not the shared-memory
 * contract: that is erlcuda_ring.h). The NIF is split by concern into
 * floors; a file calls only files on the floors below its own, and
 * includes only their headers. The floors are c_src/layers.py's, which
 * checks both (make test runs it); from the top:
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
 *   results.c      terms out: a finished job's outputs
 *   args.c         terms in: a call's Args checked against its kernel's
 *                  signature, vectors into the arena, buffers as terms
 *   kernels.c      the kernels: built-in rows, users' kernels, kernels/0
 *   slot_cache.c, signature.c, copy.c, arena.c, shm.c, prefault.c, atoms.c
 *                  leaves that call no other file (signature.c is the
 *                  signature language's reader; atoms.h, every atom)

 * Each file's functions are declared in a header of its name (args.h for
 * args.c); this one holds the structures they share and the inline
 * helpers every floor uses, and has no file of its own, as erlcuda_ring.h
 * and profile.h have none: any floor may include them.
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
#ifndef ERLCUDA_DEVICE_STATE_H
#define ERLCUDA_DEVICE_STATE_H

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
    /* __atomic: a windowed put's copy threads asleep on parts_left (a
     * futex) until an answer moves it (pipeline.c). */
    uint32_t part_waiters;
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
    /* A piece of a windowed get (OUTPUT_GET_PIECE): the result it is
     * copied into once answered (kept alive by buf_term, the sink's term),
     * at byte sink_off. */
    struct get_sink *sink;
    uint64_t sink_off;
    struct region in;  /* copied inputs */
    struct region out; /* the output */
    uint32_t out_len;
    uint32_t ncredit;
    uint32_t credit[PIPELINE_MAX_PARTS - 1];
    int64_t t_pub; /* its publish (mono_ns): the round trip's and the stalls' split */
    /* A user's kernel's job: {kmod, kname} names the kernel in a
     * kernel_fault answer (atoms, valid in every env; 0 otherwise). */
    ERL_NIF_TERM kmod, kname;
    /* ... and its module's generation (kernel_arg_name reads the names of
     * its arguments by it), and the thread order's seed it ran with
     * (seeded: EC_OPT_THREAD_ORDER was given), for that answer too. */
    uint32_t kgen, seed;
    int seeded;
    int timed;     /* a timed submit's job (profile.h, round trip) */
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

/* A get of a buffer larger than any region the arena can give (buffers.c,
 * the windowed get): the result, allocated once, filled piece by piece,
 * each piece a GET descriptor of its own into a region of the arena that
 * is given back when the piece is answered. The caller asks for the pieces
 * in order (erlcuda:get/2), at most a window's worth at once, and takes
 * the result once all are in. The term of this resource is the caller's
 * and each piece job's (in its env). */
struct get_sink {
    struct buffer_res *b; /* kept (enif_keep_resource) */
    ErlNifBinary bin;     /* the result, `bytes` long, once has_bin */
    int has_bin;
    int taken;      /* __atomic: bin handed to a term (then never written) */
    int ended;      /* __atomic: the get counted as ended (jobs_ok, ...) */
    int started;    /* __atomic: the get counted as submitted */
    uint64_t bytes; /* the buffer's */
    uint64_t piece; /* bytes per piece, whole pages; the last may have fewer */
    uint32_t pieces;
    uint32_t next;   /* __atomic: the next piece to ask for */
    uint32_t copied; /* __atomic: pieces copied into bin */
};

/* The NIF's counters of a device, X(field, stats key) (stats.c). */
#define NIF_COUNTERS(X)                                                                          \
    X(submitted, submitted) X(completed, completed) X(busy, busy)                               \
    /* Jobs as their callers see them (launches, puts, gets; a job gpud   \
     * ran in slices is one), by their end: answered {ok, _}, answered    \
     * {error, _}, cancelled after the caller's timeout; modules gpud      \
     * refused. gpud counts descriptors apart (stats.c). */               \
    X(jobs_ok, jobs_ok) X(jobs_failed, jobs_failed) X(jobs_cancelled, jobs_cancelled)          \
    X(modules_refused, modules_refused)                                                         \
    X(bogus_cqes, bogus_completions) X(wakeups_sent, sq_wakeups) X(cq_sleeps, cq_sleeps)        \
    X(failed_by_reset, failed_by_restart) X(dirty_submits, dirty_submits)                       \
    X(arena_inputs, arena_inputs) X(pipelined, pipelined) X(put_windowed, puts_windowed)      \
    X(put_window_wait_ns, put_window_wait_ns) X(get_windowed, gets_windowed)                   \
    X(buffer_frees, buffer_frees)                                                                \
    X(reaped, reaped) X(cached_reserves, cached_reserves) X(sync_spins, sync_spins)             \
    X(sync_spin_answers, sync_spin_answers) X(arena_grown_ahead, arena_grown_ahead)             \
    X(arena_grown_on_miss, arena_grown_on_miss) X(result_bytes, result_bytes)                  \
    X(pinned_bytes, pinned_bytes) X(list_results_handed, list_results_handed)                    \
    /* The VM side's stalls (EC_STALL_NS or longer, as gpud's): waits for   \
     * the device lock or the SQ's, and passes over the CQ (answering a     \
     * chunk of completions and releasing their slots); how many, their    \
     * time, the longest. */                                                \
    X(lock_stalls, lock_stalls) X(lock_stall_ns, lock_stall_ns)                                 \
    X(lock_stall_max_ns, lock_stall_max_ns) X(answer_stalls, answer_stalls)                     \
    X(answer_stall_ns, answer_stall_ns) X(answer_stall_max_ns, answer_stall_max_ns)              \
    /* Small jobs that took EC_STALL_NS or longer from publish to answer    \
     * (slow_jobs), and where each waited that long, from its CQE's stamps \
     * (erlcuda_ring.h): in the SQ until gpud's drain (queue), from the    \
     * drain until gpud saw its launch done (gpud: the driver, the GPU, a  \
     * launch ahead of it), until the VM took the CQE (cq), until its      \
     * answer was built, just before it is sent (answer). A slow job with  \
     * none of the four long waited in pieces. */                           \
    X(slow_jobs, slow_jobs) X(slow_job_ns, slow_job_ns) X(slow_job_max_ns, slow_job_max_ns)      \
    X(job_stalls_queue, job_stalls_queue) X(job_stall_ns_queue, job_stall_ns_queue)             \
    X(job_stall_max_ns_queue, job_stall_max_ns_queue)                                          \
    X(job_stalls_gpud, job_stalls_gpud) X(job_stall_ns_gpud, job_stall_ns_gpud)                 \
    X(job_stall_max_ns_gpud, job_stall_max_ns_gpud)                                            \
    X(job_stalls_cq, job_stalls_cq) X(job_stall_ns_cq, job_stall_ns_cq)                         \
    X(job_stall_max_ns_cq, job_stall_max_ns_cq)                                                \
    X(job_stalls_answer, job_stalls_answer) X(job_stall_ns_answer, job_stall_ns_answer)         \
    X(job_stall_max_ns_answer, job_stall_max_ns_answer)

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
    uint64_t put_window_bytes;           /* a larger pipelined put goes through a window this large (0: none) */
    /* __atomic: set by reset and close before they wait for a pipelined
     * submit (d->pipe, d->life): a put waiting for its window's slots to be
     * copied out stops waiting, since gpud will copy nothing more. */
    int stopping;
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
    /* Where large list results go to be built (open's list_converter:
     * the device's server), off the completion thread (results.h). */
    ErlNifPid list_pid;
    int has_list_pid;
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
    ERL_NIF_TERM atom;   /* the name (users' kernels: within their module) */
    ERL_NIF_TERM module; /* users' kernels: their module's name (an atom) */
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
    uint32_t given, grid, block, shared_bytes, seed, max_wait_us;
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
/* A piece of a windowed get: copied into its sink, answered ok. */
#define OUTPUT_GET_PIECE 0xfcu

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

static inline void count(uint64_t *c, uint64_t n) { __atomic_add_fetch(c, n, __ATOMIC_RELAXED); }

/* A step of the VM side that took `ns`: a stall (counted in *n, *sum and
 * *max) when EC_STALL_NS or longer, as gpud counts its own. */
static inline void count_stall(uint64_t *n, uint64_t *sum, uint64_t *max, uint64_t ns)
{
    if (ns < EC_STALL_NS)
        return;
    count(n, 1);
    count(sum, ns);
    uint64_t m = __atomic_load_n(max, __ATOMIC_RELAXED);
    while (ns > m && !__atomic_compare_exchange_n(max, &m, ns, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
        ;
}

static inline void timed_lock(struct device *d, pthread_mutex_t *m)
{
    /* Uncontended: no clock read. A wait is timed on every call (a stall
     * of a millisecond holds a small job as long), and in timed submits
     * (profile.h) summed. */
    if (prof_timing)
        prof_add(&d->prof.submit[PS_LOCKS], 1);
    if (pthread_mutex_trylock(m) == 0)
        return;
    int64_t t0 = mono_ns();
    pthread_mutex_lock(m);
    uint64_t waited = (uint64_t)(mono_ns() - t0);
    count_stall(&d->c.lock_stalls, &d->c.lock_stall_ns, &d->c.lock_stall_max_ns, waited);
    if (prof_timing) {
        prof_add(&d->prof.submit[PS_LOCK_WAITS], 1);
        prof_add(&d->prof.submit[PS_LOCK_WAIT_NS], waited);
    }
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
    int freed = __atomic_load_n(&b->freed, __ATOMIC_ACQUIRE);
    /* A buffer of a device closed since (the application stopped; a new
     * start made a new device) went with its gpud: lost, as after a gpud
     * restart, not a buffer of another device. */
    if (__atomic_load_n(&b->d->closed, __ATOMIC_ACQUIRE))
        return freed ? BUF_FREED : BUF_LOST;
    if (b->d != d)
        return BUF_OTHER_DEVICE;
    if (freed)
        return BUF_FREED;
    if (b->epoch != __atomic_load_n(&d->epoch, __ATOMIC_RELAXED))
        return BUF_LOST;
    return BUF_LIVE;
}

#endif
