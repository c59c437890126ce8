/*
 * submit.c: the submit path. A checked job (args.c) gets a slot and arena
 * regions, its inputs are copied in, and its descriptor is published on the
 * SQ (the caller's scheduler does the copy; large inputs move to a dirty
 * scheduler first). A large job from binaries, and a large put
 * (buffers.c), is published in parts as its inputs are copied (pipeline.c).
 */
#define _GNU_SOURCE
#include "erlcuda_nif.h"

#include <string.h>

__thread int prof_timing;
__thread struct last_submit last_submit;

/* Returns a finished job's region and slot. Caller holds d->lock. */
void free_region_locked(struct device *d, struct region *r)
{
    if (r->bytes && !r->inl)
        arena_free(&d->alloc[r->seg], r->off, r->bytes);
    r->bytes = 0;
    r->inl = 0;
}

/* Allocates `bytes` in some segment, adding a segment while the arena is
 * below its limit. Caller holds d->lock. Returns 0 or -1 (busy). */
int region_alloc_locked(struct device *d, uint64_t bytes, struct region *r)
{
    r->bytes = bytes;
    r->inl = 0;
    for (uint32_t i = 0; i < d->shm.nseg; i++) {
        if (arena_alloc(&d->alloc[i], bytes, &r->off) == 0) {
            r->seg = i;
            return 0;
        }
    }
    /* Grow by at least the first segment's size, so growth is rare. */
    uint64_t grow = arena_round(bytes);
    if (grow < d->shm.seg[0].bytes)
        grow = d->shm.seg[0].bytes;
    if (d->arena_total + grow > d->arena_max)
        grow = arena_round(bytes);
    if (d->arena_total + grow > d->arena_max || d->shm.nseg >= EC_MAX_SEGMENTS)
        return -1;
    int seg = shm_add_segment(&d->shm, grow);
    if (seg < 0)
        return -1;
    if (arena_init(&d->alloc[seg], d->shm.seg[seg].bytes) < 0)
        return -1; /* the segment stays, unused: never corrupt */
    d->arena_total += d->shm.seg[seg].bytes;
    /* gpud registers it as soon as it reads the segment message (a
     * connected gpud has it already): with prefault_arena, faulting its
     * pages in here as well shares that work with the registration
     * (prefault.h); without, the prefault thread was never started and
     * this does nothing. */
    prefault_add(&d->prefault, d->shm.seg[seg].base, d->shm.seg[seg].bytes);
    r->seg = (uint32_t)seg;
    return arena_alloc(&d->alloc[seg], bytes, &r->off);
}

/* Could a region of `bytes` ever be had, however long one waits: in a
 * segment that large, or in one the arena can still grow by? Caller holds
 * d->lock. */
static int can_ever_fit_locked(const struct device *d, uint64_t bytes)
{
    if (bytes == 0)
        return 1;
    for (uint32_t i = 0; i < d->shm.nseg; i++)
        if (d->shm.seg[i].bytes >= bytes)
            return 1;
    return d->shm.nseg < EC_MAX_SEGMENTS && d->arena_max - d->arena_total >= bytes;
}

/* A small job's regions: its input, then its output, in slot idx's inline
 * area. */
static void inline_regions(const struct device *d, uint32_t idx, uint64_t in_bytes, uint64_t out_bytes,
                           struct region *in, struct region *out)
{
    uint64_t base = d->inline_off + (uint64_t)idx * INLINE_BYTES;
    *in = (struct region){.seg = 0, .inl = 1, .off = base, .bytes = in_bytes};
    *out = (struct region){.seg = 0, .inl = 1, .off = base + in_bytes, .bytes = out_bytes};
}

/* Reserves a slot and the job's regions, plus `credits` extra slots for the
 * extra descriptors of a pipelined job. `keep_out`: the output will outlive
 * the job (a zero-copy result binary), so it cannot be in the slot's inline
 * area. Returns the slot index, -1 (busy: try later) or -2 (the regions can
 * never fit the arena: a permanent refusal, never busy). */
