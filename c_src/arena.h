/*
 * arena.h: the allocator for job regions inside the shared arena.
 *
 * The VM owns the arena (see erlcuda_ring.h); this allocator hands out
 * EC_ARENA_ALIGN-aligned byte ranges. It keeps the free space as an array of
 * spans sorted by offset and coalesces neighbours on free, so fragmentation
 * stays bounded by the number of live regions. First fit: O(free spans) per
 * call, and freeing shifts the span array: both grow with the regions alive,
 * which thousands of concurrent small jobs make slow (under the device lock).
 * So freed regions of up to ARENA_QUICK_MAX bytes go onto a LIFO list per
 * size (quick lists) and are handed out again in O(1); they return to the
 * spans only when an allocation finds no span large enough. Not
 * thread-safe: the caller holds the device lock.
 */
#ifndef ERLCUDA_ARENA_H
#define ERLCUDA_ARENA_H

#include <stdint.h>

struct arena_span {
    uint64_t off;
    uint64_t len;
};

/* Quick lists: sizes EC_ARENA_ALIGN .. ARENA_QUICK_MAX, one per multiple of
 * EC_ARENA_ALIGN, each holding at most ARENA_QUICK_DEPTH offsets. */
#define ARENA_QUICK_MAX (64u << 10)
#define ARENA_QUICK_DEPTH 4096u

struct arena_quick {
    uint32_t n, cap;
    uint64_t *off;
};

struct arena {
    uint64_t size;    /* bytes managed */
    uint64_t used;    /* bytes handed out */
    uint64_t peak;    /* high-water mark of used */
    uint32_t nspans;  /* free spans in use */
    uint32_t cap;     /* capacity of spans */
    struct arena_span *spans;
    uint64_t quick_bytes; /* free bytes parked on quick lists */
    struct arena_quick *quick; /* ARENA_QUICK_MAX / EC_ARENA_ALIGN lists, or NULL */
};

/* Rounds a byte count up to the region alignment; 0 stays 0. Returns 0 on
 * overflow too, which arena_alloc tells apart from a request of 0 bytes by
 * the request. */
uint64_t arena_round(uint64_t bytes);

int arena_init(struct arena *a, uint64_t size);
void arena_destroy(struct arena *a);
/* Allocates `bytes` rounded up; returns 0 and sets *off, or -1 when no
 * span is large enough. A region of 0 bytes takes nothing: it always
 * succeeds, at offset 0, and `used` does not move. (It once took one
 * EC_ARENA_ALIGN unit, which the NIF never gave back: a region of 0 bytes
 * looked like no region at all, and 256 bytes leaked per put.) */
int arena_alloc(struct arena *a, uint64_t bytes, uint64_t *off);
/* Returns a region obtained from arena_alloc with the same byte count; a
 * region of 0 bytes gives back nothing, as it took nothing. */
void arena_free(struct arena *a, uint64_t off, uint64_t bytes);
/* Frees everything (used by tests and by a device reset with no live regions). */
void arena_reset(struct arena *a);

#endif
