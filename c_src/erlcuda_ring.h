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
 *   - SQ: producer = the VM (its submitters serialise on a mutex in the NIF;
 *     sq_push_locked in c_src/submit.c is its one writer), consumer = gpud.
 *     CQ: producer = gpud, consumer = the VM's completion thread.
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
#define EC_ABI_VERSION 15u
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
#define EC_FLAG_FAULT (1u << 7)
/* EC_FLAG_ARGS: a job of a user's kernel. Its arguments are a struct
 * ec_job_args in the arena (see "Signatures" below); the descriptor names
 * it: in0 = its arena address, in0_len = EC_JOB_ARGS_BYTES (type U8 for the
 * bounds check; `type` says the kernel's T), every other address, length
 * and parameter 0. Users' kernels take only this form, built-ins never. */
#define EC_FLAG_ARGS (1u << 0)
/* Device buffers (built-ins; a user's job says the same per slot in
 * ec_job_args.buffers): the address field the flag names (in0, in1, out) holds a
 * buffer id, not an arena address. A buffer is memory gpud owns (device
 * memory on cuda, gpud's own heap on cpu) and keeps across jobs; the VM
 * assigns its ids (free-running per device, never reused while gpud lives,
 * 0 never), gpud maps id -> allocation. An input buffer must exist with the
 * descriptor's type and length (else BAD_BUFFER); EC_FLAG_OUT_BUF on a job
 * creates a new buffer of out_len elements for its output (an id gpud
 * knows already: BAD_BUFFER). Buffers count against gpud's memory limit:
 * one that does not fit now answers OOM, one larger than the limit
 * TOO_LARGE. */
#define EC_FLAG_IN0_BUF (1u << 1)
#define EC_FLAG_IN1_BUF (1u << 2)
#define EC_FLAG_OUT_BUF (1u << 3)

/* Element types of vectors: X(NAME, id, erlang_atom, bytes). A vector's
 * elements are native-endian; a list of numbers is f32. */
#define EC_TYPES(X)      \
    X(F32, 0, f32, 4)    \
    X(F64, 1, f64, 8)    \
    X(S32, 2, s32, 4)    \
    X(U32, 3, u32, 4)    \
    X(S64, 4, s64, 8)    \
    X(U8, 5, u8, 1)

enum ec_type {
#define EC_TYPE_ENUM(NAME, ID, ATOM, BYTES) EC_TYPE_##NAME = ID,
    EC_TYPES(EC_TYPE_ENUM)
#undef EC_TYPE_ENUM
};
/* EC_*_COUNT: the rows of a list, counted (EC_ROW_PLUS_ONE). Ids run 0, 1,
 * ... (kernels: 1, 2, ...) so a count is also one past the largest id:
 * EC_IDS_DENSE below and the layout probe check it. */
#define EC_ROW_PLUS_ONE(...) +1
enum { EC_TYPE_COUNT = 0 EC_TYPES(EC_ROW_PLUS_ONE) };
#define EC_TYPE_BIT(NAME) (1u << EC_TYPE_##NAME)
#define EC_FLOATS (EC_TYPE_BIT(F32) | EC_TYPE_BIT(F64))

/* The built-in kernels' families: which of gpud's ops runs one (its
 * lengths are the signature's; this says only how the work is done).
 *   ELEMENTWISE  one output element per input element
 *   REDUCTION    one scalar from every element
 *   MATMUL       a row-major matrix product
 * X(NAME, id, erlang_atom) */
#define EC_SHAPES(X)               \
    X(ELEMENTWISE, 0, elementwise) \
    X(REDUCTION, 1, reduction)     \
    X(MATMUL, 2, matmul)

enum ec_shape {
#define EC_SHAPE_ENUM(NAME, ID, ATOM) EC_SHAPE_##NAME = ID,
    EC_SHAPES(EC_SHAPE_ENUM)
#undef EC_SHAPE_ENUM
};
enum { EC_SHAPE_COUNT = 0 EC_SHAPES(EC_ROW_PLUS_ONE) };

