/*
 * args.c: term conversion. A kernel's Args list into checked vectors
 * (parse_args), those vectors into the arena (copy_vec), and a finished job's
 * output into its result term (result_term). The kernel table's Erlang face
 * (the kernel rows, builtin_kernel, kernels_term) and a device buffer as a
 * term (new_buffer, buffer_unusable) are here too; the rest of the NIF uses
 * only the functions declared for args.c in erlcuda_nif.h. It calls no
 * file above it: parsing a launch must not depend on how one is published.
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

/* The kernel table (erlcuda_ring.h) as the NIF uses it: one entry per row,
 * made once at load. Parsing, checking and result building below read only
 * this (or a user's kernel described the same way); no code here names a
 * kernel. */
static struct kernel_info KERNELS[EC_KERNEL_COUNT];

/* The resource types of the terms that are a result binary in the arena
 * and a device buffer; made by load with their destructors (device.c,
 * buffers.c). */
ErlNifResourceType *REGION_RT;
ErlNifResourceType *BUFFER_RT;

/* The live generation of each module slot (0: none). */
static uint32_t MODULE_GEN[EC_MODULE_SLOTS];

static const unsigned TYPE_BYTES[EC_TYPE_COUNT] = {
#define TYPE_BYTES_ROW(NAME, ID, ATOM, BYTES) [ID] = BYTES,
    EC_TYPES(TYPE_BYTES_ROW)
#undef TYPE_BYTES_ROW
};
void args_load(ErlNifEnv *env)
{
#define KERNEL_INFO(NAME, ID, ATOM, SIG, SHAPE, OUTPUT, TYPES, ENTRY)                       \
    KERNELS[ID] = (struct kernel_info){.atom = enif_make_atom(env, #ATOM), .signature = SIG,  \
                                       .shape = EC_SHAPE_##SHAPE, .output = EC_OUTPUT_##OUTPUT, \
                                       .types = TYPES, .entry = ENTRY, .id = ID};
    EC_KERNELS(KERNEL_INFO)
#undef KERNEL_INFO
    for (uint32_t k = 1; k < EC_KERNEL_COUNT; k++) {
        for (const char *c = KERNELS[k].signature; *c; c++)
            KERNELS[k].nvec += *c == 'v';
    }
}

const struct kernel_info *builtin_kernel(ErlNifEnv *env, ERL_NIF_TERM atom)
{
    if (!enif_is_atom(env, atom))
        return NULL;
    for (uint32_t k = 1; k < EC_KERNEL_COUNT; k++)
        if (enif_is_identical(atom, KERNELS[k].atom))
            return &KERNELS[k];
    return NULL;
}

uint32_t module_gen(uint32_t slot)
{
    return slot < EC_MODULE_SLOTS ? __atomic_load_n(&MODULE_GEN[slot], __ATOMIC_SEQ_CST) : 0;
}

void set_module_gen(uint32_t slot, uint32_t gen)
{
    if (slot < EC_MODULE_SLOTS)
        __atomic_store_n(&MODULE_GEN[slot], gen, __ATOMIC_SEQ_CST);
}

/* A dimension index: -1 for `none`, -2 for `one` (an output of one
 * element), else 0 .. EC_PARAM_BYTES/4 - 1. */
static int get_dim_index(ErlNifEnv *env, ERL_NIF_TERM t, int *out)
{
    int i;
    if (enif_is_identical(t, ATOM_none)) {
        *out = -1;
        return 1;
    }
    if (enif_is_identical(t, ATOM_one)) {
        *out = -2;
        return 1;
    }
    if (!enif_get_int(env, t, &i) || i < 0 || i >= (int)(EC_PARAM_BYTES / 4))
        return 0;
    *out = i;
    return 1;
}

/* {Id, Slot, Gen, Signature, Output, OutDim, DivDim, Types, Opts} (OutDim:
 * none for n, one, or a dim index; DivDim: none or a dim index), Opts =
 * {Given, Grid, Block, SharedBytes}: built by erlcuda_modules from the
 * manifest, checked here again (a wrong one must not reach gpud). */
int user_kernel(ErlNifEnv *env, ERL_NIF_TERM t, struct kernel_info *ki)
{
    const ERL_NIF_TERM *e, *o;
    int arity, oarity;
    unsigned id, slot, gen, types, given, grid, block, shared;
    ErlNifBinary sig;
    memset(ki, 0, sizeof *ki);
    if (!enif_get_tuple(env, t, &arity, &e) || arity != 9 || !enif_get_uint(env, e[0], &id) ||
        !enif_get_uint(env, e[1], &slot) || !enif_get_uint(env, e[2], &gen) ||
        !enif_inspect_binary(env, e[3], &sig) || !get_dim_index(env, e[5], &ki->out_dim) ||
        !get_dim_index(env, e[6], &ki->div_dim) || !enif_get_uint(env, e[7], &types) ||
        !enif_get_tuple(env, e[8], &oarity, &o) || oarity != 4 || !enif_get_uint(env, o[0], &given) ||
        !enif_get_uint(env, o[1], &grid) || !enif_get_uint(env, o[2], &block) ||
        !enif_get_uint(env, o[3], &shared))
        return 0;
    if (slot >= EC_MODULE_SLOTS || gen == 0 || ki->div_dim == -2 ||
        id < EC_USER_KERNEL_BASE || (id - EC_USER_KERNEL_BASE) / EC_MODULE_KERNELS != slot ||
        sig.size == 0 || sig.size >= sizeof ki->sig ||
        types == 0 || types >= (1u << EC_TYPE_COUNT) ||
        (given & ~(EC_OPT_GRID | EC_OPT_BLOCK | EC_OPT_SHARED_BYTES)) != 0)
        return 0;
    if (enif_is_identical(e[4], ATOM_scalar))
        ki->output = EC_OUTPUT_SCALAR;
    else if (enif_is_identical(e[4], ATOM_vector))
        ki->output = EC_OUTPUT_VECTOR;
    else
        return 0;
    memcpy(ki->sig, sig.data, sig.size);
    for (size_t i = 0; i < sig.size; i++) {
        char c = ki->sig[i];
        if (c != 'v' && c != 's' && c != 'd')
            return 0;
        ki->nvec += c == 'v';
    }
    if (ki->nvec < 1 || ki->nvec > EC_MAX_VECTORS)
        return 0;
    ki->signature = ki->sig;
    ki->shape = SHAPE_USER;
    ki->types = types;
    ki->entry = "";
    ki->user = 1;
    ki->id = id;
    ki->slot = slot;
    ki->gen = gen;
    ki->opts.given = given;
    ki->opts.grid = given & EC_OPT_GRID ? grid : 0;
    ki->opts.block = given & EC_OPT_BLOCK ? block : 0;
    ki->opts.shared_bytes = given & EC_OPT_SHARED_BYTES ? shared : 0;
    return 1;
}

unsigned type_bytes(uint8_t type) { return TYPE_BYTES[type]; }

/* kernels(): one map per kernel, from the table. */
ERL_NIF_TERM kernels_term(ErlNifEnv *env)
{
    ERL_NIF_TERM list = enif_make_list(env, 0);
    for (uint32_t k = EC_KERNEL_COUNT - 1; k > 0; k--) {
        const struct kernel_info *ki = &KERNELS[k];
        ERL_NIF_TERM args = enif_make_list(env, 0), types = enif_make_list(env, 0);
        for (size_t i = strlen(ki->signature); i > 0; i--) {
            char c = ki->signature[i - 1];
            args = enif_make_list_cell(
                env, c == 'v' ? ATOM_vector : c == 's' ? ATOM_scalar : ATOM_dim, args);
        }
        for (int t = EC_TYPE_COUNT - 1; t >= 0; t--)
            if (ki->types & (1u << t))
                types = enif_make_list_cell(env, TYPE_ATOMS[t], types);
        ERL_NIF_TERM entry;
        size_t elen = strlen(ki->entry);
        memcpy(enif_make_new_binary(env, elen, &entry), ki->entry, elen);
        ERL_NIF_TERM keys[] = {ATOM_name, ATOM_id, ATOM_args, ATOM_types,
                               ATOM_shape, ATOM_output, ATOM_entry, ATOM_accumulate};
        /* Sums accumulate in the element type on every backend (the header). */
        ERL_NIF_TERM vals[] = {ki->atom, enif_make_uint(env, k), args, types,
                               SHAPE_ATOMS[ki->shape], OUTPUT_ATOMS[ki->output], entry, ATOM_type};
        ERL_NIF_TERM map;
        enif_make_map_from_arrays(env, keys, vals, sizeof keys / sizeof keys[0], &map);
        list = enif_make_list_cell(env, map, list);
    }
    return list;
}

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

static ERL_NIF_TERM float_term(ErlNifEnv *env, double f)
{
    if (isnan(f))
        return ATOM_nan;
    if (isinf(f))
        return f > 0 ? ATOM_infinity : ATOM_neg_infinity;
    return enif_make_double(env, f);
}

/* A number (or nan, infinity, neg_infinity) as a double. */
static int term_to_double(ErlNifEnv *env, ERL_NIF_TERM t, double *out)
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

static int term_to_f32(ErlNifEnv *env, ERL_NIF_TERM t, float *out)
{
    double d;
    if (!term_to_double(env, t, &d))
        return 0;
    *out = (float)d;
    return 1;
}

/* Classifies a vector argument: a list of numbers (f32), a binary (f32), or
 * {Type, Binary}. Lists are measured only up to `limit` cells so that a
 * normal scheduler never walks a huge list just to learn that it must go
 * dirty. Returns 0 if the term is not a vector. */
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
        if (!enif_inspect_binary(env, t, &v->bin) || v->bin.size % eb != 0)
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

/* Is the binary's data inside one of the device's arena segments (a result
 * of an earlier job, or part of one)? Then the job can name it directly. */
static int find_in_arena(struct device *d, struct vec *v)
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

/* Copies a vector into the arena, converting list elements (lists are
 * f32). Returns 0 if an element is not a number (the region is then partly
 * written; the caller frees it). */
int copy_vec(ErlNifEnv *env, const struct vec *v, void *dst)
{
    if (v->is_binary) {
        copy_bytes(dst, v->bin.data, v->bin.size);
        return 1;
    }
    float *f = dst;
    ERL_NIF_TERM head, tail = v->list;
    uint64_t i = 0;
    while (enif_get_list_cell(env, tail, &head, &tail)) {
        if (!term_to_f32(env, head, &f[i++]))
            return 0;
    }
    return 1;
}

int parse_vector(ErlNifEnv *env, ERL_NIF_TERM t, int dirty, struct vec *v, ERL_NIF_TERM *err)
{
    if (!inspect_vec(env, t, dirty ? UINT64_MAX : LIST_ELEMS_ON_SCHEDULER, v) || v->buf) {
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

static ERL_NIF_TERM arg_error(ErlNifEnv *env, ERL_NIF_TERM what, unsigned i)
{
    return make_badarg(env, enif_make_tuple2(env, what, enif_make_uint(env, i)));
}

/* Parses Args by the kernel's row: one argument per signature letter ('v' a
 * vector, 's' a number, 'd' a dimension), every vector of one element type
 * the kernel runs on, lengths by the shape rule; scalars and dimensions are
 * packed into the descriptor's parameter area as gpud reads them. Returns 0
 * and fills spec, 1 when the job is too large for a normal scheduler, or
 * sets *err and returns -1. */
int parse_args(ErlNifEnv *env, struct device *d, ERL_NIF_TERM args, int dirty,
               struct job_spec *s, ERL_NIF_TERM *err)
{
    const struct kernel_info *ki = s->ki;
    size_t nargs = strlen(ki->signature);
    ERL_NIF_TERM cell[EC_PARAM_BYTES / 4 + EC_MAX_VECTORS], head, tail = args;
    unsigned got = 0;
    while (got <= nargs && got < sizeof cell / sizeof cell[0] &&
           enif_get_list_cell(env, tail, &head, &tail))
        cell[got++] = head;
    if (got != nargs || !enif_is_empty_list(env, tail)) {
        *err = make_badarg(env, ATOM_args);
        return -1;
    }
    uint64_t list_limit = dirty ? UINT64_MAX : LIST_ELEMS_ON_SCHEDULER;
    uint64_t list_elems = 0, bin_bytes = 0;
    int too_big = 0;
    unsigned first_vec = 0, ndims = 0;
    uint64_t dims[EC_PARAM_BYTES / 4];
    size_t at = 0; /* the parameter area is filled in signature order */
    s->nin = 0;
    memset(&s->p, 0, sizeof s->p);
    for (unsigned i = 0; i < nargs; i++) {
        char c = ki->signature[i];
        if (c == 'v') {
            struct vec *v = &s->in[s->nin];
            if (!inspect_vec(env, cell[i], list_limit, v)) {
                *err = arg_error(env, ATOM_arg, i + 1);
                return -1;
            }
            if (v->buf) {
                ERL_NIF_TERM why = buffer_unusable(env, d, v->buf);
                if (why) {
                    *err = make_error(env, why);
                    return -1;
                }
            }
            if (s->nin == 0) {
                first_vec = i + 1;
                s->type = v->type;
                /* A buffer's result comes back as get/1's: a binary for
                 * f32, else {Type, Binary}. */
                s->form = v->typed || (v->buf && v->type != EC_TYPE_F32) ? FORM_TYPED
                          : v->is_binary || v->buf                       ? FORM_BINARY
                                                                         : FORM_LIST;
            } else if (v->type != s->type) {
                *err = arg_error(env, ATOM_type, i + 1);
                return -1;
            }
            s->nin++;
            if (!v->len_known)
                too_big = 1;
            else if (v->buf)
                ; /* nothing to copy */
            else if (v->is_binary && !find_in_arena(d, v))
                bin_bytes += v->bin.size;
            else if (!v->is_binary)
                list_elems += v->len;
        } else if (c == 's') {
            double x;
            if (!term_to_double(env, cell[i], &x)) {
                *err = arg_error(env, ATOM_arg, i + 1);
                return -1;
            }
            at = (at + 7) & ~(size_t)7;
            memcpy(s->p.bytes + at, &x, 8);
            at += 8;
        } else {
            ErlNifUInt64 dim;
            if (!enif_get_uint64(env, cell[i], &dim) || dim > UINT32_MAX) {
                *err = arg_error(env, ATOM_arg, i + 1);
                return -1;
            }
            uint32_t d32 = (uint32_t)dim;
            at = (at + 3) & ~(size_t)3;
            memcpy(s->p.bytes + at, &d32, 4);
            at += 4;
            dims[ndims++] = dim;
        }
    }
    if (!(ki->types & (1u << s->type))) {
        *err = arg_error(env, ATOM_type, first_vec);
        return -1;
    }
    s->elem = TYPE_BYTES[s->type];
    if (!dirty && (too_big || list_elems > LIST_ELEMS_ON_SCHEDULER ||
                   bin_bytes > BINARY_BYTES_ON_SCHEDULER))
        return 1;
    for (unsigned i = 0; i < s->nin; i++) {
        if (s->in[i].len > UINT32_MAX) {
            *err = make_badarg(env, ATOM_too_large);
            return -1;
        }
    }
    if (ki->shape == EC_SHAPE_MATMUL) {
        uint64_t m = dims[0], n = dims[1], k = dims[2];
        /* Each factor < 2^32, so the products fit in 64 bits. */
        if (m * k != s->in[0].len || k * n != s->in[1].len) {
            *err = make_badarg(env, ATOM_shape);
            return -1;
        }
        if (m * n > UINT32_MAX) {
            *err = make_badarg(env, ATOM_too_large);
            return -1;
        }
        s->out_len = m * n;
    } else {
        for (unsigned i = 1; i < s->nin; i++) {
            if (s->in[i].len != s->in[0].len) {
                *err = make_badarg(env, ATOM_length_mismatch);
                return -1;
            }
        }
        s->out_len = ki->shape == EC_SHAPE_ELEMENTWISE ? s->in[0].len : 1;
        if (ki->user) {
            /* By the manifest: n, 1 (a scalar), or n / dim; a dimension the
             * kernel divides by is at least 1 and divides n. A dimension
             * index past the signature's dims is an Erlang-side bug: shape. */
            uint64_t n = s->in[0].len;
            int dd[2] = {ki->div_dim, ki->out_dim};
            for (int i = 0; i < 2; i++) {
                if (dd[i] >= 0 && (dd[i] >= (int)ndims || dims[dd[i]] == 0 || n % dims[dd[i]] != 0)) {
                    *err = make_badarg(env, ATOM_shape);
                    return -1;
                }
            }
            s->out_len = ki->out_dim >= 0 ? n / dims[ki->out_dim] : ki->out_dim == -2 ? 1 : n;
        }
    }
    s->shape = ki->shape;
    s->output = ki->output;
    return 0;
}

ERL_NIF_TERM result_term(ErlNifEnv *env, struct device *d, struct job *j)
{
    const uint8_t *out = region_ptr(d, &j->out);
    size_t bytes = (size_t)j->out_len * TYPE_BYTES[j->type];
    if (j->output == EC_OUTPUT_SCALAR) {
        double x;
        if (j->type == EC_TYPE_F64)
            memcpy(&x, out, 8);
        else
            x = *(const float *)out;
        return float_term(env, x);
    }
    ERL_NIF_TERM bin;
    if (j->form == FORM_LIST) {
        const float *f = (const float *)out;
        ERL_NIF_TERM list = enif_make_list(env, 0);
        for (uint64_t i = j->out_len; i > 0; i--)
            list = enif_make_list_cell(env, float_term(env, f[i - 1]), list);
        return list;
    }
    bin = 0;
    if (j->zero_copy) {
        struct region_res *rr = enif_alloc_resource(REGION_RT, sizeof *rr);
        if (rr) {
            rr->d = d;
            rr->r = j->out;
            enif_keep_resource(d);
            __atomic_add_fetch(&d->exported, 1, __ATOMIC_ACQ_REL);
            j->out_taken = 1;
            bin = enif_make_resource_binary(env, rr, out, bytes);
            enif_release_resource(rr);
        }
    }
    if (!bin) {
        unsigned char *p = enif_make_new_binary(env, bytes, &bin);
        if (p)
            memcpy(p, out, bytes);
    }
    return j->form == FORM_TYPED ? enif_make_tuple2(env, TYPE_ATOMS[j->type], bin) : bin;
}
