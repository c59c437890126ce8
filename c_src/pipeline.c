/*
 * pipeline.c: the pipelined submit. A large job whose vector inputs are
 * plain binaries (not in the arena, not buffers) of at least pipeline_bytes
 * (option of open/2) is copied into the arena in slices, each published as
 * a descriptor of its own (a part) as soon as it is in: the GPU works on
 * the first parts while the next are copied, so the end-to-end time becomes
 * max(copy, GPU) instead of copy + GPU. Every part carries the job's
 * user_data; complete.c answers the job once, when the last part is back,
 * with the first failing part's status if any (then pipeline_finish has not
 * run: an error answer never reads the output).
 *
 * How a job is split, by its kernel's shape:
 *   ELEMENTWISE  slices of every vector and of the output (vector_add,
 *                saxpy): each part is the same kernel on a slice.
 *   REDUCTION    one part per group of chunks of the header's sum order
 *                (erlcuda_ring.h, EC_SUM_GROUPS): each part writes its sum to
 *                its own element of the output region, and pipeline_finish
 *                adds them in index order from +0.0 in the element type,
 *                which is the order the CPU's sum follows, so a pipelined
 *                reduction gives the same bits there as an unpipelined one.
 *   a put        slices of the binary, each published as a slice of the
 *                buffer (EC_CONTROL_PUT at a byte offset): gpud's copies to
 *                the device overlap the copy into the arena (buffers.c).
 *   MATMUL       B is put into a device buffer in slices, each a PUT
 *                descriptor (more parts, with the job's user_data), then A
 *                is copied in bands of rows, each band a matmul part that
 *                reads B from that buffer and writes its rows of C. B thus
 *                reaches the device once: as an arena input, every band's
 *                launch would copy it again. The buffer is the job's (a term
 *                in its env): releasing the job frees it (buffers.c).
 *
 * A matmul's pieces (B's slices, then the bands) are copied in order, each
 * split over every copy thread, and each is published by whichever thread
 * copies its last bytes: they come one after another at the pool's whole
 * bandwidth, so B's put starts after its first slice and the GPU after the
 * first band. Before, B was copied whole before its put, and each thread
 * copied a band of its own, so the first 8 bands came together: 8192^3
 * from binaries took 43.7-44.9 ms on the H200; ordered, 36.2 ms, and 35.5
 * with bands of equal height (PyTorch from pinned tensors: 36.2; H200,
 * 2026-12-03, commit 316001a; today's figure: matmul.end_to_end.n8192 in
 * bench/results/h200.json). The other pipelines keep one piece per thread: ordered, vector_add 2^26 from
 * binaries took 19.2-20.7 ms against 16.6-18.1 (its mapped launches, one
 * per piece, then read PCIe less well than a few launches of 8 pieces).
 *
 * A job needs one slot per part (the parts' ring credits: the SQ never holds
 * more entries than slots); without enough free slots it runs unpipelined.
 */
#define _GNU_SOURCE
#include "device_state.h"
#include "args.h"
#include "copy.h"
#include "pipeline.h"
#include "submit.h"

#include <limits.h>
#include <linux/futex.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

/* A job at the threshold (pipeline_bytes per input) is split into this
 * many parts: slices of pipeline_bytes / PIPELINE_MIN_PARTS bytes of each
 * input (8 MiB at the default 32 MiB), large enough to be worth a descriptor
 * and a launch. Tests lower pipeline_bytes to split small jobs. */
#define PIPELINE_MIN_PARTS 4u
/* Elementwise slices are whole multiples of this many elements, so every
 * part's addresses keep the arena's alignment. */
#define PIPELINE_SLICE_ALIGN 1024u
/* A put's slices are whole multiples of this many bytes (pages), so each
 * copy thread writes whole pages of the arena. */
#define PIPELINE_PUT_ALIGN 4096u
/* A put larger than put_window_bytes goes through a window of the arena of
 * at least this many slices, each refilled once the slice before it there
 * is on the device: the arena need not grow by the put's size (a put of
 * 1 GiB registered 1 GiB of host memory, a stall of its own), and the
 * window's pages are the same ones put after put. */
#define PUT_WINDOW_MIN_SLOTS 2u
/* A matmul band is a multiple of this many rows: the GPU kernels' tile
 * height (kernels/src/abi.rs MATMUL_BM, matmul_f64_abi.rs MATMUL_F64_BM),
 * so no band but the last has a partial tile. A band large enough for the
 * f32 kernel's wide tiles (MATMUL_WIDE_BM, 256 rows) may end in half a row
 * of them; the benchmarked sizes make bands of whole ones (8192^3: 1024
 * rows, 4096^3: 2048). */
