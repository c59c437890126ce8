/*
 * prefault.h: faults the arena's pages in ahead of gpud, on a thread of its
 * own.
 *
 * gpud on CUDA registers every arena segment with the driver
 * (cuMemHostRegister) before it can serve it. On a fresh memfd most of that
 * time is the kernel allocating and zeroing the pages (on an H200 machine
 * 256 MiB took ~130 ms cold and 25-43 ms when the pages were already
 * resident, a gpud restart). The VM opens the device before it spawns gpud,
 * and gpud spends ~220 ms in cuInit and context creation before it
 * registers: this thread faults the pages in meanwhile, through the VM's
 * own mapping of the same memfd, so that gpud only pins resident pages.
 *
 * Only with the app env prefault_arena (off by default): gpud now populates
 * the pages itself while the driver starts, and the two at once slowed
 * gpud's cuInit on the H200 (116-126 ms against 93-97; the start to ready
 * 229-250 ms against 206-208 without this thread). It remains for kernels
 * before 5.14, where gpud's madvise fails.
 *
 * madvise(MADV_POPULATE_WRITE) (Linux 5.14) where the kernel has it, else a
 * read of one byte per page (a read fault on a shared memfd mapping
 * allocates the page too). Neither changes a byte, so it runs while the NIF
 * and gpud use the arena. Ranges are done in chunks of PREFAULT_CHUNK,
 * checking for a stop between them: prefault_stop waits for one chunk at
 * most (well under a millisecond), and must be called before the ranges are
 * unmapped. Plain pthreads: no Erlang terms here (prefault_test.c runs it
 * outside a VM).
 */
#ifndef ERLCUDA_PREFAULT_H
#define ERLCUDA_PREFAULT_H

#include <pthread.h>
#include <stdint.h>

#include "erlcuda_ring.h"

#define PREFAULT_CHUNK (UINT64_C(1) << 20)

struct prefault {
    pthread_mutex_t mx;
    pthread_cond_t cv;
    pthread_t tid;
    int started; /* set by prefault_start, cleared by prefault_stop */
    int stop;    /* under mx, and read __atomic between chunks */
    /* Ranges in the order given (segments only ever come, so at most one
     * per segment); `next` is the first not started yet. Under mx. */
    struct { uint8_t *base; uint64_t bytes; } q[EC_MAX_SEGMENTS];
    uint32_t n, next;
    /* __atomic, chunk by chunk: bytes faulted in (or found resident), and
     * the time spent on them. */
    uint64_t done_bytes, busy_ns;
    int touch; /* MADV_POPULATE_WRITE refused: touch pages (the thread's) */
};

/* Starts the thread, idle until prefault_add. Returns 0 or -errno (then
 * nothing was started and the other calls do nothing). */
int prefault_start(struct prefault *p);
/* Queues [base, base + bytes). Never blocks for long: takes a leaf mutex,
 * so any lock may be held. No-op unless started; never concurrent with
 * prefault_stop (the NIF: callers hold the device's life lock, read, and
 * find it open; close takes it to write). */
void prefault_add(struct prefault *p, void *base, uint64_t bytes);
/* Stops the thread and waits for it: after this no page of a queued range
 * is touched. Idempotent; no-op unless started. */
void prefault_stop(struct prefault *p);

#endif
