//! The validator on built-ins' descriptors: every check, hostile fields,
//! and random descriptors.

use super::*;
use crate::layout::{Params, Shape, EC_ADDR_SEGMENT_SHIFT, EC_FLAG_FAULT, EC_KERNEL_COUNT, EC_PARAM_BYTES};

const ARENA: u64 = 1 << 20;

fn vadd(in0: u64, in1: u64, out: u64, len: u32) -> Sqe {
    Sqe {
        user_data: 42,
        kernel: Kernel::VectorAdd.id(),
        in0,
        in1,
        out,
        in0_len: len,
        in1_len: len,
        out_len: len,
        ..Sqe::default()
    }
}

fn matmul(m: u32, n: u32, k: u32, lens: (u32, u32, u32)) -> Sqe {
    Sqe {
        user_data: 7,
        kernel: Kernel::Matmul.id(),
        in0: 0,
        in1: 0x1000,
        out: 0x2000,
        in0_len: lens.0,
        in1_len: lens.1,
        out_len: lens.2,
        p: Params::pack(Kernel::Matmul.plan(), &[], &[m, n, k]),
        ..Sqe::default()
    }
}

#[test]
fn accepts_good_descriptors_of_every_kernel() {
    let j = validate(&vadd(0, 0x100, 0x200, 64), ARENA).unwrap();
    assert_eq!(j.user_data(), 42);
    assert_eq!(j.out().offset(), 0x200);
    assert_eq!(j.out().len(), 64);

    let r = Sqe {
        kernel: Kernel::Reduce.id(),
        in0: 0,
        in0_len: 100,
        // Unused address: ignored, even when absurd.
        in1: u64::MAX,
        out: 0x1000,
        out_len: 1,
        ..Sqe::default()
    };
    let j = validate(&r, ARENA).unwrap();
    assert_eq!(j.in1(), Region::EMPTY);

    let d = Sqe {
        kernel: Kernel::DotProduct.id(),
        in0: 0,
        in1: 0,
        in0_len: 10,
        in1_len: 10,
        out: 0x100,
        out_len: 1,
        ..Sqe::default()
    };
    validate(&d, ARENA).expect("inputs may alias each other");

    validate(&matmul(2, 3, 4, (8, 12, 6)), ARENA).unwrap();
    // Degenerate matmuls are fine.
    validate(&matmul(0, 3, 4, (0, 12, 0)), ARENA).unwrap();
    validate(&matmul(2, 3, 0, (0, 0, 6)), ARENA).unwrap();
    validate(&matmul(0, 0, 0, (0, 0, 0)), ARENA).unwrap();
}

#[test]
fn region_exactly_at_the_end_is_in_bounds() {
    let r = Region::new(ARENA - 16, 4, ElemType::F32, ARENA).unwrap();
    assert_eq!(r.end(), ARENA);
    assert_eq!(Region::new(ARENA - 16, 5, ElemType::F32, ARENA), Err(Status::OutOfBounds));
    assert_eq!(Region::new(ARENA, 0, ElemType::F32, ARENA).unwrap().len(), 0);
    assert_eq!(Region::new(ARENA + 4, 0, ElemType::F32, ARENA), Err(Status::OutOfBounds));
}

#[test]
fn refuses_flags() {
    for flags in [1, 0x10, 0x40, 0x81, u8::MAX, 0x13] {
        let mut s = vadd(0, 0x100, 0x200, 4);
        s.flags = flags;
        assert_eq!(validate(&s, ARENA), Err(Status::BadFlags), "{flags:#x}");
    }
    // Buffer flags without buffers: the ids name nothing.
    for flags in [2, 4, 8, 14] {
        let mut s = vadd(0, 0x100, 0x200, 4);
        s.flags = flags;
        assert_eq!(validate(&s, ARENA), Err(Status::BadBuffer), "{flags:#x}");
    }
    assert!(!validate(&vadd(0, 0x100, 0x200, 4), ARENA).unwrap().fault());
}

/// EC_FLAG_FAULT is BAD_FLAGS unless gpud is built with the
/// `fault-injection` feature; then it is validated like any other job.
#[test]
fn fault_flag_only_with_the_feature() {
    let mut s = vadd(0, 0x100, 0x200, 4);
    s.flags = EC_FLAG_FAULT;
    if cfg!(feature = "fault-injection") {
        assert!(validate(&s, ARENA).unwrap().fault());
        // Still validated as usual.
        s.out = 0;
        assert_eq!(validate(&s, ARENA), Err(Status::Overlap));
        s.kernel = 9;
        assert_eq!(validate(&s, ARENA), Err(Status::BadKernel));
    } else {
        assert_eq!(validate(&s, ARENA), Err(Status::BadFlags));
    }
}

