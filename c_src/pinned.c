/*
 * pinned.c: erlcuda:pin/2, a binary copied into the arena once, ahead of
 * the jobs and puts that read it.
 *
 * The arena is pinned host memory that the GPU maps (DESIGN, "Zero-copy"),
 * and a binary already in it goes to a job or a put with no copy at all:
 * the GPU's DMA reads it in place. A plain binary from the VM's heap has to
 * be copied into the arena by the VM first, and that copy competes with the
 * DMA for the host's memory bandwidth: a put of 256 MiB from the heap ran
 * at 35-37 GB/s on an H100 host whatever the copy's order or thread count,
 * against 55 from pinned memory (bench/EXPERIMENTS.md). pin/2 is PyTorch's
 * pin_memory(): the copy is paid once, where the caller chooses, and every
 * later transfer of the binary runs at the bus's speed.
 *
 * The region is exported as a large result's is (region_binary,
 * results.c): freed by region_dtor when the last reference goes.
 */
#define _GNU_SOURCE
#include "device_state.h"
#include "args.h"
#include "atoms.h"
#include "copy.h"
#include "pinned.h"
#include "results.h"
#include "submit.h"

#include <string.h>

/* Larger copies go to a dirty scheduler (as a put's, args.c). */
#define PIN_BYTES_ON_SCHEDULER (1u << 20)

int pin_binary(ErlNifEnv *env, struct device *d, ERL_NIF_TERM term, int dirty, ERL_NIF_TERM *result)
{
    ErlNifBinary bin;
    if (!enif_inspect_binary(env, term, &bin)) {
        *result = make_badarg(env, enif_make_tuple2(env, ATOM_arg, enif_make_uint(env, 1)));
        return 0;
    }
    if (!dirty && bin.size > PIN_BYTES_ON_SCHEDULER)
        return 1;
    enif_rwlock_rlock(d->life);
    if (d->closed) {
        enif_rwlock_runlock(d->life);
        *result = make_error(env, ATOM_closed);
        return 0;
    }
    /* Already in the arena (a result, or pinned before): nothing to copy. */
    struct vec v;
    memset(&v, 0, sizeof v);
    v.is_binary = 1;
    v.bin = bin;
    v.type = EC_TYPE_U8;
    if (bin.size == 0 || vec_in_arena(d, &v)) {
        enif_rwlock_runlock(d->life);
        *result = enif_make_tuple2(env, ATOM_ok, term);
        return 0;
    }
    if (bin.size > d->arena_max) {
        enif_rwlock_runlock(d->life);
        *result = make_badarg(env, ATOM_too_large);
        return 0;
    }
    struct region r;
    dev_lock(d);
    int got = region_alloc_locked(d, arena_round(bin.size), &r);
    /* No segment that large, and none can be added: refused for good. */
    int never = got != 0 && !can_ever_fit_locked(d, arena_round(bin.size));
    dev_unlock(d);
    if (got != 0) {
        enif_rwlock_runlock(d->life);
        if (!never)
            count(&d->c.busy, 1);
        *result = never ? make_badarg(env, ATOM_too_large) : make_error(env, ATOM_busy);
        return 0;
    }
    uint8_t *at = region_ptr(d, &r);
    copy_bytes(at, bin.data, bin.size);
    ERL_NIF_TERM out = region_binary(env, d, &r, at, bin.size);
    if (!out) {
        dev_lock(d);
        free_region_locked(d, &r);
        dev_unlock(d);
        enif_rwlock_runlock(d->life);
        *result = make_error(env, ATOM_enomem);
        return 0;
    }
    count(&d->c.pinned_bytes, bin.size);
    enif_rwlock_runlock(d->life);
    *result = enif_make_tuple2(env, ATOM_ok, out);
    return 0;
}
