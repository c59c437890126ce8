/* slot_cache.c: per-thread caches of free inline job slots (slot_cache.h). */
#define _GNU_SOURCE
#include "device_state.h"
#include "slot_cache.h"

#include <string.h>

_Static_assert(sizeof(struct slot_cache) % 64 == 0, "a cache fills whole cache lines");

static uint32_t next_thread_no;
static __thread int64_t thread_no = -1;

int slot_caches_init(struct slot_caches *s, uint32_t nslots)
{
    memset(s, 0, sizeof *s);
    if (nslots < SLOT_CACHE_MIN_SLOTS)
        return 0;
    /* At most 1/128 of the ring per cache: 32 of 4096 slots. */
    uint32_t cap = nslots / 128;
    s->cap = cap < SLOT_CACHE_MAX ? cap : SLOT_CACHE_MAX;
    s->raw = enif_alloc(SLOT_CACHES * sizeof *s->c + 64);
    if (!s->raw) {
        s->cap = 0;
        return -1;
    }
    /* enif_alloc aligns to 8 or 16 only. */
    s->c = (struct slot_cache *)(((uintptr_t)s->raw + 63) & ~(uintptr_t)63);
    memset(s->c, 0, SLOT_CACHES * sizeof *s->c);
    return 0;
}

void slot_caches_free(struct slot_caches *s)
{
    if (s->raw)
        enif_free(s->raw);
    memset(s, 0, sizeof *s);
}

struct slot_cache *slot_cache_mine(struct slot_caches *s)
{
    if (s->cap == 0)
        return NULL;
    if (thread_no < 0)
        thread_no = __atomic_fetch_add(&next_thread_no, 1, __ATOMIC_RELAXED);
    return thread_no < SLOT_CACHES ? &s->c[thread_no] : NULL;
}

void slot_cache_lock(struct slot_cache *c)
{
    while (__atomic_exchange_n(&c->lock, 1, __ATOMIC_ACQUIRE) != 0)
        while (__atomic_load_n(&c->lock, __ATOMIC_RELAXED) != 0)
            cpu_relax();
}

void slot_cache_unlock(struct slot_cache *c) { __atomic_store_n(&c->lock, 0, __ATOMIC_RELEASE); }

int64_t slot_cache_pop(struct slot_cache *c)
{
    int64_t idx = -1;
    slot_cache_lock(c);
    if (c->n > 0)
        idx = c->idx[--c->n];
    slot_cache_unlock(c);
    return idx;
}

void slot_caches_steal_locked(struct device *d)
{
    struct slot_caches *s = &d->caches;
    for (uint32_t i = 0; s->cap && i < SLOT_CACHES; i++) {
        struct slot_cache *c = &s->c[i];
        if (__atomic_load_n(&c->n, __ATOMIC_RELAXED) == 0)
            continue; /* a release racing this keeps its slots, as one a moment later would */
        slot_cache_lock(c);
        while (c->n > 0)
            d->free_stack[d->nfree++] = c->idx[--c->n];
        slot_cache_unlock(c);
    }
}

void slot_cache_refill_locked(struct device *d, struct slot_cache *c)
{
    uint32_t want = d->caches.cap / 2;
    slot_cache_lock(c);
    while (c->n < want && d->nfree > 0 && d->free_stack[d->nfree - 1] < d->inline_slots)
        c->idx[c->n++] = d->free_stack[--d->nfree];
    slot_cache_unlock(c);
}

void slot_caches_lock_all(struct slot_caches *s)
{
    for (uint32_t i = 0; s->cap && i < SLOT_CACHES; i++)
        slot_cache_lock(&s->c[i]);
}

void slot_caches_unlock_all(struct slot_caches *s)
{
    for (uint32_t i = 0; s->cap && i < SLOT_CACHES; i++)
        slot_cache_unlock(&s->c[i]);
}
