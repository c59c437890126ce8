/*
 * kernels.c: the kernels as the NIF knows them. The built-in rows of the
 * ring header, parsed once at load; a user's kernel, parsed once when
 * erlcuda_modules loads its module; module generations; and both as Erlang
 * terms (kernels/0, signature/2). Every signature goes through
 * sig_parse (signature.c), the VM's one reader of the language.
 */
#define _GNU_SOURCE
#include "device_state.h"
#include "kernels.h"
#include "signature.h"

#include <string.h>

static struct kernel_info KERNELS[EC_KERNEL_COUNT];

/* The live generation of each module slot (0: none). */
static uint32_t MODULE_GEN[EC_MODULE_SLOTS];

/* The argument names of users' kernels, by kernel id, for an
 * out_of_bounds kernel_fault answer (kernel_arg_name): a job keeps only its
 * kernel's id and module generation, not the kernel, which an unload may
 * free before the job's answer. One table of EC_MODULE_KERNELS rows per
 * module slot, made at the slot's first kernel and kept (a slot's next
 * module reuses it): at most EC_MODULE_SLOTS of them. A row is written by
 * make_user_kernel (erlcuda_modules, one process) and read by completion
 * threads: gen is cleared before its names change and set after, so a
 * reader that sees the same gen before and after got that generation's
 * names. Names are atoms, valid in every env. */
struct arg_names {
    uint32_t gen;
    ERL_NIF_TERM name[EC_MAX_SLOTS];
};
static struct arg_names *ARG_NAMES[EC_MODULE_SLOTS];

static void set_arg_names(uint32_t id, uint32_t gen, ErlNifEnv *env, const struct sig *s)
{
    uint32_t slot = (id - EC_USER_KERNEL_BASE) / EC_MODULE_KERNELS;
    struct arg_names *t = __atomic_load_n(&ARG_NAMES[slot], __ATOMIC_ACQUIRE);
    if (!t) {
        t = enif_alloc(EC_MODULE_KERNELS * sizeof *t);
        if (!t)
            return; /* the answer names the slot's number instead */
        memset(t, 0, EC_MODULE_KERNELS * sizeof *t);
        __atomic_store_n(&ARG_NAMES[slot], t, __ATOMIC_RELEASE);
    }
    struct arg_names *r = &t[(id - EC_USER_KERNEL_BASE) % EC_MODULE_KERNELS];
    __atomic_store_n(&r->gen, 0, __ATOMIC_RELEASE);
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    for (unsigned i = 0; i < EC_MAX_SLOTS; i++)
        __atomic_store_n(&r->name[i], 0, __ATOMIC_RELAXED);
    for (unsigned a = 0; a < s->nargs; a++)
        if (s->arg[a].kind == SIG_VECTOR || s->arg[a].kind == SIG_INOUT)
            __atomic_store_n(&r->name[s->arg[a].slot], enif_make_atom(env, s->arg[a].name), __ATOMIC_RELAXED);
    for (unsigned k = 0; k < s->nouts; k++)
        __atomic_store_n(&r->name[EC_MAX_VECTORS + k], enif_make_atom(env, s->out[k].name), __ATOMIC_RELAXED);
    __atomic_store_n(&r->gen, gen, __ATOMIC_RELEASE);
}

ERL_NIF_TERM kernel_arg_name(ErlNifEnv *env, uint32_t id, uint32_t gen, uint32_t slot)
{
    if (slot == EC_FAULT_SLOT_SHARED)
        return ATOM_shared;
    ERL_NIF_TERM name = 0;
    if (id >= EC_USER_KERNEL_BASE && slot < EC_MAX_SLOTS) {
        uint32_t mod = (id - EC_USER_KERNEL_BASE) / EC_MODULE_KERNELS;
        struct arg_names *t = mod < EC_MODULE_SLOTS ? __atomic_load_n(&ARG_NAMES[mod], __ATOMIC_ACQUIRE) : NULL;
        if (t) {
            struct arg_names *r = &t[(id - EC_USER_KERNEL_BASE) % EC_MODULE_KERNELS];
            if (__atomic_load_n(&r->gen, __ATOMIC_ACQUIRE) == gen) {
                name = __atomic_load_n(&r->name[slot], __ATOMIC_RELAXED);
                __atomic_thread_fence(__ATOMIC_SEQ_CST);
                if (__atomic_load_n(&r->gen, __ATOMIC_ACQUIRE) != gen)
                    name = 0;
            }
        }
    }
    /* The module was replaced meanwhile (or the table could not be made):
     * the slot's number, which the kernel's signature still reads. */
    return name ? name : enif_make_uint(env, slot);
}

