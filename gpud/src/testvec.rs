//! Shared test vectors: one deterministic set of cases (seeded PRNG) with
//! f64 references and tolerances, run through the [`Backend`] trait exactly
//! as the daemon does (validate, coalesce, submit, poll). `cargo test` runs
//! them on the CPU backend everywhere and on the CUDA backend where a driver
//! and a device exist (skipped with a note otherwise; `ERLCUDA_REQUIRE_GPU=1`
//! makes a missing GPU a failure: [`no_gpu`], the one place that decides).
//!
//! Tolerances: `vector_add` bit-exact; `reduce`/`dot_product` within
//! 1e-5 · Σ|terms|; `matmul` per element within 1e-5 · Σ|a||b|.
//!
//! The arena is real shared memory: two memfds mapped like the VM's (segment
//! 0 and segment 1), so the CUDA backend registers them as in production.
//!
//! Also here: `gpud --bench-backend`, the mapped-vs-copied measurement.

#![allow(clippy::too_many_arguments, clippy::should_implement_trait, clippy::neg_cmp_op_on_partial_ord)]

use std::os::fd::OwnedFd;
use std::time::Instant;

use nix::sys::memfd::{memfd_create, MFdFlags};

use crate::backend::{Arena, Backend, Launch, Ticket};
use crate::coalesce::{self, Coalescer};
use crate::descriptor::{validate, Job, SegmentSizes};
use crate::error::{Error, Result};
use crate::handshake::Mapping;
use crate::layout::{Kernel, Sqe, EC_ADDR_SEGMENT_SHIFT};

/// xorshift64: deterministic and dependency-free.
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
}

/// Sizes every vector kernel is checked at.
pub const SIZES: [usize; 6] = [0, 1, 7, 1000, 4097, (1 << 20) + 7];

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
        let s = &mut self.segs[seg];
        let off = s.2 + misalign * 4;
        s.2 = (off + n as u64 * 4).next_multiple_of(256);
        assert!(s.2 <= s.1.len() as u64, "test arena segment {seg} too small");
        (seg as u64) << EC_ADDR_SEGMENT_SHIFT | off
    }

    fn ptr(&self, addr: u64) -> *mut f32 {
        let seg = (addr >> EC_ADDR_SEGMENT_SHIFT) as usize;
        let off = addr & ((1 << EC_ADDR_SEGMENT_SHIFT) - 1);
        self.segs[seg].1.base().as_ptr().wrapping_add(off as usize).cast()
    }

    pub fn write(&mut self, seg: usize, data: &[f32], misalign: u64) -> u64 {
        let addr = self.alloc(seg, data.len(), misalign);
        // SAFETY: a freshly allocated region inside the mapping.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.ptr(addr), data.len()) };
        addr
    }

    /// Overwrites the region at `addr` (allocated earlier) with `data`.
    pub fn write_at(&mut self, addr: u64, data: &[f32]) {
        // SAFETY: a region allocated inside the mapping, no launch in flight.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.ptr(addr), data.len()) };
    }

    /// Copies `out.len()` floats from `addr` into `out`.
    pub fn read_into(&self, addr: u64, out: &mut [f32]) {
        // SAFETY: as for `write_at`.
        unsafe { std::ptr::copy_nonoverlapping(self.ptr(addr), out.as_mut_ptr(), out.len()) };
    }

    pub fn read(&self, addr: u64, n: usize) -> Vec<f32> {
        // SAFETY: a region inside the mapping, no launch in flight.
        unsafe { std::slice::from_raw_parts(self.ptr(addr), n).to_vec() }
    }

    pub fn fill(&mut self, addr: u64, n: usize, v: f32) {
        // SAFETY: as for `read`.
        unsafe { std::slice::from_raw_parts_mut(self.ptr(addr), n).fill(v) }
    }
}

/// What a case must produce.
pub enum Check {
    Exact(Vec<f32>),
    /// Sum (reduce, dot): reference and Σ|terms|.
    Sum(f64, f64),
    /// Matmul: per-element reference and Σ|a||b|.
    Mat(Vec<f64>, Vec<f64>),
}

