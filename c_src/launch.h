/* launch.h: a launch, and a module's load or unload (launch.c). */
#ifndef ERLCUDA_LAUNCH_H
#define ERLCUDA_LAUNCH_H

#include "device_state.h"

/*
 * submit(Handle, Kernel, Args, Flags) on device d. Returns 0 with *result
 * the answer, or 1 when the job must move to a dirty scheduler (only when
 * !dirty): the caller reschedules it. */
int submit_job(ErlNifEnv *env, struct device *d, const ERL_NIF_TERM argv[], int dirty,
               ERL_NIF_TERM ref, ERL_NIF_TERM *result);
/* module_op(Handle, load | unload, Slot, Path): a control descriptor, in
 * order with the jobs around it; {ok, Ref}, then {erlcuda, Ref, ok} or
 * {erlcuda, Ref, {error, {module, Why}}}. */
ERL_NIF_TERM submit_control(ErlNifEnv *env, struct device *d, const ERL_NIF_TERM argv[]);

#endif
