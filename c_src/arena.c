#include "arena.h"
#include "erlcuda_ring.h"

#include <stdlib.h>
#include <string.h>

uint64_t arena_round(uint64_t bytes)
{
    const uint64_t mask = EC_ARENA_ALIGN - 1;
    if (bytes > UINT64_MAX - mask)
        return 0;
    return (bytes + mask) & ~mask;
}

#define NQUICK (ARENA_QUICK_MAX / EC_ARENA_ALIGN)

int arena_init(struct arena *a, uint64_t size)
{
    memset(a, 0, sizeof *a);
    a->cap = 64;
    a->spans = malloc(a->cap * sizeof *a->spans);
    if (!a->spans)
        return -1;
    /* Without quick lists (no memory for them) the allocator still works. */
    a->quick = calloc(NQUICK, sizeof *a->quick);
    a->size = size & ~(uint64_t)(EC_ARENA_ALIGN - 1);
    arena_reset(a);
    return 0;
}

void arena_destroy(struct arena *a)
{
    free(a->spans);
    a->spans = NULL;
    a->nspans = a->cap = 0;
    if (a->quick)
        for (uint32_t i = 0; i < NQUICK; i++)
            free(a->quick[i].off);
    free(a->quick);
    a->quick = NULL;
}

void arena_reset(struct arena *a)
{
    a->used = 0;
    a->quick_bytes = 0;
    if (a->quick)
        for (uint32_t i = 0; i < NQUICK; i++)
            a->quick[i].n = 0;
    a->nspans = 0;
    if (a->size > 0) {
        a->spans[0].off = 0;
        a->spans[0].len = a->size;
        a->nspans = 1;
    }
}

static void spans_free(struct arena *a, uint64_t off, uint64_t len);

static void note_used(struct arena *a, uint64_t need)
{
    a->used += need;
    if (a->used > a->peak)
        a->peak = a->used;
}

/* Gives every parked region back to the spans (coalescing them). */
static void quick_flush(struct arena *a)
{
    if (!a->quick || a->quick_bytes == 0)
        return;
    for (uint32_t c = 0; c < NQUICK; c++) {
        struct arena_quick *q = &a->quick[c];
        while (q->n > 0)
            spans_free(a, q->off[--q->n], (uint64_t)(c + 1) * EC_ARENA_ALIGN);
    }
    a->quick_bytes = 0;
}

static int spans_alloc(struct arena *a, uint64_t need, uint64_t *off);

int arena_alloc(struct arena *a, uint64_t bytes, uint64_t *off)
{
    if (bytes == 0) {
        *off = 0;
        return 0;
    }
    uint64_t need = arena_round(bytes);
    if (need == 0)
        return -1; /* overflow */
    if (a->quick && need <= ARENA_QUICK_MAX) {
        struct arena_quick *q = &a->quick[need / EC_ARENA_ALIGN - 1];
        if (q->n > 0) {
            *off = q->off[--q->n];
            a->quick_bytes -= need;
            note_used(a, need);
            return 0;
        }
    }
    if (spans_alloc(a, need, off) == 0)
        return 0;
    if (a->quick_bytes == 0)
        return -1;
    quick_flush(a);
    return spans_alloc(a, need, off);
}

static int spans_alloc(struct arena *a, uint64_t need, uint64_t *off)
{
    for (uint32_t i = 0; i < a->nspans; i++) {
        struct arena_span *s = &a->spans[i];
        if (s->len < need)
            continue;
        *off = s->off;
        s->off += need;
        s->len -= need;
        if (s->len == 0) {
            memmove(s, s + 1, (a->nspans - i - 1) * sizeof *s);
            a->nspans--;
        }
        note_used(a, need);
        return 0;
    }
    return -1;
}

/* Index of the first span whose offset is greater than off. */
static uint32_t upper_bound(const struct arena *a, uint64_t off)
{
    uint32_t lo = 0, hi = a->nspans;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (a->spans[mid].off > off)
            hi = mid;
        else
            lo = mid + 1;
    }
    return lo;
}

void arena_free(struct arena *a, uint64_t off, uint64_t bytes)
{
    if (bytes == 0)
        return;
    uint64_t len = arena_round(bytes);
    a->used -= len;
    if (a->quick && len <= ARENA_QUICK_MAX) {
        struct arena_quick *q = &a->quick[len / EC_ARENA_ALIGN - 1];
        if (q->n == q->cap && q->cap < ARENA_QUICK_DEPTH) {
            uint32_t cap = q->cap ? 2 * q->cap : 16;
            uint64_t *n = realloc(q->off, cap * sizeof *n);
            if (n) {
                q->off = n;
                q->cap = cap;
            }
        }
        if (q->n < q->cap) {
            q->off[q->n++] = off;
            a->quick_bytes += len;
            return;
        }
    }
    spans_free(a, off, len);
}

static void spans_free(struct arena *a, uint64_t off, uint64_t len)
{
    uint32_t i = upper_bound(a, off);
    int merge_prev = i > 0 && a->spans[i - 1].off + a->spans[i - 1].len == off;
    int merge_next = i < a->nspans && off + len == a->spans[i].off;

    if (merge_prev && merge_next) {
        a->spans[i - 1].len += len + a->spans[i].len;
        memmove(&a->spans[i], &a->spans[i + 1], (a->nspans - i - 1) * sizeof a->spans[0]);
        a->nspans--;
    } else if (merge_prev) {
        a->spans[i - 1].len += len;
    } else if (merge_next) {
        a->spans[i].off = off;
        a->spans[i].len += len;
    } else {
        if (a->nspans == a->cap) {
            /* Growth can fail only when malloc does; the span is then lost to
             * the allocator (a leak of arena space, never corruption). */
            struct arena_span *n = realloc(a->spans, 2 * a->cap * sizeof *n);
            if (!n)
                return;
            a->spans = n;
            a->cap *= 2;
        }
        memmove(&a->spans[i + 1], &a->spans[i], (a->nspans - i) * sizeof a->spans[0]);
        a->spans[i].off = off;
        a->spans[i].len = len;
        a->nspans++;
    }
}
