/* Randomized check of the arena allocator (arena.c) against a byte map:
 * regions never overlap, stay inside the arena and aligned, `used` matches
 * what is handed out, and once everything is freed the whole arena can be
 * allocated again in one piece (quick lists flushed back into the spans).
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

int main(void)
{
    unsigned long seed = (unsigned long)time(NULL);
    srand((unsigned)seed);
    static uint64_t off[SLOTS], len[SLOTS];
    struct arena a;
    if (arena_init(&a, SIZE) < 0)
        return fail("init", seed);
    uint64_t used = 0;
    for (long step = 0; step < 1000000; step++) {
        int s = rand() % SLOTS;
        if (len[s] == 0) {
            /* Mostly small sizes (quick lists), sometimes large ones. */
            uint64_t want = rand() % 8 ? (uint64_t)(rand() % 20000) : (uint64_t)(rand() % (2 << 20));
            uint64_t o;
            if (arena_alloc(&a, want, &o) != 0)
                continue;
            uint64_t l = arena_round(want ? want : 1);
            if (o % EC_ARENA_ALIGN || o + l > SIZE)
                return fail("region outside the arena or misaligned", seed);
            for (uint64_t b = o / EC_ARENA_ALIGN; b < (o + l) / EC_ARENA_ALIGN; b++) {
                if (owner_map[b])
                    return fail("overlapping regions", seed);
                owner_map[b] = 1;
            }
            off[s] = o, len[s] = l, used += l;
        } else {
            arena_free(&a, off[s], len[s]);
            memset(&owner_map[off[s] / EC_ARENA_ALIGN], 0, len[s] / EC_ARENA_ALIGN);
            used -= len[s], len[s] = 0;
        }
        if (a.used != used)
            return fail("used out of step", seed);
    }
    for (int s = 0; s < SLOTS; s++)
        if (len[s])
            arena_free(&a, off[s], len[s]);
    uint64_t o;
    if (a.used != 0 || arena_alloc(&a, SIZE, &o) != 0 || o != 0)
        return fail("the whole arena is not free again", seed);
    arena_destroy(&a);
    printf("arena_test: ok (seed %lu)\n", seed);
    return 0;
}