pub struct Case {
    pub name: String,
    pub sqe: Sqe,
    pub check: Check,
}

fn vadd_case(ta: &mut TestArena, rng: &mut Rng, name: String, n: usize, segs: [usize; 3], mis: u64) -> Case {
    let (a, b) = (rng.vec(n), rng.vec(n));
    let want: Vec<f32> = a.iter().zip(&b).map(|(x, y)| x + y).collect();
    let (pa, pb) = (ta.write(segs[0], &a, mis), ta.write(segs[1], &b, mis));
    let po = ta.alloc(segs[2], n, mis);
    Case {
        name,
        sqe: Sqe {
            kernel: Kernel::VectorAdd.id(),
            in0: pa,
            in1: pb,
            out: po,
            in0_len: n as u32,
            in1_len: n as u32,
            out_len: n as u32,
            ..Sqe::default()
        },
        check: Check::Exact(want),
    }
}

fn sum_case(ta: &mut TestArena, rng: &mut Rng, name: String, n: usize, dot: bool, alias: bool, segs: [usize; 3], mis: u64) -> Case {
    let a = rng.vec(n);
    let pa = ta.write(segs[0], &a, mis);
    let (b, pb) = if !dot {
        (Vec::new(), 0xdead_beef_dead_beef) // unused by reduce: ignored
    } else if alias {
        (a.clone(), pa)
    } else {
        let b = rng.vec(n);
        let pb = ta.write(segs[1], &b, mis);
        (b, pb)
    };
    let terms: Vec<f64> = if dot {
        a.iter().zip(&b).map(|(&x, &y)| f64::from(x) * f64::from(y)).collect()
    } else {
        a.iter().map(|&x| f64::from(x)).collect()
    };
    let po = ta.alloc(segs[2], 1, mis);
    Case {
        name,
        sqe: Sqe {
            kernel: if dot { Kernel::DotProduct.id() } else { Kernel::Reduce.id() },
            in0: pa,
            in1: pb,
            out: po,
            in0_len: n as u32,
            in1_len: if dot { n as u32 } else { 0 },
            out_len: 1,
            ..Sqe::default()
        },
        check: Check::Sum(terms.iter().sum(), terms.iter().map(|t| t.abs()).sum()),
    }
}

fn matmul_case(ta: &mut TestArena, rng: &mut Rng, name: String, (m, n, k): (usize, usize, usize), segs: [usize; 3], mis: u64) -> Case {
    let (a, b) = (rng.vec(m * k), rng.vec(k * n));
    let mut want = vec![0f64; m * n];
    let mut mag = vec![0f64; m * n];
    for i in 0..m {
        for p in 0..k {
            let aip = f64::from(a[i * k + p]);
            for j in 0..n {
                let t = aip * f64::from(b[p * n + j]);
                want[i * n + j] += t;
                mag[i * n + j] += t.abs();
            }
        }
    }
    let (pa, pb) = (ta.write(segs[0], &a, mis), ta.write(segs[1], &b, mis));
    let po = ta.alloc(segs[2], m * n, mis);
    Case {
        name,
        sqe: matmul_sqe(pa, pb, po, m, n, k),
        check: Check::Mat(want, mag),
    }
}

/// Segment 0 and 1 sizes the cases need.
pub const ARENA_BYTES: [u64; 2] = [96 << 20, 16 << 20];

