/* Randomized check of the arena allocator (arena.c) against a byte map:
 * regions never overlap, stay inside the arena and aligned, `used` matches
 * what is handed out, and once everything is freed the whole arena can be
 * allocated again in one piece (quick lists flushed back into the spans).
 * Regions of 0 bytes among them take nothing and give nothing back; first
 * checked alone, as a put's or a job's empty output region is made and
 * freed (once 256 bytes leaked per put).
 * Run by `make test` (c_src/Makefile target `test`). */
#include "arena.h"
#include "erlcuda_ring.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define SIZE (64u << 20)
#define SLOTS 20000

static unsigned char owner_map[SIZE / EC_ARENA_ALIGN];

static int fail(const char *what, unsigned long seed)
{
    fprintf(stderr, "arena_test: %s (seed %lu)\n", what, seed);
    return 1;
}

/* Regions of 0 bytes: each takes nothing, also from a full arena, and
 * 25,000 puts' worth of them (a 0-byte region beside a 64 KiB one, both
 * freed) leave `used` at 0 and the arena whole. */
static int zero_byte_regions(unsigned long seed)
{
    struct arena a;
    uint64_t o, big;
    if (arena_init(&a, SIZE) < 0)
        return fail("init", seed);
    if (arena_alloc(&a, 0, &o) != 0 || a.used != 0)
        return fail("a 0-byte region took space", seed);
    arena_free(&a, o, 0);
    if (a.used != 0)
        return fail("freeing a 0-byte region moved used", seed);
    for (int i = 0; i < 25000; i++) {
        uint64_t z;
        if (arena_alloc(&a, 0, &z) != 0 || arena_alloc(&a, 64 << 10, &big) != 0)
            return fail("a put's regions", seed);
        arena_free(&a, z, 0);
        arena_free(&a, big, 64 << 10);
    }
    if (a.used != 0)
        return fail("puts' regions left bytes in use", seed);
    if (arena_alloc(&a, SIZE, &big) != 0 || big != 0)
        return fail("the arena is not whole after the puts", seed);
    if (arena_alloc(&a, 0, &o) != 0 || a.used != SIZE)
        return fail("no 0-byte region from a full arena", seed);
    arena_free(&a, o, 0);
    arena_free(&a, big, SIZE);
    if (a.used != 0)
        return fail("used after emptying a full arena", seed);
    arena_destroy(&a);
    return 0;
}

int main(void)
{
    unsigned long seed = (unsigned long)time(NULL);
    srand((unsigned)seed);
    if (zero_byte_regions(seed) != 0)
        return 1;
    static uint64_t off[SLOTS], len[SLOTS];
    static unsigned char live[SLOTS];
    struct arena a;
    if (arena_init(&a, SIZE) < 0)
        return fail("init", seed);
    uint64_t used = 0;
    for (long step = 0; step < 1000000; step++) {
        int s = rand() % SLOTS;
        if (!live[s]) {
            /* Mostly small sizes (quick lists), sometimes large ones, and
             * now and then 0 bytes. */
            uint64_t want = rand() % 64 == 0 ? 0
                            : rand() % 8     ? (uint64_t)(rand() % 20000)
                                             : (uint64_t)(rand() % (2 << 20));
            uint64_t o;
            if (arena_alloc(&a, want, &o) != 0)
                continue;
            uint64_t l = arena_round(want);
            if (o % EC_ARENA_ALIGN || o + l > SIZE)
                return fail("region outside the arena or misaligned", seed);
            for (uint64_t b = o / EC_ARENA_ALIGN; b < (o + l) / EC_ARENA_ALIGN; b++) {
                if (owner_map[b])
                    return fail("overlapping regions", seed);
                owner_map[b] = 1;
            }
            off[s] = o, len[s] = l, used += l, live[s] = 1;
        } else {
            arena_free(&a, off[s], len[s]);
            memset(&owner_map[off[s] / EC_ARENA_ALIGN], 0, len[s] / EC_ARENA_ALIGN);
            used -= len[s], len[s] = 0, live[s] = 0;
        }
        if (a.used != used)
            return fail("used out of step", seed);
    }
    for (int s = 0; s < SLOTS; s++)
        if (live[s])
            arena_free(&a, off[s], len[s]);
    uint64_t o;
    if (a.used != 0 || arena_alloc(&a, SIZE, &o) != 0 || o != 0)
        return fail("the whole arena is not free again", seed);
    arena_destroy(&a);
    printf("arena_test: ok (seed %lu)\n", seed);
    return 0;
}
