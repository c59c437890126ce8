/*
 * erlcuda_ring.h: the one definition of the memory shared by the VM and gpud.
 *
 * gpud mirrors this file in gpud/src/layout.rs; `cargo test -p gpud layout`
 * compiles a probe against this header and proves the two agree (offsets,
 * sizes and every constant below).
 *
 * One memfd per device holds, in order:
 *
 *   [ ec_header (EC_HEADER_BYTES) | SQ: sq_entries x ec_sqe | CQ: cq_entries x ec_cqe | arena ]
 *
 * Ownership
 *   - The VM (the NIF) creates the memfd, writes the immutable part of the
 *     header once, and owns the arena: it allocates a region per job and frees
 *     it when the job's completion has been handled.
 *   - gpud never allocates; it reads and writes only arena regions named by a
 *     descriptor, after validating them. Everything gpud reads from here is
 *     untrusted input, and everything the VM reads back (CQEs, stats) is too.
 *
 * Rings: single producer, single consumer, io_uring style
 *   - head and tail are free-running u32 counters; index = counter & (entries-1);
 *     entries is a power of two; the ring is full when tail - head == entries.
 *   - SQ: producer = the VM (its submitters serialise on a mutex in the NIF),
 *     consumer = gpud. CQ: producer = gpud, consumer = the VM's completion
 *     thread.
 *   - Producer: write the entry, then STORE-RELEASE tail.
 *     Consumer: LOAD-ACQUIRE tail, read entries up to it, then STORE-RELEASE
 *     head (so the producer never overwrites an entry still being read).
 *   - Each counter and each flags word sits on its own cache line so the two
 *     sides never write the same line.
 *
 * Sleeping and waking (NEED_WAKEUP), the same in both directions
 *   consumer, after spinning for a bounded time on an empty ring:
 *       flags |= EC_NEED_WAKEUP;  full fence (seq_cst);
 *       if (tail != head) { flags &= ~EC_NEED_WAKEUP; continue; }   // re-check
 *       block on the ring's eventfd; on waking clear EC_NEED_WAKEUP
 *   producer, after publishing entries:
 *       store-release tail;  full fence (seq_cst);
 *       if (flags & EC_NEED_WAKEUP) write(eventfd, 1)
 *   The two full fences make "consumer sees the new tail" or "producer sees
 *   the flag" certain, so no wake-up is lost (Dekker's argument). A spurious
 *   wake-up costs one empty poll and nothing else.
 *   SQ eventfd: written by the VM, read by gpud. CQ eventfd: the reverse.
 *
 * Completions never overflow: the VM caps jobs in flight at cq_entries (and
 * sq_entries <= cq_entries is enforced at creation), so gpud always finds room
 * in the CQ for every job it took from the SQ.
 *
 * Handshake (AF_UNIX SOCK_SEQPACKET, abstract name passed to gpud as argv;
 * nothing is created in the file system or /dev/shm)
 *   1. gpud connects; the VM checks SO_PEERCRED: the pid must be the port's OS
 *      pid and the uid the VM's own. gpud checks the VM's uid likewise.
 *   2. The VM sends one ec_hello with SCM_RIGHTS [memfd, sq eventfd, cq eventfd].
 *      The memfd is sealed with F_SEAL_SHRINK | F_SEAL_SEAL before it is sent.
 *   3. gpud maps the memfd, checks magic, ABI version and every size against
 *      fstat, then prints "ready <backend> <name>" on stdout.
 *   The connection stays open; gpud exits when it, or its stdin, closes.
 *
 * Arena segments (growth)
 *   The arena starts as segment 0 (inside the first memfd). When it runs
 *   short the VM creates another sealed memfd, segment i (1 <= i <
 *   EC_MAX_SEGMENTS), wholly arena, and sends one ec_segment message with
 *   SCM_RIGHTS [memfd] on the handshake connection BEFORE it publishes any
 *   descriptor that names the segment; a new gpud receives every live segment
 *   the same way right after the hello. So gpud finds the message already
 *   queued on the socket whenever a descriptor names a segment it has not
 *   mapped yet: it reads pending segment messages then (and whenever poll
 *   says the socket is readable), maps them (the cuda backend registers
 *   them), and only answers OUT_OF_BOUNDS if the segment is still unknown.
 *   Segments are never removed while the VM lives.
 */
#ifndef ERLCUDA_RING_H
#define ERLCUDA_RING_H

#include <stdint.h>

#define EC_MAGIC UINT64_C(0x474e495241445543) /* "CUDARING" little-endian */
#define EC_ABI_VERSION 2u
#define EC_CACHELINE 64u
#define EC_HEADER_BYTES 4096u
/* Arena regions start on this boundary: whole cache lines for the CPU and
 * aligned, coalesced loads for the GPU. */
#define EC_ARENA_ALIGN 256u
#define EC_NEED_WAKEUP 1u
#define EC_MAX_SEGMENTS 64u
#define EC_SEGMENT_MAGIC UINT64_C(0x544e454d47455343) /* "CSEGMENT" little-endian */

/* ec_sqe.flags: everything else must be 0. EC_FLAG_FAULT makes a gpud built
 * with the `fault-injection` feature fault the device on purpose (the test of
 * crash isolation); any other gpud refuses it with BAD_FLAGS. */
#define EC_FLAG_FAULT (1u << 31)