fn seg(i: u64, off: u64) -> u64 {
    (i << EC_ADDR_SEGMENT_SHIFT) | off
}

#[test]
fn segments_are_checked_against_their_own_sizes() {
    let mut sizes = SegmentSizes::single(ARENA);
    sizes.set(1, 4096);
    sizes.set(63, 1 << 30);
    let sz = &sizes;
    // Inside segment 1, and exactly at its end.
    let j = validate(&vadd(seg(1, 0), seg(1, 16), seg(1, 4096 - 16), 4), sz).unwrap();
    assert_eq!((j.out().segment(), j.out().offset()), (1, 4096 - 16));
    // Mixed segments in one job.
    let j = validate(&vadd(0, seg(63, 0x100), seg(1, 0), 4), sz).unwrap();
    assert_eq!([j.in0().segment(), j.in1().segment(), j.out().segment()], [0, 63, 1]);
    // Past the end of segment 1 (fine in segment 0).
    assert_eq!(validate(&vadd(seg(1, 4096 - 12), 0, 0x200, 4), sz), Err(Status::OutOfBounds));
    assert!(validate(&vadd(4096 - 12, 0x1000, 0x200, 4), sz).is_ok());
    // Unknown segments, slots past EC_MAX_SEGMENTS, the top segment.
    for addr in [seg(2, 0), seg(62, 0), seg(64, 0), seg(0xffff, 0), u64::MAX - 3] {
        assert_eq!(validate(&vadd(addr, 0, 0x200, 4), sz), Err(Status::OutOfBounds), "{addr:#x}");
        assert_eq!(validate(&vadd(0, 0x200, addr, 4), sz), Err(Status::OutOfBounds), "{addr:#x}");
    }
    // Misalignment inside another segment.
    assert_eq!(validate(&vadd(seg(1, 2), 0, 0x200, 4), sz), Err(Status::Misaligned));
    // The same offset in two segments is not an overlap.
    assert!(validate(&vadd(seg(1, 0), 0x100, 0, 4), sz).is_ok());
    // The same offset in one segment is.
    assert_eq!(validate(&vadd(seg(1, 0), 0x100, seg(1, 8), 4), sz), Err(Status::Overlap));
    // Segment 0 of a plain size knows no other segment.
    assert_eq!(validate(&vadd(seg(1, 0), 0, 0x200, 4), ARENA), Err(Status::OutOfBounds));
}

#[test]
fn unknown_segments_are_recognised() {
    let mut sizes = SegmentSizes::single(ARENA);
    sizes.set(1, 4096);
    let unknown = |s: &Sqe, sizes: &SegmentSizes| names_unknown_segment(s, sizes, &NoArena);
    assert!(!unknown(&vadd(seg(1, 0), 0, 0x200, 4), &sizes));
    assert!(unknown(&vadd(seg(2, 0), 0, 0x200, 4), &sizes));
    assert!(unknown(&vadd(0, 0, seg(63, 0), 4), &sizes));
    // Slots that can never exist are not worth a look at the socket.
    assert!(!unknown(&vadd(seg(64, 0), 0, 0x200, 4), &sizes));
    assert!(!unknown(&vadd(u64::MAX, 0, 0x200, 4), &sizes));
    // Reduce ignores in1, so an unknown segment there does not count.
    let r = Sqe {
        kernel: Kernel::Reduce.id(),
        in1: seg(5, 0),
        out: 0x100,
        out_len: 1,
        ..Sqe::default()
    };
    assert!(!unknown(&r, &sizes));
    // Unknown kernels: nothing to look up.
    assert!(!unknown(&Sqe { kernel: 77, in0: seg(2, 0), ..r }, &sizes));
    // ... unless the address is a buffer id.
    assert!(!unknown(&Sqe { in0: seg(2, 0), flags: EC_FLAG_IN0_BUF, ..vadd(0, 0, 0x200, 4) }, &sizes));
    // (Users' records: user_tests.rs.)
    // SegmentSizes bookkeeping.
    assert_eq!(sizes.get(1), Some(4096));
    assert_eq!(sizes.get(2), None);
    assert_eq!(sizes.get(64), None);
    assert_eq!(sizes.get(usize::MAX), None);
}

