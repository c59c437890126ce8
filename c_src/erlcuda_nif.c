/*
 * erlcuda_nif.c: the VM side of one device's shared memory; the entry
 * points. The other files, the locks and the states of a job slot are
 * described in erlcuda_nif.h.
 *
 *   open     creates the shared memory and starts the completion thread
 *            (complete.c), which answers jobs straight to their callers.
 *   submit   validates a job (args.c), copies its vectors into an arena
 *            region and publishes a descriptor on the SQ (submit.c).
 *   reset    answers every job in flight when gpud has died and zeroes the
 *            rings for the next gpud.
 *   close    does the same for good and releases the memory and fds.
 *
 * load starts the pool of copy threads (copy.c); unload stops it.
 */
#define _GNU_SOURCE
#include "erlcuda_nif.h"

#include <errno.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

static int adaptive_mutex_init(pthread_mutex_t *m)
{
    pthread_mutexattr_t a;
    if (pthread_mutexattr_init(&a) != 0)
        return -1;
    pthread_mutexattr_settype(&a, PTHREAD_MUTEX_ADAPTIVE_NP);
    int r = pthread_mutex_init(m, &a);
    pthread_mutexattr_destroy(&a);
    return r;
}

static ErlNifResourceType *DEVICE_RT;
ErlNifResourceType *REGION_RT;
ErlNifResourceType *BUFFER_RT;

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

/* --------------------------------------------------------------- device -- */

static struct device *get_device(ErlNifEnv *env, ERL_NIF_TERM t)
{
    void *p;
    return enif_get_resource(env, t, DEVICE_RT, &p) ? p : NULL;
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
    prefault_stop(&d->prefault); /* before anything is unmapped */
    stop_completion_thread(d);
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
    /* ctl_efd stays open until the device's destructor: a buffer's
     * destructor may still write it (it holds the device, so none runs
     * after that). */
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
    if (d->sq_lock_ok)
        pthread_mutex_destroy(&d->sq_lock);
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
    slot_caches_free(&d->caches);
    if (d->ctl_efd >= 0)
        close(d->ctl_efd);
    if (d->freeq)
        enif_free(d->freeq);
    if (d->freeq_lock)
        enif_mutex_destroy(d->freeq_lock);
    if (d->drain)
        enif_rwlock_destroy(d->drain);
    for (uint32_t i = 0; i < EC_MAX_SEGMENTS; i++)
        arena_destroy(&d->alloc[i]);
    if (!d->unmapped) {
        prefault_stop(&d->prefault); /* stopped by device_close already, if it ran */
        shm_unmap(&d->shm); /* exported regions hold the device: none are left */
    }
}

/* A buffer garbage-collected: its free is queued (never blocking; see
 * buffers.c) and the completion thread woken to send it. */
static void buffer_dtor(ErlNifEnv *env, void *obj)
{
    struct buffer_res *b = obj;
    struct device *d = b->d;
    (void)env;
    uint32_t before = __atomic_load_n(&d->nfreeq, __ATOMIC_ACQUIRE);
    queue_free(b);
    if (before == 0 && __atomic_load_n(&d->nfreeq, __ATOMIC_ACQUIRE) > 0 && d->ctl_efd >= 0)
        shm_signal(d->ctl_efd);
    enif_release_resource(d);
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
 *               pipeline_bytes, zero_copy_bytes, poison_outputs, prefault_arena
 *               [, sync_spin_us]}) -> {ok, Handle} | {error, Reason} */