int kernels_load(ErlNifEnv *env)
{
    const char *why = NULL;
#define KERNEL_INFO(NAME, ID, ATOM, ARGS, OUTS, SHAPE, TYPES, ENTRY)                                 \
    KERNELS[ID] = (struct kernel_info){.atom = enif_make_atom(env, #ATOM), .shape = EC_SHAPE_##SHAPE, \
                                       .types = TYPES, .entry = ENTRY, .args_text = ARGS,            \
                                       .outs_text = OUTS, .id = ID};                                 \
    if (sig_parse(ARGS, strlen(ARGS), OUTS, strlen(OUTS), &KERNELS[ID].sig, &why) != 0)              \
        return -1;
    EC_KERNELS(KERNEL_INFO)
#undef KERNEL_INFO
    return 0;
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

ErlNifResourceType *KERNEL_RT;

/* {Id, Slot, Gen, Args, Outs, Blocks, Types, {Module, Name}}: built by
 * erlcuda_modules from
 * the manifest (Blocks: the length inside its `blocks` rule), whose
 * signature it has read with signature/2 already; checked here again, once,
 * when the module is loaded, so a wrong one never reaches gpud. The blocks
 * rule is first read here: a kernel whose blocks length does not read
 * against its signature could judge no call, so its module is refused. */
ERL_NIF_TERM make_user_kernel(ErlNifEnv *env, ERL_NIF_TERM row)
{
    const ERL_NIF_TERM *e;
    int arity;
    unsigned id, slot, gen, types;
    ErlNifBinary args, outs, blocks;
    const char *why;
    if (!enif_get_tuple(env, row, &arity, &e) || arity != 8 || !enif_get_uint(env, e[0], &id) ||
        !enif_get_uint(env, e[1], &slot) || !enif_get_uint(env, e[2], &gen) ||
        !enif_inspect_binary(env, e[3], &args) || !enif_inspect_binary(env, e[4], &outs) ||
        !enif_inspect_binary(env, e[5], &blocks) || !enif_get_uint(env, e[6], &types))
        return enif_make_badarg(env);
    /* The kernel as callers name it, {Module, Name}: two atoms, kept as
     * terms (an atom is valid in every env) for its jobs' fault answers. */
    const ERL_NIF_TERM *name;
    int narity;
    if (!enif_get_tuple(env, e[7], &narity, &name) || narity != 2 || !enif_is_atom(env, name[0]) ||
        !enif_is_atom(env, name[1]))
        return enif_make_badarg(env);
    if (slot >= EC_MODULE_SLOTS || gen == 0 || id < EC_USER_KERNEL_BASE ||
        (id - EC_USER_KERNEL_BASE) / EC_MODULE_KERNELS != slot || types >= (1u << EC_TYPE_COUNT))
        return enif_make_badarg(env);
    struct kernel_info *ki = enif_alloc_resource(KERNEL_RT, sizeof *ki);
    if (!ki)
        return make_error(env, ATOM_enomem);
    memset(ki, 0, sizeof *ki);
    ki->has_blocks = blocks.size > 0;
    ERL_NIF_TERM result = 0;
    if (sig_parse((const char *)args.data, args.size, (const char *)outs.data, outs.size, &ki->sig,
                  &why) != 0 ||
        ki->sig.uses_t != (types != 0)) {
        result = enif_make_badarg(env);
    } else if (ki->has_blocks &&
               sig_parse_len(&ki->sig, (const char *)blocks.data, blocks.size, &ki->blocks,
                             &why) != 0) {
        size_t n = strlen(why);
        memcpy(enif_make_new_binary(env, n, &result), why, n);
        result = make_error(env, result);
    }
    if (!result) {
        ki->shape = SHAPE_USER;
        ki->types = types;
        ki->entry = "";
        ki->user = 1;
        ki->id = id;
        ki->slot = slot;
        ki->gen = gen;
        ki->module = name[0];
        ki->atom = name[1];
        set_arg_names(id, gen, env, &ki->sig);
        result = enif_make_tuple2(env, ATOM_ok, enif_make_resource(env, ki));
    }
    enif_release_resource(ki);
    return result;
}

int user_kernel(ErlNifEnv *env, ERL_NIF_TERM t, const struct kernel_info **ki,
                struct launch_opts *o)
{
    const ERL_NIF_TERM *e, *opt;
    int arity, oarity;
    void *res;
    unsigned given, grid, block, shared, seed, wait;
    if (!enif_get_tuple(env, t, &arity, &e) || arity != 2 ||
        !enif_get_resource(env, e[0], KERNEL_RT, &res) || !enif_get_tuple(env, e[1], &oarity, &opt) ||
        oarity != 6 || !enif_get_uint(env, opt[0], &given) || !enif_get_uint(env, opt[1], &grid) ||
        !enif_get_uint(env, opt[2], &block) || !enif_get_uint(env, opt[3], &shared) ||
        !enif_get_uint(env, opt[4], &seed) || !enif_get_uint(env, opt[5], &wait) ||
        (given & ~(EC_OPT_GRID | EC_OPT_BLOCK | EC_OPT_SHARED_BYTES | EC_OPT_THREAD_ORDER | EC_OPT_MAX_WAIT |
                   EC_OPT_CPU_RUNS_GPU | EC_OPT_CPU_RUNS_CPU)) != 0 ||
        (given & (EC_OPT_CPU_RUNS_GPU | EC_OPT_CPU_RUNS_CPU)) == (EC_OPT_CPU_RUNS_GPU | EC_OPT_CPU_RUNS_CPU))
        return 0;
    *ki = res;
    o->given = given;
    o->grid = given & EC_OPT_GRID ? grid : 0;
    o->block = given & EC_OPT_BLOCK ? block : 0;
    o->shared_bytes = given & EC_OPT_SHARED_BYTES ? shared : 0;
    o->seed = given & EC_OPT_THREAD_ORDER ? seed : 0;
    o->max_wait_us = given & EC_OPT_MAX_WAIT ? wait : 0;
    return 1;
}

static ERL_NIF_TERM type_term(uint8_t type)
{
    return type == SIG_TYPE_T ? ATOM_T : type < EC_TYPE_COUNT ? TYPE_ATOMS[type] : TYPE_ATOMS[EC_TYPE_U32];
}

static ERL_NIF_TERM len_term(ErlNifEnv *env, const struct sig *s, const struct sig_len *l)
{
    char buf[8 * (EC_MAX_NAME + 2)];
    size_t n = sig_len_text(s, l, buf, sizeof buf);
    ERL_NIF_TERM t;
    memcpy(enif_make_new_binary(env, n, &t), buf, n);
    return t;
}

static ERL_NIF_TERM range_term(ErlNifEnv *env, const struct sig *s, uint8_t param)
{
    char buf[8 * 8 * (EC_MAX_NAME + 2)];
    size_t n = sig_range_text(s, param, buf, sizeof buf);
    if (n == 0)
        return ATOM_none;
    ERL_NIF_TERM t;
    memcpy(enif_make_new_binary(env, n, &t), buf, n);
    return t;
}

static ERL_NIF_TERM name_term(ErlNifEnv *env, const char *name)
{
    return enif_make_atom(env, name);
}

/* The signature's arguments and outputs as lists of maps:
 * #{name, kind, type, length} each (length `none` for s and d; a d's type
 * is u32), a d's with `range` too: its range as written (`1..=cols&64`), or
 * `none`. */
static void sig_terms(ErlNifEnv *env, const struct sig *s, ERL_NIF_TERM *args, ERL_NIF_TERM *outs)
{
    static ERL_NIF_TERM *const KIND[] = {[SIG_VECTOR] = &ATOM_vector, [SIG_INOUT] = &ATOM_inout,
                                         [SIG_SCALAR] = &ATOM_scalar, [SIG_DIM] = &ATOM_dim};
    ERL_NIF_TERM keys[] = {ATOM_name, ATOM_kind, ATOM_type, ATOM_length, ATOM_range};
    *args = enif_make_list(env, 0);
    for (unsigned i = s->nargs; i > 0; i--) {
        const struct sig_arg *a = &s->arg[i - 1];
        int vec = a->kind == SIG_VECTOR || a->kind == SIG_INOUT;
        ERL_NIF_TERM vals[] = {name_term(env, a->name), *KIND[a->kind], type_term(a->type),
                               vec ? len_term(env, s, &a->len) : ATOM_none, ATOM_none};
        if (a->kind == SIG_DIM)
            vals[4] = range_term(env, s, a->slot);
        ERL_NIF_TERM m;
        enif_make_map_from_arrays(env, keys, vals, a->kind == SIG_DIM ? 5 : 4, &m);
        *args = enif_make_list_cell(env, m, *args);
    }
    *outs = enif_make_list(env, 0);
    for (unsigned i = s->nouts; i > 0; i--) {
        const struct sig_out *o = &s->out[i - 1];
        ERL_NIF_TERM vals[] = {name_term(env, o->name), o->scalar ? ATOM_scalar : ATOM_vector,
                               type_term(o->type), len_term(env, s, &o->len)};
        ERL_NIF_TERM m;
        enif_make_map_from_arrays(env, keys, vals, 4, &m);
        *outs = enif_make_list_cell(env, m, *outs);
    }
}

static ERL_NIF_TERM types_term(ErlNifEnv *env, uint32_t mask)
{
    ERL_NIF_TERM types = enif_make_list(env, 0);
    for (int t = EC_TYPE_COUNT - 1; t >= 0; t--)
        if (mask & (1u << t))
            types = enif_make_list_cell(env, TYPE_ATOMS[t], types);
    return types;
}

ERL_NIF_TERM kernels_term(ErlNifEnv *env)
{
    ERL_NIF_TERM list = enif_make_list(env, 0);
    for (uint32_t k = EC_KERNEL_COUNT - 1; k > 0; k--) {
        const struct kernel_info *ki = &KERNELS[k];
        ERL_NIF_TERM args, outs, entry;
        sig_terms(env, &ki->sig, &args, &outs);
        size_t elen = strlen(ki->entry);
        memcpy(enif_make_new_binary(env, elen, &entry), ki->entry, elen);
        ERL_NIF_TERM keys[] = {ATOM_name, ATOM_id, ATOM_args, ATOM_outputs, ATOM_types,
                               ATOM_shape, ATOM_entry, ATOM_accumulate};
        /* Sums accumulate in the element type on every backend (the header). */
        ERL_NIF_TERM vals[] = {ki->atom, enif_make_uint(env, k), args, outs,
                               types_term(env, ki->types), SHAPE_ATOMS[ki->shape], entry, ATOM_type};
        ERL_NIF_TERM map;
        enif_make_map_from_arrays(env, keys, vals, sizeof keys / sizeof keys[0], &map);
        list = enif_make_list_cell(env, map, list);
    }
    return list;
}

ERL_NIF_TERM signature_term(ErlNifEnv *env, ERL_NIF_TERM args_text, ERL_NIF_TERM outs_text)
{
    ErlNifBinary a, o;
    struct sig s;
    const char *why = NULL;
    if (!enif_inspect_binary(env, args_text, &a) || !enif_inspect_binary(env, outs_text, &o))
        return enif_make_badarg(env);
    if (sig_parse((const char *)a.data, a.size, (const char *)o.data, o.size, &s, &why) != 0) {
        ERL_NIF_TERM msg;
        size_t n = strlen(why);
        memcpy(enif_make_new_binary(env, n, &msg), why, n);
        return make_error(env, msg);
    }
    ERL_NIF_TERM args, outs;
    sig_terms(env, &s, &args, &outs);
    return enif_make_tuple4(env, ATOM_ok, args, outs, s.uses_t ? ATOM_true : ATOM_false);
}
