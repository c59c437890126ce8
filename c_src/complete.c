/*
 * complete.c: completion. The completion thread drains the CQ and sends
 * {erlcuda, Ref, Result} straight to the process that called launch; no
 * Erlang server is in the path. A slot leaves INFLIGHT once, by a CAS
 * (claim_job, cancel_job): see device_state.h.
 */
#define _GNU_SOURCE
#include "device_state.h"
#include "args.h"
#include "buffers.h"
#include "complete.h"
#include "kernels.h"
#include "pipeline.h"
#include "results.h"
#include "shm.h"
#include "slot_cache.h"
#include "submit.h"

#include <errno.h>
#include <poll.h>
#include <string.h>
#include <time.h>

__thread struct last_submit last_submit;

/* Can this slot go into a thread's cache: an inline job's, nothing else
 * to free (slot_cache.h)? */
static int cacheable(const struct device *d, uint32_t idx, const struct job *j)
{
    return idx < d->inline_slots && j->ncredit == 0 && j->in.inl && j->out.inl && !j->out_taken;
}

/* Takes ownership of an in-flight job for answering it. Returns 1 when the
 * caller must send the answer, 0 when launch_sync already cancelled it (no
 * message wanted), -1 when the job is not in flight (a bogus or duplicate
 * completion: ignore it). */
static int claim_job(struct device *d, uint32_t idx, uint32_t gen)
{
    struct job *j = &d->jobs[idx];
    int expect = JOB_INFLIGHT;
    if (__atomic_compare_exchange_n(&j->state, &expect, JOB_COMPLETING, 0, __ATOMIC_ACQ_REL,
                                    __ATOMIC_ACQUIRE)) {
        if (j->gen == gen)
            return 1;
        __atomic_store_n(&j->state, JOB_INFLIGHT, __ATOMIC_RELEASE);
        return -1;
    }
    if (expect == JOB_CANCELLED &&
        __atomic_compare_exchange_n(&j->state, &expect, JOB_COMPLETING, 0, __ATOMIC_ACQ_REL,
                                    __ATOMIC_ACQUIRE)) {
        if (j->gen == gen)
            return 0;
        __atomic_store_n(&j->state, JOB_CANCELLED, __ATOMIC_RELEASE);
    }
    return -1;
}

enum cancel_result cancel_job(struct device *d, ERL_NIF_TERM ref)
{
    /* A slot is released (FREE) only after its answer was sent or handed
     * over, under this lock: not found means answered, never "not yet". */
    enum cancel_result result = CANCEL_NOT_FOUND;
    dev_lock(d);
    /* No release swaps an env out from under the refs read here. */
    slot_caches_lock_all(&d->caches);
    for (uint32_t i = 0; i < d->nslots; i++) {
        struct job *j = &d->jobs[i];
        int st = __atomic_load_n(&j->state, __ATOMIC_ACQUIRE);
        if (st == JOB_FREE || !enif_is_identical(j->ref, ref))
            continue;
        int expect = JOB_INFLIGHT;
        if (__atomic_compare_exchange_n(&j->state, &expect, JOB_CANCELLED, 0, __ATOMIC_ACQ_REL,
                                        __ATOMIC_ACQUIRE) ||
            expect == JOB_CANCELLED)
            result = CANCEL_CANCELLED;
        else
            result = CANCEL_SENDING; /* COMPLETING: its claimant answers it */
        break;
    }
    slot_caches_unlock_all(&d->caches);
    dev_unlock(d);
    return result;
}

ERL_NIF_TERM status_error(ErlNifEnv *env, int32_t status)
{
    /* Out of device memory: try later. Larger than gpud's limit: never. */
    if (status == EC_STATUS_OOM)
        return make_error(env, ATOM_oom);
    if (status == EC_STATUS_TOO_LARGE)
        return make_badarg(env, ATOM_too_large);
    ERL_NIF_TERM why = status > 0 && status < (int32_t)EC_STATUS_COUNT ? STATUS_ATOMS[status]
                                                                        : enif_make_int(env, status);
    return make_error(env, enif_make_tuple2(env, ATOM_gpud, why));
}