/// The shared cases, deterministic from `seed`.
pub fn build_cases(ta: &mut TestArena, seed: u64) -> Vec<Case> {
    let mut rng = Rng(seed);
    let mut cases = Vec::new();
    for &n in &SIZES {
        for mis in [0, 1] {
            if mis == 1 && n > 5000 {
                continue;
            }
            let tag = if mis == 1 { " misaligned" } else { "" };
            cases.push(vadd_case(ta, &mut rng, format!("vector_add n={n}{tag}"), n, [0, 0, 0], mis));
            cases.push(sum_case(ta, &mut rng, format!("reduce n={n}{tag}"), n, false, false, [0, 0, 0], mis));
            cases.push(sum_case(ta, &mut rng, format!("dot n={n}{tag}"), n, true, false, [0, 0, 0], mis));
        }
        cases.push(sum_case(ta, &mut rng, format!("dot n={n} aliased"), n, true, true, [0, 0, 0], 0));
    }
    for &shape in &MATMUL_SHAPES {
        cases.push(matmul_case(ta, &mut rng, format!("matmul {shape:?}"), shape, [0, 0, 0], 0));
    }
    cases.push(matmul_case(ta, &mut rng, "matmul (64, 200, 33) misaligned".into(), (64, 200, 33), [0, 0, 0], 1));
    // Segment 1, alone and mixed with segment 0.
    cases.push(vadd_case(ta, &mut rng, "vector_add seg1".into(), 5000, [1, 1, 1], 0));
    cases.push(vadd_case(ta, &mut rng, "vector_add seg0+1".into(), 70000, [0, 1, 0], 0));
    cases.push(sum_case(ta, &mut rng, "reduce seg1 large".into(), 200_000, false, false, [1, 1, 1], 0));
    cases.push(sum_case(ta, &mut rng, "dot seg1/0".into(), 3000, true, false, [1, 0, 1], 0));
    cases.push(matmul_case(ta, &mut rng, "matmul seg1".into(), (150, 140, 30), [1, 0, 1], 0));
    // A mixed batch of many jobs of every kernel.
    for i in 0..400 {
        let seg = |r: &mut Rng| if r.below(4) == 0 { 1 } else { 0 };
        let segs = [seg(&mut rng), seg(&mut rng), seg(&mut rng)];
        let mis = rng.below(3) / 2;
        let n = match rng.below(10) {
            0 => 0,
            1..=6 => rng.below(3000) as usize,
            _ => rng.below(90_000) as usize,
        };
        let c = match rng.below(4) {
            0 => vadd_case(ta, &mut rng, format!("mixed#{i} vector_add n={n}"), n, segs, mis),
            1 => sum_case(ta, &mut rng, format!("mixed#{i} reduce n={n}"), n, false, false, segs, mis),
            2 => sum_case(ta, &mut rng, format!("mixed#{i} dot n={n}"), n, true, false, segs, mis),
            _ => {
                let d = |r: &mut Rng| r.below(48) as usize;
                let shape = (d(&mut rng), d(&mut rng), d(&mut rng));
                matmul_case(ta, &mut rng, format!("mixed#{i} matmul {shape:?}"), shape, segs, mis)
            }
        };
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
        ta.fill(c.sqe.out, c.sqe.out_len as usize, f32::NAN);
    }
}

