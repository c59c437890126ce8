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
/* The windowed get (buffers.c): a get of a buffer larger than any arena
 * region answers {pieces, Sink, N} instead of {ok, Ref}. The resource type
 * of Sink, and Sink's struct from its term (NULL: not one). */
extern ErlNifResourceType *GET_SINK_RT;
struct get_sink *get_sink(ErlNifEnv *env, ERL_NIF_TERM t);
/* get_piece(Sink, Ref): the next piece's GET descriptor; {ok, Ref} (then
 * {erlcuda, Ref, ok | {error, Reason}}) or {error, Reason} (busy: none
 * free now, when another piece is in flight the caller retries after its
 * answer). badarg when every piece was asked for. */
ERL_NIF_TERM get_sink_piece(ErlNifEnv *env, struct get_sink *s, ERL_NIF_TERM sink, ERL_NIF_TERM ref);
/* A piece answered OK (complete.c): copies its region into the result. */
void get_sink_copy(struct device *d, struct job *j);
/* get_done(Sink, Outcome): the get's end, counted once. ok: {ok, Vector}
 * once every piece is in (badarg before, or taken already); timeout (the
 * caller cancelled) or anything else (a piece failed): ok. */
ERL_NIF_TERM get_sink_result(ErlNifEnv *env, struct get_sink *s, ERL_NIF_TERM outcome);
/* GET_SINK_RT's destructor: the result's memory, unless a term took it. */
void get_sink_dtor(ErlNifEnv *env, void *obj);
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