/* A user's job whose GPU body, run on the CPU, stopped short (gpud's
 * KERNEL_FAULT, erlcuda_ring.h): {error, {kernel_fault, #{kernel => K,
 * reason => R, block => B, thread => T}}}, K the kernel as the caller named
 * it; an out_of_bounds fault adds arg (the argument's name as its
 * signature declares it, an atom; `shared` for shared memory) and index;
 * a job run in a seeded thread order adds seed, to replay it. */
static ERL_NIF_TERM fault_error(ErlNifEnv *env, const struct job *j, const struct ec_fault *f)
{
    ERL_NIF_TERM k = j->kmod ? enif_make_tuple2(env, j->kmod, j->kname) : enif_make_uint(env, j->kernel);
    ERL_NIF_TERM why = f->reason > 0 && f->reason < EC_FAULT_COUNT ? FAULT_ATOMS[f->reason]
                                                                  : enif_make_uint(env, f->reason);
    ERL_NIF_TERM keys[7] = {ATOM_kernel, ATOM_reason, ATOM_block, ATOM_thread};
    ERL_NIF_TERM vals[7] = {k, why, enif_make_uint(env, f->block), enif_make_uint(env, f->thread)};
    size_t n = 4;
    if (f->reason == EC_FAULT_OUT_OF_BOUNDS) {
        keys[n] = ATOM_arg;
        vals[n++] = kernel_arg_name(env, j->kernel, j->kgen, f->slot);
        keys[n] = ATOM_index;
        vals[n++] = enif_make_int64(env, f->index);
    }
    if (j->seeded) {
        keys[n] = ATOM_seed;
        vals[n++] = enif_make_uint(env, j->seed);
    }
    ERL_NIF_TERM map;
    if (!enif_make_map_from_arrays(env, keys, vals, n, &map))
        map = enif_make_new_map(env);
    return make_error(env, enif_make_tuple2(env, STATUS_ATOMS[EC_STATUS_KERNEL_FAULT], map));
}

static void send_answer(struct device *d, ErlNifEnv *caller_env, ErlNifEnv *msg_env,
                        struct job *j, ERL_NIF_TERM result)
{
    if (j->output == OUTPUT_FREE) {
        enif_clear_env(msg_env); /* a free answers nobody */
        return;
    }
    ERL_NIF_TERM msg =
        enif_make_tuple3(msg_env, ATOM_erlcuda, enif_make_copy(msg_env, j->ref), result);
    /* One in PROF_SAMPLE sends of this thread is timed (profile.h). */
    static __thread uint32_t sends;
    if (++sends % PROF_SAMPLE == 0) {
        int64_t t0 = mono_ns();
        enif_send(caller_env, &j->pid, msg_env, msg);
        prof_add(&d->prof.complete[PC_SEND_SAMPLES], 1);
        prof_add(&d->prof.complete[PC_SEND_NS], (uint64_t)(mono_ns() - t0));
    } else {
        enif_send(caller_env, &j->pid, msg_env, msg);
    }
    enif_clear_env(msg_env);
}

/* Hands a large list result to the device's list converter (results.h):
 * {erlcuda_list_result, Pid, Ref, Items}. Returns 1 once sent (and clears
 * msg_env), 0 when the converter is gone: the caller then answers as
 * usual, from the same region. */
static int send_to_converter(struct device *d, ErlNifEnv *caller_env, ErlNifEnv *msg_env,
                             struct job *j, ERL_NIF_TERM items)
{
    ERL_NIF_TERM msg = enif_make_tuple4(msg_env, ATOM_erlcuda_list_result, enif_make_pid(msg_env, &j->pid),
                                        enif_make_copy(msg_env, j->ref), items);
    if (!enif_send(caller_env, &d->list_pid, msg_env, msg))
        return 0;
    count(&d->c.list_results_handed, 1);
    enif_clear_env(msg_env);
    return 1;
}

/* A control descriptor's answer: ok, {error, {module, Why}} with gpud's
 * reason from the output region, or {error, {gpud, Status}}. */
