/* results.h: terms out (a finished job's outputs) (results.c). */
#ifndef ERLCUDA_RESULTS_H
#define ERLCUDA_RESULTS_H

#include "device_state.h"


/* A double as a term: a float, or nan, infinity, neg_infinity. */
ERL_NIF_TERM float_term(ErlNifEnv *env, double f);
/* The answer of a finished kernel job, built in env: `ok` (no outputs),
 * its one output, or a tuple of them; (j->zero_copy) a single output as a
 * resource binary over the output region. */
ERL_NIF_TERM result_term(ErlNifEnv *env, struct device *d, struct job *j);

#endif
