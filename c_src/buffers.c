/*
 * buffers.c: device buffers on the VM side. A buffer is a resource (struct
 * buffer_res) naming memory gpud owns; its id is assigned here, so a put or a
 * launch with {output, buffer} needs no round trip to learn it. What gpud
 * does with ids: erlcuda_ring.h, EC_FLAG_*_BUF and EC_CONTROL_PUT/GET/FREE.
 *
 * Puts. A put of a binary of at least pipeline_bytes is copied in slices
 * over the copy pool and each slice published as soon as it is in
 * (submit_put_pipelined), so gpud's copies to the device overlap this copy;
 * gpud makes the buffer from whichever slice comes first. The put is
 * answered once, when every slice is back (complete.c); a failed put's id
 * is freed at once, whatever slices of it gpud holds.
 *
 * Gets. A get copies its buffer into one region of the arena, answered
 * as a binary (a large one stays there: a resource binary). A buffer larger
 * than any region the arena can ever give (a put through the window makes
 * such buffers, and so can a launch) comes back through a window of the
 * arena instead (the windowed get): submit_get answers {pieces, Sink, N},
 * Sink holding the result binary, allocated once; the caller asks for the
 * pieces in order, a window's worth at most in flight (erlcuda:get/2),
 * each a GET descriptor of its own (a byte offset in p.u64[0]) into a
 * region of put_window_bytes / GET_WINDOW_PIECES, copied into the result
 * when answered (complete.c), its region given back then as any job's;
 * then it takes the result (get_sink_result). A cancelled piece copies
 * nothing; its region is given back when gpud answers it.
 *
 * Frees. free/1 and the destructor (garbage collection) both go through
 * queue_free, which marks the buffer freed once and queues its id under
 * freeq_lock, a leaf: the destructor may run anywhere, even inside
 * enif_clear_env under d->lock, so it never takes d->lock and never blocks.
 * flush_frees turns queued ids into free descriptors (up to EC_FREE_MAX_IDS
 * ids each); it runs after every submit, in free/1 and on the completion
 * thread, which the destructor wakes through ctl_efd.
 *
 * A buffer's term (new_buffer) and why it cannot be used (buffer_unusable)
 * are args.c's: parsing a launch's vectors needs them.
 *
 * Lost and freed. A buffer made under epoch e (the device's restart count)
 * is lost once gpud restarted; a freed one is freed. Both are checked when
 * the job is parsed and again under sq_lock when it is published
 * (publish_checked, submit.c), and reset moves the epoch and drops queued
 * frees holding that lock, so gpud never sees an id after its free or from before it
 * started. Ids are never reused while the VM lives: a stale id can only be
 * unknown to gpud, never another buffer.
 */
#define _GNU_SOURCE
#include "device_state.h"
#include "arena.h"
#include "args.h"
#include "buffers.h"
#include "copy.h"
#include "pipeline.h"
#include "shm.h"
#include "slot_cache.h"
#include "submit.h"

#include <string.h>
#include <unistd.h>

/* The resource type of a windowed get's result (struct get_sink). */
ErlNifResourceType *GET_SINK_RT;

/* A windowed get's pieces in flight at once: each is put_window_bytes /
 * this large, so the get's regions stay within the put window, and gpud
 * copies one piece while the one before it is copied into the result. */
#define GET_WINDOW_PIECES 2u
/* Pieces are whole pages (and so whole elements of every type). */
#define GET_PIECE_ALIGN 4096u

static ERL_NIF_TERM windowed_get(ErlNifEnv *env, struct device *d, struct buffer_res *b, uint64_t bytes);

/* A buffer garbage-collected: its free is queued (never blocking; see
 * buffers.c) and, when the queue was empty, the completion thread woken
 * to send it. A queue found non-empty has had its wake-up already: the
 * flush it caused takes this id too, or leaves the queue empty before this
 * push, which then finds it empty. (Judging by a length read before the
 * push lost frees: a flush could empty the queue between that read and
 * the push, and the ids pushed after it waited for some other job.) */
