/* device.h: a device's life (device.c). */
#ifndef ERLCUDA_DEVICE_H
#define ERLCUDA_DEVICE_H

#include "device_state.h"


/* The resource type of a device (struct device). */
extern ErlNifResourceType *DEVICE_RT;
/* The device a term is, or NULL. */
struct device *get_device(ErlNifEnv *env, ERL_NIF_TERM t);
/* open(Device, Opts) -> {ok, Handle} | {error, Reason} (erlcuda_nif.c). */
ERL_NIF_TERM device_open(ErlNifEnv *env, ERL_NIF_TERM device, ERL_NIF_TERM opts);
/* The abstract socket name gpud is given, as a binary. */
ERL_NIF_TERM device_socket_name(ErlNifEnv *env, struct device *d);
/* Accepts gpud (OS pid `pid`) within timeout ms and hands it the memory:
 * ok | {error, timeout | peer | Errno}. */
ERL_NIF_TERM device_accept(ErlNifEnv *env, struct device *d, int pid, int timeout);
/* gpud has exited: jobs it answered are answered, every other job in
 * flight gets {error, Reason}, buffers are lost, the rings start again. */
void device_reset(ErlNifEnv *env, struct device *d, ERL_NIF_TERM reason);
/* Ends the device for good, every job in flight answered {error, Reason};
 * idempotent. */
void device_close(struct device *d, ErlNifEnv *caller_env, ERL_NIF_TERM reason);
/* DEVICE_RT's and REGION_RT's destructors. */
void device_dtor(ErlNifEnv *env, void *obj);
void region_dtor(ErlNifEnv *env, void *obj);

#endif
