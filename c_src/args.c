/*
 * args.c: term conversion in. A call's Args against its kernel's signature
 * (parse_args: the one checker of built-in and users' kernels alike), its
 * vectors into the arena (copy_vec), and a device buffer as a term
 * (new_buffer, buffer_unusable). The rest of the NIF uses only the
 * functions declared for args.c in args.h. It calls no file above
 * it: parsing a launch must not depend on how one is published.
 */
#define _GNU_SOURCE
#include "device_state.h"
#include "arena.h"
#include "args.h"
#include "copy.h"
#include "signature.h"

#include <math.h>
#include <string.h>

/* Above these sizes a submit moves to a dirty scheduler, so a normal
 * scheduler is never held much past ~1 ms: list conversion runs at roughly
 * 100-200 elements/us, memcpy at several GB/s (first touch of arena pages
 * included). */
#define LIST_ELEMS_ON_SCHEDULER 20000u
#define BINARY_BYTES_ON_SCHEDULER (1u << 20)

/* The resource types of the terms that are a result binary in the arena
 * and a device buffer; made by load with their destructors (device.c,
 * buffers.c). */
ErlNifResourceType *REGION_RT;
ErlNifResourceType *BUFFER_RT;

static const unsigned TYPE_BYTES[EC_TYPE_COUNT] = {
#define TYPE_BYTES_ROW(NAME, ID, ATOM, BYTES) [ID] = BYTES,
    EC_TYPES(TYPE_BYTES_ROW)
#undef TYPE_BYTES_ROW
};
unsigned type_bytes(uint8_t type) { return TYPE_BYTES[type]; }

/* ------------------------------------------------------------- buffers --
 * A device buffer as a term (buffers.c does the rest). */

struct buffer_res *get_buffer(ErlNifEnv *env, ERL_NIF_TERM t)
{
    void *p;
    return enif_get_resource(env, t, BUFFER_RT, &p) ? p : NULL;
}

ERL_NIF_TERM new_buffer(ErlNifEnv *env, struct device *d, uint8_t type, uint32_t len)
{
    struct buffer_res *b = enif_alloc_resource(BUFFER_RT, sizeof *b);
    if (!b)
        return 0;
    b->d = d;
    b->id = __atomic_add_fetch(&d->next_buf_id, 1, __ATOMIC_RELAXED);
    b->epoch = __atomic_load_n(&d->epoch, __ATOMIC_RELAXED);
    b->len = len;
    b->type = type;
    b->freed = 0;
    enif_keep_resource(d);
    ERL_NIF_TERM t = enif_make_resource(env, b);
    enif_release_resource(b);
    return t;
}

ERL_NIF_TERM buffer_unusable(ErlNifEnv *env, struct device *d, struct buffer_res *b)
{
    switch (buffer_state(d, b)) {
    case BUF_OTHER_DEVICE:
        return enif_make_tuple2(env, ATOM_buffer,
                                enif_make_tuple2(env, ATOM_device, enif_make_uint(env, b->d->id)));
    case BUF_FREED:
        return enif_make_tuple2(env, ATOM_buffer, ATOM_freed);
    case BUF_LOST:
        return enif_make_tuple2(env, ATOM_buffer, ATOM_lost);
    default:
        return 0;
    }
}

/* ---------------------------------------------------------------- terms -- */

