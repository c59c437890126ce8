/*
 * launch.c: a launch (submit/4,5) and a module's load or unload
 * (module_op/4). A checked job (args.c) gets a slot and arena regions, its
 * inputs are copied in and its descriptor published (submit.c); the
 * caller's scheduler does the copy, and large inputs move to a dirty
 * scheduler first. A large job from binaries is published in parts as its
 * inputs are copied (pipeline.c). A submit on a normal scheduler then
 * answers a few finished jobs itself (reap_cq, complete.c).
 */
#define _GNU_SOURCE
#include "device_state.h"
#include "arena.h"
#include "args.h"
#include "buffers.h"
#include "complete.h"
#include "kernels.h"
#include "launch.h"
#include "pipeline.h"
#include "submit.h"

#include <string.h>

/* Stamps a phase of a timed submit (profile.h): t[i] once phase i is over. */
#define STAMP(t, i) ((t)[0] ? (void)((t)[i] = mono_ns()) : (void)0)

static int submit_job_body(ErlNifEnv *env, struct device *d, const ERL_NIF_TERM argv[], int dirty,
                           ERL_NIF_TERM ref, ERL_NIF_TERM *result, int64_t t[5]);

/* submit(Handle, Kernel, Args, Flags[, Ref]) -> {ok, Ref} | {error, Reason}.
 * Flags: 0, `buffer`, or `fault` (only a gpud built for fault injection
 * accepts it). ref: the caller's reference, or 0 to make one.
 * One in PROF_SAMPLE accepted submits of a thread is timed by phase. */
int submit_job(ErlNifEnv *env, struct device *d, const ERL_NIF_TERM argv[], int dirty,
               ERL_NIF_TERM ref, ERL_NIF_TERM *result)
{
    int64_t t[5] = {0, 0, 0, 0, 0};
    if (prof_begin())
        t[0] = mono_ns();
    last_submit.d = NULL;
    int r = submit_job_body(env, d, argv, dirty, ref, result, t);
    prof_timing = 0;
    if (t[4]) {
        uint64_t *p = d->prof.submit;
        prof_add(&p[PS_SAMPLES], 1);
        prof_add(&p[PS_TOTAL_NS], (uint64_t)(t[4] - t[0]));
        prof_add(&p[PS_PARSE_NS], (uint64_t)(t[1] - t[0]));
        prof_add(&p[PS_RESERVE_NS], (uint64_t)(t[2] - t[1]));
        prof_add(&p[PS_COPY_NS], (uint64_t)(t[3] - t[2]));
        prof_add(&p[PS_PUBLISH_NS], (uint64_t)(t[4] - t[3]));
    }
    return r;
}