#[test]
fn refuses_unknown_kernels() {
    for kernel in [0, EC_KERNEL_COUNT as u16, 255, 0x1001, u16::MAX] {
        let mut s = vadd(0, 0x100, 0x200, 4);
        s.kernel = kernel;
        assert_eq!(validate(&s, ARENA), Err(Status::BadKernel), "kernel {kernel}");
    }
}

#[test]
fn refuses_bad_segments_and_huge_addresses() {
    for addr in [
        1u64 << 48,
        (1u64 << 48) | 0x100,
        0xffff_0000_0000_0000,
        u64::MAX,
        u64::MAX - 3,
    ] {
        for which in 0..3 {
            let mut s = vadd(0, 0x100, 0x200, 4);
            match which {
                0 => s.in0 = addr,
                1 => s.in1 = addr,
                _ => s.out = addr,
            }
            assert_eq!(validate(&s, ARENA), Err(Status::OutOfBounds), "{addr:#x}");
        }
    }
    // Segment 0 but past the arena, and offsets whose end overflows.
    let big = (1u64 << 48) - 4;
    assert_eq!(validate(&vadd(big, 0, 0x200, 4), ARENA), Err(Status::OutOfBounds));
    assert_eq!(
        validate(&vadd(0, 0x100, 0x200, 4), 0x200),
        Err(Status::OutOfBounds)
    );
    let r = Region::new(big, u32::MAX, ElemType::F32, u64::MAX).unwrap();
    assert_eq!((r.segment(), r.elem_bytes(), r.offset(), r.len()), (0, 4, big, u32::MAX as usize));
    assert_eq!(Region::new(big, u32::MAX, ElemType::F32, big), Err(Status::OutOfBounds));
}

#[test]
fn refuses_huge_lengths() {
    assert_eq!(
        validate(&vadd(0, 0x100, 0x200, u32::MAX), ARENA),
        Err(Status::OutOfBounds)
    );
    // Even in an arena as large as the address space allows.
    let s = vadd(0, 0, 1u64 << 47, u32::MAX);
    assert!(validate(&s, u64::MAX).is_ok());
    assert_eq!(validate(&s, ARENA), Err(Status::OutOfBounds));
}

#[test]
fn refuses_misaligned_addresses() {
    for off in [1u64, 2, 3, 0x101, 0x102, 0x103] {
        for which in 0..3 {
            let mut s = vadd(0x1000, 0x2000, 0x3000, 4);
            match which {
                0 => s.in0 = off,
                1 => s.in1 = off,
                _ => s.out = 0x4000 + off,
            }
            assert_eq!(validate(&s, ARENA), Err(Status::Misaligned), "{which} {off}");
        }
    }
}

#[test]
fn refuses_output_overlapping_an_input() {
    // Same region.
    assert_eq!(validate(&vadd(0, 0x100, 0, 4), ARENA), Err(Status::Overlap));
    assert_eq!(validate(&vadd(0x100, 0, 0x100, 4), ARENA), Err(Status::Overlap));
    // Partial overlap, one element.
    assert_eq!(validate(&vadd(0, 0x100, 12, 4), ARENA), Err(Status::Overlap));
    assert_eq!(validate(&vadd(0x100, 0, 0x100 - 12, 4), ARENA), Err(Status::Overlap));
    // Output starting inside an input.
    assert_eq!(validate(&vadd(0, 0x1000, 0x40, 64), ARENA), Err(Status::Overlap));
    let d = Sqe {
        kernel: Kernel::DotProduct.id(),
        in0: 0,
        in1: 0x1000,
        in0_len: 64,
        in1_len: 64,
        out: 0x40,
        out_len: 1,
        ..Sqe::default()
    };
    assert_eq!(validate(&d, ARENA), Err(Status::Overlap));
    // Adjacent regions do not overlap.
    assert!(validate(&vadd(0, 16, 32, 4), ARENA).is_ok());
    // Empty regions never overlap anything.
    assert!(validate(&vadd(0, 0, 0, 0), ARENA).is_ok());
    let m = Sqe {
        out: 0,
        in0: 0,
        in1: 0,
        ..matmul(0, 5, 5, (0, 25, 0))
    };
    assert!(validate(&m, ARENA).is_ok(), "an empty output overlaps nothing");
}