/* A number (or nan, infinity, neg_infinity) as a double. */
int term_to_double(ErlNifEnv *env, ERL_NIF_TERM t, double *out)
{
    ErlNifSInt64 i;
    if (enif_get_double(env, t, out))
        return 1;
    if (enif_get_int64(env, t, &i)) {
        *out = (double)i;
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

/* An integer of element type `type` (not a float: a float is no integer
 * argument). */
static int term_to_int(ErlNifEnv *env, ERL_NIF_TERM t, uint8_t type, int64_t *out)
{
    ErlNifSInt64 i;
    ErlNifUInt64 u;
    if (type == EC_TYPE_U32 || type == EC_TYPE_U8) {
        if (!enif_get_uint64(env, t, &u) || u > (type == EC_TYPE_U8 ? 255u : UINT32_MAX))
            return 0;
        *out = (int64_t)u;
        return 1;
    }
    if (!enif_get_int64(env, t, &i))
        return 0;
    if (type == EC_TYPE_S32 && (i < INT32_MIN || i > INT32_MAX))
        return 0;
    *out = i;
    return 1;
}

static int is_float_type(uint8_t type) { return type == EC_TYPE_F32 || type == EC_TYPE_F64; }

/* Whether a finite double stays finite as an f32: a larger one would come
 * back as infinity without a word, so it is refused as out of its type's
 * range, as an integer out of an integer type's range is. Rounding to
 * nearest takes everything below FLT_MAX plus half an ulp to FLT_MAX; the
 * half-way point itself rounds to even, that is to infinity. Infinities
 * and NaN given as such (the atoms) are kept. */
static int fits_f32(double x)
{
    return !isfinite(x) || fabs(x) < 0x1.ffffffp+127;
}

/* Classifies a vector argument: a list of numbers (f32), a binary (f32), or
 * {Type, Binary}. A plain binary's elements are of the type its argument
 * declares, so its size is checked by the caller that knows that type (len
 * here counts f32 elements, rounded down). Lists are measured only up to
 * `limit` cells so that a normal scheduler never walks a huge list just to
 * learn that it must go dirty. Returns 0 if the term is not a vector. */
static int inspect_vec(ErlNifEnv *env, ERL_NIF_TERM t, uint64_t limit, struct vec *v)
{
    memset(v, 0, sizeof *v);
    v->term = t;
    v->type = EC_TYPE_F32;
    void *res;
    if (enif_get_resource(env, t, BUFFER_RT, &res)) {
        /* A device buffer: typed and sized when it was made. */
        v->buf = res;
        v->type = v->buf->type;
        v->len = v->buf->len;
        v->len_known = 1;
        return 1;
    }
    int arity;
    const ERL_NIF_TERM *tup;
    if (enif_get_tuple(env, t, &arity, &tup) && arity == 2) {
        int found = 0;
        for (uint8_t ty = 0; ty < EC_TYPE_COUNT; ty++)
            if (enif_is_identical(tup[0], TYPE_ATOMS[ty])) {
                v->type = ty;
                found = 1;
            }
        if (!found || !enif_is_binary(env, tup[1]))
            return 0;
        v->typed = 1;
        t = tup[1];
    }
    if (enif_is_binary(env, t)) {
        unsigned eb = TYPE_BYTES[v->type];
        if (!enif_inspect_binary(env, t, &v->bin) || (v->typed && v->bin.size % eb != 0))
            return 0;
        v->bin_term = t;
        v->is_binary = 1;
        v->len = v->bin.size / eb;
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

int vec_in_arena(struct device *d, struct vec *v)
{
    const uint8_t *p = v->bin.data;
    if (((uintptr_t)p & (TYPE_BYTES[v->type] - 1)) != 0)
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

/* Copies a vector into the arena, converting list elements to its type.
 * Returns 0 if an element is no number of that type (the region is then
 * partly written; the caller frees it). */
int copy_vec(ErlNifEnv *env, const struct vec *v, void *dst)
{
    if (v->is_binary) {
        copy_bytes(dst, v->bin.data, v->bin.size);
        return 1;
    }
    ERL_NIF_TERM head, tail = v->list;
    uint64_t i = 0;
    double x;
    int64_t n;
    while (enif_get_list_cell(env, tail, &head, &tail)) {
        switch (v->type) {
        case EC_TYPE_F32:
            if (!term_to_double(env, head, &x) || !fits_f32(x))
                return 0;
            ((float *)dst)[i] = (float)x;
            break;
        case EC_TYPE_F64:
            if (!term_to_double(env, head, &x))
                return 0;
            ((double *)dst)[i] = x;
            break;
        default:
            if (!term_to_int(env, head, v->type, &n))
                return 0;
            switch (TYPE_BYTES[v->type]) {
            case 1:
                ((uint8_t *)dst)[i] = (uint8_t)n;
                break;
            case 4:
                ((uint32_t *)dst)[i] = (uint32_t)n;
                break;
            default:
                ((int64_t *)dst)[i] = n;
            }
        }
        i++;
    }
    return 1;
}

int parse_vector(ErlNifEnv *env, ERL_NIF_TERM t, int dirty, struct vec *v, ERL_NIF_TERM *err)
{
    /* put/1's vector: a plain binary is f32. */
    if (!inspect_vec(env, t, dirty ? UINT64_MAX : LIST_ELEMS_ON_SCHEDULER, v) || v->buf ||
        (v->is_binary && v->bin.size % TYPE_BYTES[v->type] != 0)) {
        *err = make_badarg(env, enif_make_tuple2(env, ATOM_arg, enif_make_uint(env, 1)));
        return -1;
    }
    if (!dirty && (!v->len_known || (v->is_binary ? v->bin.size > BINARY_BYTES_ON_SCHEDULER
                                                  : v->len > LIST_ELEMS_ON_SCHEDULER)))
        return 1;
    if (v->len > UINT32_MAX) {
        *err = make_badarg(env, ATOM_too_large);
        return -1;
    }
    return 0;
}


/* The first argument (1-based) found wrong so far, and how: the checker
 * answers {badarg, {What, I}} for the lowest I, whatever order it checks
 * in. */
struct first_bad {
    unsigned at;
    ERL_NIF_TERM what;
};

static void mark_bad(struct first_bad *b, unsigned i, ERL_NIF_TERM what)
{
    if (b->at == 0 || i + 1 < b->at) {
        b->at = i + 1;
        b->what = what;
    }
}

/* The position in Args of the d or s argument in param index `slot`. */
static unsigned param_position(const struct sig *sig, uint32_t slot)
{
    for (unsigned i = 0; i < sig->nargs; i++) {
        const struct sig_arg *a = &sig->arg[i];
        if ((a->kind == SIG_SCALAR || a->kind == SIG_DIM) && a->slot == slot)
            return i;
    }
    return 0;
}

static uint8_t resolve(uint8_t type, uint8_t t) { return type == SIG_TYPE_T ? t : type; }

/* A scalar or dimension argument into its param slot (as ec_job_args holds
 * it). */
static int parse_param(ErlNifEnv *env, const struct sig_arg *a, uint8_t t, ERL_NIF_TERM term,
                       uint64_t *param)
{
    if (a->kind == SIG_DIM) {
        ErlNifUInt64 dim;
        if (!enif_get_uint64(env, term, &dim) || dim > UINT32_MAX)
            return 0;
        *param = dim;
        return 1;
    }
    uint8_t ty = resolve(a->type, t);
    if (is_float_type(ty)) {
        double x;
        if (!term_to_double(env, term, &x) || (ty == EC_TYPE_F32 && !fits_f32(x)))
            return 0;
        memcpy(param, &x, 8);
        return 1;
    }
    int64_t n;
    if (!term_to_int(env, term, ty, &n))
        return 0;
    *param = (uint64_t)n;
    return 1;
}

/* A built-in's parameter area, packed from its params in signature order:
 * an s takes the next 8-aligned f64, a d the next u32 (erlcuda_ring.h). */
static void pack_builtin_params(const struct sig *sig, struct job_spec *s)
{
    size_t at = 0;
    memset(&s->p, 0, sizeof s->p);
    for (unsigned i = 0; i < sig->nargs; i++) {
        const struct sig_arg *a = &sig->arg[i];
        if (a->kind == SIG_SCALAR) {
            at = (at + 7) & ~(size_t)7;
            memcpy(s->p.bytes + at, &s->param[a->slot], 8);
            at += 8;
        } else if (a->kind == SIG_DIM) {
            uint32_t d32 = (uint32_t)s->param[a->slot];
            memcpy(s->p.bytes + at, &d32, 4);
            at += 4;
        }
    }
}

/* Parses Args against the kernel's signature (erlcuda_ring.h,
 * "Signatures"): T from the first T argument given as {Type, Binary} or a
 * buffer (else f32), each vector of its type and of the length its
 * expression gives, scalars and dimensions in range, outputs sized. Returns
 * 0 and fills spec, 1 when the job is too large for a normal scheduler, or
 * sets *err and returns -1. */
int parse_args(ErlNifEnv *env, struct device *d, ERL_NIF_TERM args, int dirty,
               struct job_spec *s, ERL_NIF_TERM *err)
{
    const struct kernel_info *ki = s->ki;
    const struct sig *sig = &ki->sig;
    ERL_NIF_TERM cell[SIG_MAX_ARGS + 1], head, tail = args;
    unsigned got = 0;
    while (got <= sig->nargs && got < sizeof cell / sizeof cell[0] &&
           enif_get_list_cell(env, tail, &head, &tail))
        cell[got++] = head;
    if (got != sig->nargs || !enif_is_empty_list(env, tail)) {
        *err = make_badarg(env, ATOM_args);
        return -1;
    }
    uint64_t list_limit = dirty ? UINT64_MAX : LIST_ELEMS_ON_SCHEDULER;
    struct first_bad bad = {0, 0};
    s->nin = sig->nvec;
    memset(s->param, 0, sizeof s->param);

    /* The vectors as given, and T. */
    uint8_t t = SIG_TYPE_NONE;
    unsigned t_at = 0, first_t = SIG_MAX_ARGS;
    for (unsigned i = 0; i < sig->nargs; i++) {
        const struct sig_arg *a = &sig->arg[i];
        if (a->kind != SIG_VECTOR && a->kind != SIG_INOUT)
            continue;
        struct vec *v = &s->in[a->slot];
        if (!inspect_vec(env, cell[i], list_limit, v)) {
            mark_bad(&bad, i, ATOM_arg);
            v->type = SIG_TYPE_NONE;
            continue;
        }
        if (v->buf) {
            ERL_NIF_TERM why = buffer_unusable(env, d, v->buf);
            if (why) {
                *err = make_error(env, why);
                return -1;
            }
        } else if (a->kind == SIG_INOUT) {
            mark_bad(&bad, i, ATOM_arg); /* only a buffer is updated in place */
        }
        if (a->type == SIG_TYPE_T) {
            first_t = first_t < i ? first_t : i;
            if (t == SIG_TYPE_NONE && (v->typed || v->buf)) {
                t = v->type;
                t_at = i;
            }
        }
    }
    if (t == SIG_TYPE_NONE) {
        t = EC_TYPE_F32;
        t_at = first_t < SIG_MAX_ARGS ? first_t : 0;
    }
    if (sig->uses_t && !(ki->types & (1u << t)))
        mark_bad(&bad, t_at, ATOM_type);
    if (!sig->uses_t)
        t = EC_TYPE_F32; /* what the descriptor carries for a kernel with no T */

    /* Each argument against its declared type. */
    uint64_t list_elems = 0, bin_bytes = 0;
    int too_big = 0;
    for (unsigned i = 0; i < sig->nargs; i++) {
        const struct sig_arg *a = &sig->arg[i];
        if (a->kind == SIG_SCALAR || a->kind == SIG_DIM) {
            if (!parse_param(env, a, t, cell[i], &s->param[a->slot]))
                mark_bad(&bad, i, ATOM_arg);
            continue;
        }
        struct vec *v = &s->in[a->slot];
        uint8_t ty = resolve(a->type, t);
        if (v->type == SIG_TYPE_NONE)
            continue; /* no vector at all: marked */
        if (v->typed || v->buf) {
            if (v->type != ty)
                mark_bad(&bad, i, ATOM_type);
        } else if (v->is_binary) {
            /* A plain binary holds elements of the argument's type; for a
             * T argument, f32 (it does not fix T). */
            uint8_t bt = a->type == SIG_TYPE_T ? EC_TYPE_F32 : ty;
            if (bt != ty)
                mark_bad(&bad, i, ATOM_type);
            else if (v->bin.size % TYPE_BYTES[ty] != 0)
                mark_bad(&bad, i, ATOM_arg);
            v->type = ty;
            v->len = v->bin.size / TYPE_BYTES[ty];
        } else {
            v->type = ty; /* a list: converted as it is copied */
        }
        if (!v->len_known)
            too_big = 1;
        else if (v->buf)
            ; /* nothing to copy */
        else if (v->is_binary && !vec_in_arena(d, v))
            bin_bytes += v->bin.size;
        else if (!v->is_binary)
            list_elems += v->len;
    }
    if (bad.at) {
        *err = make_badarg(env, enif_make_tuple2(env, bad.what, enif_make_uint(env, bad.at)));
        return -1;
    }
    if (!dirty && (too_big || list_elems > LIST_ELEMS_ON_SCHEDULER ||
                   bin_bytes > BINARY_BYTES_ON_SCHEDULER))
        return 1;

    /* Lengths: every vector's against its expression, then the outputs'. */
    uint64_t freev[SIG_MAX_FREE] = {0};
    for (unsigned f = 0; f < sig->nfree; f++)
        freev[f] = s->in[sig->free_slot[f]].len;
    for (unsigned i = 0; i < sig->nargs; i++) {
        const struct sig_arg *a = &sig->arg[i];
        if (a->kind != SIG_VECTOR && a->kind != SIG_INOUT)
            continue;
        const struct vec *v = &s->in[a->slot];
        uint64_t want;
        const struct sig_factor *bd;
        int r = sig_eval(&a->len, s->param, freev, &want, &bd);
        if (r == 2)
            mark_bad(&bad, param_position(sig, bd->v), ATOM_arg);
        else if (r != 0 || want != v->len)
            mark_bad(&bad, i, ATOM_arg);
        /* Naming a buffer twice where one is updated in place would let
         * the kernel read what it writes. */
        for (unsigned j = 0; a->kind == SIG_INOUT && j < sig->nargs; j++) {
            const struct sig_arg *b = &sig->arg[j];
            if (j != i && (b->kind == SIG_VECTOR || b->kind == SIG_INOUT) &&
                s->in[b->slot].buf == v->buf)
                mark_bad(&bad, i > j ? i : j, ATOM_arg);
        }
    }
    /* The dimensions' ranges (NAME:d:LO..=HI). */
    for (unsigned b = 0; b < sig->nbounds; b++) {
        const struct sig_factor *bd;
        int r = sig_bound_holds(&sig->bound[b], s->param, freev, &bd);
        if (r == 2)
            mark_bad(&bad, param_position(sig, bd->v), ATOM_arg);
        else if (r == 0)
            mark_bad(&bad, param_position(sig, sig->bound[b].param), ATOM_arg);
    }
    s->nout = sig->nouts;
    uint64_t off = 0;
    for (unsigned k = 0; k < sig->nouts; k++) {
        const struct sig_out *o = &sig->out[k];
        uint64_t len;
        const struct sig_factor *bd;
        int r = sig_eval(&o->len, s->param, freev, &len, &bd);
        if (r == 2) {
            mark_bad(&bad, param_position(sig, bd->v), ATOM_arg);
            continue;
        }
        if (r == 1 || len > UINT32_MAX) {
            *err = make_badarg(env, ATOM_too_large);
            return -1;
        }
        struct out_spec *os = &s->outs[k];
        os->type = resolve(o->type, t);
        os->scalar = o->scalar;
        os->len = (uint32_t)len;
        os->off = off;
        off += arena_round(len * TYPE_BYTES[os->type]);
    }
    if (ki->has_blocks) {
        /* The kernel's blocks divide its work exactly, or it cannot run. */
        uint64_t n;
        const struct sig_factor *bd;
        if (sig_eval(&ki->blocks, s->param, freev, &n, &bd) == 2)
            mark_bad(&bad, param_position(sig, bd->v), ATOM_arg);
    }
    if (bad.at) {
        *err = make_badarg(env, enif_make_tuple2(env, bad.what, enif_make_uint(env, bad.at)));
        return -1;
    }
    for (unsigned i = 0; i < s->nin; i++) {
        if (s->in[i].len > UINT32_MAX) {
            *err = make_badarg(env, ATOM_too_large);
            return -1;
        }
    }
    s->type = t;
    s->elem = TYPE_BYTES[t];
    /* The results' form: the first vector argument's. A buffer's comes
     * back as get/1's: a binary for f32, else {Type, Binary}. */
    const struct vec *v0 = s->nin ? &s->in[0] : NULL;
    s->form = !v0 ? FORM_LIST : v0->typed ? FORM_TYPED : v0->is_binary || v0->buf ? FORM_BINARY : FORM_LIST;
    s->shape = ki->shape;
    s->out_len = s->nout ? s->outs[0].len : 0;
    if (!ki->user)
        pack_builtin_params(sig, s);
    return 0;
}