int64_t reserve_job(struct device *d, uint64_t in_bytes, uint64_t out_bytes,
                           uint32_t credits, int keep_out)
{
    struct region in = {0, 0, 0, 0}, out = {0, 0, 0, 0};
    int small = !keep_out && credits == 0 && in_bytes + out_bytes <= INLINE_BYTES;
    struct slot_cache *cache = small ? slot_cache_mine(&d->caches) : NULL;
    if (cache) {
        /* A slot of this thread's own: no device lock (slot_cache.h). */
        int64_t idx = slot_cache_pop(cache);
        if (idx >= 0) {
            struct job *j = &d->jobs[idx];
            inline_regions(d, (uint32_t)idx, in_bytes, out_bytes, &j->in, &j->out);
            j->out_taken = 0;
            j->ncredit = 0;
            in_flight_add(d, 1);
            count(&d->c.cached_reserves, 1);
            return idx;
        }
    }
    dev_lock(d);
    if (d->nfree <= credits) {
        slot_caches_steal_locked(d);
        if (d->nfree <= credits) {
            dev_unlock(d);
            return -1;
        }
    }
    uint32_t top = d->free_stack[d->nfree - 1];
    if (!keep_out && in_bytes + out_bytes <= INLINE_BYTES && top < d->inline_slots) {
        inline_regions(d, top, in_bytes, out_bytes, &in, &out);
    } else if (region_alloc_locked(d, out_bytes, &out) != 0) {
        int never = in_bytes + out_bytes > d->arena_max || !can_ever_fit_locked(d, out_bytes) ||
                    !can_ever_fit_locked(d, in_bytes);
        dev_unlock(d);
        return never ? -2 : -1;
    } else if (in_bytes > 0 && region_alloc_locked(d, in_bytes, &in) != 0) {
        free_region_locked(d, &out);
        int never = in_bytes + out_bytes > d->arena_max || !can_ever_fit_locked(d, in_bytes);
        dev_unlock(d);
        return never ? -2 : -1;
    }
    int64_t idx = d->free_stack[--d->nfree];
    struct job *j = &d->jobs[idx];
    j->in = in;
    j->out = out;
    j->out_taken = 0;
    j->ncredit = credits;
    for (uint32_t i = 0; i < credits; i++)
        j->credit[i] = d->free_stack[--d->nfree];
    in_flight_add(d, 1 + credits);
    if (cache)
        slot_cache_refill_locked(d, cache);
    dev_unlock(d);
    return idx;
}

void unreserve_job(struct device *d, uint32_t idx)
{
    dev_lock(d);
    release_job_locked(d, idx);
    dev_unlock(d);
}

/* Wakes gpud if it sleeps, after a publish. */
void wake_gpud(struct device *d)
{
    struct ec_header *h = d->shm.hdr;
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    if (__atomic_load_n(&h->sq_flags, __ATOMIC_RELAXED) & EC_NEED_WAKEUP) {
        shm_signal(d->shm.sq_efd);
        count(&d->c.wakeups_sent, 1);
    }
}

/* Are the job's input buffers still usable? Checked under sq_lock when the
 * descriptor is published: a free/1 or a gpud restart between parse_args
 * and here is seen, so no descriptor names a buffer after its free or of an
 * older gpud. Caller holds sq_lock. */
static int buffers_live_locked(const struct device *d, const struct job_spec *s)
{
    for (unsigned i = 0; s && i < s->nin; i++) {
        const struct buffer_res *b = s->in[i].buf;
        if (b && (__atomic_load_n(&b->freed, __ATOMIC_ACQUIRE) ||
                  b->epoch != __atomic_load_n(&d->epoch, __ATOMIC_RELAXED)))
            return 0;
    }
    return 1;
}

/* The producer's half of the ring protocol (erlcuda_ring.h, "Rings"): the
 * slot is INFLIGHT before its descriptor can be seen (its completion can
 * only follow), the entries are written, then one store-release of the tail
 * makes them visible to gpud's load-acquire. `opts`, a user's launch options
 * (EC_FLAG_OPTS; the job holds a credit slot for the entry), go in the entry
 * after the descriptor under the same tail store, so gpud always drains the
 * two together. The one place that writes the SQ. Caller holds sq_lock. */