/* Kernels: the one table. Everything about a kernel that the VM and gpud
 * share is its row here; the NIF parses Args and builds results from it, gpud
 * validates and coalesces by it (and generates its kernel list from this very
 * text at build time), erlcuda:kernels/0 reports it.
 *
 *   X(NAME, id, erlang_atom, args, outs, shape, types, entry)
 *
 * args, outs the kernel's signature, in the signature language below (the
 *            same text a user's module declares in its manifest)
 * shape      an EC_SHAPE_*: which of gpud's ops runs it
 * types      the set the kernel's T ranges over (EC_TYPE_BIT mask)
 * entry      the device code: PTX entry "<entry>_<type>" (kernels/src/<entry>.rs),
 *            and gpud/src/ops/<erlang_atom>.rs for the host side
 *
 * A built-in job travels in its descriptor alone: vectors in in0, in1, the
 * output in out, its scalars and dimensions in the parameter area `p`.
 *
 * Accumulation, the same on every backend: sums are accumulated in the
 * element type (f32 jobs in f32, f64 jobs in f64). A reduction of n terms
 * adds each term through at most EC_SUM_SERIAL serial additions, then a
 * pairwise tree of depth <= 16 (one partial per chunk of EC_SUM_CHUNK
 * terms), then at most ceil(n / EC_SUM_CHUNK) + 1 partials in sequence: the
 * chunks' partials are summed in groups of G = ceil(chunks / EC_SUM_GROUPS)
 * consecutive chunks, each group's partials in sequence from +0.0, then the
 * groups' sums in sequence from +0.0 (G + groups <= chunks + 1). The CPU
 * adds in index order, so its answer is one well-defined value
 * (kernels/kit/src/sum_order.rs); the GPU adds a job's chunk partials
 * atomically, in any order, within the same depth. A reduction from large
 * binaries (the pipelined submit, c_src/pipeline.c) runs as one descriptor
 * per group, and the NIF adds the groups' sums in index order: on the CPU
 * the same bits as the same job unpipelined.
 * A matmul output sums its k products in k order at most k + 1
 * roundings deep (the GPU: one fused multiply-add chain; the CPU: blocked
 * chains, each block's sum added to the output in turn); a pipelined matmul
 * runs in bands of A's rows, each output element still one such sum.
 * Tests derive their tolerance from these depths (test/erlcuda_ref.erl).
 *
 * Adding a kernel: one row here, gpud/src/ops/<atom>.rs, kernels/src/<entry>.rs
 * and its f64 reference in test/erlcuda_ref.erl. */
#define EC_KERNELS(X)                                                                   \
    X(VECTOR_ADD, 1, vector_add, "x:v:T:n,y:v:T:n", "sum:o:T:n", ELEMENTWISE, EC_FLOATS,  \
      "vector_add")                                                                      \
    X(REDUCE, 2, reduce, "x:v:T:n", "sum:s:T", REDUCTION, EC_FLOATS, "reduce")           \
    X(DOT_PRODUCT, 3, dot_product, "x:v:T:n,y:v:T:n", "dot:s:T", REDUCTION, EC_FLOATS,   \
      "dot")                                                                             \
    X(MATMUL, 4, matmul, "a:v:T:m*k,b:v:T:k*n,m:d,n:d,k:d", "c:o:T:m*n", MATMUL,         \
      EC_FLOATS, "matmul")                                                               \
    X(SAXPY, 5, saxpy, "alpha:s:T,x:v:T:n,y:v:T:n", "out:o:T:n", ELEMENTWISE, EC_FLOATS, \
      "saxpy")

enum ec_kernel {
#define EC_KERNEL_ENUM(NAME, ID, ATOM, ARGS, OUTS, SHAPE, TYPES, ENTRY) EC_KERNEL_##NAME = ID,
    EC_KERNELS(EC_KERNEL_ENUM)
#undef EC_KERNEL_ENUM
};
/* One past the largest id (ids run 1, 2, ...): the rows and the unused 0. */
#define EC_KERNEL_COUNT (1u EC_KERNELS(EC_ROW_PLUS_ONE))