static ERL_NIF_TERM control_result(ErlNifEnv *env, struct device *d, struct job *j, int32_t status)
{
    if (status == EC_STATUS_OK)
        return ATOM_ok;
    if (status == EC_STATUS_MODULE_ERROR) {
        const char *msg = (const char *)region_ptr(d, &j->out);
        size_t n = strnlen(msg, j->out_len);
        ERL_NIF_TERM why;
        memcpy(enif_make_new_binary(env, n, &why), msg, n);
        return make_error(env, enif_make_tuple2(env, ATOM_module, why));
    }
    ERL_NIF_TERM st = status > 0 && status < (int32_t)EC_STATUS_COUNT ? STATUS_ATOMS[status]
                                                                       : enif_make_int(env, status);
    return make_error(env, enif_make_tuple2(env, ATOM_gpud, st));
}

/* A small job's wait from publish to its answer built, split by its CQE's
 * stamps (erlcuda_ring.h; 0 for every job but a small launch's): each part
 * of EC_STALL_NS or longer is counted (stats/1's job_stalls_*). A job that
 * came in while the drain that took it had begun waited nothing in the
 * queue. */
static void count_job_stalls(struct device *d, const struct ec_cqe *cqe, int64_t pub, int64_t taken,
                             int64_t built)
{
    if (cqe->drained_ns == 0 || pub == 0)
        return;
    struct counters *c = &d->c;
    int64_t drained = (int64_t)cqe->drained_ns > pub ? (int64_t)cqe->drained_ns : pub;
    int64_t done = (int64_t)cqe->done_ns > drained ? (int64_t)cqe->done_ns : drained;
    int64_t parts[4] = {drained - pub, done - drained, taken - done, built - taken};
    for (int i = 0; i < 4; i++)
        if (parts[i] < 0)
            parts[i] = 0;
    count_stall(&c->slow_jobs, &c->slow_job_ns, &c->slow_job_max_ns, (uint64_t)(built - pub));
    count_stall(&c->job_stalls_queue, &c->job_stall_ns_queue, &c->job_stall_max_ns_queue, (uint64_t)parts[0]);
    count_stall(&c->job_stalls_gpud, &c->job_stall_ns_gpud, &c->job_stall_max_ns_gpud, (uint64_t)parts[1]);
    count_stall(&c->job_stalls_cq, &c->job_stall_ns_cq, &c->job_stall_max_ns_cq, (uint64_t)parts[2]);
    count_stall(&c->job_stalls_answer, &c->job_stall_ns_answer, &c->job_stall_max_ns_answer,
                (uint64_t)parts[3]);
}

/* A job's end in the counters of jobs as their callers see them: one per
 * job, whatever number of descriptors gpud answered for it; `claim` as
 * claim_job's (0: the caller timed out and cancelled it), `ok` whether it
 * is answered {ok, _}. A free is no caller's job; a module load or unload
 * (a control) counts only when gpud refused it. */
static void count_answer(struct device *d, const struct job *j, int claim, int ok)
{
    /* A windowed get's piece: the get is counted as one job, at its end
     * (buffers.c, get_sink_result). */
    if (j->output == OUTPUT_FREE || j->output == OUTPUT_GET_PIECE)
        return;
    if (j->output == OUTPUT_CONTROL) {
        if (claim == 1 && !ok)
            count(&d->c.modules_refused, 1);
        return;
    }
    count(claim == 0 ? &d->c.jobs_cancelled : ok ? &d->c.jobs_ok : &d->c.jobs_failed, 1);
}

/* Answers the job of one CQE; sets *release to its slot once answered (or
 * cancelled), to be freed with release_jobs; leaves it alone otherwise. */
