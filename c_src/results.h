/* results.h: terms out (a finished job's outputs) (results.c). */
#ifndef ERLCUDA_RESULTS_H
#define ERLCUDA_RESULTS_H

#include "device_state.h"


/* A double as a term: a float, or nan, infinity, neg_infinity. */
ERL_NIF_TERM float_term(ErlNifEnv *env, double f);
/* A binary of `bytes` at `at` in region r of device d, which keeps the
 * region (and the device) until it is garbage collected (region_dtor frees
 * it): a zero-copy result, or a pinned binary (pinned.c). 0 when the VM
 * is out of memory (the region is still the caller's). */
ERL_NIF_TERM region_binary(ErlNifEnv *env, struct device *d, const struct region *r, const uint8_t *at,
                           size_t bytes);
/* The answer of a finished kernel job, built in env: `ok` (no outputs),
 * its one output, or a tuple of them; (j->zero_copy) a single output as a
 * resource binary over the output region. */
ERL_NIF_TERM result_term(ErlNifEnv *env, struct device *d, struct job *j);

/* A list of n elements of `type` at p (numbers; nan, infinity and
 * neg_infinity for floats that are none): a result's list form. */
ERL_NIF_TERM list_term(ErlNifEnv *env, const uint8_t *p, uint8_t type, uint64_t n);

/* Large list results are built off the completion thread: a list of a
 * million elements held it 15 ms, and every other caller's answer with it
 * (bench/EXPERIMENTS.md). A job whose outputs in list form hold
 * LIST_HAND_ELEMS elements or more, on a device with a list converter, is
 * described instead: *items, in env, is a list with one item per output,
 * {Type, Binary} over the output region (kept until those binaries are
 * garbage collected: j->out_taken) or {value, Number} for a scalar, for
 * the converter to build the answer from (list_term, in the dirty NIF
 * list_build/2 and list_send/2). Returns 1 then, else 0 (build the result here). */
#define LIST_HAND_ELEMS 16384u
int list_handed(ErlNifEnv *env, struct device *d, struct job *j, ERL_NIF_TERM *items);

#endif