/* Users' kernels (loaded at run time from a module built with the helper
 * crate, kernels/kit): module slot s (0 <= s < EC_MODULE_SLOTS) holds up to
 * EC_MODULE_KERNELS kernels, kernel i of it has the id
 *     EC_USER_KERNEL_BASE + s * EC_MODULE_KERNELS + i.
 * Their signatures come from the module's manifest (kernels/kit/src/job.rs),
 * in the signature language below, not from this table.
 *
 * Control descriptors load and unload a module, in order with the jobs
 * around them (gpud finishes every job before one first):
 *   kernel  EC_CONTROL_LOAD_MODULE or EC_CONTROL_UNLOAD_MODULE
 *   type    EC_TYPE_U8
 *   in0     (load) the module's directory path, in0_len bytes, no NUL
 *   out     out_len bytes where gpud writes why a load failed (NUL-padded)
 *   p.dim[0] the slot
 * and complete with OK or MODULE_ERROR. */
#define EC_USER_KERNEL_BASE 1024u
#define EC_MODULE_KERNELS 64u
#define EC_MODULE_SLOTS 1000u
#define EC_CONTROL_LOAD_MODULE 0xff00u
#define EC_CONTROL_UNLOAD_MODULE 0xff01u

/* Buffer control descriptors, answered in SQ order with the jobs around
 * them (a put is done before a later job that names its buffer is
 * validated; a free releases the memory only once every launch submitted
 * before it has finished):
 *   PUT   one slice of a new buffer: in0 = arena region of in0_len elements
 *         of `type`; out = the buffer's id with EC_FLAG_OUT_BUF, out_len =
 *         the whole buffer's length; p.u64[0] = the slice's byte offset in
 *         the buffer (a multiple of the element size; in0_len elements from
 *         there must lie inside out_len). A whole put is one slice at 0
 *         with in0_len == out_len; a large one is sent as several, each
 *         published as soon as the VM has copied it in, in any order, so
 *         the device copies overlap the VM's (the pipelined put).
 *         The first slice of an id to arrive creates the buffer (memory
 *         counted once, for out_len); the others write into it. The buffer
 *         can be used (GET, launches) once slices covering out_len have
 *         arrived; before that it is BAD_BUFFER. Once a slice of an id has
 *         failed, its later slices answer the same status without
 *         allocating, until a FREE of the id. OK, OOM, TOO_LARGE,
 *         BAD_BUFFER (the id is a complete buffer, or a filling one of
 *         another type or length), BAD_SHAPE (the slice is outside
 *         out_len, misaligned, or more than is left to fill).
 *         The VM answers a put once, after all of its slices, and frees
 *         the id whenever any slice failed.
 *   GET   in0 = a buffer id with EC_FLAG_IN0_BUF, in0_len its length;
 *         out = arena region of out_len elements; p.u64[0] = a byte offset
 *         in the buffer (a multiple of the element size; out_len elements
 *         from there must lie inside in0_len). Copies that slice of the
 *         buffer out. A whole get is one slice at 0 with out_len ==
 *         in0_len; a buffer too large for any region of the arena comes
 *         back in slices, one descriptor each, through a window of the
 *         arena (the windowed get, buffers.c). OK, BAD_BUFFER, BAD_SHAPE.
 *   FREE  in0 = arena region of in0_len u64 buffer ids (type S64, at most
 *         EC_FREE_MAX_IDS); ids gpud does not know are skipped (a buffer
 *         whose put failed is freed too), a buffer still filling is freed
 *         as any other, and a failed put's id is forgotten. Always OK once
 *         the region is. */
#define EC_CONTROL_PUT 0xff02u
#define EC_CONTROL_GET 0xff03u
#define EC_CONTROL_FREE 0xff04u
#define EC_FREE_MAX_IDS 512u

