/*
 * submit.c: the producer side of the rings. A job's slot and arena regions
 * (reserve_job; small jobs from a thread's own slot cache, slot_cache.c),
 * given back when it is answered (release_job_locked); its descriptor
 * written onto the SQ by the one push of the ring's ordering rules
 * (sq_push_locked), after the checks a publish makes under sq_lock; gpud
 * woken when it sleeps. Everything that publishes goes through here: a
 * launch (launch.c), a pipeline's parts (pipeline.c), puts, gets and frees
 * (buffers.c).
 */
#define _GNU_SOURCE
#include "device_state.h"
#include "arena.h"
#include "kernels.h"
#include "prefault.h"
#include "shm.h"
#include "slot_cache.h"
#include "submit.h"

#include <string.h>

__thread int prof_timing;

/* Gives a region back to its segment's allocator, whatever its size: a
 * region of 0 bytes took nothing there and gives back nothing (arena.h).
 * (Skipping those here, while the allocator still took 256 bytes for
 * them, lost 256 bytes per put above the inline size and per
 * {output, buffer} job with copied inputs.) A slot's inline area is never
 * the allocator's. Caller holds d->lock. */
void free_region_locked(struct device *d, struct region *r)
{
    if (!r->inl)
        arena_free(&d->alloc[r->seg], r->off, r->bytes);
    r->bytes = 0;
    r->inl = 0;
}

/* Adds a segment of at least `bytes` (at least segment 0's size, so growth
 * is rare) while the arena is below its limit. Caller holds d->lock.
 * Returns its index, or -1. */
static int grow_locked(struct device *d, uint64_t bytes)
{
    uint64_t grow = arena_round(bytes);
    if (grow < d->shm.seg[0].bytes)
        grow = d->shm.seg[0].bytes;
    if (d->arena_total + grow > d->arena_max)
        grow = arena_round(bytes);
    if (grow == 0 || d->arena_total + grow > d->arena_max || d->shm.nseg >= EC_MAX_SEGMENTS)
        return -1;
    int seg = shm_add_segment(&d->shm, grow);
    if (seg < 0)
        return -1;
    if (arena_init(&d->alloc[seg], d->shm.seg[seg].bytes) < 0)
        return -1; /* the segment stays, unused: never corrupt */
    d->arena_total += d->shm.seg[seg].bytes;
    /* gpud registers it as soon as it reads the segment message (a
     * connected gpud has it already): with prefault_arena, faulting its
     * pages in here as well shares that work with the registration
     * (prefault.h); without, the prefault thread was never started and
     * this does nothing. */
    prefault_add(&d->prefault, d->shm.seg[seg].base, d->shm.seg[seg].bytes);
    return seg;
}

/* Growth ahead of demand: once the regions in use pass ARENA_HIGH_WATER of
 * the arena (the slots' inline areas aside), the next segment is added
 * now, so gpud has registered it (off its loop, 84-178 ms for a fresh
 * segment on the H200) before a job needs it; growing on a miss made that
 * job wait for the registration. Caller holds d->lock. */
static void grow_ahead_locked(struct device *d)
{
    uint64_t inline_all = (uint64_t)d->inline_slots * INLINE_BYTES, used = 0;
    for (uint32_t i = 0; i < d->shm.nseg; i++)
        used += d->alloc[i].used;
    uint64_t usable = d->arena_total - inline_all;
    if ((used - inline_all) * ARENA_HIGH_WATER_DEN <= usable * ARENA_HIGH_WATER_NUM)
        return;
    if (grow_locked(d, d->shm.seg[0].bytes) >= 0)
        count(&d->c.arena_grown_ahead, 1);
}

/* Allocates `bytes` in some segment, adding a segment on a miss while the
 * arena is below its limit, and ahead of demand (grow_ahead_locked).
 * Caller holds d->lock. Returns 0 or -1 (busy). */
int region_alloc_locked(struct device *d, uint64_t bytes, struct region *r)
{
    r->bytes = bytes;
    r->inl = 0;
    for (uint32_t i = 0; i < d->shm.nseg; i++) {
        if (arena_alloc(&d->alloc[i], bytes, &r->off) == 0) {
            r->seg = i;
            grow_ahead_locked(d);
            return 0;
        }
    }
    int seg = grow_locked(d, bytes);
    if (seg < 0)
        return -1;
    count(&d->c.arena_grown_on_miss, 1);
    r->seg = (uint32_t)seg;
    if (arena_alloc(&d->alloc[seg], bytes, &r->off) != 0)
        return -1;
    grow_ahead_locked(d);
    return 0;
}

int can_ever_fit_locked(const struct device *d, uint64_t bytes)
{
    if (bytes == 0)
        return 1;
    for (uint32_t i = 0; i < d->shm.nseg; i++)
        if (d->shm.seg[i].bytes >= bytes)
            return 1;
    return d->shm.nseg < EC_MAX_SEGMENTS && d->arena_max - d->arena_total >= bytes;
}

