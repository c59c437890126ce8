/*
 * slot_cache.h: per-thread caches of free inline job slots.
 *
 * The H200 profile at ~1M jobs/s (16 schedulers, 1,000 callers) measured
 * 4.2-4.5 us of a ~7.3 us submit in reserving a slot, 35-43% of the device
 * lock's acquisitions waiting (3.5-4.1 us each), and another 0.9 us per job
 * releasing slots under the same lock. A small job (its input and output
 * fit a slot's inline area, INLINE_BYTES) needs only a free slot, no arena
 * region: each thread keeps a few such slots of its own, taken and given
 * back under a lock of its own (uncontended but for the two rare visitors
 * below), and goes to the device lock only to refill or overflow.
 *
 * - A thread's cache is found by the thread's number (given on first use,
 *   shared by all devices); threads beyond SLOT_CACHES use the device lock.
 * - Slots in a cache are free (JOB_FREE) and not in flight.
 * - Nothing is lost to caches: when the device's free stack is empty,
 *   reserve (and flush_frees) steal every cache back under the device lock
 *   first, so `busy' still means every slot is in flight.
 * - cancel_job holds every cache's lock as well as the device lock while it
 *   reads slots' refs: a release into a cache swaps the slot's env under
 *   the cache's lock, so the ref cancel reads is never cleared under it.
 * - Lock order: device lock, then cache locks. A cache's lock is never held
 *   while taking the device lock.
 * - Only devices of at least SLOT_CACHE_MIN_SLOTS slots have caches, so
 *   that caches never hold more than a small share of the ring.
 */
#ifndef ERLCUDA_SLOT_CACHE_H
#define ERLCUDA_SLOT_CACHE_H

#include <stdint.h>

#define SLOT_CACHES 128
#define SLOT_CACHE_MAX 32
#define SLOT_CACHE_MIN_SLOTS 1024

struct slot_cache {
    uint32_t lock; /* __atomic: 0 free, 1 held */
    uint32_t n;
    uint32_t idx[SLOT_CACHE_MAX];
    uint8_t pad[64 - (2 * 4 + SLOT_CACHE_MAX * 4) % 64]; /* one cache per line set */
};

struct slot_caches {
    struct slot_cache *c; /* SLOT_CACHES of them, 64-byte aligned inside raw */
    void *raw;
    uint32_t cap; /* slots a cache may hold: 0 for none */
};

struct device;

/* Sets up the caches of a device of nslots slots. 0, or -1 (no memory). */
int slot_caches_init(struct slot_caches *s, uint32_t nslots);
void slot_caches_free(struct slot_caches *s);

/* The calling thread's cache on this device, or NULL. */
struct slot_cache *slot_cache_mine(struct slot_caches *s);

void slot_cache_lock(struct slot_cache *c);
void slot_cache_unlock(struct slot_cache *c);

/* A slot off the thread's cache (taken under its lock), or -1. */
int64_t slot_cache_pop(struct slot_cache *c);

/* Caller holds the device lock: moves every cached slot back onto the
 * device's free stack. */
void slot_caches_steal_locked(struct device *d);

/* Caller holds the device lock: fills c up to half its cap from the top
 * of the free stack, while the slots there have inline areas. */
void slot_cache_refill_locked(struct device *d, struct slot_cache *c);

/* cancel_job's exclusion of releases into caches (see above). */
void slot_caches_lock_all(struct slot_caches *s);
void slot_caches_unlock_all(struct slot_caches *s);

#endif