void buffer_dtor(ErlNifEnv *env, void *obj)
{
    struct buffer_res *b = obj;
    struct device *d = b->d;
    (void)env;
    if (queue_free(b) && d->ctl_efd >= 0)
        shm_signal(d->ctl_efd);
    enif_release_resource(d);
}

int queue_free(struct buffer_res *b)
{
    struct device *d = b->d;
    int zero = 0;
    if (!__atomic_compare_exchange_n(&b->freed, &zero, 1, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
        return 0; /* freed already */
    if (b->epoch != __atomic_load_n(&d->epoch, __ATOMIC_RELAXED))
        return 0; /* lost with its gpud */
    enif_mutex_lock(d->freeq_lock);
    if (d->nfreeq == d->freeq_cap) {
        uint32_t cap = d->freeq_cap ? d->freeq_cap * 2 : 1024;
        uint64_t *q = enif_realloc(d->freeq, cap * sizeof *q);
        if (!q) {
            /* Out of memory in the VM: the block stays in gpud until it
             * restarts. Leaks device memory, never corrupts it. */
            enif_mutex_unlock(d->freeq_lock);
            return 0;
        }
        d->freeq = q;
        d->freeq_cap = cap;
    }
    uint32_t was = d->nfreeq;
    d->freeq[was] = b->id;
    __atomic_store_n(&d->nfreeq, was + 1, __ATOMIC_RELEASE);
    enif_mutex_unlock(d->freeq_lock);
    return was == 0;
}

void flush_frees(struct device *d)
{
    if (__atomic_load_n(&d->nfreeq, __ATOMIC_ACQUIRE) == 0 || d->closed)
        return;
    int published = 0;
    dev_lock(d);
    for (;;) {
        /* Ids leave the queue only here and in reset, both under d->lock,
         * which is held: the n ids seen now are still queued once the slot
         * is reserved (destructors only add). */
        uint32_t n = __atomic_load_n(&d->nfreeq, __ATOMIC_ACQUIRE);
        if (n > EC_FREE_MAX_IDS)
            n = EC_FREE_MAX_IDS;
        if (n == 0)
            break;
        /* A slot and a region for the ids, as every job gets them. No
         * slot or no arena room: the next flush (after a completion)
         * tries again. */
        int64_t idx = reserve_job_locked(d, (uint64_t)n * 8, 0, 0, 0);
        if (idx < 0)
            break;
        struct job *j = &d->jobs[idx];
        enif_mutex_lock(d->freeq_lock);
        /* The last n ids: the queue is a stack, order does not matter. */
        memcpy(region_ptr(d, &j->in), d->freeq + (d->nfreeq - n), (size_t)n * 8);
        __atomic_store_n(&d->nfreeq, d->nfreeq - n, __ATOMIC_RELEASE);
        enif_mutex_unlock(d->freeq_lock);
        struct ec_sqe sqe = {
            .user_data = job_begin(d, (uint32_t)idx, NULL, 0, EC_CONTROL_FREE, EC_TYPE_S64, OUTPUT_FREE, 0),
            .kernel = EC_CONTROL_FREE,
            .type = EC_TYPE_S64,
            .in0 = region_addr(&j->in),
            .in0_len = n,
        };
        sq_lock(d);
        sq_push_locked(d, (uint32_t)idx, &sqe);
        sq_unlock(d);
        count(&d->c.buffer_frees, n);
        published = 1;
    }
    dev_unlock(d);
    if (published)
        wake_gpud(d);
}

/* A descriptor of a buffer job (put or get) in slot idx: fills the job's
 * fields (job_begin, and what a buffer job adds), keeps `keep` (the
 * buffer's term) in its env. A put of parts > 1 slices copies `src` into
 * its input region as it publishes (submit_put_pipelined); otherwise the
 * input is in already. Returns 0, or an error term when nothing was
 * published (a get's buffer freed or lost since it was checked): the
 * caller then gives the slot back. */
static ERL_NIF_TERM start_job(ErlNifEnv *env, struct device *d, int64_t idx, uint32_t kernel,
                              uint8_t type, uint32_t len, unsigned output, ERL_NIF_TERM keep,
                              struct buffer_res *b, struct ec_sqe *sqe, uint32_t parts,
                              const uint8_t *src, ERL_NIF_TERM ref)
{
    struct job *j = &d->jobs[idx];
    j->out_buf = output == OUTPUT_PUT;
    j->buf_term = enif_make_copy(j->env, keep);
    /* A get answers its buffer's contents as a kernel's one output does. */
    j->nout = 1;
    j->outs[0] = (struct out_spec){.type = type, .scalar = 0, .len = len, .off = 0};
    sqe->user_data = job_begin(d, (uint32_t)idx, env, ref, kernel, type, (uint8_t)output, len);
    sqe->kernel = (uint16_t)kernel;
    sqe->type = type;
    if (output == OUTPUT_PUT && parts > 1) {
        submit_put_pipelined(d, (uint32_t)idx, sqe, src, region_ptr(d, &j->in), parts);
    } else if (output == OUTPUT_PUT) {
        publish(d, (uint32_t)idx, sqe);
    } else {
        /* A get (b, its buffer): checked again under sq_lock
         * (publish_checked). */
        struct job_spec s;
        memset(&s, 0, sizeof s);
        s.nin = 1;
        s.in[0].buf = b;
        if (publish_checked(d, (uint32_t)idx, sqe, &s) != 0) {
            ERL_NIF_TERM why = buffer_unusable(env, d, b);
            return make_error(env, why ? why : enif_make_tuple2(env, ATOM_buffer, ATOM_lost));
        }
    }
    /* A windowed get counts once, as its caller sees it (get_sink_piece). */
    if (output != OUTPUT_GET_PIECE)
        count(&d->c.submitted, 1);
    return 0;
}

/* free(Buf): queued at once (queue_free), then sent, unless the device is
 * closed. */
void buffer_free(struct buffer_res *b)
{
    struct device *d = b->d;
    queue_free(b);
    enif_rwlock_rlock(d->life);
    if (!d->closed)
        flush_frees(d);
    enif_rwlock_runlock(d->life);
}

/* buffer_info(Buf): {Device, Type, Len, live | freed | lost}. */
ERL_NIF_TERM buffer_info(ErlNifEnv *env, struct buffer_res *b)
{
    ERL_NIF_TERM why = buffer_unusable(env, b->d, b);
    const ERL_NIF_TERM *e;
    int n;
    ERL_NIF_TERM st = !why ? ATOM_live : enif_get_tuple(env, why, &n, &e) ? e[1] : why;
    return enif_make_tuple4(env, enif_make_uint(env, b->d->id), TYPE_ATOMS[b->type],
                            enif_make_uint(env, b->len), st);
}

/* Could a get's result of `bytes` ever be held: at most the machine's
 * memory (an Erlang binary could be far larger)? put refuses a larger
 * vector with the reason get would give (on a put, the vector is in
 * memory already, so only a list of numbers could come near). */
static int host_can_hold(uint64_t bytes)
{
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    if (pages <= 0 || page <= 0)
        return 1; /* unknown: the allocation judges */
    return bytes <= (uint64_t)pages * (uint64_t)page;
}

int submit_put(ErlNifEnv *env, struct device *d, const ERL_NIF_TERM argv[], int dirty,
               ERL_NIF_TERM ref, ERL_NIF_TERM *result)
{
    struct vec v;
    /* Every way out after the lock goes through `out`, which gives back
     * the slot (and its regions) of a put that published nothing. */
    ERL_NIF_TERM fail = 0;
    int64_t idx = -1;
    int redo = 0;
    enif_rwlock_rlock(d->life);
    if (d->closed) {
        fail = make_error(env, ATOM_closed);
        goto out;
    }
    int r = parse_vector(env, argv[1], dirty, &v, result);
    if (r < 0) {
        fail = *result;
        goto out;
    }
    if (r > 0) {
        count(&d->c.dirty_submits, 1);
        redo = 1;
        goto out;
    }
    uint64_t bytes = v.len * type_bytes(v.type);
    /* What get could never answer, put refuses now, with get's reason. */
    if (!host_can_hold(bytes)) {
        fail = make_badarg(env, ATOM_too_large);
        goto out;
    }
    /* A binary already in the arena (a result, or pinned: pinned.c) is
     * named where it lies: gpud's DMA reads it, nothing is copied. */
    int in_arena = v.is_binary && bytes > 0 && vec_in_arena(d, &v);
    /* A large binary is copied in slices over the copy pool, each published
     * as soon as it is in, so gpud's copies to the device overlap the copy
     * into the arena (the pipelined put: max(copy, DMA), not their sum).
     * A list is converted element by element on this thread: one piece. */
    uint32_t parts = v.is_binary && !in_arena ? pipeline_put_parts(d, bytes) : 1;
    /* A put larger than put_window_bytes needs only its window of the
     * arena (pipeline_put_plan). A put's output is a buffer: no region. */
    struct put_plan pp;
    pipeline_put_plan(d, v.len, type_bytes(v.type), parts, &pp);
    uint64_t in_bytes = in_arena ? 0 : arena_round(pp.region);
    idx = pp.region > d->arena_max ? -2 : reserve_job(d, in_bytes, 0, parts - 1, 0);
    if (idx == -1 && parts > 1) {
        parts = 1; /* not enough free slots for the extra descriptors: one is fine */
        in_bytes = arena_round(bytes);
        idx = bytes > d->arena_max ? -2 : reserve_job(d, in_bytes, 0, 0, 0);
    }
    if (idx < 0) {
        if (idx == -1)
            count(&d->c.busy, 1);
        fail = idx == -1 ? make_error(env, ATOM_busy) : make_badarg(env, ATOM_too_large);
        goto out;
    }
    struct job *j = &d->jobs[idx];
    if (in_arena) {
        /* Keeps the binary, and so its region, alive while gpud reads it. */
        enif_make_copy(j->env, v.bin_term);
        count(&d->c.arena_inputs, 1);
    } else if (parts == 1 && !copy_vec(env, &v, region_ptr(d, &j->in))) {
        fail = make_badarg(env, enif_make_tuple2(env, ATOM_arg, enif_make_uint(env, 1)));
        goto out;
    }
    ERL_NIF_TERM buf = new_buffer(env, d, v.type, (uint32_t)v.len);
    struct buffer_res *b;
    if (!buf || !enif_get_resource(env, buf, BUFFER_RT, (void **)&b)) {
        fail = make_error(env, ATOM_enomem);
        goto out;
    }
    /* The whole buffer as one slice at byte 0 (p.u64[0]);
     * submit_put_pipelined cuts it into its parts. */
    struct ec_sqe sqe = {
        .flags = EC_FLAG_OUT_BUF,
        .in0 = in_arena ? v.addr : region_addr(&j->in),
        .in0_len = (uint32_t)v.len,
        .out = b->id,
        .out_len = (uint32_t)v.len,
    };
    if (!ref)
        ref = enif_make_ref(env);
    fail = start_job(env, d, idx, EC_CONTROL_PUT, v.type, (uint32_t)v.len, OUTPUT_PUT, buf, NULL, &sqe,
                     parts, v.bin.data, ref);
    if (!fail) {
        *result = enif_make_tuple2(env, ATOM_ok, ref);
        flush_frees(d);
    }
out:
    if (fail) {
        if (idx >= 0)
            unreserve_job(d, (uint32_t)idx);
        *result = fail;
    }
    enif_rwlock_runlock(d->life);
    return redo;
}

ERL_NIF_TERM submit_get(ErlNifEnv *env, struct buffer_res *b, ERL_NIF_TERM buf, ERL_NIF_TERM ref)
{
    struct device *d = b->d;
    enif_rwlock_rlock(d->life);
    /* A closed device is the buffer's own (b->d): the buffer is lost
     * (buffer_state), which buffer_unusable says. */
    ERL_NIF_TERM why = buffer_unusable(env, d, b);
    if (why) {
        enif_rwlock_runlock(d->life);
        return make_error(env, why);
    }
    uint64_t bytes = (uint64_t)b->len * type_bytes(b->type);
    if (!host_can_hold(bytes)) {
        enif_rwlock_runlock(d->life);
        return make_badarg(env, ATOM_too_large);
    }
    /* A large result stays in the arena as a resource binary (no copy). */
    int zero_copy = bytes >= d->zero_copy_bytes;
    int64_t idx = reserve_job(d, 0, arena_round(bytes), 0, zero_copy);
    if (idx == -2 && d->put_window_bytes > 0) {
        /* No region will ever be that large: through the window. */
        ERL_NIF_TERM r = windowed_get(env, d, b, bytes);
        enif_rwlock_runlock(d->life);
        return r;
    }
    if (idx < 0) {
        enif_rwlock_runlock(d->life);
        if (idx == -1)
            count(&d->c.busy, 1);
        return idx == -1 ? make_error(env, ATOM_busy) : make_badarg(env, ATOM_too_large);
    }
    struct job *j = &d->jobs[idx];
    j->form = b->type == EC_TYPE_F32 ? FORM_BINARY : FORM_TYPED;
    j->zero_copy = zero_copy;
    struct ec_sqe sqe = {
        .flags = EC_FLAG_IN0_BUF,
        .in0 = b->id,
        .in0_len = b->len,
        .out = region_addr(&j->out),
        .out_len = b->len,
    };
    if (!ref)
        ref = enif_make_ref(env);
    ERL_NIF_TERM res = start_job(env, d, idx, EC_CONTROL_GET, b->type, b->len, OUTPUT_KERNEL, buf,
                                 b, &sqe, 1, NULL, ref);
    if (res)
        unreserve_job(d, (uint32_t)idx);
    else
        flush_frees(d);
    enif_rwlock_runlock(d->life);
    return res ? res : enif_make_tuple2(env, ATOM_ok, ref);
}

/* ------------------------------------------------------ the windowed get -- */

/* Counts a windowed get's end once (jobs_ok, jobs_failed or
 * jobs_cancelled), if it was counted as submitted. */
static void sink_end(struct get_sink *s, uint64_t *counter)
{
    int zero = 0;
    if (__atomic_compare_exchange_n(&s->ended, &zero, 1, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE) &&
        __atomic_load_n(&s->started, __ATOMIC_ACQUIRE))
        count(counter, 1);
}

void get_sink_dtor(ErlNifEnv *env, void *obj)
{
    struct get_sink *s = obj;
    (void)env;
    if (!s->b)
        return;
    /* The caller went away before the get ended (no piece job holds the
     * sink any more either): as a get whose caller timed out. */
    sink_end(s, &s->b->d->c.jobs_cancelled);
    if (s->has_bin && !__atomic_load_n(&s->taken, __ATOMIC_ACQUIRE))
        enif_release_binary(&s->bin);
    enif_release_resource(s->b);
}

/* submit_get of a buffer no arena region can hold: a sink of its size
 * and {pieces, Sink, N}. Caller holds d->life. */
static ERL_NIF_TERM windowed_get(ErlNifEnv *env, struct device *d, struct buffer_res *b, uint64_t bytes)
{
    uint64_t piece = d->put_window_bytes / GET_WINDOW_PIECES / GET_PIECE_ALIGN * GET_PIECE_ALIGN;
    if (piece == 0)
        piece = GET_PIECE_ALIGN;
    struct get_sink *s = enif_alloc_resource(GET_SINK_RT, sizeof *s);
    if (!s)
        return make_error(env, ATOM_enomem);
    memset(s, 0, sizeof *s);
    ERL_NIF_TERM t = enif_make_resource(env, s);
    enif_release_resource(s); /* the term's now */
    /* Allocated once, here: fails (never aborts the VM) when the machine
     * has no room for it now. */
    if (!enif_alloc_binary((size_t)bytes, &s->bin))
        return make_error(env, ATOM_enomem);
    s->has_bin = 1;
    s->b = b;
    enif_keep_resource(b);
    s->bytes = bytes;
    s->piece = piece;
    s->pieces = (uint32_t)((bytes + piece - 1) / piece);
    return enif_make_tuple3(env, ATOM_pieces, t, enif_make_uint(env, s->pieces));
}

struct get_sink *get_sink(ErlNifEnv *env, ERL_NIF_TERM t)
{
    struct get_sink *s;
    return enif_get_resource(env, t, GET_SINK_RT, (void **)&s) && s->b ? s : NULL;
}

ERL_NIF_TERM get_sink_piece(ErlNifEnv *env, struct get_sink *s, ERL_NIF_TERM sink, ERL_NIF_TERM ref)
{
    struct buffer_res *b = s->b;
    struct device *d = b->d;
    /* Each piece is asked for once: a piece answered is never written
     * again, so once `copied` counts them all the result is final. */
    uint32_t k = __atomic_load_n(&s->next, __ATOMIC_ACQUIRE);
    if (k >= s->pieces || __atomic_load_n(&s->ended, __ATOMIC_ACQUIRE) ||
        !__atomic_compare_exchange_n(&s->next, &k, k + 1, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
        return enif_make_badarg(env);
    ERL_NIF_TERM fail = 0;
    int64_t idx = -1;
    enif_rwlock_rlock(d->life);
    ERL_NIF_TERM why = buffer_unusable(env, d, b);
    if (why) {
        fail = make_error(env, why);
        goto out;
    }
    uint64_t off = (uint64_t)k * s->piece;
    uint64_t n = s->bytes - off < s->piece ? s->bytes - off : s->piece;
    idx = reserve_job(d, 0, arena_round(n), 0, 0);
    if (idx < 0) {
        if (idx == -1)
            count(&d->c.busy, 1);
        fail = idx == -1 ? make_error(env, ATOM_busy) : make_badarg(env, ATOM_too_large);
        goto out;
    }
    struct job *j = &d->jobs[idx];
    j->sink = s;
    j->sink_off = off;
    uint32_t cnt = (uint32_t)(n / type_bytes(b->type));
    struct ec_sqe sqe = {
        .flags = EC_FLAG_IN0_BUF,
        .in0 = b->id,
        .in0_len = b->len,
        .out = region_addr(&j->out),
        .out_len = cnt,
    };
    sqe.p.u64[0] = off;
    fail = start_job(env, d, idx, EC_CONTROL_GET, b->type, cnt, OUTPUT_GET_PIECE, sink, b, &sqe, 1,
                     NULL, ref);
    if (!fail && k == 0) {
        __atomic_store_n(&s->started, 1, __ATOMIC_RELEASE);
        count(&d->c.submitted, 1);
        count(&d->c.get_windowed, 1);
    }
out:
    if (fail) {
        if (idx >= 0)
            unreserve_job(d, (uint32_t)idx);
        __atomic_store_n(&s->next, k, __ATOMIC_RELEASE); /* not asked for after all */
    } else {
        flush_frees(d);
    }
    enif_rwlock_runlock(d->life);
    return fail ? fail : enif_make_tuple2(env, ATOM_ok, ref);
}

void get_sink_copy(struct device *d, struct job *j)
{
    struct get_sink *s = j->sink;
    uint64_t n = (uint64_t)j->out_len * type_bytes(j->type);
    copy_bytes(s->bin.data + j->sink_off, region_ptr(d, &j->out), (size_t)n);
    __atomic_add_fetch(&s->copied, 1, __ATOMIC_ACQ_REL);
}

ERL_NIF_TERM get_sink_result(ErlNifEnv *env, struct get_sink *s, ERL_NIF_TERM outcome)
{
    struct counters *c = &s->b->d->c;
    if (outcome == ATOM_timeout) {
        sink_end(s, &c->jobs_cancelled);
        return ATOM_ok;
    }
    if (outcome != ATOM_ok) {
        sink_end(s, &c->jobs_failed);
        return ATOM_ok;
    }
    int zero = 0;
    if (__atomic_load_n(&s->copied, __ATOMIC_ACQUIRE) != s->pieces ||
        !__atomic_compare_exchange_n(&s->taken, &zero, 1, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
        return enif_make_badarg(env);
    sink_end(s, &c->jobs_ok);
    ERL_NIF_TERM bin = enif_make_binary(env, &s->bin);
    return enif_make_tuple2(env, ATOM_ok, s->b->type == EC_TYPE_F32
                                              ? bin
                                              : enif_make_tuple2(env, TYPE_ATOMS[s->b->type], bin));
}