static void handle_cqe(struct device *d, ErlNifEnv *caller_env, ErlNifEnv *m,
                       const struct ec_cqe *cqe, int64_t taken, int64_t *release)
{
    uint32_t idx = (uint32_t)cqe->user_data;
    uint32_t gen = (uint32_t)(cqe->user_data >> 32);
    if (idx >= d->nslots) {
        count(&d->c.bogus_cqes, 1);
        return;
    }
    struct job *j = &d->jobs[idx];
    int32_t status = cqe->status;
    int st = __atomic_load_n(&j->state, __ATOMIC_ACQUIRE);
    uint32_t parts = __atomic_load_n(&j->parts, __ATOMIC_RELAXED);
    if ((st == JOB_INFLIGHT || st == JOB_CANCELLED) && __atomic_load_n(&j->gen, __ATOMIC_RELAXED) == gen &&
        parts > 1) {
        /* One part of a pipelined job: only the last one answers it. */
        if (status != EC_STATUS_OK) {
            int32_t ok = EC_STATUS_OK;
            __atomic_compare_exchange_n(&j->part_status, &ok, status, 0, __ATOMIC_RELAXED,
                                        __ATOMIC_RELAXED);
        }
        uint32_t left = __atomic_sub_fetch(&j->parts_left, 1, __ATOMIC_SEQ_CST);
        pipeline_part_answered(j);
        if (left > 0)
            return;
        status = __atomic_load_n(&j->part_status, __ATOMIC_RELAXED);
        if (status == EC_STATUS_OK)
            pipeline_finish(d, j, parts);
    }
    int claim = claim_job(d, idx, gen);
    if (claim < 0) {
        count(&d->c.bogus_cqes, 1);
        return;
    }
    if (j->output == OUTPUT_PUT && status != EC_STATUS_OK) {
        /* A failed put: its buffer is nobody's. Freed now rather than when
         * the caller's heap lets go of it, since some slices of a pipelined
         * put may have made it in gpud (and a free also makes gpud forget
         * the failure it keeps for the put's later slices). */
        struct buffer_res *b;
        if (enif_get_resource(j->env, j->buf_term, BUFFER_RT, (void **)&b))
            queue_free(b);
    }
    /* A free answers nobody (send_answer), so it builds no result. */
    if (claim == 1 && j->output != OUTPUT_FREE) {
        ERL_NIF_TERM result;
        int handed = 0; /* to the list converter, which answers */
        if (j->output == OUTPUT_CONTROL) {
            result = control_result(m, d, j, status);
        } else if (status == EC_STATUS_KERNEL_FAULT) {
            result = fault_error(m, j, &cqe->fault);
        } else if (status != EC_STATUS_OK) {
            result = status_error(m, status);
        } else if (j->output == OUTPUT_GET_PIECE) {
            /* Into the result before the answer says so; the region is
             * given back with the slot, as any job's. */
            get_sink_copy(d, j);
            result = ATOM_ok;
        } else if (j->out_buf) {
            /* A put, or a launch with {output, buffer}: the new buffer. */
            result = enif_make_tuple2(m, ATOM_ok, enif_make_copy(m, j->buf_term));
        } else {
            ERL_NIF_TERM items;
            handed = list_handed(m, d, j, &items) && send_to_converter(d, caller_env, m, j, items);
            /* Not sent: the region stays readable (a handed region is kept
             * by the binaries in m until m is cleared). */
            result = handed ? 0 : enif_make_tuple2(m, ATOM_ok, result_term(m, d, j));
        }
        /* Counted before the answer goes: a caller that reads stats/1 once
         * answered sees its own job there. */
        count_answer(d, j, claim, status == EC_STATUS_OK);
        /* A fault's payload sits where the stamps would (no sample). */
        if (!handed && cqe->drained_ns && status != EC_STATUS_KERNEL_FAULT)
            count_job_stalls(d, cqe, j->t_pub, taken, mono_ns());
        if (!handed)
            send_answer(d, caller_env, m, j, result);
        if (j->timed) {
            /* A timed submit's job (profile.h, round trip). */
            int64_t sent = mono_ns();
            uint64_t *p = d->prof.complete;
            prof_add(&p[PC_TRIP_SAMPLES], 1);
            prof_add(&p[PC_TRIP_GPUD_NS], (uint64_t)(taken - j->t_pub));
            prof_add(&p[PC_TRIP_ANSWER_NS], (uint64_t)(sent - taken));
        }
    }
    if (claim == 0)
        count_answer(d, j, claim, 0);
    count(&d->c.completed, 1);
    *release = idx;
}

/* A completion thread's own clear envs, swapped into the slots it frees
 * (see release_jobs). */
struct env_pool {
    ErlNifEnv *env[CQ_CHUNK];
};

/* Gives the slot the pool's clear env k and keeps its used one there, to
 * be cleared once no slot points to it (release_jobs). */
