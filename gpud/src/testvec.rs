//! Shared test vectors: one deterministic set of cases (seeded PRNG) for
//! every kernel of the table and every element type it runs on, with f64
//! references (each kernel's `KernelOp::reference`) and tolerances derived
//! from the accumulation the header states, run through the [`Backend`]
//! trait exactly as the daemon does (validate, coalesce, submit, poll).
//! `cargo test` runs them on the CPU backend everywhere and on the CUDA
//! backend where a driver and a device exist (skipped with a note
//! otherwise; `ERLCUDA_REQUIRE_GPU=1` makes a missing GPU a failure:
//! [`no_gpu`], the one place that decides).
//!
//! Tolerance per output: `depth · u · Σ|terms|` with `u` the type's unit
//! roundoff and `depth` the longest chain of roundings the shape allows:
//! 2 for elementwise kernels (a product and a sum), the stated reduction
//! depth (`EC_SUM_SERIAL + 16 + ceil(n / EC_SUM_CHUNK) + 1`), `k + 1` for a
//! matmul. Outputs are poisoned with NaN before every run.
//!
//! The arena is real shared memory: two memfds mapped like the VM's (segment
//! 0 and segment 1), so the CUDA backend registers them as in production.
//!
//! Also here: `gpud-bench --bench-backend`, the mapped-vs-copied measurement.

#![allow(clippy::too_many_arguments, clippy::should_implement_trait, clippy::neg_cmp_op_on_partial_ord)]

use std::os::fd::OwnedFd;
use std::time::Instant;

use nix::sys::memfd::{memfd_create, MFdFlags};

use crate::arena::Arena;
use crate::backend::{Backend, Launch, Ticket};
use crate::coalesce::{self, Coalescer};
use crate::descriptor::{validate, Job, SegmentSizes};
use crate::error::{Error, Result};
use crate::handshake::Mapping;
use crate::layout::{ElemType, Kernel, Params, Shape, Sqe, EC_ADDR_SEGMENT_SHIFT, EC_SUM_CHUNK, EC_SUM_SERIAL};
use crate::ops;

/// xorshift64: deterministic and dependency-free; the one PRNG of gpud's
/// tests and tools.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next() % n
        }
    }
    /// Uniform in [-1, 1), one in 64 scaled by 1000.
    pub fn f(&mut self) -> f32 {
        let u = (self.next() >> 40) as f32 / (1u64 << 24) as f32;
        let x = 2.0 * u - 1.0;
        if self.next().is_multiple_of(64) {
            x * 1000.0
        } else {
            x
        }
    }
    pub fn vec(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.f()).collect()
    }
    /// Like [`Rng::f`] with all 53 bits for f64, representable in `ty`.
    pub fn of(&mut self, ty: ElemType) -> f64 {
        let u = (self.next() >> 11) as f64 / (1u64 << 53) as f64;
        let x = 2.0 * u - 1.0;
        let x = if self.next().is_multiple_of(64) { x * 1000.0 } else { x };
        round_to(x, ty)
    }
    pub fn vec_of(&mut self, n: usize, ty: ElemType) -> Vec<f64> {
        (0..n).map(|_| self.of(ty)).collect()
    }
}

/// `x` rounded to the nearest value of `ty` (a float type).
pub fn round_to(x: f64, ty: ElemType) -> f64 {
    match ty {
        ElemType::F32 => x as f32 as f64,
        _ => x,
    }
}

/// The unit roundoff of a float type.
pub fn unit_roundoff(ty: ElemType) -> f64 {
    match ty {
        ElemType::F32 => f64::from(f32::EPSILON) / 2.0,
        _ => f64::EPSILON / 2.0,
    }
}

/// The longest chain of roundings an output of `kernel` goes through, as
/// the header states it (see the module doc).
pub fn depth(kernel: Kernel, n: usize, k: usize) -> f64 {
    match kernel.row().shape {
        Shape::Elementwise => 2.0,
        Shape::Reduction => (EC_SUM_SERIAL as usize + 16 + n.div_ceil(EC_SUM_CHUNK as usize) + 1) as f64,
        Shape::Matmul => (k + 1) as f64,
    }
}

/// Sizes every vector kernel is checked at.
pub const SIZES: [usize; 6] = [0, 1, 7, 1023, 4097, (1 << 20) + 7];