#define PIPELINE_MATMUL_ROWS 128u
/* and, when A has more rows than that takes, at least this many 128-wide
 * tiles of C: 4 x 132, so a band alone keeps an H200's 132 SMs busy for
 * several waves of the f32 kernel (one block per SM; 2 when this was
 * measured) (8192^3: 8 bands of 1024 rows; a band of 192 tiles, as before,
 * filled 73% of one wave). */
#define PIPELINE_MATMUL_TILES 528u

static uint64_t div_ceil(uint64_t a, uint64_t b) { return (a + b - 1) / b; }

static uint64_t slice_bytes(const struct device *d)
{
    uint64_t b = d->pipeline_bytes / PIPELINE_MIN_PARTS;
    return b > 0 ? b : 1;
}

static void single(const struct job_spec *s, struct pipe_plan *p)
{
    *p = (struct pipe_plan){.parts = 1, .pieces = 1, .slice = 0, .out_elems = s->out_len};
}

/* Are all of the job's vectors binaries still outside the arena, each at
 * least `min` bytes? Only those are copied by this submit. */
static int big_binaries(const struct device *d, const struct job_spec *s, uint64_t min)
{
    if (min < d->pipeline_bytes || min == 0)
        return 0;
    for (unsigned i = 0; i < s->nin; i++)
        if (!s->in[i].is_binary || s->in[i].in_arena || s->in[i].buf)
            return 0;
    return 1;
}

void pipeline_plan(const struct device *d, const struct job_spec *s, struct pipe_plan *p)
{
    single(s, p);
    if (s->ki->user || s->nin == 0)
        return;
    uint64_t n = s->in[0].len;
    switch (s->shape) {
    case EC_SHAPE_ELEMENTWISE: {
        if (s->nin != 2 || !big_binaries(d, s, s->out_len * s->elem))
            return;
        uint64_t parts = div_ceil(s->out_len * s->elem, slice_bytes(d));
        if (parts > PIPELINE_MAX_PARTS)
            parts = PIPELINE_MAX_PARTS;
        uint64_t slice = div_ceil(div_ceil(s->out_len, parts), PIPELINE_SLICE_ALIGN) * PIPELINE_SLICE_ALIGN;
        p->slice = slice;
        p->pieces = (uint32_t)div_ceil(s->out_len, slice);
        break;
    }
    case EC_SHAPE_REDUCTION: {
        if (!big_binaries(d, s, n * s->elem))
            return;
        /* One part per group of the sum order (erlcuda_ring.h). */
        uint64_t chunks = div_ceil(n, EC_SUM_CHUNK);
        uint64_t g = div_ceil(chunks, EC_SUM_GROUPS);
        p->slice = g * EC_SUM_CHUNK;
        p->pieces = (uint32_t)div_ceil(n, p->slice);
        p->out_elems = p->pieces; /* one partial per part */
        break;
    }
    case EC_SHAPE_MATMUL: {
        uint64_t m = s->p.dim[0], nn = s->p.dim[1], k = s->p.dim[2];
        if (m == 0 || nn == 0 || k == 0 || !big_binaries(d, s, m * k * s->elem))
            return;
        /* Bands of at least slice_bytes of A, at most three quarters of
         * PIPELINE_MAX_PARTS (the rest are slices of the put of B). */
        uint64_t rows = div_ceil(slice_bytes(d), k * s->elem);
        uint64_t fewest = div_ceil(m, PIPELINE_MAX_PARTS - PIPELINE_MAX_PARTS / 4);
        uint64_t wide = div_ceil(PIPELINE_MATMUL_TILES, div_ceil(nn, PIPELINE_MATMUL_ROWS)) * PIPELINE_MATMUL_ROWS;
        if (rows < fewest)
            rows = fewest;
        if (rows < wide && m > wide)
            rows = wide;
        rows = div_ceil(rows, PIPELINE_MATMUL_ROWS) * PIPELINE_MATMUL_ROWS;
        /* As many bands, of equal height: no runt band at the end, a wave
         * of the GPU for a few tiles (8192: 8 bands of 1024 rows, not 7 of
         * 1152 and one of 128). */
        rows = div_ceil(div_ceil(m, div_ceil(m, rows)), PIPELINE_MATMUL_ROWS) * PIPELINE_MATMUL_ROWS;
        p->slice = rows;
        p->pieces = (uint32_t)div_ceil(m, rows);
        if (p->pieces < 2)
            break;
        /* B in slices of whole pages, at most a quarter of the parts. */
        uint64_t b_len = k * nn;
        uint64_t b_parts = div_ceil(b_len * s->elem, slice_bytes(d));
        if (b_parts > PIPELINE_MAX_PARTS / 4)
            b_parts = PIPELINE_MAX_PARTS / 4;
        uint64_t align = PIPELINE_PUT_ALIGN / s->elem;
        p->b_slice = div_ceil(div_ceil(b_len, b_parts), align) * align;
        p->b_pieces = (uint32_t)div_ceil(b_len, p->b_slice);
        p->parts = p->pieces + p->b_pieces;
        return;
    }
    default:
        return;
    }
    if (p->pieces < 2) {
        single(s, p);
        return;
    }
    p->parts = p->pieces;
}

