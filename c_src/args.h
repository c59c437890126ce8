/* args.h: terms in (a call's Args against its kernel's signature) (args.c). */
#ifndef ERLCUDA_ARGS_H
#define ERLCUDA_ARGS_H

#include "device_state.h"

/*
 * Everything else knows the kernels and their arguments only through these
 * (and struct job_spec / struct vec, which submit reads). */

/* The resource type of a result binary that stays in the arena. */
extern ErlNifResourceType *REGION_RT;
/* The resource type of a device buffer (struct buffer_res). */
extern ErlNifResourceType *BUFFER_RT;
/* Parses the Args of kernel s->kernel (the caller sets it, from kernel_id)
 * into s, s->nin included. Returns 0 when s is filled, 1 when the job is too
 * large for a normal scheduler (only when !dirty), or -1 with *err set to the
 * {error, _} answer. Reads the mapping (arena lookups): the caller holds
 * d->life. */
int parse_args(ErlNifEnv *env, struct device *d, ERL_NIF_TERM args, int dirty,
               struct job_spec *s, ERL_NIF_TERM *err);
/* Parses one vector (not a buffer) for put: 0, 1 to go dirty (only when
 * !dirty), or -1 with *err set. */
int parse_vector(ErlNifEnv *env, ERL_NIF_TERM t, int dirty, struct vec *v, ERL_NIF_TERM *err);
/* Is binary vector v's data inside one of the device's arena segments (a
 * result of an earlier job or part of one, or pinned: pinned.c), aligned to
 * its type? Then sets v->in_arena and v->addr, and a job or a put names it
 * directly, with no copy. Caller holds d->life. */
int vec_in_arena(struct device *d, struct vec *v);
/* Writes a vector argument to dst (v->len elements of its type; lists as f32). Returns 0 if a
 * list element is not a number (dst is then partly written). */
int copy_vec(ErlNifEnv *env, const struct vec *v, void *dst);
/* Bytes per element of an enum ec_type. */
unsigned type_bytes(uint8_t type);
/* A number (or nan, infinity, neg_infinity) as a double. */
int term_to_double(ErlNifEnv *env, ERL_NIF_TERM t, double *out);
/* The buffer a term is, or NULL. */
struct buffer_res *get_buffer(ErlNifEnv *env, ERL_NIF_TERM t);
/* Makes a new buffer of device d (a fresh id, the current epoch): its
 * resource term in env, or 0 when out of memory. */
ERL_NIF_TERM new_buffer(ErlNifEnv *env, struct device *d, uint8_t type, uint32_t len);
/* Why buffer b cannot be used on device d now ({buffer, freed | lost |
 * {device, D}}), or 0 when it can (buffer_state). */
ERL_NIF_TERM buffer_unusable(ErlNifEnv *env, struct device *d, struct buffer_res *b);

#endif