/// Ragged matmul shapes (m, n, k), zero dims included.
pub const MATMUL_SHAPES: [(usize, usize, usize); 16] = [
    (0, 0, 0),
    (0, 5, 3),
    (4, 0, 3),
    (3, 4, 0),
    (1, 1, 1),
    (1, 7, 1),
    (7, 13, 5),
    (33, 17, 65),
    (130, 4, 9),
    (64, 200, 33),
    (1, 517, 64),
    (300, 1, 70),
    (129, 65, 257),
    (128, 128, 128),
    (256, 256, 64),
    (200, 300, 40),
];

/// The descriptor of one job of `kernel` on `ty` with the lengths its shape
/// rule asks for: `n` elements (elementwise, reduction) or the `dims`
/// (m, n, k: matmul); scalars in signature order. Addresses are left 0.
/// The one descriptor builder of gpud's tests.
pub fn shaped_sqe(kernel: Kernel, ty: ElemType, n: u32, dims: [u32; 3], scalars: &[f64]) -> Sqe {
    let two = kernel.vector_inputs() == 2;
    let (l0, l1, lo) = match kernel.row().shape {
        Shape::Elementwise => (n, if two { n } else { 0 }, n),
        Shape::Reduction => (n, if two { n } else { 0 }, 1),
        Shape::Matmul => {
            // Wrapping: hostile tests build dimensions whose products do not
            // fit a length on purpose.
            let [m, nn, k] = dims;
            (m.wrapping_mul(k), k.wrapping_mul(nn), m.wrapping_mul(nn))
        }
    };
    let dims_used: &[u32] = if kernel.row().shape == Shape::Matmul { &dims } else { &[] };
    Sqe {
        kernel: kernel.id(),
        ty: ty.id(),
        in0_len: l0,
        in1_len: l1,
        out_len: lo,
        p: Params::pack(kernel.plan(), scalars, dims_used),
        ..Sqe::default()
    }
}

/// The descriptor of an f32 m×k by k×n matmul at the given arena addresses.
pub fn matmul_sqe(pa: u64, pb: u64, po: u64, m: usize, n: usize, k: usize) -> Sqe {
    Sqe {
        in0: pa,
        in1: pb,
        out: po,
        ..shaped_sqe(Kernel::Matmul, ElemType::F32, 0, [m as u32, n as u32, k as u32], &[])
    }
}

/// Arena segments in memfds, mapped MAP_SHARED like the VM's.
pub struct TestArena {
    segs: Vec<(OwnedFd, Mapping, u64)>,
}

impl TestArena {
    /// One memfd per entry of `bytes` (segment i = bytes[i]).
    pub fn new(bytes: &[u64]) -> TestArena {
        let segs = bytes
            .iter()
            .map(|&b| {
                let fd = memfd_create(c"gpud-testvec", MFdFlags::MFD_CLOEXEC).expect("memfd_create");
                nix::unistd::ftruncate(&fd, b as i64).expect("ftruncate");
                let m = Mapping::new_plain(&fd, b).expect("mmap");
                (fd, m, 0u64)
            })
            .collect();
        TestArena { segs }
    }