#[test]
fn refuses_bad_shapes() {
    let mut s = vadd(0, 0x100, 0x200, 4);
    s.in1_len = 3;
    assert_eq!(validate(&s, ARENA), Err(Status::BadShape));
    let mut s = vadd(0, 0x100, 0x200, 4);
    s.out_len = 5;
    assert_eq!(validate(&s, ARENA), Err(Status::BadShape));

    let reduce = |in1_len, out_len| Sqe {
        kernel: Kernel::Reduce.id(),
        in0_len: 4,
        in1_len,
        out: 0x100,
        out_len,
        ..Sqe::default()
    };
    assert_eq!(validate(&reduce(1, 1), ARENA), Err(Status::BadShape));
    assert_eq!(validate(&reduce(0, 0), ARENA), Err(Status::BadShape));
    assert_eq!(validate(&reduce(0, 2), ARENA), Err(Status::BadShape));
    assert_eq!(validate(&reduce(0, u32::MAX), ARENA), Err(Status::BadShape));
    assert!(validate(&reduce(0, 1), ARENA).is_ok());

    let dot = |a, b, o| Sqe {
        kernel: Kernel::DotProduct.id(),
        in1: 0x100,
        in0_len: a,
        in1_len: b,
        out: 0x200,
        out_len: o,
        ..Sqe::default()
    };
    assert_eq!(validate(&dot(4, 5, 1), ARENA), Err(Status::BadShape));
    assert_eq!(validate(&dot(4, 4, 4), ARENA), Err(Status::BadShape));
    assert_eq!(validate(&dot(4, 4, 0), ARENA), Err(Status::BadShape));

    assert_eq!(validate(&matmul(2, 3, 4, (8, 12, 5)), ARENA), Err(Status::BadShape));
    assert_eq!(validate(&matmul(2, 3, 4, (9, 12, 6)), ARENA), Err(Status::BadShape));
    assert_eq!(validate(&matmul(2, 3, 4, (8, 11, 6)), ARENA), Err(Status::BadShape));
}

#[test]
fn matmul_dimension_products_do_not_wrap() {
    // 65536 * 65536 == 2^32, which wraps to 0 in u32 arithmetic.
    let s = matmul(65536, 0, 65536, (0, 0, 0));
    assert_eq!(validate(&s, ARENA), Err(Status::BadShape));
    let s = matmul(u32::MAX, u32::MAX, u32::MAX, (1, 1, 1));
    assert_eq!(validate(&s, ARENA), Err(Status::BadShape));
    // m*k wraps to exactly in0_len in u32: 0x1_0000_0001 -> 1.
    let s = matmul(0x10001, 1, 0xffff, (1, 0xffff, 0x10001));
    assert_eq!(validate(&s, ARENA), Err(Status::BadShape));
    let s = matmul(u32::MAX, 0, 0, (0, 0, 0));
    assert!(validate(&s, ARENA).is_ok(), "a 4G x 0 result is empty and fine");
}

#[test]
fn every_field_extreme_at_once() {
    let s = Sqe {
        user_data: u64::MAX,
        kernel: u16::MAX,
        ty: u8::MAX,
        flags: u8::MAX,
        in0: u64::MAX,
        in1: u64::MAX,
        out: u64::MAX,
        in0_len: u32::MAX,
        in1_len: u32::MAX,
        out_len: u32::MAX,
        p: Params([0xff; EC_PARAM_BYTES]),
    };
    assert_eq!(validate(&s, ARENA), Err(Status::BadFlags));
    assert_eq!(validate(&Sqe { flags: 0, ..s }, ARENA), Err(Status::BadKernel));
    assert_eq!(validate(&Sqe { flags: 0, kernel: 1, ..s }, ARENA), Err(Status::BadType));
    for k in Kernel::ALL {
        let r = validate(&Sqe { flags: 0, kernel: k.id(), ty: 0, ..s }, u64::MAX);
        assert!(r.is_err(), "{k:?} accepted an all-ones descriptor");
    }
    // Zero arena: only empty regions at offset 0 fit.
    assert_eq!(validate(&vadd(0, 0, 0, 0), 0).map(|j| j.out().len()), Ok(0));
    assert_eq!(validate(&vadd(0, 0, 0, 1), 0), Err(Status::OutOfBounds));
    assert_eq!(validate(&vadd(0, 0, 4, 1), 0), Err(Status::OutOfBounds));
}

use crate::testvec::Rng;

