/* pinned.h: binaries copied into the arena ahead of use (pinned.c). */
#ifndef ERLCUDA_PINNED_H
#define ERLCUDA_PINNED_H

#include "device_state.h"

/* pin(Handle, Binary): a copy of Binary in the device's arena (pinned,
 * device-mapped host memory), as a binary that keeps its region until it is
 * garbage collected. Sets *result to {ok, Binary'} or {error, Reason};
 * returns 1 to go dirty (a large copy, when !dirty), else 0. */
int pin_binary(ErlNifEnv *env, struct device *d, ERL_NIF_TERM bin, int dirty, ERL_NIF_TERM *result);

#endif
