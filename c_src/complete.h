/* complete.h: completion (complete.c). */
#ifndef ERLCUDA_COMPLETE_H
#define ERLCUDA_COMPLETE_H

#include "device_state.h"


/* Starts the device's completion thread. Returns 0 or an errno value. */
int start_completion_thread(struct device *d);
/* Stops it and waits for it, if it runs. */
void stop_completion_thread(struct device *d);
/* Consumes every CQE present and answers their jobs. Caller holds cq_lock
 * (or the completion thread is gone). Returns the CQEs consumed. */
uint32_t drain_cq(struct device *d, ErlNifEnv *caller_env);
/* Answers up to REAP_MAX completed jobs on the calling scheduler thread
 * (with its own erts allocator instance), if the CQ has some and nobody
 * else is taking them. Called by submits; the caller holds d->life (read). */
void reap_cq(struct device *d, ErlNifEnv *caller_env);
/* The {error, _} answer of a gpud status other than OK. */
ERL_NIF_TERM status_error(ErlNifEnv *env, int32_t status);

/* The last small job this scheduler thread submitted with the caller's
 * reference (launch_sync's): set by a submit that published one inline job,
 * cleared by any other submit. ref_hash tells await_spin it is the job
 * awaited: an entry left by a job whose await ran on another thread (its
 * process moved) must not be spun for. */
struct last_submit {
    struct device *d;
    uint32_t idx, gen;
    ErlNifPid pid;
    ErlNifUInt64 ref_hash;
};
extern __thread struct last_submit last_submit;
/* Jobs in flight on the device above which await_spin does not spin: the
 * caller's scheduler is then better spent on other processes. */
#define SYNC_SPIN_MAX_IN_FLIGHT 2u
/* await_spin(Handle, Ref) -> answered | waiting. Spins on the calling
 * scheduler, up to the device's sync_spin_us, until the job the calling
 * process just submitted with reference Ref (last_submit) is answered,
 * taking CQEs itself meanwhile: the answer is then in the caller's mailbox
 * without a completion thread's enif_send waking a sleeping scheduler. */
ERL_NIF_TERM await_spin(ErlNifEnv *env, struct device *d, ERL_NIF_TERM ref);
/* Answers every job still in flight with {error, Reason}. The caller holds
 * cq_lock (or the completion thread is gone), and d->lock. */
void fail_in_flight_locked(struct device *d, ErlNifEnv *caller_env, ERL_NIF_TERM reason);
/* What cancel_job found. */
enum cancel_result {
    CANCEL_CANCELLED, /* in flight (or cancelled before): no answer will be sent */
    CANCEL_SENDING,   /* claimed by whoever answers it: the answer is being built
                       * and sent, or handed to the list converter (results.h) */
    CANCEL_NOT_FOUND  /* no job of this ref: answered already (its message sent,
                       * or handed to the list converter), or never one */
};
/* Cancels the job in flight whose ref is `ref`. */
enum cancel_result cancel_job(struct device *d, ERL_NIF_TERM ref);

#endif