void sq_push_locked(struct device *d, uint32_t idx, const struct ec_sqe *sqe,
                    const struct ec_launch_opts *opts)
{
    struct ec_header *h = d->shm.hdr;
    uint32_t mask = d->nslots - 1;
    __atomic_store_n(&d->jobs[idx].state, JOB_INFLIGHT, __ATOMIC_RELEASE);
    uint32_t tail = __atomic_load_n(&h->sq_tail, __ATOMIC_RELAXED);
    d->shm.sq[tail & mask] = *sqe;
    uint32_t n = 1;
    if (opts) {
        memcpy(&d->shm.sq[(tail + 1) & mask], opts, sizeof *opts);
        n = 2;
    }
    __atomic_store_n(&h->sq_tail, tail + n, __ATOMIC_RELEASE);
}

/* Publishes the job's descriptor and wakes gpud if it sleeps. A user's
 * kernel (s->ki->user) is published only while its module generation is
 * live, checked under the lock that also orders the unload descriptor
 * (erlcuda_modules retires a generation, then submits the unload): every
 * job of a generation is ahead of its unload in the SQ. Returns 0, -1
 * (nothing published) when the generation was retired, or -2 when an input
 * buffer of `s` was freed or lost meanwhile. */
int publish_checked(struct device *d, uint32_t idx, const struct ec_sqe *sqe,
                    const struct job_spec *s)
{
    const struct kernel_info *ki = s ? s->ki : NULL;
    sq_lock(d);
    if (ki && ki->user && module_gen(ki->slot) != ki->gen) {
        sq_unlock(d);
        return -1;
    }
    if (!buffers_live_locked(d, s)) {
        sq_unlock(d);
        return -2;
    }
    d->jobs[idx].t_pub = prof_timing ? mono_ns() : 0;
    sq_push_locked(d, idx, sqe, ki && (sqe->flags & EC_FLAG_OPTS) ? &ki->opts : NULL);
    sq_unlock(d);
    wake_gpud(d);
    return 0;
}