/* A small job's regions: its input, then its output, in slot idx's inline
 * area. */
static void inline_regions(const struct device *d, uint32_t idx, uint64_t in_bytes, uint64_t out_bytes,
                           struct region *in, struct region *out)
{
    uint64_t base = d->inline_off + (uint64_t)idx * INLINE_BYTES;
    *in = (struct region){.seg = 0, .inl = 1, .off = base, .bytes = in_bytes};
    *out = (struct region){.seg = 0, .inl = 1, .off = base + in_bytes, .bytes = out_bytes};
}

/* Slot idx takes the job's regions and `credits` slots more off the free
 * stack (caller holds d->lock when credits > 0): the one place a job's
 * regions are set, as free_slot_locked is the one place they are given
 * back. */
static void take_slot(struct device *d, uint32_t idx, struct region in, struct region out,
                      uint32_t credits)
{
    struct job *j = &d->jobs[idx];
    j->in = in;
    j->out = out;
    j->out_taken = 0;
    j->ncredit = credits;
    for (uint32_t i = 0; i < credits; i++)
        j->credit[i] = d->free_stack[--d->nfree];
    in_flight_add(d, 1 + credits);
}

int64_t reserve_job_locked(struct device *d, uint64_t in_bytes, uint64_t out_bytes, uint32_t credits,
                           int keep_out)
{
    if (d->nfree <= credits) {
        slot_caches_steal_locked(d);
        if (d->nfree <= credits)
            return -1;
    }
    struct region in = {0, 0, 0, 0}, out = {0, 0, 0, 0};
    uint32_t top = d->free_stack[d->nfree - 1];
    if (!keep_out && in_bytes + out_bytes <= INLINE_BYTES && top < d->inline_slots) {
        inline_regions(d, top, in_bytes, out_bytes, &in, &out);
    } else if (region_alloc_locked(d, out_bytes, &out) != 0) {
        int never = in_bytes + out_bytes > d->arena_max || !can_ever_fit_locked(d, out_bytes) ||
                    !can_ever_fit_locked(d, in_bytes);
        return never ? -2 : -1;
    } else if (region_alloc_locked(d, in_bytes, &in) != 0) {
        free_region_locked(d, &out);
        int never = in_bytes + out_bytes > d->arena_max || !can_ever_fit_locked(d, in_bytes);
        return never ? -2 : -1;
    }
    uint32_t idx = d->free_stack[--d->nfree];
    take_slot(d, idx, in, out, credits);
    return idx;
}

/* Reserves a slot and the job's regions (reserve_job_locked); a small job
 * takes a slot of this thread's own cache, without the device lock. */
int64_t reserve_job(struct device *d, uint64_t in_bytes, uint64_t out_bytes,
                           uint32_t credits, int keep_out)
{
    int small = !keep_out && credits == 0 && in_bytes + out_bytes <= INLINE_BYTES;
    struct slot_cache *cache = small ? slot_cache_mine(&d->caches) : NULL;
    if (cache) {
        /* A slot of this thread's own: no device lock (slot_cache.h). */
        int64_t idx = slot_cache_pop(cache);
        if (idx >= 0) {
            struct region in, out;
            inline_regions(d, (uint32_t)idx, in_bytes, out_bytes, &in, &out);
            take_slot(d, (uint32_t)idx, in, out, 0);
            count(&d->c.cached_reserves, 1);
            return idx;
        }
    }
    dev_lock(d);
    int64_t idx = reserve_job_locked(d, in_bytes, out_bytes, credits, keep_out);
    if (idx >= 0 && cache)
        slot_cache_refill_locked(d, cache);
    dev_unlock(d);
    return idx;
}

uint64_t job_begin(struct device *d, uint32_t idx, ErlNifEnv *caller, ERL_NIF_TERM ref, uint32_t kernel,
                   uint8_t type, uint8_t output, uint32_t out_len)
{
    struct job *j = &d->jobs[idx];
    /* The slot's own field, read by others without the lock: stored
     * atomically (device_state.h). */
    uint32_t gen = __atomic_load_n(&j->gen, __ATOMIC_RELAXED) + 1;
    __atomic_store_n(&j->gen, gen, __ATOMIC_RELAXED);
    j->kernel = kernel;
    j->type = type;
    j->output = output;
    j->out_len = out_len;
    if (caller) {
        j->ref = enif_make_copy(j->env, ref);
        enif_self(caller, &j->pid);
    } else {
        j->ref = ATOM_false; /* no caller: cancel/2 never matches it */
    }
    return ((uint64_t)gen << 32) | (uint64_t)idx;
}

/* A slot back to free, carrying nothing of its last job: every field of
 * the job's (JOB_FIRST_FIELD on, device_state.h) zeroed, the slot's own
 * reset. Its regions must be freed or handed over already. The caller
 * puts the slot (and its credits) where free slots go. */
