/*
 * args.c: term conversion. A kernel's Args list into checked vectors
 * (parse_args), those vectors into the arena (copy_vec), and a finished job's
 * output into its result term (result_term). The kernel table's Erlang face
 * (the kernel atoms, kernel_id, kernels_term) is here too; the rest of the
 * NIF uses only the functions declared for args.c in erlcuda_nif.h.
 */
#define _GNU_SOURCE
#include "erlcuda_nif.h"

#include <math.h>
#include <string.h>

/* Above these sizes a submit moves to a dirty scheduler, so a normal
 * scheduler is never held much past ~1 ms: list conversion runs at roughly
 * 100-200 elements/us, memcpy at several GB/s (first touch of arena pages
 * included). */
#define LIST_ELEMS_ON_SCHEDULER 20000u
#define BINARY_BYTES_ON_SCHEDULER (1u << 20)

#define KERNEL_ATOM_DECL(NAME, ID, ATOM, NIN) static ERL_NIF_TERM ATOM_k_##ATOM;
EC_KERNELS(KERNEL_ATOM_DECL)
#undef KERNEL_ATOM_DECL

static const unsigned KERNEL_INPUTS[EC_KERNEL_COUNT] = {
#define KERNEL_NIN(NAME, ID, ATOM, NIN) [ID] = NIN,
    EC_KERNELS(KERNEL_NIN)
#undef KERNEL_NIN
};

void args_load(ErlNifEnv *env)
{
#define KERNEL_ATOM_INIT(NAME, ID, ATOM, NIN) ATOM_k_##ATOM = enif_make_atom(env, #ATOM);
    EC_KERNELS(KERNEL_ATOM_INIT)
#undef KERNEL_ATOM_INIT
}

static ERL_NIF_TERM kernel_atom(uint32_t k)
{
    switch (k) {
#define KERNEL_CASE(NAME, ID, ATOM, NIN) \
    case ID:                             \
        return ATOM_k_##ATOM;
        EC_KERNELS(KERNEL_CASE)
#undef KERNEL_CASE
    }
    return 0;
}

