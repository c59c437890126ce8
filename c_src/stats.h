/* stats.h: the stats map (stats.c). */
#ifndef ERLCUDA_STATS_H
#define ERLCUDA_STATS_H

#include "device_state.h"


/* stats(Handle): the device's counters, the profile's sums and gpud's. */
ERL_NIF_TERM stats_term(ErlNifEnv *env, struct device *d);

#endif