/* Signatures: the one language of every kernel's arguments, built-in
 * (the rows above) or a user's (its manifest line). `args` and `outs` are
 * comma-separated items ("-" for none), in the order callers pass them
 * and get them back:
 *   args  NAME:v:TYPE:LEN   a vector (a list, binary, {Type, Binary} or buffer)
 *         NAME:io:TYPE:LEN  an inout vector: only a device buffer, updated
 *                           in place
 *         NAME:s:TYPE       a scalar: an Erlang number (an integer type takes
 *                           an integer)
 *         NAME:d            a dimension: an integer in 0 .. 2^32-1
 *         NAME:d:RANGE      a dimension in a range: LO.., ..=HI or LO..=HI
 *                           (inclusive), each side one or more lengths as
 *                           an output's joined by `&`, every one holding
 *                           (topk_rows's k:d:1..=cols&64 is 1 <= k <=
 *                           min(cols, 64)); at most EC_MAX_BOUNDS bounds a
 *                           signature. A call outside is refused like a
 *                           length that does not fit.
 *   outs  NAME:o:TYPE:LEN   a vector output
 *         NAME:s:TYPE       a one-element output given back as a number
 * TYPE is u8, s32, u32, s64, f32, f64 (EC_TYPES) or T, the kernel's type
 * variable over its declared set (fixed by the first T argument given as
 * {Type, Binary} or a buffer, else f32); a scalar's TYPE is never u8. LEN is
 *   FREE               a name that is no dimension: the length of the call's
 *                      vectors so declared (every vector with that LEN has
 *                      the same length; an input fixes it, an output may
 *                      only use one an input fixed)
 *   F*F*..[/F]         a product of dimension names and decimal constants,
 *                      divided exactly by one more (a divisor must be >= 1
 *                      and divide the product; a FREE name may stand in
 *                      an output's product too)
 * Every length is at most 2^32-1 elements. Limits per kernel:
 * EC_MAX_VECTORS v and io items, EC_MAX_OUTPUTS outs, EC_MAX_PARAMS s and d
 * args (a name is an identifier of at most 31 bytes, unique in the
 * signature). Every output starts zeroed. Parsed by the VM
 * (c_src/signature.c) and by gpud and the kit (kernels/kit/src/job.rs, the
 * same grammar); the layout test checks that both read each built-in row
 * alike. */
#define EC_MAX_VECTORS 8u
#define EC_MAX_OUTPUTS 4u
#define EC_MAX_SLOTS (EC_MAX_VECTORS + EC_MAX_OUTPUTS)
#define EC_MAX_PARAMS 8u
#define EC_MAX_NAME 31u
#define EC_MAX_BOUNDS 8u
/* A built-in's parameter area (ec_sqe.p). */
#define EC_PARAM_BYTES 16u
/* The accumulation depths stated above. */
#define EC_SUM_SERIAL 256u
#define EC_SUM_CHUNK 65536u
#define EC_SUM_GROUPS 32u

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
    X(DEVICE_ERROR, 7, device_error)    \
    X(BAD_TYPE, 8, bad_type)            \
    X(MODULE_ERROR, 9, module_error)  \
    X(OOM, 10, oom)                     \
    X(TOO_LARGE, 11, too_large)         \
    X(BAD_BUFFER, 12, bad_buffer)      \
    X(KERNEL_FAULT, 13, kernel_fault)

enum ec_status {
#define EC_STATUS_ENUM(NAME, CODE, ATOM) EC_STATUS_##NAME = CODE,
    EC_STATUSES(EC_STATUS_ENUM)
#undef EC_STATUS_ENUM
};
enum { EC_STATUS_COUNT = 0 EC_STATUSES(EC_ROW_PLUS_ONE) };

/* Every list's ids are distinct and run from its first id up, one per row:
 * the rows' bits (1 << id) fill exactly the bits below the count. Arrays
 * indexed by id (atoms, kernel rows, element sizes) rely on it. */
#define EC_ID_BIT(NAME, ID, ...) | (UINT64_C(1) << (ID))
#define EC_IDS_DENSE(LIST, FIRST, COUNT) \
    ((0 LIST(EC_ID_BIT)) == (((UINT64_C(1) << (COUNT)) - 1) & ~((UINT64_C(1) << (FIRST)) - 1)))
