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

#endif