static int submit_job_body(ErlNifEnv *env, struct device *d, const ERL_NIF_TERM argv[], int dirty,
                           ERL_NIF_TERM ref, ERL_NIF_TERM *result, int64_t t[5])
{
    uint8_t flags = enif_is_identical(argv[3], ATOM_fault) ? EC_FLAG_FAULT : 0;
    /* `buffer`: the outputs stay on the device, new buffers. */
    int out_buf = enif_is_identical(argv[3], ATOM_buffer);
    struct job_spec s;
    struct launch_opts opts = {0, 0, 0, 0, 0, 0};
    memset(&s, 0, sizeof s);
    s.ki = builtin_kernel(env, argv[1]);
    if (!s.ki && flags == 0 && user_kernel(env, argv[1], &s.ki, &opts))
        flags = EC_FLAG_ARGS;
    if (!s.ki) {
        *result = make_error(env, enif_make_tuple2(env, ATOM_unknown_kernel, argv[1]));
        return 0;
    }
    s.kernel = s.ki->id;
    int users = s.ki->user;

    /* From here every way out goes through `out`, the one place that
     * gives back what the submit took: the slot and its regions once
     * reserved (unless published: then the job's answer releases them),
     * and the hold on the mapping. `fail` is the answer of a submit that
     * publishes nothing. */
    ERL_NIF_TERM fail = 0;
    int64_t idx = -1;
    int redo = 0; /* parse_args asks for a dirty scheduler */
    struct pipe_plan plan;

    /* The mapping is read from parse_args on (arena lookups): hold it. */
    enif_rwlock_rlock(d->life);
    if (d->closed) {
        fail = make_error(env, ATOM_closed);
        goto out;
    }
    int r = parse_args(env, d, argv[2], dirty, &s, result);
    if (r < 0) {
        fail = *result;
        goto out;
    }
    if (r > 0) {
        count(&d->c.dirty_submits, 1);
        redo = 1;
        goto out;
    }
    STAMP(t, 1);

    /* Inputs not in the arena yet share one region (after a user's job
     * record, which opens it); the outputs share another, which a large
     * binary result keeps after the job. */
    uint64_t in_off[EC_MAX_VECTORS] = {0}, in_bytes = users ? EC_JOB_ARGS_BYTES : 0;
    for (unsigned i = 0; i < s.nin; i++) {
        if (s.in[i].in_arena || s.in[i].buf)
            continue;
        in_off[i] = in_bytes;
        in_bytes += arena_round(s.in[i].len * type_bytes(s.in[i].type));
    }
    /* A job with a fault or buffer outputs is never pipelined; a pipelined
     * reduction's output holds its partials. */
    if (!users && flags == 0 && !out_buf)
        pipeline_plan(d, &s, &plan);
    else
        pipeline_unplan(&s, &plan);
    uint64_t out_bytes = 0;
    if (!out_buf && users && s.nout)
        out_bytes = s.outs[s.nout - 1].off + arena_round(s.outs[s.nout - 1].len * type_bytes(s.outs[s.nout - 1].type));
    else if (!out_buf && !users)
        out_bytes = arena_round(plan.out_elems * s.elem);
    if (in_bytes > d->arena_max || out_bytes > d->arena_max || in_bytes + out_bytes > d->arena_max) {
        fail = make_badarg(env, ATOM_too_large);
        goto out;
    }
    /* A binary vector result this large stays in the arena as the answer. */
    int zero_copy = !out_buf && s.nout == 1 && !s.outs[0].scalar && s.form != FORM_LIST &&
                    s.nin && s.in[0].is_binary &&
                    (uint64_t)s.outs[0].len * type_bytes(s.outs[0].type) >= d->zero_copy_bytes;
    idx = reserve_job(d, in_bytes, out_bytes, plan.parts - 1, zero_copy);
    if (idx < 0 && plan.parts > 1) {
        /* not enough free slots for the extra descriptors: one is fine (a
         * reduction's output region is then larger than it needs) */
        pipeline_unplan(&s, &plan);
        idx = reserve_job(d, in_bytes, out_bytes, 0, zero_copy);
    }
    if (idx == -2) {
        fail = make_badarg(env, ATOM_too_large);
        goto out;
    }
    if (idx < 0) {
        /* Busy: answering finished jobs frees slots for the retry. */
        if (!dirty)
            reap_cq(d, env);
        count(&d->c.busy, 1);
        fail = make_error(env, ATOM_busy);
        goto out;
    }
    STAMP(t, 2);
    struct job *j = &d->jobs[idx];
    uint64_t addr[EC_MAX_VECTORS] = {0};
    uint32_t bufs = 0;
    for (unsigned i = 0; i < s.nin; i++) {
        if (s.in[i].buf) {
            /* Named by id; the term in the job's env keeps the buffer (so
             * no free of it) until the job is answered. */
            enif_make_copy(j->env, s.in[i].term);
            addr[i] = s.in[i].buf->id;
            bufs |= 1u << i;
            continue;
        }
        if (s.in[i].in_arena) {
            /* Keeps the binary, and so its region, alive while gpud reads it. */
            enif_make_copy(j->env, s.in[i].bin_term);
            addr[i] = s.in[i].addr;
            count(&d->c.arena_inputs, 1);
            continue;
        }
        addr[i] = region_addr(&j->in) + in_off[i];
        if (plan.parts > 1)
            continue; /* binaries, copied part by part by submit_pipelined */
        if (!copy_vec(env, &s.in[i], region_ptr(d, &j->in) + in_off[i])) {
            fail = make_badarg(env, enif_make_tuple2(env, ATOM_arg, enif_make_uint(env, i + 1)));
            goto out;
        }
    }
    if (d->poison && !out_buf && out_bytes)
        memset(region_ptr(d, &j->out), 0xff, out_bytes); /* all NaN, f32 or f64; gpud zeroes a user's */
    j->out_buf = out_buf;
    j->nout = (uint8_t)s.nout;
    memcpy(j->outs, s.outs, sizeof j->outs);
    uint64_t out_ids[EC_MAX_OUTPUTS] = {0};
    if (out_buf) {
        ERL_NIF_TERM bt[EC_MAX_OUTPUTS];
        for (unsigned k = 0; k < s.nout; k++) {
            bt[k] = new_buffer(j->env, d, s.outs[k].type, s.outs[k].len);
            if (!bt[k]) {
                fail = make_error(env, ATOM_enomem);
                goto out;
            }
            out_ids[k] = get_buffer(j->env, bt[k])->id;
        }
        j->buf_term = s.nout == 1 ? bt[0] : enif_make_tuple_from_array(j->env, bt, s.nout);
    }
    int given_ref = ref != 0; /* launch_sync's: await_spin may follow */
    if (!ref)
        ref = enif_make_ref(env);
    j->form = s.form;
    j->zero_copy = zero_copy;
    if (users) {
        j->kmod = s.ki->module;
        j->kname = s.ki->atom;
        j->kgen = s.ki->gen;
        j->seeded = (opts.given & EC_OPT_THREAD_ORDER) != 0;
        j->seed = opts.seed;
    }
    struct ec_sqe sqe = {
        .user_data = job_begin(d, (uint32_t)idx, env, ref, s.kernel, s.nout ? s.outs[0].type : s.type,
                               OUTPUT_KERNEL, (uint32_t)s.out_len),
        .kernel = (uint16_t)s.kernel,
        .type = s.type,
        .flags = flags,
    };
    /* What await_spin needs, kept here: once published, the job may be
     * answered and its slot cleared (zeroed: clear_slot) or reused before
     * this submit returns, so no field of j is read after the publish. */
    const uint32_t gen = (uint32_t)(sqe.user_data >> 32);
    const ErlNifPid pid = j->pid;
    if (users) {
        /* The job record opens the input region (8-aligned: regions are
         * EC_ARENA_ALIGN-aligned). */
        struct ec_job_args *ja = (struct ec_job_args *)region_ptr(d, &j->in);
        memset(ja, 0, sizeof *ja);
        for (unsigned i = 0; i < s.nin; i++) {
            ja->addr[i] = addr[i];
            ja->len[i] = (uint32_t)s.in[i].len;
        }
        for (unsigned k = 0; k < s.nout; k++) {
            ja->addr[EC_MAX_VECTORS + k] = out_buf ? out_ids[k] : region_addr(&j->out) + s.outs[k].off;
            ja->len[EC_MAX_VECTORS + k] = s.outs[k].len;
            if (out_buf)
                bufs |= 1u << (EC_MAX_VECTORS + k);
        }
        memcpy(ja->param, s.param, sizeof ja->param);
        ja->buffers = bufs;
        ja->given = opts.given;
        ja->grid = opts.grid;
        ja->block = opts.block;
        ja->shared_bytes = opts.shared_bytes;
        ja->seed = opts.seed;
        ja->max_wait_us = opts.max_wait_us;
        sqe.in0 = region_addr(&j->in);
        sqe.in0_len = EC_JOB_ARGS_BYTES;
    } else {
        sqe.flags |= (bufs & 1 ? EC_FLAG_IN0_BUF : 0) | (bufs & 2 ? EC_FLAG_IN1_BUF : 0) |
                     (out_buf ? EC_FLAG_OUT_BUF : 0);
        sqe.in0 = addr[0];
        sqe.in1 = addr[1];
        sqe.out = out_buf ? out_ids[0] : region_addr(&j->out);
        sqe.p = s.p;
        sqe.in0_len = (uint32_t)s.in[0].len;
        sqe.in1_len = s.nin > 1 ? (uint32_t)s.in[1].len : 0;
        sqe.out_len = (uint32_t)s.out_len;
    }
    STAMP(t, 3);
    if (plan.parts > 1) {
        uint8_t *dst[2] = {region_ptr(d, &j->in) + in_off[0], region_ptr(d, &j->in) + in_off[1]};
        enif_rwlock_rlock(d->pipe);
        int pr = submit_pipelined(d, (uint32_t)idx, &sqe, &s, dst, &plan);
        enif_rwlock_runlock(d->pipe);
        if (pr != 0) {
            fail = make_error(env, ATOM_enomem);
            goto out;
        }
        count(&d->c.pipelined, 1);
    } else {
        int pr = publish_checked(d, (uint32_t)idx, &sqe, &s);
        if (pr != 0) {
            /* -1: its module was replaced or unloaded meanwhile: the caller
             * looks the kernel up again (erlcuda:launch/3). -2: an input
             * buffer was freed, or gpud restarted, since parse_args. */
            ERL_NIF_TERM why = 0;
            for (unsigned i = 0; pr == -2 && !why && i < s.nin; i++)
                if (s.in[i].buf)
                    why = buffer_unusable(env, d, s.in[i].buf);
            fail = make_error(env, pr == -1 ? ATOM_stale_kernel
                                   : why ? why
                                         : enif_make_tuple2(env, ATOM_buffer, ATOM_lost));
            goto out;
        }
    }
    flush_frees(d);
    /* After the timed phases: answering others' jobs is not this submit's cost. */
    STAMP(t, 4);
    if (given_ref && d->sync_spin_us && !dirty && plan.parts == 1 && (uint32_t)idx < d->inline_slots)
        last_submit = (struct last_submit){.d = d, .idx = (uint32_t)idx, .gen = gen, .pid = pid,
                                           .ref_hash = enif_hash(ERL_NIF_INTERNAL_HASH, ref, 0)};
    if (!dirty)
        reap_cq(d, env);
    count(&d->c.submitted, 1);
    *result = enif_make_tuple2(env, ATOM_ok, ref);
out:
    if (fail) {
        if (idx >= 0)
            unreserve_job(d, (uint32_t)idx);
        *result = fail;
    }
    enif_rwlock_runlock(d->life);
    return redo;
}