_Static_assert(EC_IDS_DENSE(EC_TYPES, 0, EC_TYPE_COUNT), "EC_TYPES ids run 0, 1, ...");
_Static_assert(EC_IDS_DENSE(EC_SHAPES, 0, EC_SHAPE_COUNT), "EC_SHAPES ids run 0, 1, ...");
_Static_assert(EC_IDS_DENSE(EC_KERNELS, 1, EC_KERNEL_COUNT), "EC_KERNELS ids run 1, 2, ...");
_Static_assert(EC_IDS_DENSE(EC_STATUSES, 0, EC_STATUS_COUNT), "EC_STATUSES codes run 0, 1, ...");

/* An arena address: segment index in the top 16 bits, byte offset inside the
 * segment below. Only segment 0 exists today; the split leaves room for arena
 * segments added later without changing the descriptor. */
#define EC_ADDR_SEGMENT_SHIFT 48u
#define EC_ADDR_OFFSET_MASK ((UINT64_C(1) << EC_ADDR_SEGMENT_SHIFT) - 1)

/* A submission: 64 bytes, one cache line. Lengths count elements of `type`.
 *
 * The parameter area `p` holds the kernel's scalar ('s') and dimension ('d')
 * arguments, packed in signature order the way io_uring overlays per-opcode
 * fields in its SQE: an 's' takes the next 8-aligned f64, a 'd' the next u32.
 * saxpy ("svv"): p.scalar[0] = alpha; matmul ("vvddd"): p.dim[0..3] = m, n, k.
 * Bytes no argument uses must be 0. */
union ec_params {
    uint8_t bytes[EC_PARAM_BYTES];
    double scalar[EC_PARAM_BYTES / 8];
    uint32_t dim[EC_PARAM_BYTES / 4];
    uint64_t u64[EC_PARAM_BYTES / 8]; /* control descriptors: PUT's offset */
};

struct ec_sqe {
    uint64_t user_data; /* echoed in the CQE; opaque to gpud */
    uint64_t in0;       /* arena address of vector argument 0 */
    uint64_t in1;       /* arena address of vector argument 1 (0 when unused) */
    uint64_t out;       /* arena address of the output */
    union ec_params p;
    uint32_t in0_len;
    uint32_t in1_len; /* 0 when the kernel takes one vector */
    uint32_t out_len;
    uint16_t kernel; /* enum ec_kernel */
    uint8_t type;    /* enum ec_type, of every vector and the output */
    uint8_t flags;   /* EC_FLAG_*; must be 0 otherwise */
};

/* The arguments of one job of a user's kernel (EC_FLAG_ARGS), in the
 * arena, 8-aligned. The very same layout is the job record the kernel
 * reads (kernels/kit/src/job.rs, `Job`), where gpud has put device (or
 * host) addresses in `addr`, set `block_start` and cleared `buffers`.
 *   addr, len  slot i < EC_MAX_VECTORS: the i-th v or io argument;
 *              slot EC_MAX_VECTORS + j: the j-th output. An arena address
 *              (or, with bit i of `buffers`, a device buffer id: an io
 *              argument's must be, and an output's names the new buffer
 *              made for it) and a length in elements of the slot's type.
 *              Unused slots: 0, 0.
 *   param      the s and d arguments in declared order: a float scalar as
 *              f64 bits (the kernel rounds an f32 or T one), an integer
 *              scalar as a two's complement s64, a dimension as u64.
 *              Unused: 0.
 *   grid, block, shared_bytes, seed  the launch options that `given`
 *              names (EC_OPT_* bits; the others, and `reserved`, are 0).
 *              seed: the order a GPU body run on the CPU (the kit's
 *              emulator) runs each block's threads in between barriers,
 *              drawn from it; a GPU ignores it.
 *   max_wait_us  how long gpud may hold the job of a kernel with group
 *              bodies, its shared inputs on device buffers, for companions
 *              on the same buffers (a group launch), in microseconds from
 *              the drain that took it; the VM keeps it below the call's
 *              timeout. Other kernels' jobs ignore it.
 * gpud checks every length against the signature and T, every region
 * (inputs may overlap each other; an output overlaps nothing), and the
 * options, before anything runs. */