static void swap_env(struct job *j, struct env_pool *pool, uint32_t k)
{
    ErlNifEnv *used = j->env;
    j->env = pool->env[k];
    j->ref = 0;
    pool->env[k] = used;
}

/* Frees the slots of answered jobs: one hold of the lock for many, which
 * submitters contend for. With a pool, the lock is held only to swap each
 * slot's env for a clear one and push the slot: the envs come out and are
 * cleared after the unlock (the profile on the H200 measured 0.4 to 2.2 us
 * per job of release under the lock, most of it enif_clear_env, with
 * submitters waiting 4 to 65 us for the lock). cancel_job reads a slot's
 * ref under the lock, so the old env may be cleared only once no slot
 * points to it. A scheduler that reaps (to_cache) first gives small jobs'
 * slots to its own cache, without the device lock (slot_cache.h); the
 * completion thread never does, as it reserves none. Returns the
 * nanoseconds it took (profile.h). */
static int64_t release_jobs(struct device *d, const uint32_t *idx, uint32_t n, struct env_pool *pool,
                            int to_cache)
{
    if (n == 0)
        return 0;
    int64_t t0 = mono_ns();
    uint32_t swapped = 0, rest[CQ_CHUNK], nrest = 0;
    struct slot_cache *c = pool && to_cache ? slot_cache_mine(&d->caches) : NULL;
    if (c)
        slot_cache_lock(c);
    for (uint32_t i = 0; i < n; i++) {
        struct job *j = &d->jobs[idx[i]];
        if (c && c->n < d->caches.cap && cacheable(d, idx[i], j)) {
            swap_env(j, pool, swapped++);
            j->in.bytes = 0;
            j->in.inl = 0;
            j->out.inl = 0;
            clear_slot(d, j);
            c->idx[c->n++] = idx[i];
        } else {
            rest[nrest++] = idx[i];
        }
    }
    if (c)
        slot_cache_unlock(c);
    if (nrest) {
        dev_lock(d);
        for (uint32_t i = 0; i < nrest; i++) {
            struct job *j = &d->jobs[rest[i]];
            if (pool)
                swap_env(j, pool, swapped++);
            else
                enif_clear_env(j->env);
            free_slot_locked(d, rest[i]);
        }
        dev_unlock(d);
    }
    /* May run buffer and region destructors: region_dtor takes d->lock. */
    for (uint32_t i = 0; pool && i < swapped; i++)
        enif_clear_env(pool->env[i]);
    return mono_ns() - t0;
}

/* Takes up to CQ_CHUNK entries off the CQ into out (gpud gets their room at
 * once). Caller holds cq_lock. A hostile tail can claim at most nslots
 * entries: more cannot be legitimate. Sets *more when entries are left. */
static uint32_t grab_cqes(struct device *d, struct ec_cqe *out, uint32_t max, int *more)
{
    struct ec_header *h = d->shm.hdr;
    uint32_t head = __atomic_load_n(&h->cq_head, __ATOMIC_RELAXED);
    uint32_t tail = __atomic_load_n(&h->cq_tail, __ATOMIC_ACQUIRE);
    uint32_t avail = tail - head;
    if (avail > d->nslots) {
        count(&d->c.bogus_cqes, avail - d->nslots);
        avail = d->nslots;
    }
    uint32_t n = avail < max ? avail : max;
    for (uint32_t i = 0; i < n; i++)
        memcpy(&out[i], &d->shm.cq[(head + i) & (d->nslots - 1)], sizeof out[i]);
    __atomic_store_n(&h->cq_head, head + n, __ATOMIC_RELEASE);
    *more = avail > n;
    return n;
}

