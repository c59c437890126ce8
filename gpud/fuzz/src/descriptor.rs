//! Target `descriptor`: a segment table and up to 64 descriptors, each
//! through `gpud::descriptor::validate`.
//!
//! Checks: never panics; the verdict (accept, or which status) equals that
//! of [`reference`], an independent re-statement of the contract in u128
//! arithmetic; an accepted job's regions are exactly the ones the
//! descriptor names, lie inside their segment, are 4-aligned, the output
//! overlaps no input; `names_unknown_segment` is false for accepted jobs;
//! the plain-`u64` size interface agrees with a one-segment table; the
//! coalescer keeps every job; `coalesce::independent` equals brute force.

use gpud::coalesce::{independent, Coalescer};
use gpud::descriptor::{names_unknown_segment, validate, Job, Region, SegmentSizes};
use gpud::descriptor::NoArena;
use gpud::layout::{
    Shape, Sqe, Status, EC_ADDR_OFFSET_MASK, EC_ADDR_SEGMENT_SHIFT, EC_FLAG_ARGS, EC_MAX_SEGMENTS, EC_USER_KERNEL_BASE,
    KERNEL_ROWS,
};

use crate::{gen_sqe, Cursor};

fn gen_size(c: &mut Cursor<'_>) -> u64 {
    match c.u8() % 5 {
        0 => u64::from(c.u16()),
        1 => u64::from(c.u32()),
        2 => c.u64(),
        3 => 0,
        _ => u64::from(c.u8()) * 256,
    }
}

pub fn run(data: &[u8]) {
    let mut c = Cursor::new(data);
    let seg0 = gen_size(&mut c);
    let mut sizes = SegmentSizes::single(seg0);
    let only_seg0 = c.u8().is_multiple_of(4);
    if !only_seg0 {
        for _ in 0..c.u8() % 5 {
            let i = usize::from(c.u8()) % EC_MAX_SEGMENTS as usize;
            let b = gen_size(&mut c);
            sizes.set(i, b);
        }
    }
    let mut jobs = Vec::new();
    let mut n = 0;
    while !c.is_empty() && n < 64 {
        n += 1;
        let mut sqe = gen_sqe(&mut c);
        sqe.user_data = n;
        if let Some(j) = check(&sqe, &sizes) {
            jobs.push(j);
        }
        if only_seg0 && sizes.get(0) == Some(seg0) {
            // The `u64` shorthand must mean the same as a one-segment table.
            assert_eq!(validate(&sqe, seg0), validate(&sqe, &sizes), "{sqe:?} in {seg0}");
        }
    }

    let mut co = Coalescer::new();
    for j in &jobs {
        co.push(j.clone());
    }
    assert_eq!(co.len(), jobs.len());
    let mut seen = 0;
    for (k, t, group) in co.groups() {
        assert!(!group.is_empty());
        assert!(group.iter().all(|j| j.builtin() == Some(k) && j.ty() == t));
        // Submission order is kept inside a group.
        assert!(group.windows(2).all(|w| w[0].user_data() < w[1].user_data()));
        seen += group.len();
    }
    assert_eq!(seen, jobs.len());

    let brute = jobs.iter().enumerate().all(|(i, a)| {
        jobs.iter().enumerate().all(|(j, b)| {
            i == j || !(a.out().overlaps(&b.out()) || a.out().overlaps(&b.in0()) || a.out().overlaps(&b.in1()))
        })
    });
    assert_eq!(independent(&jobs), brute, "{jobs:?}");
}

/// Validates one descriptor and checks the verdict; the job if accepted.
fn check(sqe: &Sqe, sizes: &SegmentSizes) -> Option<Job> {
    let got = validate(sqe, sizes);
    let want = reference(sqe, sizes);
    assert_eq!(got.as_ref().map(|_| ()).map_err(|s| *s), want, "{sqe:?} with {sizes:?}");
    let job = got.ok()?;
    assert_ne!(want, Err(Status::Ok));
    assert_eq!(job.user_data(), sqe.user_data);
    assert_eq!(job.builtin().unwrap().id(), sqe.kernel);
    assert!(!job.fault(), "EC_FLAG_FAULT accepted without the feature");
    let two = job.builtin().unwrap().vector_inputs() == 2;
    let mut used = vec![(job.in0(), sqe.in0, sqe.in0_len), (job.out(), sqe.out, sqe.out_len)];
    if two {
        used.push((job.in1(), sqe.in1, sqe.in1_len));
    } else {
        assert_eq!(job.in1(), Region::EMPTY);
    }
    let eb = job.ty().bytes();
    assert_eq!(job.ty().id(), sqe.ty);
    for (r, addr, len) in used {
        assert_eq!(r.segment() as u64, addr >> EC_ADDR_SEGMENT_SHIFT);
        assert_eq!(r.offset(), addr & EC_ADDR_OFFSET_MASK);
        assert_eq!(r.len(), len as usize);
        let seg_bytes = sizes.get(r.segment()).expect("accepted region in an unknown segment");
        assert_eq!(r.offset() % eb, 0);
        assert!(r.offset() as u128 + r.len() as u128 * eb as u128 <= seg_bytes as u128, "{r:?} past {seg_bytes}");
        assert_eq!(r.end() as u128, r.offset() as u128 + r.len() as u128 * eb as u128);
    }
    for input in job.inputs() {
        assert!(!bytes_overlap(&job.out(), input), "{job:?}: output overlaps an input");
    }
    assert!(!names_unknown_segment(sqe, sizes, &NoArena));
    let (m, n, k) = job.dims();
    if job.builtin().unwrap().row().shape == Shape::Matmul {
        assert_eq!((m as u32, n as u32, k as u32), (sqe.p.u32_at(0), sqe.p.u32_at(4), sqe.p.u32_at(8)));
    } else {
        assert_eq!((m, n, k), (0, 0, 0));
    }
    let _ = job.work();
    Some(job)
}

