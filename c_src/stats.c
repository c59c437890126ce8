/*
 * stats.c: stats/1's map of one device. The NIF's own counters (struct
 * counters, NIF_COUNTERS) and the profile's sums (profile.h) come from
 * their lists; gpud's counters (struct ec_stats, erlcuda_ring.h), written
 * by gpud and so only read while the mapping lives, from GPUD_STATS below.
 * Every counter is a relaxed load: the map is a snapshot, not a cut.
 */
#define _GNU_SOURCE
#include "device_state.h"
#include "stats.h"

/* gpud's counters: X(field of struct ec_stats, stats key). */
#define GPUD_STATS(X)                                                                            \
    /* every descriptor gpud answered: each slice of a job, frees and    \
     * module loads too (jobs as callers see them: NIF_COUNTERS) */       \
    X(jobs_ok, gpud_descriptors_ok) X(jobs_failed, gpud_descriptors_failed)                    \
    X(batches, batches) X(launches, launches)                                                  \
    X(bad_descriptors, bad_descriptors) X(max_batch, max_batch) X(sleeps, gpud_sleeps)          \
    X(work_ns, gpud_work_ns) X(launches_timed, gpud_launches_timed)                             \
    X(launch_drain_ns, gpud_launch_drain_ns) X(launch_run_ns, gpud_launch_run_ns)               \
    X(launch_answer_ns, gpud_launch_answer_ns) X(launch_backend_ns, gpud_launch_backend_ns)      \
    X(launch_enqueue_ns, gpud_launch_enqueue_ns)                                                \
    X(launches_wide, gpud_launches_wide) X(launches_beside_lane, gpud_launches_beside_lane)     \
    X(group_launches, group_launches) X(group_jobs, group_jobs)                                 \
    /* device buffers, as gpud accounts them (memory/1) */                                      \
    X(buf_used, buffers_used) X(buf_peak, buffers_peak) X(buf_limit, buffers_limit)             \
    X(buf_count, buffers) X(buf_cached, buffers_cached) X(buf_device_allocs, buffers_device_allocs)

static void put(ErlNifEnv *env, ERL_NIF_TERM *map, const char *key, uint64_t v)
{
    enif_make_map_put(env, *map, enif_make_atom(env, key), enif_make_uint64(env, v), map);
}

static uint64_t load64(const uint64_t *p) { return __atomic_load_n(p, __ATOMIC_RELAXED); }

ERL_NIF_TERM stats_term(ErlNifEnv *env, struct device *d)
{
    ERL_NIF_TERM m = enif_make_new_map(env);
#define PUT_COUNTER(FIELD, KEY) put(env, &m, #KEY, load64(&d->c.FIELD));
    NIF_COUNTERS(PUT_COUNTER)
#undef PUT_COUNTER
#define PUT_SUBMIT(NAME, KEY) put(env, &m, #KEY, load64(&d->prof.submit[NAME]));
    PROF_SUBMIT(PUT_SUBMIT)
#undef PUT_SUBMIT
#define PUT_COMPLETE(NAME, KEY) put(env, &m, #KEY, load64(&d->prof.complete[NAME]));
    PROF_COMPLETE(PUT_COMPLETE)
#undef PUT_COMPLETE
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
#define PUT_GPUD(FIELD, KEY) put(env, &m, #KEY, load64(&g->FIELD));
        GPUD_STATS(PUT_GPUD)
#undef PUT_GPUD
        ERL_NIF_TERM hist = enif_make_list(env, 0);
        for (unsigned i = EC_BATCH_HIST_BUCKETS; i > 0; i--)
            hist = enif_make_list_cell(env, enif_make_uint64(env, load64(&g->batch_hist[i - 1])),
                                       hist);
        enif_make_map_put(env, m, enif_make_atom(env, "batch_hist"), hist, &m);
        /* Steps of gpud's loop that took EC_STALL_NS or longer, per phase. */
#define PUT_STALLS(NAME, INDEX, KEY)                                                             \
        put(env, &m, "gpud_stalls_" #KEY, load64(&g->stalls[INDEX]));                          \
        put(env, &m, "gpud_stall_ns_" #KEY, load64(&g->stall_ns[INDEX]));                      \
        put(env, &m, "gpud_stall_max_ns_" #KEY, load64(&g->stall_max_ns[INDEX]));
        EC_STALLS(PUT_STALLS)
#undef PUT_STALLS
    }
    enif_rwlock_runlock(d->life);
    enif_make_map_put(env, m, enif_make_atom(env, "closed"), d->closed ? ATOM_true : ATOM_false,
                      &m);
    return m;
}