#define EC_OPT_GRID 1u         /* grid.x: 1 .. 2^31-1 */
#define EC_OPT_BLOCK 2u        /* threads per block: 1 .. 1024 */
#define EC_OPT_SHARED_BYTES 4u /* dynamic shared memory: 0 .. 48 KiB */
#define EC_OPT_THREAD_ORDER 8u /* seed: any u32 */
#define EC_OPT_MAX_WAIT 16u    /* max_wait_us: any u32 */
/* The body the CPU backend runs for this job, over gpud's --cpu-runs
 * default (at most one of the two; no field: the bit is the value; a
 * kernel with a GPU body only runs it whatever the job says; a GPU
 * ignores both). */
#define EC_OPT_CPU_RUNS_GPU 32u
#define EC_OPT_CPU_RUNS_CPU 64u
struct ec_job_args {
    uint64_t addr[EC_MAX_SLOTS];
    uint32_t len[EC_MAX_SLOTS];
    uint64_t param[EC_MAX_PARAMS];
    uint64_t block_start;
    uint32_t buffers;
    uint32_t grid;
    uint32_t block;
    uint32_t shared_bytes;
    uint32_t given;
    uint32_t seed;
    uint32_t max_wait_us;
    uint32_t reserved[3];
};
#define EC_JOB_ARGS_BYTES 256u
_Static_assert(sizeof(struct ec_job_args) == EC_JOB_ARGS_BYTES, "ec_job_args is 256 bytes");

/* A completion: 32 bytes. drained_ns and done_ns are gpud's
 * CLOCK_MONOTONIC (the VM's clock too: one host) when the drain that took
 * the job off the SQ began and when gpud saw its launch finished, for the
 * jobs of a launch of small jobs only; 0 for every other (a large launch,
 * a copy, a refused or control job). With the VM's own
 * stamps (publish, CQE taken, answer built) they split a small job's wait
 * into queue, gpud and CQ (stats/1's job_stalls_*): a small job that waited
 * a millisecond with no step of gpud's loop or the VM's that long must have
 * waited in one of those. */
/* Why a user's GPU body, run on the CPU (the kit's emulator), stopped short
 * of its end: the completion of such a job has status KERNEL_FAULT and the
 * fault in place of its stamps (a faulted job is no timing sample). Only
 * that job: the other jobs of its launch ran on their own and are answered
 * as usual. X(NAME, code, erlang_atom); the codes are the kit's FAULT_*
 * (kernels/kit/src/job.rs), which gpud's layout test holds to these.
 *   DIVERGENT_BARRIER  a thread waits at a barrier that others of its block
 *                      do not reach (they returned, or wait elsewhere);
 *   DIVERGENT_WARP_OP  a lane waits at a warp operation that other lanes
 *                      of its warp reach at another place, or not at all;
 *   OUT_OF_BOUNDS      a read or write outside argument `slot` (as
 *                      ec_job_args' slots), at element `index` (negative:
 *                      before its first); slot EC_FAULT_SLOT_SHARED: in
 *                      the block's shared memory, at byte `index` of its
 *                      window (outside it, or outside a shared array). */
#define EC_FAULTS(X)                               \
    X(DIVERGENT_BARRIER, 1, divergent_barrier)     \
    X(DIVERGENT_WARP_OP, 2, divergent_warp_op)     \
    X(OUT_OF_BOUNDS, 3, out_of_bounds)
enum ec_fault_reason {
#define EC_FAULT_ENUM(NAME, CODE, ATOM) EC_FAULT_##NAME = CODE,
    EC_FAULTS(EC_FAULT_ENUM)
#undef EC_FAULT_ENUM
};
enum { EC_FAULT_COUNT = 1 EC_FAULTS(EC_ROW_PLUS_ONE) }; /* codes run 1 .. COUNT-1 */
_Static_assert(EC_IDS_DENSE(EC_FAULTS, 1, EC_FAULT_COUNT), "EC_FAULTS codes run 1, 2, ...");

#define EC_FAULT_SLOT_SHARED 255u

/* A kernel fault: 16 bytes, in a completion's place of its stamps. */
struct ec_fault {
    int64_t index;   /* OUT_OF_BOUNDS: the element index (else 0) */
    uint32_t block;  /* the virtual block of the job that faulted */
    uint16_t thread; /* the thread, linear index within its block (< 1024) */
    uint8_t reason;  /* EC_FAULT_* */
    uint8_t slot;    /* OUT_OF_BOUNDS: the argument's slot (else 0) */
};