    pub fn arena(&self) -> Arena<'_> {
        // SAFETY: the mappings live as long as self, read-write, page-aligned.
        unsafe {
            let mut a = Arena::from_raw(self.segs[0].1.base(), self.segs[0].1.len() as u64);
            for (i, s) in self.segs.iter().enumerate().skip(1) {
                a.set_segment(i, s.1.base(), s.1.len() as u64);
            }
            a
        }
    }

    pub fn sizes(&self) -> SegmentSizes {
        let mut s = SegmentSizes::single(self.segs[0].1.len() as u64);
        for (i, seg) in self.segs.iter().enumerate().skip(1) {
            s.set(i, seg.1.len() as u64);
        }
        s
    }

    /// Registers every segment with `backend`.
    pub fn attach(&self, backend: &mut dyn Backend) -> Result<()> {
        for (i, s) in self.segs.iter().enumerate() {
            backend.add_segment(i, s.1.base(), s.1.len() as u64)?;
        }
        Ok(())
    }

    /// Allocates `n` f32 in segment `seg`: 256-aligned like the NIF, or
    /// (misaligned) 4 to 12 bytes past that, to reach the kernels' scalar paths.
    pub fn alloc(&mut self, seg: usize, n: usize, misalign: u64) -> u64 {
        self.alloc_of(seg, n, ElemType::F32, misalign)
    }

    /// Allocates `n` elements of `ty` in segment `seg`, `misalign` elements
    /// past a 256-byte boundary.
    pub fn alloc_of(&mut self, seg: usize, n: usize, ty: ElemType, misalign: u64) -> u64 {
        let s = &mut self.segs[seg];
        let off = s.2 + misalign * ty.bytes();
        s.2 = (off + n as u64 * ty.bytes()).next_multiple_of(256);
        assert!(s.2 <= s.1.len() as u64, "test arena segment {seg} too small");
        (seg as u64) << EC_ADDR_SEGMENT_SHIFT | off
    }

    fn ptr(&self, addr: u64) -> *mut u8 {
        let seg = (addr >> EC_ADDR_SEGMENT_SHIFT) as usize;
        let off = addr & ((1 << EC_ADDR_SEGMENT_SHIFT) - 1);
        self.segs[seg].1.base().as_ptr().wrapping_add(off as usize)
    }

    pub fn write(&mut self, seg: usize, data: &[f32], misalign: u64) -> u64 {
        let addr = self.alloc(seg, data.len(), misalign);
        self.write_at(addr, data);
        addr
    }

    /// Overwrites the f32 region at `addr` (allocated earlier) with `data`.
    pub fn write_at(&mut self, addr: u64, data: &[f32]) {
        // SAFETY: a region allocated inside the mapping, no launch in flight.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.ptr(addr).cast(), data.len()) };
    }

    /// Copies `out.len()` floats from `addr` into `out`.
    pub fn read_into(&self, addr: u64, out: &mut [f32]) {
        // SAFETY: as for `write_at`.
        unsafe { std::ptr::copy_nonoverlapping(self.ptr(addr).cast::<f32>(), out.as_mut_ptr(), out.len()) };
    }

    pub fn read(&self, addr: u64, n: usize) -> Vec<f32> {
        let mut v = vec![0f32; n];
        self.read_into(addr, &mut v);
        v
    }

    /// Writes `data` (values of `ty`) as elements of `ty` at a fresh region.
    pub fn write_of(&mut self, seg: usize, data: &[f64], ty: ElemType, misalign: u64) -> u64 {
        let addr = self.alloc_of(seg, data.len(), ty, misalign);
        self.store(addr, data, ty);
        addr
    }

    /// Stores `data` as elements of `ty` at `addr`.
    pub fn store(&mut self, addr: u64, data: &[f64], ty: ElemType) {
        let p = self.ptr(addr);
        for (i, &x) in data.iter().enumerate() {
            // SAFETY: inside a region allocated for data.len() elements of ty;
            // unaligned writes, so any misalignment is fine.
            unsafe {
                match ty {
                    ElemType::F32 => p.cast::<f32>().add(i).write_unaligned(x as f32),
                    _ => p.cast::<f64>().add(i).write_unaligned(x),
                }
            }
        }
    }

    /// Reads `n` elements of `ty` at `addr`, as f64.
    pub fn load(&self, addr: u64, n: usize, ty: ElemType) -> Vec<f64> {
        let p = self.ptr(addr);
        // SAFETY: as for `store`.
        (0..n)
            .map(|i| unsafe {
                match ty {
                    ElemType::F32 => f64::from(p.cast::<f32>().add(i).read_unaligned()),
                    _ => p.cast::<f64>().add(i).read_unaligned(),
                }
            })
            .collect()
    }
}

/// One job and what it must produce: per output element the f64
/// reference and Σ|terms| (the tolerance's scale), and the depth.
pub struct Case {
    pub name: String,
    pub sqe: Sqe,
    pub ty: ElemType,
    pub want: Vec<(f64, f64)>,
    pub depth: f64,
}

/// Where and how a case's vectors are placed.
#[derive(Clone, Copy)]
pub struct Placing {
    /// Segment of in0, in1, out.
    pub segs: [usize; 3],
    /// Elements past a 256-byte boundary.
    pub misalign: u64,
    /// in1 names in0's region (for two-vector kernels).
    pub alias: bool,
}

const PLAIN: Placing = Placing { segs: [0, 0, 0], misalign: 0, alias: false };

