/*
 * results.c: term conversion out. A finished job's outputs as the caller
 * gets them (erlcuda_ring.h, "Signatures"; DESIGN's result forms): one
 * output alone, several as a tuple in declared order, `ok` for none; each
 * in the form of the job's first vector argument.
 */
#define _GNU_SOURCE
#include "device_state.h"
#include "args.h"
#include "results.h"

#include <math.h>
#include <string.h>

ERL_NIF_TERM float_term(ErlNifEnv *env, double f)
{
    if (isnan(f))
        return ATOM_nan;
    if (isinf(f))
        return f > 0 ? ATOM_infinity : ATOM_neg_infinity;
    return enif_make_double(env, f);
}

/* Element i of a vector of `type` at p, as a number. */
static ERL_NIF_TERM elem_term(ErlNifEnv *env, const uint8_t *p, uint8_t type, uint64_t i)
{
    switch (type) {
    case EC_TYPE_F32:
        return float_term(env, ((const float *)p)[i]);
    case EC_TYPE_F64: {
        double x;
        memcpy(&x, p + i * 8, 8);
        return float_term(env, x);
    }
    case EC_TYPE_U8:
        return enif_make_uint(env, p[i]);
    case EC_TYPE_S32:
        return enif_make_int(env, ((const int32_t *)p)[i]);
    case EC_TYPE_U32:
        return enif_make_uint(env, ((const uint32_t *)p)[i]);
    default: {
        int64_t x;
        memcpy(&x, p + i * 8, 8);
        return enif_make_int64(env, x);
    }
    }
}

ERL_NIF_TERM region_binary(ErlNifEnv *env, struct device *d, const struct region *r, const uint8_t *at,
                           size_t bytes)
{
    struct region_res *rr = enif_alloc_resource(REGION_RT, sizeof *rr);
    if (!rr)
        return 0;
    rr->d = d;
    rr->r = *r;
    enif_keep_resource(d);
    __atomic_add_fetch(&d->exported, 1, __ATOMIC_ACQ_REL);
    ERL_NIF_TERM bin = enif_make_resource_binary(env, rr, at, bytes);
    enif_release_resource(rr);
    return bin;
}

ERL_NIF_TERM list_term(ErlNifEnv *env, const uint8_t *p, uint8_t type, uint64_t n)
{
    ERL_NIF_TERM list = enif_make_list(env, 0);
    for (uint64_t i = n; i > 0; i--)
        list = enif_make_list_cell(env, elem_term(env, p, type, i - 1), list);
    return list;
}

int list_handed(ErlNifEnv *env, struct device *d, struct job *j, ERL_NIF_TERM *items)
{
    uint64_t elems = 0;
    for (unsigned k = 0; k < j->nout; k++)
        elems += j->outs[k].scalar ? 0 : j->outs[k].len;
    if (j->form != FORM_LIST || !d->has_list_pid || elems < LIST_HAND_ELEMS || j->out.inl)
        return 0;
    /* One resource binary over the whole output region (kept until the
     * converter's binaries are garbage collected), a sub-binary each. */
    const uint8_t *base = region_ptr(d, &j->out);
    size_t total = 0;
    for (unsigned k = 0; k < j->nout; k++) {
        const struct out_spec *o = &j->outs[k];
        size_t end = o->off + (size_t)o->len * type_bytes(o->type);
        total = end > total ? end : total;
    }
    ERL_NIF_TERM whole = region_binary(env, d, &j->out, base, total);
    if (!whole)
        return 0;
    j->out_taken = 1;
    ERL_NIF_TERM l = enif_make_list(env, 0);
    for (unsigned k = j->nout; k > 0; k--) {
        const struct out_spec *o = &j->outs[k - 1];
        ERL_NIF_TERM item =
            o->scalar ? enif_make_tuple2(env, ATOM_value, elem_term(env, base + o->off, o->type, 0))
                      : enif_make_tuple2(env, TYPE_ATOMS[o->type],
                                         enif_make_sub_binary(env, whole, o->off,
                                                              (size_t)o->len * type_bytes(o->type)));
        l = enif_make_list_cell(env, item, l);
    }
    *items = l;
    return 1;
}

/* Output k of job j. `whole`: the job's only output, which may be handed
 * over as a resource binary on its region (j->zero_copy). */
static ERL_NIF_TERM output_term(ErlNifEnv *env, struct device *d, struct job *j, unsigned k, int whole)
{
    const struct out_spec *o = &j->outs[k];
    const uint8_t *out = region_ptr(d, &j->out) + o->off;
    size_t bytes = (size_t)o->len * type_bytes(o->type);
    if (o->scalar)
        return elem_term(env, out, o->type, 0);
    /* stats/1's result_bytes: the output bytes read into terms (a list or
     * a copied binary; a zero-copy binary reads none). */
    if (j->form == FORM_LIST) {
        count(&d->c.result_bytes, bytes);
        return list_term(env, out, o->type, o->len);
    }
    ERL_NIF_TERM bin = 0;
    if (whole && j->zero_copy) {
        bin = region_binary(env, d, &j->out, out, bytes);
        j->out_taken = bin != 0;
    }
    if (!bin) {
        count(&d->c.result_bytes, bytes);
        unsigned char *p = enif_make_new_binary(env, bytes, &bin);
        if (p)
            memcpy(p, out, bytes);
    }
    /* A plain binary in gives a plain binary out for f32 only. */
    int typed = j->form == FORM_TYPED || o->type != EC_TYPE_F32;
    return typed ? enif_make_tuple2(env, TYPE_ATOMS[o->type], bin) : bin;
}

ERL_NIF_TERM result_term(ErlNifEnv *env, struct device *d, struct job *j)
{
    if (j->nout == 0)
        return ATOM_ok;
    if (j->nout == 1)
        return output_term(env, d, j, 0, 1);
    ERL_NIF_TERM t[EC_MAX_OUTPUTS];
    for (unsigned k = 0; k < j->nout; k++)
        t[k] = output_term(env, d, j, k, 0);
    return enif_make_tuple_from_array(env, t, j->nout);
}