void pipeline_unplan(const struct job_spec *s, struct pipe_plan *p) { single(s, p); }

struct pipeline {
    struct device *d;
    uint32_t idx;
    unsigned shape, nin, elem;
    int put;               /* slices of a put: EC_CONTROL_PUT descriptors */
    struct ec_sqe whole;   /* the job's descriptor over all of its regions */
    const uint8_t *src[2]; /* the binaries */
    uint8_t *dst[2];       /* their places in the arena */
    uint64_t slice;        /* elements (a matmul: rows of A) per piece */
    uint64_t buf_id;       /* a matmul: the buffer holding B */
    uint32_t subs;         /* copies each piece is split into (1: a thread per piece) */
    uint32_t pieces;
    /* A put through a window (pipeline_put_plan): piece c lands in slot
     * c % slots of dst (0: at its own offset), and is published in order
     * (`published`, __atomic). */
    uint32_t slots, published;
    uint32_t publish_waiters; /* __atomic: copy threads asleep on `published` */
    uint32_t left[PIPELINE_MAX_PARTS]; /* __atomic: a piece's copies not done */
};

static uint64_t min_u64(uint64_t a, uint64_t b) { return a < b ? a : b; }

/* Copy `sub` of p->subs of n bytes from src + off to dst + at_dst: whole
 * pages, the last the rest. */
static void copy_sub(const struct pipeline *p, unsigned in, uint64_t off, uint64_t at_dst, uint64_t n,
                     uint32_t sub)
{
    uint64_t chunk = div_ceil(div_ceil(n, p->subs), 4096) * 4096;
    uint64_t at = (uint64_t)sub * chunk;
    if (at < n)
        copy_streaming(p->dst[in] + at_dst + at, p->src[in] + off + at, min_u64(chunk, n - at));
}

/* A windowed put's copy threads wait for two things: their slot of the
 * window (slice k - slots answered: parts_left) and their turn to publish
 * (`published`). Each spins this many times, then sleeps on the word as a
 * futex until whoever moves it wakes it. Against sleeping in steps of a
 * fixed time (20 us, ~70 with the kernel's timer slack): 2-4% faster and
 * 10% less of the VM's CPU a 256 MiB put on idle cores, the same on
 * shared ones (2-core CPU machine; bench/EXPERIMENTS.md). */
#define PUT_WAIT_SPINS 100u
/* The longest futex sleep: a reset or close (d->stopping) wakes no one,
 * so a waiter sees it this late at most. */
#define PUT_WAIT_MAX_NS 1000000L