/* Kernels: the one table. X(NAME, id, erlang_atom, vector_inputs) */
#define EC_KERNELS(X)              \
    X(VECTOR_ADD, 1, vector_add, 2)  \
    X(REDUCE, 2, reduce, 1)          \
    X(DOT_PRODUCT, 3, dot_product, 2) \
    X(MATMUL, 4, matmul, 2)

enum ec_kernel {
#define EC_KERNEL_ENUM(NAME, ID, ATOM, NIN) EC_KERNEL_##NAME = ID,
    EC_KERNELS(EC_KERNEL_ENUM)
#undef EC_KERNEL_ENUM
    EC_KERNEL_COUNT = 5 /* one past the largest id */
};

/* Completion status: 0 is success, everything else names why gpud refused or
 * failed a job. X(NAME, code, erlang_atom) */
#define EC_STATUSES(X)                  \
    X(OK, 0, ok)                        \
    X(BAD_KERNEL, 1, bad_kernel)        \
    X(BAD_FLAGS, 2, bad_flags)          \
    X(OUT_OF_BOUNDS, 3, out_of_bounds)  \
    X(BAD_SHAPE, 4, bad_shape)          \
    X(OVERLAP, 5, overlap)              \
    X(MISALIGNED, 6, misaligned)        \
    X(DEVICE_ERROR, 7, device_error)

enum ec_status {
#define EC_STATUS_ENUM(NAME, CODE, ATOM) EC_STATUS_##NAME = CODE,
    EC_STATUSES(EC_STATUS_ENUM)
#undef EC_STATUS_ENUM
    EC_STATUS_COUNT = 8
};

/* An arena address: segment index in the top 16 bits, byte offset inside the
 * segment below. Only segment 0 exists today; the split leaves room for arena
 * segments added later without changing the descriptor. */
#define EC_ADDR_SEGMENT_SHIFT 48u
#define EC_ADDR_OFFSET_MASK ((UINT64_C(1) << EC_ADDR_SEGMENT_SHIFT) - 1)

/* A submission: 64 bytes, one cache line. Lengths count f32 elements. */
struct ec_sqe {
    uint64_t user_data; /* echoed in the CQE; opaque to gpud */
    uint32_t kernel;    /* enum ec_kernel */
    uint32_t flags;     /* must be 0 */
    uint64_t in0;       /* arena address of input 0 */
    uint64_t in1;       /* arena address of input 1 (0 when unused) */
    uint64_t out;       /* arena address of the output */
    uint32_t in0_len;
    uint32_t in1_len;
    uint32_t out_len;
    uint32_t m, n, k; /* matmul: A is m x k, B is k x n, out is m x n */
};

/* A completion: 16 bytes. */
struct ec_cqe {
    uint64_t user_data;
    int32_t status; /* enum ec_status */
    uint32_t batch; /* how many jobs of this kernel shared the launch */
};

#define EC_BATCH_HIST_BUCKETS 16u /* bucket i counts batches of size [2^i, 2^(i+1)) */

/* Written by gpud only (relaxed stores), read by the VM for stats/1. Never
 * reset by a ring reset, so the counts run across gpud restarts. */
struct ec_stats {
    uint64_t jobs_ok;
    uint64_t jobs_failed;
    uint64_t batches;        /* drains of the SQ that found work */
    uint64_t launches;       /* backend calls: one per kernel per batch */
    uint64_t bad_descriptors;
    uint64_t max_batch;
    uint64_t sleeps;         /* times gpud blocked on the SQ eventfd */
    uint64_t batch_hist[EC_BATCH_HIST_BUCKETS];
    uint64_t work_ns;        /* time spent draining, launching and answering
                                (not waiting): gpud's load */
};

struct ec_header {
    /* Immutable after creation (written by the VM before the handshake). */
    uint64_t magic;
    uint32_t abi_version;
    uint32_t header_bytes;
    uint32_t sqe_bytes;
    uint32_t cqe_bytes;
    uint32_t sq_entries;
    uint32_t cq_entries;
    uint64_t sq_offset;
    uint64_t cq_offset;
    uint64_t arena_offset;
    uint64_t arena_bytes;
    /* Ring control, one cache line each. */
    _Alignas(64) uint32_t sq_head; /* gpud writes */
    _Alignas(64) uint32_t sq_tail; /* VM writes */
    _Alignas(64) uint32_t sq_flags; /* gpud writes EC_NEED_WAKEUP */
    _Alignas(64) uint32_t cq_head; /* VM writes */
    _Alignas(64) uint32_t cq_tail; /* gpud writes */
    _Alignas(64) uint32_t cq_flags; /* VM writes EC_NEED_WAKEUP */
    _Alignas(64) struct ec_stats stats;
};

/* The handshake message that travels with the three fds. */
struct ec_hello {
    uint64_t magic;
    uint32_t abi_version;
    uint32_t device;
    uint64_t total_bytes; /* size of the memfd */
    uint32_t segments;    /* ec_segment messages that follow at once (arena
                             segments after the first): gpud reads them all
                             before it is ready, so no job it drains can
                             name a segment still on its way */
    uint32_t reserved;
};

/* An arena segment after the first; travels with its memfd. */
struct ec_segment {
    uint64_t magic;   /* EC_SEGMENT_MAGIC */
    uint32_t segment; /* 1 .. EC_MAX_SEGMENTS-1 */
    uint32_t reserved;
    uint64_t bytes;   /* size of the memfd, all of it arena */
};

#endif /* ERLCUDA_RING_H */
