/* pipeline.h: the pipelined submit (pipeline.c). */
#ifndef ERLCUDA_PIPELINE_H
#define ERLCUDA_PIPELINE_H

#include "device_state.h"

/*
 * A large job from binaries published as several descriptors (parts) as its
 * inputs are copied in; see pipeline.c for how each shape is split. */

/* How a job is split. parts == 1: not pipelined. */
struct pipe_plan {
    uint32_t parts;     /* descriptors (a matmul's slices of the put of B included) */
    uint32_t pieces;    /* slices copied and published as kernel jobs */
    uint64_t slice;     /* elements (a matmul: rows of A) per piece; the last may have fewer */
    uint64_t out_elems; /* the output region's elements: out_len, or a reduction's partials */
    uint32_t b_pieces;  /* a matmul: slices of B, each put on its own */
    uint64_t b_slice;   /* and their elements; the last may have fewer */
};
/* The plan for checked job s (parts == 1 unless it is worth pipelining). */
void pipeline_plan(const struct device *d, const struct job_spec *s, struct pipe_plan *p);
/* Back to one descriptor (not enough free slots for the parts). */
void pipeline_unplan(const struct job_spec *s, struct pipe_plan *p);
/* Copies job idx's inputs into `dst` (per vector) and publishes its parts
 * from `whole`, its descriptor over all of its regions; returns when all are
 * published (the binaries are only valid during the NIF call). Caller holds
 * d->life and d->pipe (read). Returns 0, or -1 with nothing published (the
 * VM is out of memory). */
int submit_pipelined(struct device *d, uint32_t idx, const struct ec_sqe *whole,
                     const struct job_spec *s, uint8_t *dst[2], const struct pipe_plan *plan);
/* How many parts a put of `bytes` from a binary is published as: 1 below
 * the device's pipeline_bytes, else one per slice (as an elementwise job's),
 * at most PIPELINE_MAX_PARTS. */
uint32_t pipeline_put_parts(const struct device *d, uint64_t bytes);
/* A put of `len` elements of `elem` bytes in `parts` (pipeline_put_parts):
 * slices of `slice` bytes (whole pages; the last may have fewer), `pieces`
 * of them, through a window of `slots` slices of the arena when the put is
 * larger than the device's put_window_bytes (slots 0: the whole binary in
 * the arena). `region` is the arena bytes the put needs. */
struct put_plan {
    uint64_t slice, region;
    uint32_t pieces, slots;
};
void pipeline_put_plan(const struct device *d, uint64_t len, unsigned elem, uint32_t parts,
                       struct put_plan *pp);
/* Copies a put's binary src -> dst (whole->in0_len elements) in `parts`
 * slices over the copy pool, publishing each as a slice of the buffer
 * (EC_CONTROL_PUT, byte offset in p.u64[0]) as soon as it is in, so gpud's
 * copies to the device overlap this copy. Slot idx holds parts - 1 credit
 * slots. Through a window (pipeline_put_plan), `dst` is the window, and a
 * slice waits for the slice before it in its slot to be copied out.
 * Returns when all are published; caller holds d->life (read). */
void submit_put_pipelined(struct device *d, uint32_t idx, const struct ec_sqe *whole,
                          const uint8_t *src, uint8_t *dst, uint32_t parts);
/* Completes the answer of a pipelined job of `parts` descriptors once all
 * are back and OK: a reduction's partials are added into its result. */
void pipeline_finish(struct device *d, struct job *j, uint32_t parts);

/* After one part of job j is counted off parts_left (complete.c): wakes a
 * windowed put's copy threads waiting for that count (pipeline.c). */
void pipeline_part_answered(struct job *j);

#endif
