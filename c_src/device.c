/*
 * device.c: one device's life on the VM side. open creates its shared
 * memory (shm.c), arena allocator and slots and starts its completion
 * thread (complete.c); accept hands the memory to a gpud that connected
 * (erlcuda_ring.h, Handshake); reset answers every job in flight once that
 * gpud has died and zeroes the rings for the next one; close does the same
 * for good and releases the memory and fds. The destructors of the device
 * and of a result binary that stays in the arena are here too: the last
 * one of them unmaps the arena.
 */
#define _GNU_SOURCE
#include "device_state.h"
#include "arena.h"
#include "complete.h"
#include "device.h"
#include "prefault.h"
#include "shm.h"
#include "slot_cache.h"
#include "submit.h"

#include <errno.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

ErlNifResourceType *DEVICE_RT;

struct device *get_device(ErlNifEnv *env, ERL_NIF_TERM t)
{
    void *p;
    return enif_get_resource(env, t, DEVICE_RT, &p) ? p : NULL;
}

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
void device_close(struct device *d, ErlNifEnv *caller_env, ERL_NIF_TERM reason)
{
    __atomic_store_n(&d->stopping, 1, __ATOMIC_RELEASE);
    enif_rwlock_rwlock(d->life);
    if (d->closed) {
        enif_rwlock_rwunlock(d->life);
        return;
    }
    /* Atomic: buffer_state reads it for a buffer of this device without
     * its lock (a job of another device naming it). */
    __atomic_store_n(&d->closed, 1, __ATOMIC_RELEASE);
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

void device_dtor(ErlNifEnv *env, void *obj)
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

void region_dtor(ErlNifEnv *env, void *obj)
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

static int get_opt_u64(ErlNifEnv *env, ERL_NIF_TERM map, ERL_NIF_TERM key, ErlNifUInt64 *v)
{
    ERL_NIF_TERM t;
    return enif_get_map_value(env, map, key, &t) && enif_get_uint64(env, t, v);
}

/* open(Device, #{ring_entries, arena_bytes, arena_max_bytes, spin_us, busy_spin_us,
 *               pipeline_bytes, zero_copy_bytes, poison_outputs, prefault_arena
 *               [, sync_spin_us, list_converter, put_window_bytes]}) -> {ok, Handle} | {error, Reason} */
ERL_NIF_TERM device_open(ErlNifEnv *env, ERL_NIF_TERM device, ERL_NIF_TERM opts)
{
    unsigned dev;
    ErlNifUInt64 entries, arena_bytes, arena_max, spin, busy_spin, zero_copy, pipeline;
    ERL_NIF_TERM poison, prefault;
    if (!enif_get_uint(env, device, &dev) || !enif_is_map(env, opts) ||
        !get_opt_u64(env, opts, ATOM_ring_entries, &entries) ||
        !get_opt_u64(env, opts, ATOM_arena_bytes, &arena_bytes) ||
        !get_opt_u64(env, opts, ATOM_arena_max_bytes, &arena_max) ||
        !get_opt_u64(env, opts, ATOM_spin_us, &spin) ||
        !get_opt_u64(env, opts, ATOM_busy_spin_us, &busy_spin) ||
        !get_opt_u64(env, opts, ATOM_zero_copy_bytes, &zero_copy) ||
        !get_opt_u64(env, opts, ATOM_pipeline_bytes, &pipeline) ||
        !enif_get_map_value(env, opts, ATOM_poison_outputs, &poison) ||
        !enif_get_map_value(env, opts, ATOM_prefault_arena, &prefault) ||
        entries < 2 || entries > (1u << 20) || (entries & (entries - 1)) != 0 ||
        arena_bytes < 4096 || arena_bytes > (UINT64_C(1) << EC_ADDR_SEGMENT_SHIFT) ||
        arena_max < arena_bytes || spin > 1000000 || busy_spin > 1000000)
        return enif_make_badarg(env);
    /* Optional (await_spin): absent is 0, never spin. */
    ErlNifUInt64 sync_spin = 0;
    ERL_NIF_TERM t;
    if (enif_get_map_value(env, opts, ATOM_sync_spin_us, &t) &&
        (!enif_get_uint64(env, t, &sync_spin) || sync_spin > 1000))
        return enif_make_badarg(env);
    /* Optional: a put's window (pipeline.c); absent is 0, none. */
    ErlNifUInt64 put_window = 0;
    if (enif_get_map_value(env, opts, ATOM_put_window_bytes, &t) && !enif_get_uint64(env, t, &put_window))
        return enif_make_badarg(env);
    /* Optional: a local pid that builds large list results (results.h). */
    ErlNifPid list_pid;
    int has_list_pid = 0;
    if (enif_get_map_value(env, opts, ATOM_list_converter, &t)) {
        if (!enif_get_local_pid(env, t, &list_pid))
            return enif_make_badarg(env);
        has_list_pid = 1;
    }

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
    if (has_list_pid) {
        d->list_pid = list_pid;
        d->has_list_pid = 1;
    }
    d->arena_max = arena_max;
    d->zero_copy_bytes = zero_copy;
    d->pipeline_bytes = pipeline;
    d->put_window_bytes = put_window;
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

/* socket_name(Handle): the abstract name gpud connects to. */
ERL_NIF_TERM device_socket_name(ErlNifEnv *env, struct device *d)
{
    ERL_NIF_TERM t;
    size_t n = strlen(d->shm.sock_name);
    memcpy(enif_make_new_binary(env, n, &t), d->shm.sock_name, n);
    return t;
}

/* accept(Handle, OsPid, TimeoutMs): waits for gpud's connection, checks
 * its credentials and hands it the memory (erlcuda_ring.h, Handshake). */
ERL_NIF_TERM device_accept(ErlNifEnv *env, struct device *d, int pid, int timeout)
{
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

/* reset(Handle, Reason), once gpud has exited: real
 * completions still in the CQ are delivered, every other job in flight gets
 * {error, Reason}, and the rings start again from zero. */
void device_reset(ErlNifEnv *env, struct device *d, ERL_NIF_TERM reason)
{
    enif_rwlock_rlock(d->life);
    if (!d->closed) {
        __atomic_store_n(&d->stopping, 1, __ATOMIC_RELEASE);
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
        fail_in_flight_locked(d, env, reason);
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
        __atomic_store_n(&d->stopping, 0, __ATOMIC_RELEASE);
        enif_rwlock_rwunlock(d->pipe);
    }
    enif_rwlock_runlock(d->life);
}