/* Answers n grabbed entries and frees their slots. */
static void answer_chunk(struct device *d, ErlNifEnv *caller_env, ErlNifEnv *m,
                         const struct ec_cqe *cqes, uint32_t n, struct env_pool *pool)
{
    uint32_t done[CQ_CHUNK], ndone = 0;
    int64_t t0 = mono_ns();
    for (uint32_t i = 0; i < n; i++) {
        int64_t idx = -1;
        handle_cqe(d, caller_env, m, &cqes[i], t0, &idx);
        if (idx >= 0)
            done[ndone++] = (uint32_t)idx;
    }
    /* A scheduler's reap (caller_env) may keep slots in its cache. */
    int64_t released = release_jobs(d, done, ndone, pool, caller_env != NULL);
    uint64_t *p = d->prof.complete;
    prof_add(&p[PC_DRAINS], 1);
    prof_add(&p[PC_CQES], n);
    int64_t took = mono_ns() - t0;
    prof_add(&p[PC_ANSWER_NS], (uint64_t)(took - released));
    prof_add(&p[PC_RELEASE_NS], (uint64_t)released);
    count_stall(&d->c.answer_stalls, &d->c.answer_stall_ns, &d->c.answer_stall_max_ns, (uint64_t)took);
}

/* Consumes every CQE present and answers their jobs. Caller holds cq_lock
 * (close and reset; the completion threads use serve_cq). */
uint32_t drain_cq(struct device *d, ErlNifEnv *caller_env)
{
    struct ec_cqe cqes[CQ_CHUNK];
    uint32_t total = 0;
    int more = 1;
    while (more) {
        uint32_t n = grab_cqes(d, cqes, CQ_CHUNK, &more);
        if (n == 0)
            break;
        answer_chunk(d, caller_env, d->msg_env, cqes, n, NULL);
        total += n;
    }
    return total;
}

static int cq_pending(struct device *d)
{
    struct ec_header *h = d->shm.hdr;
    return __atomic_load_n(&h->cq_tail, __ATOMIC_ACQUIRE) !=
           __atomic_load_n(&h->cq_head, __ATOMIC_RELAXED);
}

/* How often queued frees that found no slot or arena are tried again
 * while the completion thread sleeps (wait_cq). */
#define FREE_RETRY_MS 10

/* Waits for completions: spins for spin_us (the next job of a caller that
 * just got its answer usually follows within microseconds), and for up to
 * busy_spin_us while jobs are in flight (a GPU job of tens of microseconds
 * then costs no eventfd write in gpud and no thread wake-up here: ~10 us of
 * a one-in-flight round trip); then sleeps on the CQ eventfd under the
 * NEED_WAKEUP protocol of erlcuda_ring.h. */