/// Byte-level overlap, written out independently of `Region::overlaps`.
fn bytes_overlap(a: &Region, b: &Region) -> bool {
    let (a0, a1) = (a.offset() as u128, a.offset() as u128 + a.len() as u128 * a.elem_bytes() as u128);
    let (b0, b1) = (b.offset() as u128, b.offset() as u128 + b.len() as u128 * b.elem_bytes() as u128);
    a.segment() == b.segment() && a0 < a1 && b0 < b1 && a0.max(b0) < a1.min(b1)
}

/// The contract (`c_src/erlcuda_ring.h`; SECURITY.md, "Descriptors")
/// re-stated from the kernel table's columns: flags, kernel, element type,
/// a one-vector kernel's in1 flag, shape, in0, in1 (two-vector kernels
/// only), out, then overlap.
pub fn reference(s: &Sqe, sizes: &SegmentSizes) -> Result<(), Status> {
    // EC_FLAG_ARGS (1) is a user's job, whose kernel no module here has:
    // every id from EC_USER_KERNEL_BASE is unknown, and a built-in never
    // takes it. Buffer flags (EC_FLAG_IN0_BUF 2, IN1_BUF 4, OUT_BUF 8) name
    // buffer ids; validation here knows no buffer, so each one named is
    // BAD_BUFFER where its slot would be judged.
    let bufs = s.flags & 0x0e;
    if s.flags & !(0x0e | EC_FLAG_ARGS) != 0 {
        return Err(Status::BadFlags);
    }
    if s.kernel >= EC_USER_KERNEL_BASE {
        return Err(Status::BadKernel);
    }
    let row = KERNEL_ROWS.get(usize::from(s.kernel).wrapping_sub(1)).ok_or(Status::BadKernel)?;
    if s.flags & EC_FLAG_ARGS != 0 {
        return Err(Status::BadFlags);
    }
    if s.ty >= 6 || row.types & (1 << s.ty) == 0 {
        return Err(Status::BadType);
    }
    let eb: u128 = if s.ty == 1 || s.ty == 4 { 8 } else if s.ty == 5 { 1 } else { 4 };
    let two = row.args.split(',').filter(|a| a.split(':').nth(1) == Some("v")).count() == 2;
    // A one-vector kernel has no second slot to name a buffer in.
    if !two && bufs & 4 != 0 {
        return Err(Status::BadFlags);
    }
    let (m, n, k) = (s.p.u32_at(0) as u128, s.p.u32_at(4) as u128, s.p.u32_at(8) as u128);
    let (l0, l1, lo) = (s.in0_len as u128, s.in1_len as u128, s.out_len as u128);
    let l1_ok = |want: u128| if two { l1 == want } else { l1 == 0 };
    let shape_ok = match row.shape {
        Shape::Elementwise => l0 == lo && l1_ok(lo),
        Shape::Reduction => lo == 1 && l1_ok(l0),
        Shape::Matmul => m * k == l0 && k * n == l1 && m * n == lo,
    };
    if !shape_ok {
        return Err(Status::BadShape);
    }
    let region = |addr: u64, len: u32| -> Result<(u64, u128, u128), Status> {
        let seg = addr >> 48;
        let bytes = if seg < 64 { sizes.get(seg as usize) } else { None };
        let bytes = bytes.ok_or(Status::OutOfBounds)?;
        let off = addr & ((1u64 << 48) - 1);
        if !(off as u128).is_multiple_of(eb) {
            return Err(Status::Misaligned);
        }
        let end = off as u128 + len as u128 * eb;
        if end > bytes as u128 {
            return Err(Status::OutOfBounds);
        }
        Ok((seg, off as u128, end))
    };
    if bufs & 2 != 0 {
        return Err(Status::BadBuffer);
    }
    let in0 = region(s.in0, s.in0_len)?;
    let in1 = match (two, bufs & 4 != 0) {
        (true, true) => return Err(Status::BadBuffer),
        (true, false) => Some(region(s.in1, s.in1_len)?),
        (false, _) => None,
    };
    if bufs & 8 != 0 {
        return Err(Status::BadBuffer);
    }
    let out = region(s.out, s.out_len)?;
    let hit = |a: (u64, u128, u128), b: (u64, u128, u128)| a.0 == b.0 && a.1 < a.2 && b.1 < b.2 && a.1 < b.2 && b.1 < a.2;
    if hit(out, in0) || in1.is_some_and(|i| hit(out, i)) {
        return Err(Status::Overlap);
    }
    Ok(())
}