static ERL_NIF_TERM nif_open(ErlNifEnv *env, int argc, const ERL_NIF_TERM argv[])
{
    unsigned dev;
    ErlNifUInt64 entries, arena_bytes, arena_max, spin, busy_spin, zero_copy, pipeline;
    ERL_NIF_TERM poison, prefault;
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
        !enif_get_map_value(env, argv[1], ATOM_prefault_arena, &prefault) ||
        entries < 2 || entries > (1u << 20) || (entries & (entries - 1)) != 0 ||
        arena_bytes < 4096 || arena_bytes > (UINT64_C(1) << EC_ADDR_SEGMENT_SHIFT) ||
        arena_max < arena_bytes || spin > 1000000 || busy_spin > 1000000)
        return enif_make_badarg(env);
    /* Optional (await_spin): absent is 0, never spin. */
    ErlNifUInt64 sync_spin = 0;
    ERL_NIF_TERM t;
    if (enif_get_map_value(env, argv[1], ATOM_sync_spin_us, &t) &&
        (!enif_get_uint64(env, t, &sync_spin) || sync_spin > 1000))
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
    d->sync_spin_us = (uint32_t)sync_spin;
    d->arena_max = arena_max;
    d->zero_copy_bytes = zero_copy;
    d->pipeline_bytes = pipeline;
    d->poison = enif_is_identical(poison, ATOM_true);
    d->life = enif_rwlock_create("erlcuda.life");
    d->pipe = enif_rwlock_create("erlcuda.pipe");
    d->cq_lock = enif_mutex_create("erlcuda.cq");
    d->lock_ok = adaptive_mutex_init(&d->lock) == 0;
    d->sq_lock_ok = adaptive_mutex_init(&d->sq_lock) == 0;
    d->msg_env = enif_alloc_env();
    d->freeq_lock = enif_mutex_create("erlcuda.freeq");
    d->drain = enif_rwlock_create("erlcuda.drain");
    d->jobs = enif_alloc(entries * sizeof *d->jobs);
    d->free_stack = enif_alloc(entries * sizeof *d->free_stack);
    if (!d->life || !d->pipe || !d->cq_lock || !d->lock_ok || !d->msg_env || !d->jobs ||
        !d->free_stack || !d->freeq_lock || !d->drain || !d->sq_lock_ok)
        return make_error(env, ATOM_enomem);
    memset(d->jobs, 0, entries * sizeof *d->jobs);
    for (uint32_t i = 0; i < entries; i++) {
        d->jobs[i].env = enif_alloc_env();
        d->jobs[i].parts = 1;
        if (!d->jobs[i].env)
            return make_error(env, ATOM_enomem);
        d->free_stack[i] = entries - 1 - i;
    }
    d->nfree = entries;
    if (slot_caches_init(&d->caches, entries) < 0)
        return make_error(env, ATOM_enomem);

    int err = shm_create(&d->shm, dev, d->nslots, arena_bytes);
    if (err < 0)
        return make_errno(env, err);
    if (arena_init(&d->alloc[0], d->shm.seg[0].bytes) < 0)
        return make_error(env, ATOM_enomem);
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
    err = start_completion_thread(d);
    if (err != 0)
        return make_errno(env, -err);
    /* The arena's pages, faulted in while gpud starts, when asked
     * (prefault.h). Only an optimization: a thread that cannot start
     * changes nothing else. */
    if (enif_is_identical(prefault, ATOM_true) && prefault_start(&d->prefault) == 0)
        prefault_add(&d->prefault, d->shm.seg[0].base, d->shm.seg[0].bytes);
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
        /* No completion thread holds entries it took off the CQ: each job
         * is answered by its CQE or failed below, never both. */
        enif_rwlock_rwlock(d->drain);
        drain_cq(d, env);
        /* One hold of both locks from failing the jobs in flight to zeroing
         * the rings: a descriptor published in between would be wiped out
         * and its job never answered. */
        dev_lock(d);
        sq_lock(d);
        fail_in_flight_locked(d, env, argv[1]);
        shm_reset_rings(&d->shm);
        shm_disconnect(&d->shm);
        /* gpud's buffers died with it: every buffer made so far is lost,
         * and frees queued for them have nobody to go to. Under d->lock, so
         * no submit publishes an id of the old epoch after this. */
        __atomic_add_fetch(&d->epoch, 1, __ATOMIC_RELAXED);
        enif_mutex_lock(d->freeq_lock);
        __atomic_store_n(&d->nfreeq, 0, __ATOMIC_RELEASE);
        enif_mutex_unlock(d->freeq_lock);
        sq_unlock(d);
        dev_unlock(d);
        enif_rwlock_rwunlock(d->drain);
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
    return cancel_job(d, argv[1]) ? ATOM_cancelled : ATOM_sent;
}

/* The job's reference: the caller's, argv[pos] where the NIF's arity has
 * it, else 0 (the submit makes one). A reference the caller made with
 * make_ref/0 right before its receive lets the VM skip the messages that
 * were in the mailbox before it (OTP's receive marker): launch_sync in a
 * process with 10,000 unrelated messages waiting then costs what it costs
 * with none. Returns 0 when argv[pos] is there but is no reference. */
static int caller_ref(ErlNifEnv *env, int argc, const ERL_NIF_TERM argv[], int pos, ERL_NIF_TERM *ref)
{
    *ref = 0;
    if (argc <= pos)
        return 1;
    if (!enif_is_ref(env, argv[pos]))
        return 0;
    *ref = argv[pos];
    return 1;
}

