/*
 * atoms.h: every atom the NIF uses, written once. X(name) in EC_NIF_ATOMS
 * declares ATOM_name, the atom `name`; the atoms of the ring header's lists
 * (element types, shapes, gpud's statuses) come from those lists,
 * indexed by id. atoms.c defines them all and makes them once, in load (as
 * jiffy and exile do), so no NIF call builds an atom from text.
 *
 * The bottom floor of the NIF with erlcuda_ring.h: it uses nothing else.
 */
#ifndef ERLCUDA_ATOMS_H
#define ERLCUDA_ATOMS_H

#include <erl_nif.h>

#include "erlcuda_ring.h"

#define EC_NIF_ATOMS(X)                                                                        \
    /* answers and error reasons (the erlcuda module's docs list them) */                     \
    X(ok) X(error) X(erlcuda) X(badarg) X(busy) X(closed) X(unknown_kernel) X(args) X(arg)      \
    X(shape) X(too_large) X(gpud) X(timeout) X(peer) X(oom) X(enomem)       \
    X(stale_kernel) X(module) X(buffer) X(freed) X(lost) X(live) X(device)                     \
    /* a kernel_fault's keys (complete.c) */                                                   \
    X(kernel) X(reason) X(block) X(thread) X(index) X(seed) X(shared)                          \
    /* floats that are no numbers */                                                           \
    X(nan) X(infinity) X(neg_infinity)                                                          \
    /* cancel/2, await_spin/2, booleans, submit's flags, module_op's operations */              \
    X(cancelled) X(sending) X(not_found) X(answered) X(waiting) X(true) X(false) X(fault) X(load) X(unload)     \
    /* a user's kernel as erlcuda_modules describes it */                                       \
    X(none) X(one)                                                                              \
    /* open/2's options */                                                                      \
    X(ring_entries) X(arena_bytes) X(arena_max_bytes) X(spin_us) X(busy_spin_us)                \
    X(zero_copy_bytes) X(pipeline_bytes) X(put_window_bytes) X(poison_outputs) X(prefault_arena) X(sync_spin_us)    \
    X(list_converter)                                                                           \
    /* a get through the arena's window (buffers.c) */                                        \
    X(pieces)                                                                                   \
    /* a large list result handed to the list converter (results.c) */                         \
    X(erlcuda_list_result) X(value)                                                             \
    /* kernels/0's keys and values */                                                          \
    X(name) X(id) X(types) X(outputs) X(entry) X(vector) X(scalar) X(dim) X(inout) X(type)      \
    X(accumulate) X(kind) X(length) X(range) X(T)                                               \
    /* option_bits/0's keys: the launch options behind EC_OPT_* */                              \
    X(grid) X(shared_bytes) X(thread_order) X(max_wait_us) X(cpu_runs_gpu) X(cpu_runs_cpu)

#define EC_NIF_ATOM_DECLARE(name) extern ERL_NIF_TERM ATOM_##name;
EC_NIF_ATOMS(EC_NIF_ATOM_DECLARE)
#undef EC_NIF_ATOM_DECLARE

/* The atoms of erlcuda_ring.h's lists, by id or code. */
extern ERL_NIF_TERM TYPE_ATOMS[EC_TYPE_COUNT], SHAPE_ATOMS[EC_SHAPE_COUNT],
    STATUS_ATOMS[EC_STATUS_COUNT], FAULT_ATOMS[EC_FAULT_COUNT];

/* Makes every atom above; called by load and upgrade. */
void atoms_load(ErlNifEnv *env);

#endif