/// A case of `kernel` on `ty`: random inputs (and scalars) of the lengths
/// its shape asks for (`n`, or `dims` for a matmul), the reference from
/// the kernel's op.
pub fn case(ta: &mut TestArena, rng: &mut Rng, kernel: Kernel, ty: ElemType, n: usize, dims: [usize; 3], at: Placing) -> Case {
    let nscalars = kernel.sig().args().iter().filter(|a| a.kind == crate::signature::Kind::Scalar).count();
    let scalars: Vec<f64> = (0..nscalars).map(|_| rng.of(ElemType::F64)).collect();
    let d = [dims[0] as u32, dims[1] as u32, dims[2] as u32];
    let mut sqe = shaped_sqe(kernel, ty, n as u32, d, &scalars);
    let a = rng.vec_of(sqe.in0_len as usize, ty);
    sqe.in0 = ta.write_of(at.segs[0], &a, ty, at.misalign);
    let mut ins = vec![a];
    if kernel.vector_inputs() == 2 {
        if at.alias {
            sqe.in1 = sqe.in0;
            ins.push(ins[0].clone());
        } else {
            let b = rng.vec_of(sqe.in1_len as usize, ty);
            sqe.in1 = ta.write_of(at.segs[1], &b, ty, at.misalign);
            ins.push(b);
        }
    } else {
        sqe.in1 = 0xdead_beef_dead_beef; // unused: ignored
    }
    sqe.out = ta.alloc_of(at.segs[2], sqe.out_len as usize, ty, at.misalign);
    let refs: Vec<&[f64]> = ins.iter().map(Vec::as_slice).collect();
    let want = ops::op(kernel).reference(ty, &refs, &scalars, &d);
    assert_eq!(want.len(), sqe.out_len as usize, "{kernel:?} reference length");
    let tag = if at.misalign > 0 { " misaligned" } else if at.alias { " aliased" } else { "" };
    let what = if kernel.row().shape == Shape::Matmul { format!("{dims:?}") } else { format!("n={n}") };
    Case {
        name: format!("{} {} {what}{tag}", kernel.atom(), ty.atom()),
        sqe,
        ty,
        want,
        depth: depth(kernel, n, dims[2]),
    }
}

/// Segment 0 and 1 sizes the cases need.
pub const ARENA_BYTES: [u64; 2] = [448 << 20, 64 << 20];

/// The float types a kernel runs on.
fn types_of(kernel: Kernel) -> impl Iterator<Item = ElemType> {
    ElemType::ALL.into_iter().filter(move |t| kernel.runs_on(*t))
}

/// The shared cases, deterministic from `seed`: every kernel of the table,
/// every type it runs on, every size (or matmul shape), aligned and not.
pub fn build_cases(ta: &mut TestArena, seed: u64) -> Vec<Case> {
    let mut rng = Rng(seed);
    let mut cases = Vec::new();
    for kernel in Kernel::ALL {
        for ty in types_of(kernel) {
            if kernel.row().shape == Shape::Matmul {
                for &(m, n, k) in &MATMUL_SHAPES {
                    cases.push(case(ta, &mut rng, kernel, ty, 0, [m, n, k], PLAIN));
                }
                let mis = Placing { misalign: 1, ..PLAIN };
                cases.push(case(ta, &mut rng, kernel, ty, 0, [64, 200, 33], mis));
                cases.push(case(ta, &mut rng, kernel, ty, 0, [150, 140, 30], Placing { segs: [1, 0, 1], ..PLAIN }));
                continue;
            }
            for &n in &SIZES {
                cases.push(case(ta, &mut rng, kernel, ty, n, [0; 3], PLAIN));
                if n <= 5000 {
                    cases.push(case(ta, &mut rng, kernel, ty, n, [0; 3], Placing { misalign: 1, ..PLAIN }));
                }
                if kernel.vector_inputs() == 2 {
                    cases.push(case(ta, &mut rng, kernel, ty, n, [0; 3], Placing { alias: true, ..PLAIN }));
                }
            }
            // Segment 1, alone and mixed with segment 0.
            cases.push(case(ta, &mut rng, kernel, ty, 5000, [0; 3], Placing { segs: [1, 1, 1], ..PLAIN }));
            cases.push(case(ta, &mut rng, kernel, ty, 200_000, [0; 3], Placing { segs: [0, 1, 0], ..PLAIN }));
        }
    }
    // A mixed batch of many jobs of every kernel and type.
    for _ in 0..400 {
        let kernel = Kernel::ALL[rng.below(Kernel::ALL.len() as u64) as usize];
        let tys: Vec<ElemType> = types_of(kernel).collect();
        let ty = tys[rng.below(tys.len() as u64) as usize];
        let seg = |r: &mut Rng| if r.below(4) == 0 { 1 } else { 0 };
        let at = Placing { segs: [seg(&mut rng), seg(&mut rng), seg(&mut rng)], misalign: rng.below(3) / 2, alias: false };
        let n = match rng.below(10) {
            0 => 0,
            1..=6 => rng.below(3000) as usize,
            _ => rng.below(90_000) as usize,
        };
        let d = |r: &mut Rng| r.below(48) as usize;
        let dims = [d(&mut rng), d(&mut rng), d(&mut rng)];
        let mut c = case(ta, &mut rng, kernel, ty, n, dims, at);
        c.name = format!("mixed {}", c.name);
        cases.push(c);
    }
    for (i, c) in cases.iter_mut().enumerate() {
        c.sqe.user_data = i as u64;
    }
    cases
}