/* submit(Handle, Kernel, Args, Flags[, Ref]) -> {ok, Ref} | {error, Reason};
 * see submit_job. A job too large for a normal scheduler (~1 ms of copying
 * or list conversion) starts again on a dirty CPU scheduler. */
static ERL_NIF_TERM submit_dirty(ErlNifEnv *env, int argc, const ERL_NIF_TERM argv[])
{
    struct device *d = get_device(env, argv[0]);
    ERL_NIF_TERM result, ref;
    if (!d || !caller_ref(env, argc, argv, 4, &ref))
        return enif_make_badarg(env);
    submit_job(env, d, argv, 1, ref, &result);
    return result;
}

static ERL_NIF_TERM nif_submit(ErlNifEnv *env, int argc, const ERL_NIF_TERM argv[])
{
    struct device *d = get_device(env, argv[0]);
    ERL_NIF_TERM result, ref;
    if (!d || !caller_ref(env, argc, argv, 4, &ref))
        return enif_make_badarg(env);
    if (submit_job(env, d, argv, 0, ref, &result) == 0)
        return result;
    return enif_schedule_nif(env, "submit_dirty", ERL_NIF_DIRTY_JOB_CPU_BOUND, submit_dirty, argc,
                             argv);
}

/* put(Handle, Vector) -> {ok, Ref} | {error, _}; then {erlcuda, Ref,
 * {ok, Buf} | {error, _}}. Large vectors go to a dirty scheduler. */
static ERL_NIF_TERM put_dirty(ErlNifEnv *env, int argc, const ERL_NIF_TERM argv[])
{
    struct device *d = get_device(env, argv[0]);
    ERL_NIF_TERM result, ref;
    if (!d || !caller_ref(env, argc, argv, 2, &ref))
        return enif_make_badarg(env);
    submit_put(env, d, argv, 1, ref, &result);
    return result;
}

static ERL_NIF_TERM nif_put(ErlNifEnv *env, int argc, const ERL_NIF_TERM argv[])
{
    struct device *d = get_device(env, argv[0]);
    ERL_NIF_TERM result, ref;
    if (!d || !caller_ref(env, argc, argv, 2, &ref))
        return enif_make_badarg(env);
    if (submit_put(env, d, argv, 0, ref, &result) == 0)
        return result;
    return enif_schedule_nif(env, "put_dirty", ERL_NIF_DIRTY_JOB_CPU_BOUND, put_dirty, argc, argv);
}

static struct buffer_res *get_buffer(ErlNifEnv *env, ERL_NIF_TERM t)
{
    void *p;
    return enif_get_resource(env, t, BUFFER_RT, &p) ? p : NULL;
}

/* get(Buf[, Ref]) -> {ok, Ref} | {error, _}; then {erlcuda, Ref, {ok, Vector}}. */
static ERL_NIF_TERM nif_get(ErlNifEnv *env, int argc, const ERL_NIF_TERM argv[])
{
    struct buffer_res *b = get_buffer(env, argv[0]);
    ERL_NIF_TERM ref;
    if (!b || !caller_ref(env, argc, argv, 1, &ref))
        return enif_make_badarg(env);
    return submit_get(env, b, argv[0], ref);
}

/* free(Buf) -> ok: at once and idempotent; the free goes to gpud now. */
static ERL_NIF_TERM nif_free(ErlNifEnv *env, int argc, const ERL_NIF_TERM argv[])
{
    struct buffer_res *b = get_buffer(env, argv[0]);
    (void)argc;
    if (!b)
        return enif_make_badarg(env);
    queue_free(b);
    struct device *d = b->d;
    enif_rwlock_rlock(d->life);
    if (!d->closed)
        flush_frees(d);
    enif_rwlock_runlock(d->life);
    return ATOM_ok;
}

/* buffer_info(Buf) -> {Device, Type, Len, Status} (Status: live | freed |
 * lost) | false when Buf is not a buffer. */
static ERL_NIF_TERM nif_buffer_info(ErlNifEnv *env, int argc, const ERL_NIF_TERM argv[])
{
    struct buffer_res *b = get_buffer(env, argv[0]);
    (void)argc;
    if (!b)
        return ATOM_false;
    ERL_NIF_TERM why = buffer_unusable(env, b->d, b);
    const ERL_NIF_TERM *e;
    int n;
    ERL_NIF_TERM st = !why ? ATOM_live
                      : enif_get_tuple(env, why, &n, &e) ? e[1] : why;
    return enif_make_tuple4(env, enif_make_uint(env, b->d->id), TYPE_ATOMS[b->type],
                            enif_make_uint(env, b->len), st);
}