/// Hostile fields, drawn from the tests' one PRNG.
trait Hostile {
    fn addr(&mut self, arena: u64) -> u64;
    fn len(&mut self) -> u32;
    fn dim(&mut self) -> u32;
}
impl Hostile for Rng {
    fn addr(&mut self, arena: u64) -> u64 {
        match self.next() % 8 {
            0 => self.next(),
            1 => arena.wrapping_sub(self.next() % 64),
            2 => (self.next() % 4) << 48 | (self.next() % arena.max(1)),
            3 => u64::MAX - self.next() % 16,
            _ => (self.next() % arena.max(1)) & !3,
        }
    }
    fn len(&mut self) -> u32 {
        match self.next() % 6 {
            0 => self.next() as u32,
            1 => u32::MAX - (self.next() % 4) as u32,
            2 => 1,
            3 => 0,
            _ => (self.next() % 512) as u32,
        }
    }
    fn dim(&mut self) -> u32 {
        match self.next() % 5 {
            0 => self.next() as u32,
            1 => 65536,
            2 => 0,
            _ => (self.next() % 24) as u32,
        }
    }
}

#[test]
fn randomized_descriptors_never_panic_and_accepted_ones_are_sound() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut accepted = 0usize;
    let mut seen = std::collections::HashSet::new();
    for i in 0..200_000 {
        let arena = match i % 4 {
            0 => 0,
            1 => 4096,
            2 => 1 << 20,
            _ => rng.next() % (1 << 24),
        };
        let (m, n, k) = (rng.dim(), rng.dim(), rng.dim());
        let mut s = Sqe {
            user_data: rng.next(),
            kernel: (rng.next() % (EC_KERNEL_COUNT as u64 + 2)) as u16,
            ty: match rng.next() % 4 {
                0 => rng.next() as u8,
                1 => (rng.next() % 8) as u8,
                2 => ElemType::F64.id(),
                _ => ElemType::F32.id(),
            },
            flags: if rng.next().is_multiple_of(16) { rng.next() as u8 } else { 0 },
            in0: rng.addr(arena),
            in1: rng.addr(arena),
            out: rng.addr(arena),
            in0_len: rng.len(),
            in1_len: rng.len(),
            out_len: rng.len(),
            p: Params::default(),
        };
        // Make a good share of the shapes consistent so that the address
        // checks get exercised, not only the shape check.
        if let (Some(kernel), 0) = (Kernel::from_id(s.kernel), rng.next() % 2) {
            let scalars = [f64::from_bits(rng.next()), 1.5];
            let sh = crate::testvec::shaped_sqe(kernel, ElemType::F32, s.in0_len, [m, n, k], &scalars);
            (s.in0_len, s.in1_len, s.out_len, s.p) = (sh.in0_len, sh.in1_len, sh.out_len, sh.p);
        }
        match validate(&s, arena) {
            Err(st) => {
                seen.insert(st);
            }
            Ok(j) => {
                accepted += 1;
                assert!(s.flags == 0 || (s.flags == EC_FLAG_FAULT && j.fault()));
                assert_eq!(j.builtin().unwrap().id(), s.kernel);
                assert_eq!(j.ty().id(), s.ty);
                assert!(j.builtin().unwrap().runs_on(j.ty()));
                let eb = j.ty().bytes();
                let mut regions = vec![j.in0(), j.out()];
                if j.builtin().unwrap().vector_inputs() == 2 {
                    regions.push(j.in1());
                }
                for r in &regions {
                    assert_eq!(r.offset() % eb, 0);
                    let end = r.offset() as u128 + r.len() as u128 * eb as u128;
                    assert!(end <= arena as u128, "{s:?} -> {r:?} beyond {arena}");
                }
                assert!(!j.out().overlaps(&j.in0()) && !j.out().overlaps(&j.in1()));
                let two = j.builtin().unwrap().vector_inputs() == 2;
                match j.builtin().unwrap().row().shape {
                    Shape::Elementwise => {
                        assert!(j.in0().len() == j.out().len() && (!two || j.in1().len() == j.out().len()))
                    }
                    Shape::Reduction => {
                        assert!(j.out().len() == 1 && (!two || j.in0().len() == j.in1().len()))
                    }
                    Shape::Matmul => {
                        let (m, n, k) = j.dims();
                        assert_eq!(m as u128 * k as u128, j.in0().len() as u128);
                        assert_eq!(k as u128 * n as u128, j.in1().len() as u128);
                        assert_eq!(m as u128 * n as u128, j.out().len() as u128);
                    }
                }
            }
        }
    }
    assert!(accepted > 1000, "only {accepted} random descriptors accepted");
    for st in [
        Status::BadKernel,
        Status::BadFlags,
        Status::OutOfBounds,
        Status::BadShape,
        Status::Overlap,
        Status::Misaligned,
        Status::BadType,
    ] {
        assert!(seen.contains(&st), "fuzzing never produced {st:?}");
    }
}