uint32_t kernel_id(ErlNifEnv *env, ERL_NIF_TERM atom)
{
    if (!enif_is_atom(env, atom))
        return 0;
#define KERNEL_MATCH(NAME, ID, ATOM, NIN) \
    if (enif_is_identical(atom, ATOM_k_##ATOM)) \
        return ID;
    EC_KERNELS(KERNEL_MATCH)
#undef KERNEL_MATCH
    return 0;
}

ERL_NIF_TERM kernels_term(ErlNifEnv *env)
{
    ERL_NIF_TERM list = enif_make_list(env, 0);
    for (uint32_t k = EC_KERNEL_COUNT - 1; k > 0; k--)
        list = enif_make_list_cell(
            env,
            enif_make_tuple3(env, kernel_atom(k), enif_make_uint(env, k),
                             enif_make_uint(env, KERNEL_INPUTS[k])),
            list);
    return list;
}

/* ---------------------------------------------------------------- terms -- */

static ERL_NIF_TERM float_term(ErlNifEnv *env, float f)
{
    if (isnan(f))
        return ATOM_nan;
    if (isinf(f))
        return f > 0 ? ATOM_infinity : ATOM_neg_infinity;
    return enif_make_double(env, (double)f);
}

static int term_to_f32(ErlNifEnv *env, ERL_NIF_TERM t, float *out)
{
    double d;
    ErlNifSInt64 i;
    if (enif_get_double(env, t, &d)) {
        *out = (float)d;
        return 1;
    }
    if (enif_get_int64(env, t, &i)) {
        *out = (float)i;
        return 1;
    }
    if (enif_is_identical(t, ATOM_nan)) {
        *out = NAN;
        return 1;
    }
    if (enif_is_identical(t, ATOM_infinity)) {
        *out = INFINITY;
        return 1;
    }
    if (enif_is_identical(t, ATOM_neg_infinity)) {
        *out = -INFINITY;
        return 1;
    }
    return 0;
}

/* Classifies a vector argument. Lists are measured only up to `limit` cells
 * so that a normal scheduler never walks a huge list just to learn that it
 * must go dirty. Returns 0 if the term is not a vector. */
static int inspect_vec(ErlNifEnv *env, ERL_NIF_TERM t, uint64_t limit, struct vec *v)
{
    memset(v, 0, sizeof *v);
    v->term = t;
    if (enif_is_binary(env, t)) {
        if (!enif_inspect_binary(env, t, &v->bin) || v->bin.size % sizeof(float) != 0)
            return 0;
        v->is_binary = 1;
        v->len = v->bin.size / sizeof(float);
        v->len_known = 1;
        return 1;
    }
    if (!enif_is_list(env, t))
        return 0;
    v->list = t;
    ERL_NIF_TERM head, tail = t;
    uint64_t n = 0;
    while (n <= limit && enif_get_list_cell(env, tail, &head, &tail))
        n++;
    if (n <= limit) {
        if (!enif_is_empty_list(env, tail))
            return 0; /* improper list */
        v->len = n;
        v->len_known = 1;
    }
    return 1;
}

/* Is the binary's data inside one of the device's arena segments (a result
 * of an earlier job, or part of one)? Then the job can name it directly. */
static int find_in_arena(struct device *d, struct vec *v)
{
    const uint8_t *p = v->bin.data;
    if (((uintptr_t)p & 3) != 0)
        return 0;
    for (uint32_t i = 0; i < d->shm.nseg; i++) {
        const struct shm_segment *g = &d->shm.seg[i];
        if (g->base && p >= g->base && (uint64_t)(p - g->base) + v->bin.size <= g->bytes) {
            v->in_arena = 1;
            v->addr = ((uint64_t)i << EC_ADDR_SEGMENT_SHIFT) | (uint64_t)(p - g->base);
            return 1;
        }
    }
    return 0;
}

/* Copies a vector into the arena, converting list elements. Returns 0 if an
 * element is not a number (the region is then partly written; the caller
 * frees it). */
int copy_vec(ErlNifEnv *env, const struct vec *v, float *dst)
{
    if (v->is_binary) {
        copy_bytes(dst, v->bin.data, v->bin.size);
        return 1;
    }
    ERL_NIF_TERM head, tail = v->list;
    uint64_t i = 0;
    while (enif_get_list_cell(env, tail, &head, &tail)) {
        if (!term_to_f32(env, head, &dst[i++]))
            return 0;
    }
    return 1;
}

/* Parses Args for the kernel. Returns 0 and fills spec, 1 when the job is too
 * large for a normal scheduler, or sets *err and returns -1. */
int parse_args(ErlNifEnv *env, struct device *d, ERL_NIF_TERM args, int dirty,
               struct job_spec *s, ERL_NIF_TERM *err)
{
    s->nin = KERNEL_INPUTS[s->kernel];
    ERL_NIF_TERM cell[5], head, tail = args;
    unsigned want = s->nin + (s->kernel == EC_KERNEL_MATMUL ? 3 : 0), got = 0;
    while (got < 5 && enif_get_list_cell(env, tail, &head, &tail))
        cell[got++] = head;
    if (got != want || !enif_is_empty_list(env, tail)) {
        *err = make_badarg(env, ATOM_args);
        return -1;
    }
    uint64_t list_limit = dirty ? UINT64_MAX : LIST_ELEMS_ON_SCHEDULER;
    uint64_t list_elems = 0, bin_bytes = 0;
    int too_big = 0;
    for (unsigned i = 0; i < s->nin; i++) {
        if (!inspect_vec(env, cell[i], list_limit, &s->in[i])) {
            *err = make_badarg(env, enif_make_tuple2(env, ATOM_arg, enif_make_uint(env, i + 1)));
            return -1;
        }
        if (!s->in[i].len_known)
            too_big = 1;
        else if (s->in[i].is_binary && !find_in_arena(d, &s->in[i]))
            bin_bytes += s->in[i].bin.size;
        else
            list_elems += s->in[i].len;
    }
    if (!dirty && (too_big || list_elems > LIST_ELEMS_ON_SCHEDULER ||
                   bin_bytes > BINARY_BYTES_ON_SCHEDULER))
        return 1;
    for (unsigned i = 0; i < s->nin; i++) {
        if (s->in[i].len > UINT32_MAX) {
            *err = make_badarg(env, ATOM_too_large);
            return -1;
        }
    }
    switch (s->kernel) {
    case EC_KERNEL_VECTOR_ADD:
    case EC_KERNEL_DOT_PRODUCT:
        if (s->in[0].len != s->in[1].len) {
            *err = make_badarg(env, ATOM_length_mismatch);
            return -1;
        }
        s->out_len = s->kernel == EC_KERNEL_VECTOR_ADD ? s->in[0].len : 1;
        break;
    case EC_KERNEL_REDUCE:
        s->out_len = 1;
        break;
    case EC_KERNEL_MATMUL: {
        ErlNifUInt64 dim[3];
        for (unsigned i = 0; i < 3; i++) {
            if (!enif_get_uint64(env, cell[2 + i], &dim[i]) || dim[i] > UINT32_MAX) {
                *err = make_badarg(
                    env, enif_make_tuple2(env, ATOM_arg, enif_make_uint(env, 3 + i)));
                return -1;
            }
        }
        s->m = dim[0];
        s->n = dim[1];
        s->k = dim[2];
        /* Each factor < 2^32, so the products fit in 64 bits. */
        if (s->m * s->k != s->in[0].len || s->k * s->n != s->in[1].len) {
            *err = make_badarg(env, ATOM_shape);
            return -1;
        }
        if (s->m * s->n > UINT32_MAX) {
            *err = make_badarg(env, ATOM_too_large);
            return -1;
        }
        s->out_len = s->m * s->n;
        break;
    }
    }
    return 0;
}

ERL_NIF_TERM result_term(ErlNifEnv *env, struct device *d, struct job *j)
{
    const float *out = (const float *)region_ptr(d, &j->out);
    if (j->kernel == EC_KERNEL_REDUCE || j->kernel == EC_KERNEL_DOT_PRODUCT)
        return float_term(env, out[0]);
    if (j->zero_copy) {
        struct region_res *rr = enif_alloc_resource(REGION_RT, sizeof *rr);
        if (rr) {
            rr->d = d;
            rr->r = j->out;
            enif_keep_resource(d);
            __atomic_add_fetch(&d->exported, 1, __ATOMIC_ACQ_REL);
            j->out_taken = 1;
            ERL_NIF_TERM bin =
                enif_make_resource_binary(env, rr, out, (size_t)j->out_len * sizeof(float));
            enif_release_resource(rr);
            return bin;
        }
    }
    if (j->as_binary) {
        ERL_NIF_TERM bin;
        unsigned char *p = enif_make_new_binary(env, (size_t)j->out_len * sizeof(float), &bin);
        if (p)
            memcpy(p, out, (size_t)j->out_len * sizeof(float));
        return bin;
    }
    ERL_NIF_TERM list = enif_make_list(env, 0);
    for (uint64_t i = j->out_len; i > 0; i--)
        list = enif_make_list_cell(env, float_term(env, out[i - 1]), list);
    return list;
}
