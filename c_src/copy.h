/* copy.h: copies of vectors into the arena, split over a pool of threads (copy.c). */
#ifndef ERLCUDA_COPY_H
#define ERLCUDA_COPY_H

#include <stddef.h>
#include <stdint.h>

/*
 * A leaf, like arena.c, shm.c and prefault.c: it calls no other file. */

/* Starts the copy pool of `threads` threads (0: the default; the first
 * holder decides) at nice value `nice` (0: the process's) or takes another
 * hold of it; called by load/upgrade. Never fails: without threads a copy
 * runs on its caller. */
void copy_pool_hold(uint32_t threads, int nice);
/* Drops a hold; the last one stops the threads and waits for them. Called
 * by unload, when no code of this library instance can run any more. */
void copy_pool_release(void);
/* memcpy into the arena, over the copy pool when large (copy_streaming). */
void copy_bytes(void *dst, const void *src, size_t n);
/* memcpy into the arena; large copies with streaming stores, fenced before
 * it returns (the caller may publish the bytes at once). */
void copy_streaming(void *dst, const void *src, size_t n);
/* Calls piece(arg, i) for every i in 0 .. pieces - 1, in that order of
 * start, on the caller and pool threads, `threads` at once at most (0: as
 * many as the pool has, copy_threads()); returns when all have returned. */
void copy_pieces(void (*piece)(void *arg, uint32_t i), void *arg, uint32_t pieces, uint32_t threads);
/* The copy pool's threads, the caller's included. */
uint32_t copy_threads(void);
/* Pieces that finish together run at most this many at once (copy.c). */
#define SPREAD_COPY_THREADS 8u

#endif