static void put_wait_pause(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

/* Sleeps while *word is still `seen` (at most PUT_WAIT_MAX_NS); the caller
 * checks its condition again after. Announced in *waiters first, then
 * checked: sequentially consistent with wake_word's move-then-look, either
 * this sees the new value or the mover sees this waiter and wakes it. */
static void sleep_on_word(uint32_t *word, uint32_t seen, uint32_t *waiters)
{
    __atomic_add_fetch(waiters, 1, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(word, __ATOMIC_SEQ_CST) == seen) {
        struct timespec most = {0, PUT_WAIT_MAX_NS};
        syscall(SYS_futex, word, FUTEX_WAIT_PRIVATE, seen, &most, NULL, 0);
    }
    __atomic_sub_fetch(waiters, 1, __ATOMIC_SEQ_CST);
}

/* After *word moved (sequentially consistent): wakes its sleepers. */
static void wake_word(uint32_t *word, uint32_t *waiters)
{
    if (__atomic_load_n(waiters, __ATOMIC_SEQ_CST) > 0)
        syscall(SYS_futex, word, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
}

void pipeline_part_answered(struct job *j)
{
    wake_word(&j->parts_left, &j->part_waiters);
}

/* Until slice k of the put in slot idx is answered (copied to the device,
 * or failed): its slot is free then. The slices are published in order
 * (pipeline_piece) and gpud copies them out in SQ order (one stream a
 * direction; a put's slices all land or all fail), so k's answer is there
 * once more than k slices are answered, whichever answers came. (A slice
 * answered with an error ahead of one still copying fails the put: a slot
 * refilled early then only spoils a buffer that is freed unread.) Stops
 * waiting when the device is reset or closed: gpud copies nothing more,
 * and the job is failed. */
static void wait_put_slice(struct device *d, struct job *j, uint32_t pieces, uint32_t k)
{
    struct timespec t0 = {0, 0};
    for (unsigned spins = 0;; spins++) {
        uint32_t left = __atomic_load_n(&j->parts_left, __ATOMIC_SEQ_CST);
        if (pieces - left > k || __atomic_load_n(&d->stopping, __ATOMIC_ACQUIRE))
            break;
        if (spins == 0)
            clock_gettime(CLOCK_MONOTONIC, &t0);
        if (spins < PUT_WAIT_SPINS)
            put_wait_pause();
        else
            sleep_on_word(&j->parts_left, left, &j->part_waiters);
    }
    /* Time the copy threads waited for a slot (summed over them): near
     * none means the put is bound by the copies into the arena, much means
     * by the device side (the copy engine, gpud's loop, the answers). */
    if (t0.tv_sec != 0 || t0.tv_nsec != 0) {
        struct timespec t1;
        clock_gettime(CLOCK_MONOTONIC, &t1);
        count(&d->c.put_window_wait_ns,
              (uint64_t)((t1.tv_sec - t0.tv_sec) * 1000000000LL + (t1.tv_nsec - t0.tv_nsec)));
    }
}

/* Copy i of the pipeline: part i % subs of piece i / subs of the inputs
 * into the arena. The thread that copies a piece's last part publishes
 * the piece's descriptor (each copy's stores are fenced before the count
 * goes down: copy_streaming). */
static void pipeline_piece(void *arg, uint32_t i)
{
    struct pipeline *p = arg;
    uint32_t c = i / p->subs, sub = i % p->subs;
    struct ec_sqe sqe = p->whole;
    uint64_t first = (uint64_t)c * p->slice;
    if (p->shape == EC_SHAPE_MATMUL) {
        uint64_t m = p->whole.p.dim[0], n = p->whole.p.dim[1], k = p->whole.p.dim[2];
        uint64_t rows = min_u64(m - first, p->slice);
        uint64_t a_off = first * k * p->elem;
        copy_sub(p, 0, a_off, a_off, rows * k * p->elem, sub);
        if (__atomic_sub_fetch(&p->left[c], 1, __ATOMIC_ACQ_REL) > 0)
            return;
        sqe.in0 += a_off;
        sqe.in0_len = (uint32_t)(rows * k);
        sqe.in1 = p->buf_id;
        sqe.flags |= EC_FLAG_IN1_BUF;
        sqe.out += first * n * p->elem;
        sqe.out_len = (uint32_t)(rows * n);
        sqe.p.dim[0] = (uint32_t)rows;
    } else {
        uint64_t len = p->whole.in0_len;
        uint64_t cnt = min_u64(len - first, p->slice);
        uint64_t off = first * p->elem;
        /* Where in dst: its own offset, or its slot of the window once
         * the slice there before it is on the device. */
        uint64_t at = off;
        if (p->slots > 0) {
            at = (uint64_t)(c % p->slots) * p->slice * p->elem;
            if (c >= p->slots)
                wait_put_slice(p->d, &p->d->jobs[p->idx], p->pieces, c - p->slots);
        }
        for (unsigned in = 0; in < p->nin; in++)
            copy_sub(p, in, off, at, cnt * p->elem, sub);
        if (__atomic_sub_fetch(&p->left[c], 1, __ATOMIC_ACQ_REL) > 0)
            return;
        sqe.in0 += at;
        sqe.in0_len = (uint32_t)cnt;
        if (p->put) {
            /* A slice of the buffer: out and out_len still name all of it. */
            sqe.p.u64[0] = off;
            if (p->slots == 0) {
                publish(p->d, p->idx, &sqe);
                return;
            }
            /* In slice order: the slices before this one are in the SQ
             * first (see wait_put_slice). A slice's copies wait only for
             * slices before it, so every wait ends. */
            for (unsigned spins = 0;; spins++) {
                uint32_t at_now = __atomic_load_n(&p->published, __ATOMIC_SEQ_CST);
                if (at_now == c)
                    break;
                if (spins < PUT_WAIT_SPINS)
                    put_wait_pause();
                else
                    sleep_on_word(&p->published, at_now, &p->publish_waiters);
            }
            publish(p->d, p->idx, &sqe);
            __atomic_store_n(&p->published, c + 1, __ATOMIC_SEQ_CST);
            wake_word(&p->published, &p->publish_waiters);
            return;
        }
        if (p->nin > 1) {
            sqe.in1 += off;
            sqe.in1_len = (uint32_t)cnt;
        }
        if (p->shape == EC_SHAPE_REDUCTION) {
            sqe.out += (uint64_t)c * p->elem; /* its own partial */
            sqe.out_len = 1;
        } else {
            sqe.out += off;
            sqe.out_len = (uint32_t)cnt;
        }
    }
    publish(p->d, p->idx, &sqe);
}

/* Runs the pipeline's pieces, each split into `subs` copies, at most
 * `threads` at once (0: every copy thread): a matmul's in order, each
 * over every thread; a windowed put's likewise over SPREAD_COPY_THREADS;
 * other pieces one per thread, SPREAD_COPY_THREADS at once. */
static void run_pieces(struct pipeline *p, uint32_t pieces, uint32_t subs, uint32_t threads)
{
    p->subs = subs > 0 ? subs : 1;
    p->pieces = pieces;
    for (uint32_t c = 0; c < pieces; c++)
        p->left[c] = p->subs;
    copy_pieces(pipeline_piece, p, pieces * p->subs, threads);
}

/* A matmul's B: put into a new buffer that the bands name, in slices (each
 * published as soon as it is in the arena, so the device's copy overlaps
 * this one). The slices are parts of the job (same user_data): a failure
 * (out of device memory, say) is the job's answer. Returns the buffer id,
 * or 0 when the VM is out of memory (nothing published). */
static uint64_t put_b(struct device *d, uint32_t idx, const struct pipeline *a, uint64_t b_len,
                      const struct pipe_plan *plan)
{
    struct job *j = &d->jobs[idx];
    ERL_NIF_TERM bt = new_buffer(j->env, d, a->whole.type, (uint32_t)b_len);
    struct buffer_res *b;
    if (!bt || !enif_get_resource(j->env, bt, BUFFER_RT, (void **)&b))
        return 0;
    struct pipeline p = {.d = d, .idx = idx, .shape = EC_SHAPE_ELEMENTWISE, .nin = 1,
                         .elem = a->elem, .put = 1,
                         .whole = {.user_data = a->whole.user_data, .kernel = EC_CONTROL_PUT,
                                   .type = a->whole.type, .flags = EC_FLAG_OUT_BUF,
                                   .in0 = a->whole.in1, .in0_len = (uint32_t)b_len, .out = b->id,
                                   .out_len = (uint32_t)b_len},
                         .src = {a->src[1], NULL}, .dst = {a->dst[1], NULL}, .slice = plan->b_slice};
    run_pieces(&p, plan->b_pieces, copy_threads(), 0);
    return b->id;
}

int submit_pipelined(struct device *d, uint32_t idx, const struct ec_sqe *whole,
                     const struct job_spec *s, uint8_t *dst[2], const struct pipe_plan *plan)
{
    struct job *j = &d->jobs[idx];
    struct pipeline p = {.d = d, .idx = idx, .shape = s->shape, .nin = s->nin,
                         .elem = s->elem, .whole = *whole,
                         .src = {s->in[0].bin.data, s->nin > 1 ? s->in[1].bin.data : NULL},
                         .dst = {dst[0], dst[1]}, .slice = plan->slice};
    /* Every part counted before the first is published: a part can only
     * complete after it. */
    __atomic_store_n(&j->part_status, EC_STATUS_OK, __ATOMIC_RELAXED);
    __atomic_store_n(&j->parts_left, plan->parts, __ATOMIC_RELAXED);
    __atomic_store_n(&j->parts, plan->parts, __ATOMIC_RELEASE);
    if (s->shape == EC_SHAPE_MATMUL) {
        p.buf_id = put_b(d, idx, &p, s->in[1].len, plan);
        if (p.buf_id == 0) {
            __atomic_store_n(&j->parts, 1, __ATOMIC_RELAXED);
            return -1;
        }
    }
    if (s->shape == EC_SHAPE_MATMUL)
        run_pieces(&p, plan->pieces, copy_threads(), 0);
    else
        run_pieces(&p, plan->pieces, 1, SPREAD_COPY_THREADS);
    return 0;
}

uint32_t pipeline_put_parts(const struct device *d, uint64_t bytes)
{
    if (bytes < d->pipeline_bytes || bytes == 0)
        return 1;
    uint64_t parts = div_ceil(bytes, slice_bytes(d));
    return parts > PIPELINE_MAX_PARTS ? PIPELINE_MAX_PARTS : (uint32_t)parts;
}

void pipeline_put_plan(const struct device *d, uint64_t len, unsigned elem, uint32_t parts,
                       struct put_plan *pp)
{
    /* Slices of whole pages: each copy thread writes whole pages. */
    uint64_t align = PIPELINE_PUT_ALIGN / elem;
    uint64_t slice = div_ceil(div_ceil(len, parts ? parts : 1), align) * align;
    if (slice == 0)
        slice = align; /* an empty put: one empty piece */
    uint32_t pieces = (uint32_t)div_ceil(len, slice); /* rounding up may leave fewer */
    uint64_t bytes = len * elem, sb = slice * elem;
    uint64_t slots = d->put_window_bytes / sb;
    if (slots < PUT_WINDOW_MIN_SLOTS)
        slots = PUT_WINDOW_MIN_SLOTS;
    *pp = (struct put_plan){.slice = sb, .region = bytes, .pieces = pieces, .slots = 0};
    if (parts > 1 && d->put_window_bytes > 0 && bytes > d->put_window_bytes && slots < pieces &&
        pieces <= PIPELINE_MAX_PARTS) {
        pp->slots = (uint32_t)slots;
        pp->region = slots * sb;
    }
}

void submit_put_pipelined(struct device *d, uint32_t idx, const struct ec_sqe *whole,
                          const uint8_t *src, uint8_t *dst, uint32_t parts)
{
    struct job *j = &d->jobs[idx];
    unsigned elem = type_bytes(whole->type);
    uint64_t len = whole->in0_len;
    struct put_plan pp;
    pipeline_put_plan(d, len, elem, parts, &pp);
    __atomic_store_n(&j->part_status, EC_STATUS_OK, __ATOMIC_RELAXED);
    __atomic_store_n(&j->parts_left, pp.pieces, __ATOMIC_RELAXED);
    __atomic_store_n(&j->parts, pp.pieces, __ATOMIC_RELEASE);
    /* Reset (a gpud exit) waits for the last part: it never fails the job
     * while parts are still to be published. */
    enif_rwlock_rlock(d->pipe);
    struct pipeline p = {.d = d, .idx = idx, .shape = EC_SHAPE_ELEMENTWISE, .nin = 1,
                         .elem = elem, .put = 1, .whole = *whole, .src = {src, NULL},
                         .dst = {dst, NULL}, .slice = pp.slice / elem, .slots = pp.slots};
    if (pp.slots > 0) {
        /* Each slice split over as many threads as copy a whole put, with
         * the same streaming stores: the window changes where the slices
         * land, not how fast they are copied. */
        uint32_t t = copy_threads() < SPREAD_COPY_THREADS ? copy_threads() : SPREAD_COPY_THREADS;
        run_pieces(&p, pp.pieces, t, t);
        count(&d->c.put_windowed, 1);
    } else {
        run_pieces(&p, pp.pieces, 1, SPREAD_COPY_THREADS);
    }
    enif_rwlock_runlock(d->pipe);
    count(&d->c.pipelined, 1);
}

/* Adds n partials of type T from `at` in index order from +0.0, in T. */
#define SUM_PARTIALS(T, at, n)                         \
    do {                                               \
        T total_ = 0, x_;                              \
        for (uint32_t i_ = 0; i_ < (n); i_++) {        \
            memcpy(&x_, (at) + i_ * sizeof x_, sizeof x_); \
            total_ += x_;                              \
        }                                              \
        memcpy((at), &total_, sizeof total_);          \
    } while (0)

void pipeline_finish(struct device *d, struct job *j, uint32_t parts)
{
    if (j->output != OUTPUT_KERNEL || j->nout != 1 || !j->outs[0].scalar || parts < 2)
        return;
    uint8_t *at = region_ptr(d, &j->out);
    if (j->type == EC_TYPE_F64)
        SUM_PARTIALS(double, at, parts);
    else
        SUM_PARTIALS(float, at, parts);
}