void clear_slot(struct device *d, struct job *j)
{
    __atomic_sub_fetch(&d->in_flight, 1 + j->ncredit, __ATOMIC_RELAXED); /* read by wait_cq */
    size_t from = offsetof(struct job, JOB_FIRST_FIELD);
    memset((char *)j + from, 0, sizeof *j - from);
    __atomic_store_n(&j->parts, 1, __ATOMIC_RELAXED);
    __atomic_store_n(&j->parts_left, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&j->part_status, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&j->state, JOB_FREE, __ATOMIC_RELEASE);
}

/* Frees the slot; its env must be clear already (or swapped for a clear
 * one: release_jobs). */
void free_slot_locked(struct device *d, uint32_t idx)
{
    struct job *j = &d->jobs[idx];
    free_region_locked(d, &j->in);
    if (!j->out_taken)
        free_region_locked(d, &j->out);
    d->free_stack[d->nfree++] = idx;
    for (uint32_t i = 0; i < j->ncredit; i++)
        d->free_stack[d->nfree++] = j->credit[i];
    clear_slot(d, j);
}

/* Clears the slot's env, then frees it (free_slot_locked). */
void release_job_locked(struct device *d, uint32_t idx)
{
    /* May run buffer destructors (queue_free takes only the leaf
     * freeq_lock) and region destructors. */
    enif_clear_env(d->jobs[idx].env);
    free_slot_locked(d, idx);
}

void unreserve_job(struct device *d, uint32_t idx)
{
    dev_lock(d);
    release_job_locked(d, idx);
    dev_unlock(d);
}

/* Wakes gpud if it sleeps, after a publish. */
void wake_gpud(struct device *d)
{
    struct ec_header *h = d->shm.hdr;
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    if (__atomic_load_n(&h->sq_flags, __ATOMIC_RELAXED) & EC_NEED_WAKEUP) {
        shm_signal(d->shm.sq_efd);
        count(&d->c.wakeups_sent, 1);
    }
}

/* Are the job's input buffers still usable? Checked under sq_lock when the
 * descriptor is published: a free/1 or a gpud restart between parse_args
 * and here is seen, so no descriptor names a buffer after its free or of an
 * older gpud. Caller holds sq_lock. */
static int buffers_live_locked(const struct device *d, const struct job_spec *s)
{
    for (unsigned i = 0; s && i < s->nin; i++) {
        const struct buffer_res *b = s->in[i].buf;
        if (b && buffer_state(d, b) != BUF_LIVE)
            return 0;
    }
    return 1;
}

/* The producer's half of the ring protocol (erlcuda_ring.h, "Rings"): the
 * slot is INFLIGHT before its descriptor can be seen (its completion can
 * only follow), the entry is written, then one store-release of the tail
 * makes it visible to gpud's load-acquire. The one place that writes the
 * SQ. Caller holds sq_lock. */
void sq_push_locked(struct device *d, uint32_t idx, const struct ec_sqe *sqe)
{
    struct ec_header *h = d->shm.hdr;
    uint32_t mask = d->nslots - 1;
    __atomic_store_n(&d->jobs[idx].state, JOB_INFLIGHT, __ATOMIC_RELEASE);
    uint32_t tail = __atomic_load_n(&h->sq_tail, __ATOMIC_RELAXED);
    d->shm.sq[tail & mask] = *sqe;
    __atomic_store_n(&h->sq_tail, tail + 1, __ATOMIC_RELEASE);
}

/* Publishes the job's descriptor and wakes gpud if it sleeps. A user's
 * kernel (s->ki->user) is published only while its module generation is
 * live, checked under the lock that also orders the unload descriptor
 * (erlcuda_modules retires a generation, then submits the unload): every
 * job of a generation is ahead of its unload in the SQ. Returns 0, -1
 * (nothing published) when the generation was retired, or -2 when an input
 * buffer of `s` was freed or lost meanwhile. */
int publish_checked(struct device *d, uint32_t idx, const struct ec_sqe *sqe,
                    const struct job_spec *s)
{
    const struct kernel_info *ki = s ? s->ki : NULL;
    sq_lock(d);
    if (ki && ki->user && module_gen(ki->slot) != ki->gen) {
        sq_unlock(d);
        return -1;
    }
    if (!buffers_live_locked(d, s)) {
        sq_unlock(d);
        return -2;
    }
    d->jobs[idx].t_pub = mono_ns();
    d->jobs[idx].timed = prof_timing;
    sq_push_locked(d, idx, sqe);
    sq_unlock(d);
    wake_gpud(d);
    return 0;
}

void publish(struct device *d, uint32_t idx, const struct ec_sqe *sqe)
{
    (void)publish_checked(d, idx, sqe, NULL);
}
