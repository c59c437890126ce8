/*
 * shm.h: the OS plumbing of one device: the sealed memfd that holds the
 * header, rings and arena, the two eventfds, and the private AF_UNIX socket
 * over which they are handed to gpud (see the handshake in erlcuda_ring.h).
 * Plain C with errno-style results; no Erlang terms here.
 */
#ifndef ERLCUDA_SHM_H
#define ERLCUDA_SHM_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "erlcuda_ring.h"

struct shm {
    int memfd;
    uint8_t *base;        /* mapping of the whole memfd */
    uint64_t total_bytes;
    struct ec_header *hdr;
    struct ec_sqe *sq;
    struct ec_cqe *cq;
    uint8_t *arena;
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
void shm_destroy(struct shm *s);
/* Zeroes the ring counters and gpud's SQ flags; the stats stay, and so does
 * cq_flags: the completion thread may be asleep with EC_NEED_WAKEUP set, and
 * clearing it would make the next gpud skip the wake-up it needs. Only while
 * no gpud runs. */
void shm_reset_rings(struct shm *s);

/* Waits up to timeout_ms for gpud to connect; a peer whose pid is not
 * expect_pid or whose uid is not ours is dropped and waiting goes on. Then
 * sends ec_hello with the memfd and eventfds. Returns 0 or -errno
 * (-ETIMEDOUT, -EPERM when only strangers called). */
int shm_accept(struct shm *s, uint32_t device, pid_t expect_pid, int timeout_ms);
/* Closes the connection to the current gpud, if any. */
void shm_disconnect(struct shm *s);

/* Adds 1 to an eventfd, ignoring EAGAIN (the counter is then already set). */
void shm_signal(int efd);
/* Reads and discards an eventfd's counter. */
void shm_drain(int efd);

#endif