static void wait_cq(struct device *d)
{
    struct ec_header *h = d->shm.hdr;
    int64_t start = mono_ns();
    int64_t idle_until = start + (int64_t)d->spin_us * 1000;
    int64_t busy_until = start + (int64_t)d->busy_spin_us * 1000;
    for (;;) {
        for (int i = 0; i < 64; i++) {
            if (cq_pending(d) || __atomic_load_n(&d->stop, __ATOMIC_RELAXED))
                return;
            cpu_relax();
        }
        int64_t now = mono_ns();
        if (now >= idle_until &&
            (now >= busy_until || __atomic_load_n(&d->in_flight, __ATOMIC_RELAXED) == 0))
            break;
    }
    __atomic_fetch_or(&h->cq_flags, EC_NEED_WAKEUP, __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    if (!cq_pending(d)) {
        struct pollfd p[2] = {{.fd = d->shm.cq_efd, .events = POLLIN},
                              {.fd = d->ctl_efd, .events = POLLIN}};
        /* Frees still queued here are ones a flush could not send (no
         * free slot, or a full arena): they wait for a completion, which
         * a scheduler may answer (reap_cq) without waking this thread.
         * So while any is queued the sleep is bounded and the flush tried
         * again; with none queued, only an eventfd ends it. */
        int timeout = __atomic_load_n(&d->nfreeq, __ATOMIC_ACQUIRE) > 0 ? FREE_RETRY_MS : -1;
        count(&d->c.cq_sleeps, 1);
        while (poll(p, 2, timeout) < 0 && errno == EINTR)
            ;
        if (p[0].revents & POLLIN)
            shm_drain(d->shm.cq_efd);
        if (p[1].revents & POLLIN)
            shm_drain(d->ctl_efd); /* frees queued (stop is seen by the flag) */
    }
    __atomic_fetch_and(&h->cq_flags, ~EC_NEED_WAKEUP, __ATOMIC_RELAXED);
}

static int pool_init(struct env_pool *pool)
{
    for (uint32_t i = 0; i < CQ_CHUNK; i++)
        if (!(pool->env[i] = enif_alloc_env()))
            return -1;
    return 0;
}

static void pool_free(struct env_pool *pool)
{
    for (uint32_t i = 0; i < CQ_CHUNK; i++)
        if (pool->env[i])
            enif_free_env(pool->env[i]);
}

/* Takes up to max entries off the CQ (waiting for cq_lock, or, with
 * try_only, only if nobody holds it) and answers them outside cq_lock
 * under the read side of d->drain, which reset takes for writing: it fails
 * the jobs in flight only once no thread holds entries it took. Returns how
 * many it answered. */
static uint32_t take_and_answer(struct device *d, ErlNifEnv *caller_env, ErlNifEnv *m,
                                struct env_pool *pool, uint32_t max, int try_only)
{
    struct ec_cqe cqes[CQ_CHUNK];
    int more;
    if (try_only) {
        if (enif_mutex_trylock(d->cq_lock) != 0)
            return 0;
    } else {
        enif_mutex_lock(d->cq_lock);
    }
    uint32_t n = grab_cqes(d, cqes, max, &more);
    if (n)
        enif_rwlock_rlock(d->drain);
    enif_mutex_unlock(d->cq_lock);
    if (n) {
        answer_chunk(d, caller_env, m, cqes, n, pool);
        enif_rwlock_runlock(d->drain);
    }
    return n;
}

/* The completion thread's work: chunks of CQEs until the CQ is empty
 * (schedulers reap at the same time, reap_cq). */
static void serve_cq(struct device *d, ErlNifEnv *m, struct env_pool *pool)
{
    while (take_and_answer(d, NULL, m, pool, CQ_CHUNK, 0) > 0)
        ;
}

/* A scheduler thread's clear envs and message env for reap_cq. Answers
 * are built on scheduler threads because there they scale: on the H200,
 * one completion thread spent 3.1 us per answer, and four spent 7.8 to
 * 13.5 us each (enif_send 1.9 to 2.7 us) for hardly more jobs/s. The erts
 * allocators keep an instance per scheduler, while all other threads share
 * one behind a lock, which is the likely contention. Allocated on a
 * thread's first reap and kept for the thread's life (65 envs per
 * scheduler). */
static __thread struct env_pool *reap_pool;
static __thread ErlNifEnv *reap_msg_env;

void reap_cq(struct device *d, ErlNifEnv *caller_env)
{
    if (!cq_pending(d))
        return;
    if (!reap_msg_env) {
        struct env_pool *pool = enif_alloc(sizeof *pool);
        ErlNifEnv *m = enif_alloc_env();
        if (pool)
            memset(pool, 0, sizeof *pool);
        if (!pool || !m || pool_init(pool) < 0) {
            /* Nothing kept half made: the completion thread answers. */
            if (pool) {
                pool_free(pool);
                enif_free(pool);
            }
            if (m)
                enif_free_env(m);
            return;
        }
        reap_pool = pool;
        reap_msg_env = m;
    }
    /* Never wait for the CQ: whoever holds it is answering. */
    uint32_t n = take_and_answer(d, caller_env, reap_msg_env, reap_pool, REAP_MAX, 1);
    if (n) {
        count(&d->c.reaped, n);
        enif_consume_timeslice(caller_env, (int)(n * 100 / REAP_MAX / 4 + 1));
    }
}

/* Has the job of slot j, generation gen, been answered? Its answer is sent
 * before its slot is freed, and a slot is reused (gen changes) only after. */
static int answered(struct job *j, uint32_t gen)
{
    return __atomic_load_n(&j->state, __ATOMIC_ACQUIRE) == JOB_FREE ||
           __atomic_load_n(&j->gen, __ATOMIC_RELAXED) != gen;
}

ERL_NIF_TERM await_spin(ErlNifEnv *env, struct device *d, ERL_NIF_TERM ref)
{
    struct last_submit ls = last_submit;
    last_submit.d = NULL;
    ErlNifPid self;
    /* Not the awaited job of this process on this device (another process
     * submitted on this thread since, or this one moved to another
     * scheduler between its submit and here). */
    if (ls.d != d || d->sync_spin_us == 0 || !enif_self(env, &self) ||
        enif_compare_pids(&self, &ls.pid) != 0 || enif_hash(ERL_NIF_INTERNAL_HASH, ref, 0) != ls.ref_hash)
        return ATOM_waiting;
    enif_rwlock_rlock(d->life);
    if (d->closed) {
        enif_rwlock_runlock(d->life);
        return ATOM_waiting;
    }
    count(&d->c.sync_spins, 1);
    struct job *j = &d->jobs[ls.idx];
    int64_t until = mono_ns() + (int64_t)d->sync_spin_us * 1000;
    int done = 0;
    for (;;) {
        for (int i = 0; i < 32 && !(done = answered(j, ls.gen)); i++)
            cpu_relax();
        if (done || __atomic_load_n(&d->in_flight, __ATOMIC_RELAXED) > SYNC_SPIN_MAX_IN_FLIGHT ||
            mono_ns() >= until)
            break;
        reap_cq(d, env);
    }
    enif_rwlock_runlock(d->life);
    if (done)
        count(&d->c.sync_spin_answers, 1);
    return done ? ATOM_answered : ATOM_waiting;
}

/* Publishes queued buffer frees (garbage collection's, which wakes this
 * thread through ctl_efd) unless the device is closing: close holds life
 * (write) while it stops this thread, so only a try. */
static void thread_flush_frees(struct device *d)
{
    if (__atomic_load_n(&d->nfreeq, __ATOMIC_ACQUIRE) == 0 || enif_rwlock_tryrlock(d->life) != 0)
        return;
    flush_frees(d);
    enif_rwlock_runlock(d->life);
}

/* Waits on the CQ (spinning, then its eventfd) and answers what the
 * schedulers' submits leave (reap_cq). */
static void *completion_thread(void *arg)
{
    struct device *d = arg;
    struct env_pool envs = {{0}};
    /* Without clear envs to swap in, release clears under the lock. */
    struct env_pool *pool = pool_init(&envs) == 0 ? &envs : NULL;
    while (!__atomic_load_n(&d->stop, __ATOMIC_ACQUIRE)) {
        thread_flush_frees(d);
        if (!cq_pending(d)) {
            wait_cq(d);
            continue;
        }
        serve_cq(d, d->msg_env, pool);
    }
    pool_free(&envs);
    return NULL;
}

int start_completion_thread(struct device *d)
{
    ErlNifThreadOpts *o = enif_thread_opts_create("erlcuda.completion");
    int err = enif_thread_create("erlcuda.completion", &d->thread, completion_thread, d, o);
    enif_thread_opts_destroy(o);
    if (err == 0)
        d->thread_started = 1;
    return err;
}

void stop_completion_thread(struct device *d)
{
    if (!d->thread_started)
        return;
    __atomic_store_n(&d->stop, 1, __ATOMIC_RELEASE);
    shm_signal(d->ctl_efd);
    enif_thread_join(d->thread, NULL);
    d->thread_started = 0;
}

/* Answers every job still in flight with {error, Reason}. The caller holds
 * cq_lock (or the completion thread is gone), so no CQE races this, and
 * d->lock, so no submit publishes until the rings are consistent again. */
void fail_in_flight_locked(struct device *d, ErlNifEnv *caller_env, ERL_NIF_TERM reason)
{
    ErlNifEnv *m = enif_alloc_env();
    for (uint32_t i = 0; i < d->nslots; i++) {
        struct job *j = &d->jobs[i];
        int st = __atomic_load_n(&j->state, __ATOMIC_ACQUIRE);
        if (st == JOB_FREE)
            continue;
        int claim = claim_job(d, i, j->gen);
        if (claim < 0)
            continue;
        if (j->output != OUTPUT_CONTROL)
            count_answer(d, j, claim, 0);
        if (claim == 1)
            send_answer(d, caller_env, m, j, make_error(m, enif_make_copy(m, reason)));
        release_job_locked(d, i);
        count(&d->c.failed_by_reset, 1);
    }
    enif_free_env(m);
}
