/*
 * shm.h: the OS plumbing of one device: the sealed memfds that hold the
 * header, rings and arena segments, the two eventfds, and the private AF_UNIX
 * socket over which they are handed to gpud (see the handshake and "Arena
 * segments" in erlcuda_ring.h). Plain C with errno-style results; no Erlang
 * terms here.
 */
#ifndef ERLCUDA_SHM_H
#define ERLCUDA_SHM_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "erlcuda_ring.h"

/* One arena segment: segment 0 lives inside the first memfd, after the rings;
 * later ones are memfds of their own, wholly arena. */
struct shm_segment {
    uint8_t *base;     /* first arena byte */
    uint64_t bytes;    /* arena bytes */
    int memfd;         /* -1 for segment 0 (its fd is shm.memfd) */
};

struct shm {
    int memfd;
    uint8_t *base;        /* mapping of the whole first memfd */
    uint64_t total_bytes;
    struct ec_header *hdr;
    struct ec_sqe *sq;
    struct ec_cqe *cq;
    struct shm_segment seg[EC_MAX_SEGMENTS];
    uint32_t nseg;
    int sq_efd;           /* VM writes, gpud reads */
    int cq_efd;           /* gpud writes, VM reads */
    int listen_fd;        /* abstract-namespace SEQPACKET listener */
    int conn_fd;          /* the connected gpud, or -1 */
    char sock_name[64];   /* without the leading NUL */
};

/* Creates, sizes, seals and maps the memfd, lays out the header, creates the
 * eventfds and the listening socket. entries must be a power of two. Returns
 * 0 or -errno; on failure everything is released. */
int shm_create(struct shm *s, uint32_t device, uint32_t entries, uint64_t arena_bytes);
/* Closes every fd; the mappings stay (arena memory may still be referenced). */
void shm_close_fds(struct shm *s);
/* Unmaps everything. After shm_close_fds. */
void shm_unmap(struct shm *s);
/* Zeroes the ring counters and gpud's SQ flags; the stats stay, and so does
 * cq_flags: the completion thread may be asleep with EC_NEED_WAKEUP set, and
 * clearing it would make the next gpud skip the wake-up it needs. Only while
 * no gpud runs. */
void shm_reset_rings(struct shm *s);

/* Adds an arena segment of `bytes` (rounded up to pages) and, when a gpud is
 * connected, sends it the segment. Returns the new index or -errno. */
int shm_add_segment(struct shm *s, uint64_t bytes);

/* Waits up to timeout_ms for gpud to connect; a peer that is neither
 * expect_pid nor a descendant of it, or whose uid is not ours, is dropped
 * and waiting goes on.
 * Returns the connected fd or -errno (-ETIMEDOUT, -EPERM when only strangers
 * called). */
int shm_accept_peer(struct shm *s, pid_t expect_pid, int timeout_ms);
/* Sends ec_hello with the memfd and eventfds, then every later segment, on
 * fd, and makes fd the connection. Returns 0 or -errno (fd is then closed). */
int shm_handover(struct shm *s, int fd, uint32_t device);
/* Closes the connection to the current gpud, if any. */
void shm_disconnect(struct shm *s);

/* Adds 1 to an eventfd, ignoring EAGAIN (the counter is then already set). */
void shm_signal(int efd);
/* Reads and discards an eventfd's counter. */
void shm_drain(int efd);

#endif