void publish(struct device *d, uint32_t idx, const struct ec_sqe *sqe)
{
    (void)publish_checked(d, idx, sqe, NULL);
}

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
    /* `buffer`: the output stays on the device, a new buffer. */
    int out_buf = enif_is_identical(argv[3], ATOM_buffer);
    struct job_spec s;
    struct kernel_info user;
    memset(&s, 0, sizeof s);
    s.ki = builtin_kernel(env, argv[1]);
    if (!s.ki && user_kernel(env, argv[1], &user) && flags == 0) {
        s.ki = &user;
        if (user.opts.given)
            flags = EC_FLAG_OPTS;
    }
    if (!s.ki) {
        *result = make_error(env, enif_make_tuple2(env, ATOM_unknown_kernel, argv[1]));
        return 0;
    }
    s.kernel = s.ki->id;

    /* The mapping is read from parse_args on (arena lookups): hold it. */
    enif_rwlock_rlock(d->life);
    if (d->closed) {
        enif_rwlock_runlock(d->life);
        *result = make_error(env, ATOM_closed);
        return 0;
    }
    int r = parse_args(env, d, argv[2], dirty, &s, result);
    if (r != 0) {
        enif_rwlock_runlock(d->life);
        if (r < 0)
            return 0;
        count(&d->c.dirty_submits, 1);
        return 1;
    }
    STAMP(t, 1);

    /* Inputs not in the arena yet share one region; the output has its own,
     * which a large binary result keeps after the job. */
    uint64_t in_off[2] = {0, 0}, in_bytes = 0;
    for (unsigned i = 0; i < s.nin; i++) {
        if (s.in[i].in_arena || s.in[i].buf)
            continue;
        in_off[i] = in_bytes;
        in_bytes += arena_round(s.in[i].len * s.elem);
    }
    /* A job with launch options, a fault or a buffer output is never
     * pipelined; a pipelined reduction's output holds its partials. */
    struct pipe_plan plan;
    if (flags == 0 && !out_buf)
        pipeline_plan(d, &s, &plan);
    else
        pipeline_unplan(&s, &plan);
    uint64_t out_bytes = out_buf ? 0 : arena_round(plan.out_elems * s.elem);
    if (in_bytes > d->arena_max || out_bytes > d->arena_max || in_bytes + out_bytes > d->arena_max) {
        enif_rwlock_runlock(d->life);
        *result = make_badarg(env, ATOM_too_large);
        return 0;
    }
    /* A binary vector result this large stays in the arena as the answer. */
    int zero_copy = !out_buf && s.in[0].is_binary && s.output == EC_OUTPUT_VECTOR &&
                    s.out_len * s.elem >= d->zero_copy_bytes;
    /* A job with launch options takes a second SQ entry: one credit slot. */
    uint32_t credits = flags & EC_FLAG_OPTS ? 1 : plan.parts - 1;
    int64_t idx = reserve_job(d, in_bytes, out_bytes, credits, zero_copy);
    if (idx < 0 && plan.parts > 1) {
        /* not enough free slots for the extra descriptors: one is fine (a
         * reduction's output region is then larger than it needs) */
        pipeline_unplan(&s, &plan);
        idx = reserve_job(d, in_bytes, out_bytes, 0, zero_copy);
    }
    if (idx == -2) {
        enif_rwlock_runlock(d->life);
        *result = make_badarg(env, ATOM_too_large);
        return 0;
    }
    if (idx < 0) {
        /* Busy: answering finished jobs frees slots for the retry. */
        if (!dirty)
            reap_cq(d, env);
        enif_rwlock_runlock(d->life);
        count(&d->c.busy, 1);
        *result = make_error(env, ATOM_busy);
        return 0;
    }
    STAMP(t, 2);
    struct job *j = &d->jobs[idx];
    uint64_t addr[2] = {0, 0};
    for (unsigned i = 0; i < s.nin; i++) {
        if (s.in[i].buf) {
            /* Named by id; the term in the job's env keeps the buffer (so
             * no free of it) until the job is answered. */
            enif_make_copy(j->env, s.in[i].term);
            addr[i] = s.in[i].buf->id;
            flags |= i == 0 ? EC_FLAG_IN0_BUF : EC_FLAG_IN1_BUF;
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
            unreserve_job(d, (uint32_t)idx);
            enif_rwlock_runlock(d->life);
            *result =
                make_badarg(env, enif_make_tuple2(env, ATOM_arg, enif_make_uint(env, i + 1)));
            return 0;
        }
    }
    if (d->poison && !out_buf)
        memset(region_ptr(d, &j->out), 0xff, plan.out_elems * s.elem); /* all NaN, f32 or f64 */
    j->out_buf = out_buf;
    if (out_buf) {
        ERL_NIF_TERM bt = new_buffer(j->env, d, s.type, (uint32_t)s.out_len);
        if (!bt) {
            unreserve_job(d, (uint32_t)idx);
            enif_rwlock_runlock(d->life);
            *result = make_error(env, ATOM_enomem);
            return 0;
        }
        struct buffer_res *ob;
        enif_get_resource(j->env, bt, BUFFER_RT, (void **)&ob);
        j->buf_term = bt;
        flags |= EC_FLAG_OUT_BUF;
        j->out_len = (uint32_t)s.out_len;
    }
    int given_ref = ref != 0; /* launch_sync's: await_spin may follow */
    if (!ref)
        ref = enif_make_ref(env);
    j->gen++;
    j->kernel = s.kernel;
    j->type = s.type;
    j->output = (uint8_t)s.output;
    j->form = s.form;
    j->zero_copy = zero_copy;
    j->ref = enif_make_copy(j->env, ref);
    enif_self(env, &j->pid);
    j->out_len = (uint32_t)s.out_len;

    struct ec_sqe sqe = {
        .user_data = ((uint64_t)j->gen << 32) | (uint64_t)idx,
        .kernel = (uint16_t)s.kernel,
        .type = s.type,
        .flags = flags,
        .in0 = addr[0],
        .in1 = addr[1],
        .out = out_buf ? 0 : region_addr(&j->out),
        .p = s.p,
        .in0_len = (uint32_t)s.in[0].len,
        .in1_len = s.nin > 1 ? (uint32_t)s.in[1].len : 0,
        .out_len = (uint32_t)s.out_len,
    };
    STAMP(t, 3);
    if (plan.parts > 1) {
        uint8_t *dst[2] = {region_ptr(d, &j->in) + in_off[0], region_ptr(d, &j->in) + in_off[1]};
        enif_rwlock_rlock(d->pipe);
        int pr = submit_pipelined(d, (uint32_t)idx, &sqe, &s, dst, &plan);
        enif_rwlock_runlock(d->pipe);
        if (pr != 0) {
            unreserve_job(d, (uint32_t)idx);
            enif_rwlock_runlock(d->life);
            *result = make_error(env, ATOM_enomem);
            return 0;
        }
        count(&d->c.pipelined, 1);
    } else {
        if (out_buf) {
            struct buffer_res *ob;
            enif_get_resource(j->env, j->buf_term, BUFFER_RT, (void **)&ob);
            sqe.out = ob->id;
        }
        int pr = publish_checked(d, (uint32_t)idx, &sqe, &s);
        if (pr != 0) {
            /* -1: its module was replaced or unloaded meanwhile: the caller
             * looks the kernel up again (erlcuda:launch/3). -2: an input
             * buffer was freed, or gpud restarted, since parse_args. */
            ERL_NIF_TERM why = 0;
            for (unsigned i = 0; pr == -2 && !why && i < s.nin; i++)
                if (s.in[i].buf)
                    why = buffer_unusable(env, d, s.in[i].buf);
            unreserve_job(d, (uint32_t)idx);
            enif_rwlock_runlock(d->life);
            *result = make_error(env, pr == -1 ? ATOM_stale_kernel
                                     : why ? why
                                           : enif_make_tuple2(env, ATOM_buffer, ATOM_lost));
            return 0;
        }
    }
    flush_frees(d);
    /* After the timed phases: answering others' jobs is not this submit's cost. */
    STAMP(t, 4);
    if (given_ref && d->sync_spin_us && !dirty && plan.parts == 1 && (uint32_t)idx < d->inline_slots)
        last_submit = (struct last_submit){.d = d, .idx = (uint32_t)idx, .gen = j->gen, .pid = j->pid,
                                           .ref_hash = enif_hash(ERL_NIF_INTERNAL_HASH, ref, 0)};
    if (!dirty)
        reap_cq(d, env);
    enif_rwlock_runlock(d->life);
    count(&d->c.submitted, 1);
    *result = enif_make_tuple2(env, ATOM_ok, ref);
    return 0;
}

/* module_op(Handle, load | unload, Slot, Path): see erlcuda_nif.h. The path
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
    j->gen++;
    j->kernel = load ? EC_CONTROL_LOAD_MODULE : EC_CONTROL_UNLOAD_MODULE;
    j->type = EC_TYPE_U8;
    j->output = OUTPUT_CONTROL;
    j->form = FORM_BINARY;
    j->zero_copy = 0;
    j->ref = enif_make_copy(j->env, ref);
    enif_self(env, &j->pid);
    j->out_len = CONTROL_MSG_BYTES;
    struct ec_sqe sqe = {
        .user_data = ((uint64_t)j->gen << 32) | (uint64_t)idx,
        .kernel = (uint16_t)j->kernel,
        .type = EC_TYPE_U8,
        .in0 = region_addr(&j->in),
        .in0_len = (uint32_t)path.size,
        .out = region_addr(&j->out),
        .out_len = CONTROL_MSG_BYTES,
    };
    sqe.p.dim[0] = slot;
    publish(d, (uint32_t)idx, &sqe);
    enif_rwlock_runlock(d->life);
    count(&d->c.submitted, 1);
    return enif_make_tuple2(env, ATOM_ok, ref);
}