struct ec_cqe {
    uint64_t user_data;
    int32_t status; /* enum ec_status */
    uint32_t batch; /* how many jobs of this kernel shared the launch */
    union {
        struct {
            uint64_t drained_ns;
            uint64_t done_ns;
        };
        struct ec_fault fault; /* status EC_STATUS_KERNEL_FAULT only */
    };
};

#define EC_BATCH_HIST_BUCKETS 16u /* bucket i counts batches of size [2^i, 2^(i+1)) */

/* Stalls: a step of gpud's loop that takes EC_STALL_NS or longer holds every
 * job that comes meanwhile, small ones too; ec_stats counts such steps per
 * phase (index, stats/1 key):
 *   0 drain    one drain of the SQ, whole: validation, control, submits;
 *   1 submit   one launch handed to the backend (CUDA: the driver calls
 *              that enqueue it; the CPU backend runs it here);
 *   2 poll     one poll of the backend: events queried, copy pieces issued;
 *   3 answer   the completions of finished launches written to the CQ;
 *   4 control  one buffer control descriptor: alloc, free, a copy queued;
 *   5 segments arena segments read from the socket or adopted once
 *              registered.
 * Drain contains submit and control; the others are apart. */
#define EC_STALL_NS 1000000u
#define EC_STALL_PHASES 6u
/* X(NAME, INDEX, stats key suffix): gpud's StallPhase, stats.c's keys. */
#define EC_STALLS(X)                                                                             \
    X(DRAIN, 0, drain) X(SUBMIT, 1, submit) X(POLL, 2, poll) X(ANSWER, 3, answer)                \
    X(CONTROL, 4, control) X(SEGMENTS, 5, segments)

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
    /* Device buffers, as this gpud sees them (stored, not added: a new
     * gpud starts them from 0, its predecessor's buffers being gone). */
    uint64_t buf_used;   /* bytes held by live buffers (size classes) */
    uint64_t buf_peak;   /* the most buf_used has been */
    uint64_t buf_limit;  /* gpud's memory limit for buffers */
    uint64_t buf_count;  /* live buffers */
    uint64_t buf_cached; /* bytes of freed buffers kept for reuse */
    uint64_t buf_device_allocs; /* allocations from the device (cuMemAlloc) */
    /* Where gpud's side of a launch goes, summed over the launches
     * answered (erlcuda_bench:latency_split/0 reads them): from the start
     * of its drain to the backend's submit returning, from there to the
     * poll that saw it done, and from that poll to its CQEs published. */
    uint64_t launches_timed;
    uint64_t launch_drain_ns;
    uint64_t launch_run_ns;
    uint64_t launch_answer_ns;
    /* Stalls per phase (EC_STALL_PHASES above): how many steps took
     * EC_STALL_NS or longer, their time, and the longest step of all. */
    uint64_t stalls[EC_STALL_PHASES];
    uint64_t stall_ns[EC_STALL_PHASES];
    uint64_t stall_max_ns[EC_STALL_PHASES];
    /* Of launch_drain_ns, the time inside the backend's submit (placement,
     * tables, driver calls), and of that the driver calls that enqueue the
     * launch's steps (copies, memsets, kernels, its event; 0 on the CPU
     * backend): what is gpud's own loop and what the driver's. */
    uint64_t launch_backend_ns;
    uint64_t launch_enqueue_ns;
    /* Large launches under an SM reservation (the latency lane's green
     * contexts): on every SM (no small job for a while) or on the SMs the
     * lane leaves. A kernel whose blocks fill the device in whole waves
     * runs a wave more on the smaller part (matmul 4096: 512 tiles, 4
     * waves on 132 SMs, 5 on 124). */
    uint64_t launches_wide;
    uint64_t launches_beside_lane;
    /* Group launches (a kernel's group body over jobs sharing an input
     * buffer, gpud/src/coalesce.rs form_groups) and the jobs they ran:
     * groups of two or more only, a job alone counts in neither. */
    uint64_t group_launches;
    uint64_t group_jobs;
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