/* module_op(Handle, load | unload, Slot, Path) -> {ok, Ref} | {error, _} */
static ERL_NIF_TERM nif_module_op(ErlNifEnv *env, int argc, const ERL_NIF_TERM argv[])
{
    struct device *d = get_device(env, argv[0]);
    (void)argc;
    if (!d)
        return enif_make_badarg(env);
    return submit_control(env, d, argv);
}

/* module_gen(Slot, Gen) -> ok: Gen (0: none) becomes the live generation of
 * module slot Slot on every device. */
static ERL_NIF_TERM nif_module_gen(ErlNifEnv *env, int argc, const ERL_NIF_TERM argv[])
{
    unsigned slot, gen;
    (void)argc;
    if (!enif_get_uint(env, argv[0], &slot) || slot >= EC_MODULE_SLOTS ||
        !enif_get_uint(env, argv[1], &gen))
        return enif_make_badarg(env);
    set_module_gen(slot, gen);
    return ATOM_ok;
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
    put(env, &m, "buffer_frees", load64(&d->c.buffer_frees));
    put(env, &m, "reaped", load64(&d->c.reaped));
    put(env, &m, "cached_reserves", load64(&d->c.cached_reserves));
    put(env, &m, "sync_spins", load64(&d->c.sync_spins));
    put(env, &m, "sync_spin_answers", load64(&d->c.sync_spin_answers));
    /* profile.h: sums of the sampled submit phases and of the drains */
    static const char *const ps[PS_COUNT] = {
        "prof_submit_samples", "prof_submit_ns", "prof_parse_ns", "prof_reserve_ns",
        "prof_copy_ns", "prof_publish_ns", "prof_locks", "prof_lock_waits", "prof_lock_wait_ns"};
    static const char *const pc[PC_COUNT] = {"prof_drains", "prof_cqes", "prof_answer_ns",
                                             "prof_release_ns", "prof_send_samples", "prof_send_ns",
                                             "prof_trip_samples", "prof_trip_gpud_ns",
                                             "prof_trip_answer_ns"};
    for (int i = 0; i < PS_COUNT; i++)
        put(env, &m, ps[i], load64(&d->prof.submit[i]));
    for (int i = 0; i < PC_COUNT; i++)
        put(env, &m, pc[i], load64(&d->prof.complete[i]));
    put(env, &m, "buffer_frees_queued", __atomic_load_n(&d->nfreeq, __ATOMIC_RELAXED));
    put(env, &m, "buffer_epoch", __atomic_load_n(&d->epoch, __ATOMIC_RELAXED));
    put(env, &m, "slots", d->nslots);

    enif_rwlock_rlock(d->life);
    dev_lock(d);
    put(env, &m, "in_flight", __atomic_load_n(&d->in_flight, __ATOMIC_RELAXED));
    put(env, &m, "in_flight_peak", __atomic_load_n(&d->in_flight_peak, __ATOMIC_RELAXED));
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
    /* The pre-fault thread's progress: bytes faulted in (or found resident)
     * and the time it took, every segment together. */
    put(env, &m, "arena_prefaulted_bytes", __atomic_load_n(&d->prefault.done_bytes, __ATOMIC_RELAXED));
    put(env, &m, "arena_prefault_us", __atomic_load_n(&d->prefault.busy_ns, __ATOMIC_RELAXED) / 1000);
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
        put(env, &m, "gpud_launches_timed", load64(&g->launches_timed));
        put(env, &m, "gpud_launch_drain_ns", load64(&g->launch_drain_ns));
        put(env, &m, "gpud_launch_run_ns", load64(&g->launch_run_ns));
        put(env, &m, "gpud_launch_answer_ns", load64(&g->launch_answer_ns));
        /* Device buffers, as gpud accounts them (memory/1). */
        put(env, &m, "buffers_used", load64(&g->buf_used));
        put(env, &m, "buffers_peak", load64(&g->buf_peak));
        put(env, &m, "buffers_limit", load64(&g->buf_limit));
        put(env, &m, "buffers", load64(&g->buf_count));
        put(env, &m, "buffers_cached", load64(&g->buf_cached));
        put(env, &m, "buffers_device_allocs", load64(&g->buf_device_allocs));
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

/* in_flight(Handle) -> ring entries in flight (queued in the SQ or running).
 * erlcuda_cluster reads it on every {device, any} launch, so it takes no
 * lock and builds no map (stats/1 costs ~20 us on the 2-core machine): a
 * relaxed load, as wait_cq reads the same counter; the value is a hint for
 * placement, never used for correctness. */
static ERL_NIF_TERM nif_in_flight(ErlNifEnv *env, int argc, const ERL_NIF_TERM argv[])
{
    struct device *d = get_device(env, argv[0]);
    (void)argc;
    if (!d)
        return enif_make_badarg(env);
    return enif_make_uint(env, __atomic_load_n(&d->in_flight, __ATOMIC_RELAXED));
}

/* await_spin(Handle, Ref) -> answered | waiting: see erlcuda_nif.h. */
static ERL_NIF_TERM nif_await_spin(ErlNifEnv *env, int argc, const ERL_NIF_TERM argv[])
{
    struct device *d = get_device(env, argv[0]);
    (void)argc;
    if (!d || !enif_is_ref(env, argv[1]))
        return enif_make_badarg(env);
    return await_spin(env, d, argv[1]);
}

/* kernels() -> [{Atom, Id, VectorInputs}]: the kernel table, for Erlang. */
static ERL_NIF_TERM nif_kernels(ErlNifEnv *env, int argc, const ERL_NIF_TERM argv[])
{
    (void)argc;
    (void)argv;
    return kernels_term(env);
}

static int load(ErlNifEnv *env, void **priv, ERL_NIF_TERM info)
{
    (void)priv;
    atoms_load(env);
    args_load(env);
    /* members counts the callbacks set, from the top of the struct: with 0
     * the VM would never call the destructor. */
    ErlNifResourceTypeInit init = {.dtor = device_dtor, .members = 1};
    DEVICE_RT = enif_init_resource_type(env, "erlcuda_device", &init,
                                        ERL_NIF_RT_CREATE | ERL_NIF_RT_TAKEOVER, NULL);
    ErlNifResourceTypeInit rinit = {.dtor = region_dtor, .members = 1};
    REGION_RT = enif_init_resource_type(env, "erlcuda_region", &rinit,
                                        ERL_NIF_RT_CREATE | ERL_NIF_RT_TAKEOVER, NULL);
    ErlNifResourceTypeInit binit = {.dtor = buffer_dtor, .members = 1};
    BUFFER_RT = enif_init_resource_type(env, "erlcuda_buffer", &binit,
                                        ERL_NIF_RT_CREATE | ERL_NIF_RT_TAKEOVER, NULL);
    if (!DEVICE_RT || !REGION_RT || !BUFFER_RT)
        return -1;
    /* Last: a failed load gets no unload, so it must hold nothing. info:
     * the app env copy_threads, 0 for the default (erlcuda_nif:init/0). */
    unsigned threads = 0;
    if (!enif_get_uint(env, info, &threads))
        threads = 0;
    copy_pool_hold(threads);
    return 0;
}

/* Runs load for the new instance: each instance holds the copy pool once
 * (the same file loaded again shares it, see copy.c) and unload drops that
 * hold when the instance is purged. */
static int upgrade(ErlNifEnv *env, void **priv, void **old_priv, ERL_NIF_TERM info)
{
    (void)old_priv;
    return load(env, priv, info);
}

static void unload(ErlNifEnv *env, void *priv)
{
    (void)env;
    (void)priv;
    copy_pool_release();
}

static ErlNifFunc nif_funcs[] = {
    {"open", 2, nif_open, 0},
    {"socket_name", 1, nif_socket_name, 0},
    {"accept", 3, nif_accept, ERL_NIF_DIRTY_JOB_IO_BOUND},
    {"reset", 2, nif_reset, ERL_NIF_DIRTY_JOB_IO_BOUND},
    {"close", 1, nif_close, ERL_NIF_DIRTY_JOB_IO_BOUND},
    {"cancel", 2, nif_cancel, 0},
    {"submit", 4, nif_submit, 0},
    {"submit", 5, nif_submit, 0},
    {"stats", 1, nif_stats, 0},
    {"in_flight", 1, nif_in_flight, 0},
    {"await_spin", 2, nif_await_spin, 0},
    {"kernels", 0, nif_kernels, 0},
    {"module_op", 4, nif_module_op, 0},
    {"module_gen", 2, nif_module_gen, 0},
    {"put", 2, nif_put, 0},
    {"put", 3, nif_put, 0},
    {"get", 1, nif_get, 0},
    {"get", 2, nif_get, 0},
    {"free", 1, nif_free, 0},
    {"buffer_info", 1, nif_buffer_info, 0},
};

ERL_NIF_INIT(erlcuda_nif, nif_funcs, load, NULL, upgrade, unload)