/// Poisons every output with NaN.
fn poison(ta: &mut TestArena, cases: &[Case]) {
    for c in cases {
        ta.store(c.sqe.out, &vec![f64::NAN; c.sqe.out_len as usize], c.ty);
    }
}

/// Checks every case's output; returns one line per failure.
pub fn check(ta: &TestArena, cases: &[Case]) -> Vec<String> {
    let mut bad = Vec::new();
    for c in cases {
        let got = ta.load(c.sqe.out, c.sqe.out_len as usize, c.ty);
        let u = unit_roundoff(c.ty);
        let tiny = if c.ty == ElemType::F32 { f64::from(f32::MIN_POSITIVE) } else { f64::MIN_POSITIVE };
        if let Some(i) = (0..got.len()).find(|&i| {
            let (want, mag) = c.want[i];
            if mag == 0.0 {
                got[i] != want
            } else {
                !((got[i] - want).abs() <= c.depth * u * mag + tiny)
            }
        }) {
            let (want, mag) = c.want[i];
            bad.push(format!("{}: elem {i}: {} vs {want} (Σ|terms| {mag}, depth {})", c.name, got[i], c.depth));
        }
    }
    bad
}

/// Runs `cases` through `backend` as the daemon would: validate, group by
/// kernel, submit launches of at most `per_launch` jobs (all in flight at
/// once), poll until every ticket is back. Returns the launch count.
pub fn run(backend: &mut dyn Backend, ta: &TestArena, cases: &[Case], per_launch: usize) -> Result<usize> {
    let sizes = ta.sizes();
    let mut co = Coalescer::new();
    for c in cases {
        let j = validate(&c.sqe, &sizes).map_err(|s| Error::Device(format!("{}: refused: {s:?}", c.name)))?;
        co.push(j);
    }
    let arena = ta.arena();
    let mut tickets: Vec<Ticket> = Vec::new();
    for (kernel, ty, jobs) in co.groups() {
        for chunk in jobs.chunks(per_launch.max(1)) {
            let launch = Launch::builtin(kernel, ty, chunk, coalesce::independent(chunk));
            tickets.push(backend.submit(&arena, &launch)?);
        }
    }
    let n = tickets.len();
    let mut done = Vec::new();
    let deadline = Instant::now() + std::time::Duration::from_secs(120);
    while done.len() < n {
        backend.poll(&mut done)?;
        if Instant::now() > deadline {
            return Err(Error::Device(format!("only {}/{n} launches finished in 120 s", done.len())));
        }
        std::hint::spin_loop();
    }
    done.sort_unstable();
    tickets.sort_unstable();
    if done != tickets {
        return Err(Error::Device(format!("tickets back {done:?}, submitted {tickets:?}")));
    }
    Ok(n)
}

/// The whole shared-vector check on one backend: one launch per kernel,
/// then many small launches in flight together. Panics on any failure.
pub fn check_backend(backend: &mut dyn Backend) {
    let mut ta = TestArena::new(&ARENA_BYTES);
    ta.attach(backend).expect("register the test arena");
    let cases = build_cases(&mut ta, 0x5eed_cafe);
    for per_launch in [usize::MAX, 37] {
        poison(&mut ta, &cases);
        let t = Instant::now();
        let launches = run(backend, &ta, &cases, per_launch).unwrap_or_else(|e| panic!("{}: {e}", backend.kind()));
        let bad = check(&ta, &cases);
        eprintln!(
            "testvec: {} backend: {} cases in {launches} launches, {:.1} ms, {} failures",
            backend.kind(),
            cases.len(),
            t.elapsed().as_secs_f64() * 1e3,
            bad.len()
        );
        assert!(bad.is_empty(), "{} backend failed {} cases:\n{}", backend.kind(), bad.len(), bad.join("\n"));
    }
    assert_eq!(backend.in_flight(), 0);
}

