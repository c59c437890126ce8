/* kernels.h: the kernels (built-in rows, users' kernels) (kernels.c). */
#ifndef ERLCUDA_KERNELS_H
#define ERLCUDA_KERNELS_H

#include "device_state.h"


/* Parses the built-in rows; called by load/upgrade, after atoms_load.
 * Returns -1 when a row does not parse (a build that cannot load). */
int kernels_load(ErlNifEnv *env);
/* The built-in kernel an atom names, or NULL when it names none. */
const struct kernel_info *builtin_kernel(ErlNifEnv *env, ERL_NIF_TERM kernel);
/* user_kernel(Row) -> {ok, Kernel} | {error, Why}: a user's kernel as
 * erlcuda_modules describes it when its module is loaded, {Id, Slot, Gen,
 * Args, Outs, Blocks, Types, {Module, Name}}, read and checked into a KERNEL_RT resource.
 * {error, Why}: the blocks length does not read against the signature (Why:
 * the reader's message); badarg for a row that is not one. */
ERL_NIF_TERM make_user_kernel(ErlNifEnv *env, ERL_NIF_TERM row);
extern ErlNifResourceType *KERNEL_RT;
/* A launch's user kernel, {Kernel, {Given, Grid, Block, SharedBytes}}:
 * *ki points into Kernel's resource, alive while the term is. Returns 0
 * when the term is not one. */
int user_kernel(ErlNifEnv *env, ERL_NIF_TERM t, const struct kernel_info **ki,
                struct launch_opts *o);
/* The live generation of module slot `slot` (0: none); set by
 * erlcuda_nif:module_gen/2. A submit of a user's kernel publishes only while
 * its generation is live, checked under sq_lock (publish_checked). */
uint32_t module_gen(uint32_t slot);
/* The name of argument `slot` (as ec_job_args' slots) of the user's kernel
 * `id` of module generation `gen`, as its signature declares it (an atom):
 * `shared` for EC_FAULT_SLOT_SHARED; the slot's number where that module
 * is gone. For an out_of_bounds kernel_fault answer. */
ERL_NIF_TERM kernel_arg_name(ErlNifEnv *env, uint32_t id, uint32_t gen, uint32_t slot);
void set_module_gen(uint32_t slot, uint32_t gen);
/* kernels(): one map per built-in (name, id, args, outputs, types, shape,
 * entry, accumulate). */
ERL_NIF_TERM kernels_term(ErlNifEnv *env);
/* signature(Args, Outs) -> {ok, ArgMaps, OutMaps, UsesT} | {error, Why}:
 * a user's manifest line read as the NIF reads it. */
ERL_NIF_TERM signature_term(ErlNifEnv *env, ERL_NIF_TERM args, ERL_NIF_TERM outs);

#endif