/* module_op(Handle, load | unload, Slot, Path): see launch.h. The path
 * travels in the job's input region, why a load failed in its output. */
ERL_NIF_TERM submit_control(ErlNifEnv *env, struct device *d, const ERL_NIF_TERM argv[])
{
    ErlNifBinary path;
    unsigned slot;
    int load = enif_is_identical(argv[1], ATOM_load);
    if ((!load && !enif_is_identical(argv[1], ATOM_unload)) ||
        !enif_get_uint(env, argv[2], &slot) || slot >= EC_MODULE_SLOTS ||
        !enif_inspect_binary(env, argv[3], &path) || path.size > 4096)
        return enif_make_badarg(env);
    enif_rwlock_rlock(d->life);
    if (d->closed) {
        enif_rwlock_runlock(d->life);
        return make_error(env, ATOM_closed);
    }
    uint64_t in_bytes = arena_round(path.size ? path.size : 1);
    int64_t idx = reserve_job(d, in_bytes, CONTROL_MSG_BYTES, 0, 0);
    if (idx < 0) {
        enif_rwlock_runlock(d->life);
        count(&d->c.busy, 1);
        return make_error(env, ATOM_busy);
    }
    struct job *j = &d->jobs[idx];
    memcpy(region_ptr(d, &j->in), path.data, path.size);
    memset(region_ptr(d, &j->out), 0, CONTROL_MSG_BYTES);
    ERL_NIF_TERM ref = enif_make_ref(env);
    uint32_t kernel = load ? EC_CONTROL_LOAD_MODULE : EC_CONTROL_UNLOAD_MODULE;
    j->form = FORM_BINARY;
    struct ec_sqe sqe = {
        .user_data = job_begin(d, (uint32_t)idx, env, ref, kernel, EC_TYPE_U8, OUTPUT_CONTROL,
                               CONTROL_MSG_BYTES),
        .kernel = (uint16_t)kernel,
        .type = EC_TYPE_U8,
        .in0 = region_addr(&j->in),
        .in0_len = (uint32_t)path.size,
        .out = region_addr(&j->out),
        .out_len = CONTROL_MSG_BYTES,
    };
    sqe.p.dim[0] = slot;
    publish(d, (uint32_t)idx, &sqe);
    enif_rwlock_runlock(d->life);
    /* No caller's job (submitted counts those): a module load or unload. */
    return enif_make_tuple2(env, ATOM_ok, ref);
}