/// The CUDA backend for tests, or None after [`no_gpu`].
pub fn gpu_for_tests() -> Option<crate::backend::cuda::CudaBackend> {
    match crate::backend::cuda::CudaBackend::open(0, crate::backend::DEFAULT_LANE_SMS) {
        Ok(b) => Some(b),
        Err(e) => {
            no_gpu(&e.to_string());
            None
        }
    }
}

/// Every test that needs a GPU calls this where it finds none (`why`):
/// with `ERLCUDA_REQUIRE_GPU=1` (the GPU bundle sets it) that is a failure,
/// elsewhere the test is skipped with a note on stderr.
pub fn no_gpu(why: &str) {
    if std::env::var("ERLCUDA_REQUIRE_GPU").is_ok_and(|v| v == "1") {
        panic!("ERLCUDA_REQUIRE_GPU=1 but no CUDA backend: {why}");
    }
    eprintln!("NOTE: CUDA test skipped, no GPU backend here: {why}");
}

/// `gpud-bench --bench-backend`: per kernel and size, the time from submit to
/// completion with inputs read in place (mapped) and copied to the device
/// first (copy-in, copy-in+out), median of 15 runs after 3 warm-ups, µs.
pub fn bench_backend(device: u32) -> Result<()> {
    use crate::backend::cuda::CudaBackend;
    use crate::ops::Placement as Mode;
    let mut b = CudaBackend::open(device, crate::backend::DEFAULT_LANE_SMS)?;
    let mut ta = TestArena::new(&[1536 << 20]);
    ta.attach(&mut b)?;
    let mut rng = Rng(7);
    struct Bench {
        label: String,
        sqes: Vec<Sqe>,
    }
    let mut benches = Vec::new();
    let one = |ta: &mut TestArena, rng: &mut Rng, k: Kernel, n: usize| -> Sqe {
        case(ta, rng, k, ElemType::F32, n, [0; 3], PLAIN).sqe
    };
    for k in [Kernel::VectorAdd, Kernel::Reduce, Kernel::DotProduct] {
        for n in [4096usize, 1 << 16, 1 << 20, 1 << 24] {
            benches.push(Bench {
                label: format!("{} 1 x {n}", k.atom()),
                sqes: vec![one(&mut ta, &mut rng, k, n)],
            });
        }
        benches.push(Bench {
            label: format!("{} 1000 x 1000", k.atom()),
            sqes: (0..1000).map(|_| one(&mut ta, &mut rng, k, 1000)).collect(),
        });
    }
    // Matmul inputs without the f64 reference (not checked here).
    let mm = |ta: &mut TestArena, rng: &mut Rng, m: usize, n: usize, k: usize| -> Sqe {
        let (pa, pb) = (ta.write(0, &rng.vec(m * k), 0), ta.write(0, &rng.vec(k * n), 0));
        let po = ta.alloc(0, m * n, 0);
        matmul_sqe(pa, pb, po, m, n, k)
    };
    for s in [64usize, 128, 256, 512, 1024, 2048] {
        benches.push(Bench {
            label: format!("matmul 1 x {s}^3"),
            sqes: vec![mm(&mut ta, &mut rng, s, s, s)],
        });
    }
    benches.push(Bench {
        label: "matmul 200 x 32^3".into(),
        sqes: (0..200).map(|_| mm(&mut ta, &mut rng, 32, 32, 32)).collect(),
    });
    benches.push(Bench {
        label: "matmul 1 x 4096x64x4096".into(),
        sqes: vec![mm(&mut ta, &mut rng, 4096, 64, 4096)],
    });
    benches.push(Bench {
        label: "matmul 1 x 4096^3".into(),
        sqes: vec![mm(&mut ta, &mut rng, 4096, 4096, 4096)],
    });
    let sizes = ta.sizes();
    let arena = ta.arena();
    println!("| case | mapped µs | copy-in µs | copy-in+out µs | policy |");
    println!("|---|---|---|---|---|");
    for bench in &benches {
        let jobs: Vec<Job> = bench.sqes.iter().map(|s| validate(s, &sizes).expect("bench job")).collect();
        let kernel = jobs[0].builtin().expect("a built-in");
        let launch = Launch::builtin(kernel, jobs[0].ty(), &jobs, true);
        let mut cols = Vec::new();
        for mode in [Mode::Mapped, Mode::CopyIn, Mode::CopyInOut] {
            b.force_mode(Some(mode));
            let mut ts = Vec::new();
            for rep in 0..18 {
                let t = Instant::now();
                crate::backend::run_to_completion(&mut b, &arena, &launch)?;
                if rep >= 3 {
                    ts.push(t.elapsed().as_secs_f64() * 1e6);
                }
            }
            ts.sort_by(f64::total_cmp);
            cols.push(ts[ts.len() / 2]);
        }
        let p = crate::backend::cuda::policy(crate::ops::op(kernel), &jobs[0], jobs.len());
        println!(
            "| {} | {:.1} | {:.1} | {:.1} | {:?} |",
            bench.label, cols[0], cols[1], cols[2], p
        );
        if kernel == Kernel::Matmul && jobs.len() == 1 {
            let (m, n, k) = jobs[0].dims();
            let flop = 2.0 * m as f64 * n as f64 * k as f64;
            let best = cols.iter().cloned().fold(f64::INFINITY, f64::min);
            println!("|   (best mode: {:.2} TFLOP/s, transfers included) | | | | |", flop / best / 1e6);
        }
    }
    b.force_mode(None);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::CpuBackend;

    #[test]
    fn shared_vectors_cpu() {
        check_backend(&mut CpuBackend::new(0));
    }

    /// The same cases on the GPU: with the measured placement policy, then
    /// with every job's inputs (and outputs) forced through device copies,
    /// so that both data paths are checked whatever the policy picks.
    #[test]
    fn shared_vectors_cuda() {
        use crate::ops::Placement as Mode;
        for mode in [None, Some(Mode::CopyIn), Some(Mode::CopyInOut), Some(Mode::Mapped)] {
            let Some(mut b) = gpu_for_tests() else { return };
            eprintln!("testvec: cuda device {}, placement {mode:?}", b.name());
            b.force_mode(mode);
            check_backend(&mut b);
        }
    }

    #[test]
    fn cases_are_deterministic() {
        let mut t1 = TestArena::new(&ARENA_BYTES);
        let mut t2 = TestArena::new(&ARENA_BYTES);
        let (a, b) = (build_cases(&mut t1, 1), build_cases(&mut t2, 1));
        assert_eq!(a.len(), b.len());
        assert!(a.iter().zip(&b).all(|(x, y)| x.sqe == y.sqe && x.name == y.name));
        assert!(a.len() > 450);
        // Every kernel and every type it runs on is covered.
        for k in Kernel::ALL {
            for t in types_of(k) {
                assert!(a.iter().any(|c| c.sqe.kernel == k.id() && c.ty == t), "{k:?} {t:?} has no case");
            }
        }
    }

    /// A CUDA open that fails at any step leaves nothing behind: no
    /// stream, event, module or green context alive and the primary
    /// context released (`backend auto` then serves on the CPU holding
    /// nothing of the GPU). Run in a child process: other tests' backends
    /// would be counted too. Without a GPU, the open fails at the driver
    /// and the child checks that nothing was made.
    #[test]
    fn cuda_open_leaks_nothing_at_any_step() {
        if std::env::var("GPUD_OPEN_CHILD").is_ok() {
            return;
        }
        let exe = std::env::current_exe().unwrap();
        let out = std::process::Command::new(exe)
            .args(["--exact", "testvec::tests::cuda_open_child", "--include-ignored", "--nocapture"])
            .env("GPUD_OPEN_CHILD", "1")
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
        eprintln!("{text}");
        assert!(out.status.success(), "open child failed");
        assert!(text.contains("OPEN-CHILD-OK"), "open child did not run");
    }

    #[test]
    #[ignore = "run by cuda_open_leaks_nothing_at_any_step in a child process"]
    fn cuda_open_child() {
        use crate::backend::cuda::{live_handles, primary_context_held, CudaBackend, OPEN_STEPS};
        let nothing_held = |when: &str| {
            let held: Vec<_> = live_handles().into_iter().filter(|&(_, n)| n != 0).collect();
            assert!(held.is_empty(), "{when}: handles alive: {held:?}");
            assert_ne!(primary_context_held(0), Some(true), "{when}: the primary context is still retained");
        };
        nothing_held("before any open");
        match CudaBackend::open(0, crate::backend::DEFAULT_LANE_SMS) {
            Ok(b) => {
                assert!(live_handles().iter().all(|&(_, n)| n >= 0));
                let streams = live_handles().into_iter().find(|&(k, _)| k == "stream").map_or(0, |(_, n)| n);
                assert!(streams > 0, "an open backend owns streams");
                assert_eq!(primary_context_held(0), Some(true));
                drop(b);
                nothing_held("after a backend was dropped");
                for step in OPEN_STEPS {
                    let e = CudaBackend::open_failing_at(0, crate::backend::DEFAULT_LANE_SMS, Some(step))
                        .err()
                        .unwrap_or_else(|| panic!("open did not fail at {step}"));
                    assert!(e.to_string().contains(step), "{step}: {e}");
                    nothing_held(&format!("after an open failed at {step}"));
                    eprintln!("open failed at {step}: nothing held");
                }
                // And it opens again, whole, after all that.
                drop(CudaBackend::open(0, crate::backend::DEFAULT_LANE_SMS).expect("open after the faults"));
                nothing_held("after the last open was dropped");
            }
            Err(e) => {
                // No GPU here (ERLCUDA_REQUIRE_GPU=1 makes that a failure):
                // the open failed before any handle.
                no_gpu(&e.to_string());
                nothing_held("after an open without a GPU");
            }
        }
        eprintln!("OPEN-CHILD-OK");
    }

    /// The context really faults: run in a child process (the fault poisons
    /// the process's primary context, which other tests share).
    #[cfg(feature = "fault-injection")]
    #[test]
    fn cuda_fault_injection_poisons_and_reports() {
        if std::env::var("GPUD_FAULT_CHILD").is_ok() {
            return;
        }
        let Some(b) = gpu_for_tests() else { return };
        drop(b);
        let exe = std::env::current_exe().unwrap();
        let out = std::process::Command::new(exe)
            .args(["--exact", "testvec::tests::cuda_fault_child", "--include-ignored", "--nocapture"])
            .env("GPUD_FAULT_CHILD", "1")
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
        eprintln!("{text}");
        assert!(out.status.success(), "fault child failed");
        assert!(text.contains("FAULT-CHILD-OK"), "fault child did not run");
    }

    #[cfg(feature = "fault-injection")]
    #[test]
    #[ignore = "run by cuda_fault_injection_poisons_and_reports in a child process"]
    fn cuda_fault_child() {
        let Some(mut b) = gpu_for_tests() else { return };
        let mut ta = TestArena::new(&[1 << 20]);
        ta.attach(&mut b).unwrap();
        let pa = ta.write(0, &[1.0; 16], 0);
        let po = ta.alloc(0, 16, 0);
        let mut s = Sqe {
            user_data: 1,
            kernel: Kernel::VectorAdd.id(),
            in0: pa,
            in1: pa,
            out: po,
            in0_len: 16,
            in1_len: 16,
            out_len: 16,
            ..Sqe::default()
        };
        let sizes = ta.sizes();
        let good = validate(&s, &sizes).unwrap();
        // A clean launch first: the backend works.
        crate::backend::run_to_completion(&mut b, &ta.arena(), &Launch::builtin(Kernel::VectorAdd, ElemType::F32, std::slice::from_ref(&good), true)).unwrap();
        assert_eq!(ta.read(po, 16), vec![2.0; 16]);
        s.flags = crate::layout::EC_FLAG_FAULT;
        let bad = validate(&s, &sizes).unwrap();
        let arena = ta.arena();
        let r = crate::backend::run_to_completion(&mut b, &arena, &Launch::builtin(Kernel::VectorAdd, ElemType::F32, &[good, bad], true));
        let e = r.expect_err("a faulting launch completed");
        eprintln!("fault reported as: {e}");
        assert_eq!(e.exit_code(), 3);
        assert!(
            matches!(e, Error::Driver { err: cudarc::driver::DriverError(cudarc::driver::sys::CUresult::CUDA_ERROR_ILLEGAL_ADDRESS), .. }),
            "{e}"
        );
        // The context is gone: the next launch fails too.
        let again = crate::backend::run_to_completion(&mut b, &arena, &Launch::builtin(Kernel::Reduce, ElemType::F32, &[], true));
        assert!(again.is_err(), "the context survived an illegal address");
        println!("FAULT-CHILD-OK");
    }
}
