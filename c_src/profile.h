/*
 * profile.h: where the VM side's time goes. The GPU machines have no perf,
 * so the NIF times its own paths:
 *
 *   submit      one in PROF_SAMPLE submits of each scheduler is timed in
 *               phases (parse, reserve, copy, publish) and the waits for the
 *               device lock inside it;
 *   completion  every drain of the CQ is timed (answering, releasing slots),
 *               and one in PROF_SAMPLE answers' enif_send;
 *   round trip  a timed submit's job is stamped when its descriptor is
 *               published; the thread that takes its CQE adds the time
 *               since (gpud's side: pick-up, launch, GPU, CQE) and the
 *               time until its answer is sent. With the caller's own clock
 *               around launch and receive, that splits a one-in-flight
 *               round trip into submit, gpud, answer and the rest (the
 *               caller's wake-up and receive): erlcuda_bench:latency_split/0.
 *
 * erlcuda:stats/1 carries the sums as prof_* fields; bench/erlcuda_bench.erl
 * (profile/0) turns them into nanoseconds per job beside msacc. Sampling
 * keeps the cost to two clock reads per PROF_SAMPLE jobs on the submit path.
 * The submit sums and the completion sums sit on their own cache lines: a
 * counter written by every scheduler next to one the completion thread
 * writes would itself be the contention this is meant to find.
 */
#ifndef ERLCUDA_PROFILE_H
#define ERLCUDA_PROFILE_H

#include <stdint.h>
#include <time.h>

#define PROF_SAMPLE 64u

/* The sums, X(index, stats key): stats/1 reports each under its key. */
#define PROF_SUBMIT(X)                                                                          \
    X(PS_SAMPLES, prof_submit_samples)  /* submits timed */                                    \
    X(PS_TOTAL_NS, prof_submit_ns)      /* the whole submit NIF call, entry to {ok, Ref} */    \
    X(PS_PARSE_NS, prof_parse_ns)       /* parse_args */                                       \
    X(PS_RESERVE_NS, prof_reserve_ns)   /* reserve_job (slot and regions, under the lock) */   \
    X(PS_COPY_NS, prof_copy_ns)         /* inputs into the arena, the job's terms */           \
    X(PS_PUBLISH_NS, prof_publish_ns)   /* the descriptor onto the SQ and the wake-up */       \
    X(PS_LOCKS, prof_locks)             /* dev_lock calls of timed submits */                  \
    X(PS_LOCK_WAITS, prof_lock_waits)   /* of those, the ones that found it held */            \
    X(PS_LOCK_WAIT_NS, prof_lock_wait_ns) /* and how long they waited */

#define PROF_COMPLETE(X)                                                                        \
    X(PC_DRAINS, prof_drains)           /* CQ drains with at least one entry */                \
    X(PC_CQES, prof_cqes)               /* entries drained */                                  \
    X(PC_ANSWER_NS, prof_answer_ns)     /* handling the entries: results as terms, enif_send */ \
    X(PC_RELEASE_NS, prof_release_ns)   /* freeing the slots (under the device lock) */        \
    X(PC_SEND_SAMPLES, prof_send_samples) /* sampled enif_send calls */                        \
    X(PC_SEND_NS, prof_send_ns)         /* their time */                                       \
    X(PC_TRIP_SAMPLES, prof_trip_samples) /* answered jobs of timed submits */                 \
    X(PC_TRIP_GPUD_NS, prof_trip_gpud_ns) /* from publish to their CQE being taken */          \
    X(PC_TRIP_ANSWER_NS, prof_trip_answer_ns) /* from their CQE taken to the answer sent */

#define PROF_ENUM(NAME, KEY) NAME,
enum prof_submit { PROF_SUBMIT(PROF_ENUM) PS_COUNT };
enum prof_complete { PROF_COMPLETE(PROF_ENUM) PC_COUNT };
#undef PROF_ENUM

/* Padding, not __attribute__((aligned(64))): struct device lives in an
 * enif_alloc_resource block, which is only 8-byte aligned, and an
 * over-aligned struct lets the compiler use aligned vector stores on it (a
 * crash in nif_open on the H200 run of 2026-12-03). 64 bytes of padding on
 * each side keep the two groups off each other's cache lines and off their
 * neighbours' whatever the block's alignment. */
struct prof {
    uint64_t pad0[8];
    uint64_t submit[PS_COUNT];
    uint64_t pad1[8];
    uint64_t complete[PC_COUNT];
    uint64_t pad2[8];
};

/* Set by a scheduler thread for the one submit it times (PROF_SAMPLE). */
extern __thread int prof_timing;

/* The monotonic clock in nanoseconds: the one clock of the NIF (the
 * profile, the completion thread's spinning, the pre-fault's counter). */
static inline int64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Starts timing this submit when it is this thread's PROF_SAMPLE-th. */
static inline int prof_begin(void)
{
    static __thread uint32_t n;
    prof_timing = (++n % PROF_SAMPLE) == 0;
    return prof_timing;
}

static inline void prof_add(uint64_t *c, uint64_t v) { __atomic_add_fetch(c, v, __ATOMIC_RELAXED); }

#endif
