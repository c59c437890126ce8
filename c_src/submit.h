/* submit.h: the ring producer (slots, regions, the SQ push) (submit.c). */
#ifndef ERLCUDA_SUBMIT_H
#define ERLCUDA_SUBMIT_H

#include "device_state.h"

/*
 * Slots, regions and the SQ. */

/* Returns a region to its segment's allocator. Caller holds d->lock. */
void free_region_locked(struct device *d, struct region *r);
/* Allocates a region of `bytes` (growing the arena). Caller holds d->lock.
 * 0 or -1. */
int region_alloc_locked(struct device *d, uint64_t bytes, struct region *r);
/* Could a region of `bytes` ever be had, however long one waits: in a
 * segment that large, or in one the arena can still grow by (segments
 * never merge)? Caller holds d->lock. */
int can_ever_fit_locked(const struct device *d, uint64_t bytes);
/* A job's slot and regions, made here and nowhere else (given back by
 * free_slot_locked, and nowhere else): a slot, plus `credits` extra slots
 * for the extra descriptors of a pipelined job, and regions of in_bytes
 * and out_bytes (in the slot's inline area for a small job; a region of 0
 * bytes takes nothing). `keep_out`: the output will outlive the job (a
 * zero-copy result binary), so it cannot be in the inline area. Returns
 * the slot, -1 (busy: try later) or -2 (the regions can never fit the
 * arena: a permanent refusal, never busy). reserve_job_locked: the
 * caller holds d->lock. */
int64_t reserve_job(struct device *d, uint64_t in_bytes, uint64_t out_bytes, uint32_t credits,
                    int keep_out);
int64_t reserve_job_locked(struct device *d, uint64_t in_bytes, uint64_t out_bytes, uint32_t credits,
                           int keep_out);
/* The fields every job of slot idx starts with, set here for every kind
 * (a launch, a module's load or unload, a put, a get, a free): a new
 * generation, its kernel, output type and kind and length, and whom it
 * answers: the process calling in `caller` under `ref`, or nobody (caller
 * NULL: a free). Returns its descriptor's user_data. */
uint64_t job_begin(struct device *d, uint32_t idx, ErlNifEnv *caller, ERL_NIF_TERM ref, uint32_t kernel,
                   uint8_t type, uint8_t output, uint32_t out_len);
/* Gives back a slot reserved but not published. */
void unreserve_job(struct device *d, uint32_t idx);
/* A slot's job fields back to free; the caller puts the slot (and its
 * credits) where free slots go. */
void clear_slot(struct device *d, struct job *j);
/* Frees slot idx (its regions unless exported, its credits); its env must
 * be clear already. Caller holds d->lock. */
void free_slot_locked(struct device *d, uint32_t idx);
/* Frees job idx's env, regions (unless exported) and slots. Caller holds
 * d->lock. */
void release_job_locked(struct device *d, uint32_t idx);
/* The one SQ write: slot idx INFLIGHT, its descriptor at the tail, then the
 * tail stored with release, as erlcuda_ring.h orders it. Caller holds sq_lock; no wake-up. */
void sq_push_locked(struct device *d, uint32_t idx, const struct ec_sqe *sqe);
/* Publishes one descriptor of slot idx (sq_push_locked) and wakes gpud. */
void publish(struct device *d, uint32_t idx, const struct ec_sqe *sqe);
/* publish, unless an input buffer of s (may be NULL) was freed or lost
 * since it was checked (-2), or s's kernel is a user's whose module
 * generation was retired (-1): then nothing is published. */
int publish_checked(struct device *d, uint32_t idx, const struct ec_sqe *sqe,
                    const struct job_spec *s);
/* Wakes gpud if it sleeps, after a publish. */
void wake_gpud(struct device *d);

#endif