/// Checks every case's output; returns one line per failure.
pub fn check(ta: &TestArena, cases: &[Case]) -> Vec<String> {
    let tiny = f64::from(f32::MIN_POSITIVE);
    let mut bad = Vec::new();
    for c in cases {
        let got = ta.read(c.sqe.out, c.sqe.out_len as usize);
        match &c.check {
            Check::Exact(want) => {
                if let Some(i) = (0..want.len()).find(|&i| got[i].to_bits() != want[i].to_bits()) {
                    bad.push(format!("{}: elem {i}: {} != {}", c.name, got[i], want[i]));
                }
            }
            Check::Sum(want, mag) => {
                let g = f64::from(got[0]);
                let ok = if *mag == 0.0 { g == 0.0 } else { (g - want).abs() <= 1e-5 * mag + tiny };
                if !ok {
                    bad.push(format!("{}: {g} vs {want} (Σ|t| {mag})", c.name));
                }
            }
            Check::Mat(want, mag) => {
                if let Some(i) = (0..want.len()).find(|&i| {
                    let g = f64::from(got[i]);
                    if mag[i] == 0.0 {
                        g != 0.0
                    } else {
                        !((g - want[i]).abs() <= 1e-5 * mag[i] + tiny)
                    }
                }) {
                    bad.push(format!("{}: elem {i}: {} vs {} (Σ|ab| {})", c.name, got[i], want[i], mag[i]));
                }
            }
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
    for (kernel, jobs) in co.groups() {
        for chunk in jobs.chunks(per_launch.max(1)) {
            let launch = Launch {
                kernel,
                jobs: chunk,
                independent: coalesce::independent(chunk),
            };
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
    match crate::backend::cuda::CudaBackend::open(0) {
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

/// The descriptor of an m×k by k×n matmul at the given arena addresses.
pub fn matmul_sqe(pa: u64, pb: u64, po: u64, m: usize, n: usize, k: usize) -> Sqe {
    Sqe {
        kernel: Kernel::Matmul.id(),
        in0: pa,
        in1: pb,
        out: po,
        in0_len: (m * k) as u32,
        in1_len: (k * n) as u32,
        out_len: (m * n) as u32,
        m: m as u32,
        n: n as u32,
        k: k as u32,
        ..Sqe::default()
    }
}

/// `gpud --bench-backend`: per kernel and size, the time from submit to
/// completion with inputs read in place (mapped) and copied to the device
/// first (copy-in, copy-in+out), median of 15 runs after 3 warm-ups, µs.
pub fn bench_backend(device: u32) -> Result<()> {
    use crate::backend::cuda::{CudaBackend, Mode};
    let mut b = CudaBackend::open(device)?;
    let mut ta = TestArena::new(&[1536 << 20]);
    ta.attach(&mut b)?;
    let mut rng = Rng(7);
    struct Bench {
        label: String,
        sqes: Vec<Sqe>,
    }
    let mut benches = Vec::new();
    let one = |ta: &mut TestArena, rng: &mut Rng, k: Kernel, n: usize| -> Sqe {
        let c = match k {
            Kernel::VectorAdd => vadd_case(ta, rng, String::new(), n, [0; 3], 0),
            Kernel::Reduce => sum_case(ta, rng, String::new(), n, false, false, [0; 3], 0),
            _ => sum_case(ta, rng, String::new(), n, true, false, [0; 3], 0),
        };
        c.sqe
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
        let kernel = jobs[0].kernel();
        let launch = Launch {
            kernel,
            jobs: &jobs,
            independent: true,
        };
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
        let p = crate::backend::cuda::policy(kernel, &jobs[0], jobs.len());
        println!(
            "| {} | {:.1} | {:.1} | {:.1} | {:?} |",
            bench.label, cols[0], cols[1], cols[2], p
        );
        if kernel == Kernel::Matmul && jobs.len() == 1 {
            let j = &bench.sqes[0];
            let flop = 2.0 * j.m as f64 * j.n as f64 * j.k as f64;
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
        use crate::backend::cuda::Mode;
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
        crate::backend::run_to_completion(&mut b, &ta.arena(), &Launch { kernel: Kernel::VectorAdd, jobs: &[good], independent: true }).unwrap();
        assert_eq!(ta.read(po, 16), vec![2.0; 16]);
        s.flags = crate::layout::EC_FLAG_FAULT;
        let bad = validate(&s, &sizes).unwrap();
        let arena = ta.arena();
        let r = crate::backend::run_to_completion(&mut b, &arena, &Launch { kernel: Kernel::VectorAdd, jobs: &[good, bad], independent: true });
        let e = r.expect_err("a faulting launch completed");
        eprintln!("fault reported as: {e}");
        assert!(matches!(e, Error::Device(_)));
        assert_eq!(e.exit_code(), 3);
        assert!(e.to_string().contains("ILLEGAL_ADDRESS"), "{e}");
        // The context is gone: the next launch fails too.
        let again = crate::backend::run_to_completion(&mut b, &arena, &Launch { kernel: Kernel::Reduce, jobs: &[], independent: true });
        assert!(again.is_err(), "the context survived an illegal address");
        println!("FAULT-CHILD-OK");
    }
}
