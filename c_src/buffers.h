/* buffers.h: device buffers (put, get, free) (buffers.c). */
#ifndef ERLCUDA_BUFFERS_H
#define ERLCUDA_BUFFERS_H

#include "device_state.h"


/* put(Handle, Vector): a put descriptor; {ok, Ref}, then {erlcuda, Ref,
 * {ok, Buf} | {error, Reason}}. Returns 1 to go dirty (when !dirty). */
int submit_put(ErlNifEnv *env, struct device *d, const ERL_NIF_TERM argv[], int dirty,
               ERL_NIF_TERM ref, ERL_NIF_TERM *result);
/* get(Buf): a get descriptor; {ok, Ref}, then {erlcuda, Ref, {ok, Vector}}. */
ERL_NIF_TERM submit_get(ErlNifEnv *env, struct buffer_res *b, ERL_NIF_TERM buf, ERL_NIF_TERM ref);
/* Queues buffer b's free (once; never blocks: the destructor calls it).
 * Returns 1 when the queue was empty before (the caller that must see the
 * free sent wakes the completion thread then), else 0. */
int queue_free(struct buffer_res *b);
/* Publishes queued frees as free descriptors, as far as slots and arena
 * allow. Caller holds d->life (read) and not d->lock. */
void flush_frees(struct device *d);
/* free(Buf): queue_free, then flush_frees while the device is open. */
void buffer_free(struct buffer_res *b);
/* buffer_info(Buf): {Device, Type, Len, live | freed | lost}. */
ERL_NIF_TERM buffer_info(ErlNifEnv *env, struct buffer_res *b);
/* BUFFER_RT's destructor: queues the free and wakes the completion thread
 * to send it. */
void buffer_dtor(ErlNifEnv *env, void *obj);

#endif
