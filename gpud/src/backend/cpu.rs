//! The CPU backend: the four kernels in plain Rust on rayon's pool.
//!
//! Semantics every backend must match: f32 in, f32 out, IEEE NaN/Inf.
//! `vector_add` is an f32 add (bit-exact); `reduce` and `dot_product`
//! accumulate in f64; `matmul` accumulates each output element in f64.
//! Results do not depend on the thread count: parallel sums combine their
//! per-chunk partials in a fixed order.

use rayon::prelude::*;

use std::ptr::NonNull;

use super::{Arena, Backend, Launch, Ticket};
use crate::descriptor::Job;
use crate::error::{Error, Result};
use crate::layout::Kernel;

/// Elements per parallel chunk for the streaming kernels. Below two chunks
/// a job runs on the calling thread: fork/join would cost more than it saves.
const PAR_CHUNK: usize = 1 << 16;
/// Multiply-adds above which a matmul is split by rows.
const PAR_MATMUL_WORK: u64 = 1 << 18;
/// Total elements in a launch above which its jobs are spread over threads.
const PAR_BATCH_WORK: u64 = 1 << 15;

/// Synchronous behind the asynchronous trait: `submit` runs the launch to
/// the end and queues its ticket, `poll` hands the tickets out.
pub struct CpuBackend {
    name: String,
    next_ticket: Ticket,
    done: Vec<Ticket>,
}

impl CpuBackend {
    pub fn new(_device: u32) -> CpuBackend {
        CpuBackend {
            name: format!("cpu-{}-threads", rayon::current_num_threads()),
            next_ticket: 1,
            done: Vec::new(),
        }
    }
}

impl Backend for CpuBackend {
    fn kind(&self) -> &'static str {
        "cpu"
    }

    fn name(&self) -> &str {
        &self.name
    }

    fn add_segment(&mut self, _seg: usize, _base: NonNull<u8>, _bytes: u64) -> Result<()> {
        // Plain memory: the mapping is all the CPU needs.
        Ok(())
    }

    fn submit(&mut self, arena: &Arena<'_>, launch: &Launch<'_>) -> Result<Ticket> {
        if launch.jobs.iter().any(Job::fault) {
            // Only reachable with the `fault-injection` feature: the CPU's
            // stand-in for a poisoned context, so that crash isolation can
            // be tested without a GPU. gpud answers what it holds and exits 3.
            return Err(Error::Device(format!(
                "simulated device fault (EC_FLAG_FAULT, {:?} launch of {} jobs)",
                launch.kernel,
                launch.jobs.len()
            )));
        }
        self.run(arena, launch);
        let t = self.next_ticket;
        self.next_ticket += 1;
        self.done.push(t);
        Ok(t)
    }

    fn poll(&mut self, done: &mut Vec<Ticket>) -> Result<()> {
        done.append(&mut self.done);
        Ok(())
    }

    fn in_flight(&self) -> usize {
        self.done.len()
    }
}

impl CpuBackend {
    fn run(&mut self, arena: &Arena<'_>, launch: &Launch<'_>) {
        let work: u64 = launch.jobs.iter().map(Job::work).fold(0, u64::saturating_add);
        if launch.independent && launch.jobs.len() > 1 && work >= PAR_BATCH_WORK {
            // SAFETY: `independent` means no job's output overlaps a region
            // of any other job, and within a job validation proved the output
            // disjoint from the inputs, so concurrent jobs never alias.
            launch.jobs.par_iter().for_each(|job| unsafe { run_job(arena, job) });
        } else {
            for job in launch.jobs {
                // SAFETY: one job at a time; its slices die before the next
                // job's are made, and within the job validation proved the
                // output disjoint from the inputs.
                unsafe { run_job(arena, job) };
            }
        }
    }
}

/// # Safety
/// While this runs, no other thread may hold a slice that conflicts with
/// the job's regions (the output must not be read or written elsewhere, and
/// the inputs not written).
unsafe fn run_job(arena: &Arena<'_>, job: &Job) {
    // SAFETY: per this function's contract plus validation (the output does
    // not overlap either input; inputs may alias each other, both shared).
    let (a, b, out) = unsafe {
        (
            arena.input(job.in0()),
            arena.input(job.in1()),
            arena.output(job.out()),
        )
    };
    match job.kernel() {
        Kernel::VectorAdd => vector_add(a, b, out),
        Kernel::Reduce => out[0] = reduce(a),
        Kernel::DotProduct => out[0] = dot_product(a, b),
        Kernel::Matmul => {
            let (m, n, k) = job.dims();
            matmul(a, b, out, m, n, k)
        }
    }
}

/// `out[i] = a[i] + b[i]` in f32.
pub fn vector_add(a: &[f32], b: &[f32], out: &mut [f32]) {
    assert!(a.len() == out.len() && b.len() == out.len());
    if out.len() >= 2 * PAR_CHUNK {
        out.par_chunks_mut(PAR_CHUNK)
            .zip(a.par_chunks(PAR_CHUNK).zip(b.par_chunks(PAR_CHUNK)))
            .for_each(|(o, (a, b))| add_seq(a, b, o));
    } else {
        add_seq(a, b, out);
    }
}

fn add_seq(a: &[f32], b: &[f32], out: &mut [f32]) {
    for ((o, x), y) in out.iter_mut().zip(a).zip(b) {
        *o = x + y;
    }
}

/// Sum of `a`, accumulated in f64, rounded once to f32.
pub fn reduce(a: &[f32]) -> f32 {
    chunked(a.len(), |r| sum_seq(&a[r])) as f32
}

/// Dot product of `a` and `b`, accumulated in f64, rounded once to f32.
pub fn dot_product(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    chunked(a.len(), |r| dot_seq(&a[r.clone()], &b[r])) as f32
}

/// Splits `0..len` into `PAR_CHUNK` pieces, evaluates `f` on each (in
/// parallel when there are several) and adds the partials in index order,
/// so the result is the same on any number of threads.
fn chunked(len: usize, f: impl Fn(std::ops::Range<usize>) -> f64 + Sync) -> f64 {
    if len < 2 * PAR_CHUNK {
        return f(0..len);
    }
    let parts: Vec<f64> = (0..len.div_ceil(PAR_CHUNK))
        .into_par_iter()
        .map(|c| f(c * PAR_CHUNK..((c + 1) * PAR_CHUNK).min(len)))
        .collect();
    parts.iter().sum()
}

/// Eight independent f64 lanes: lets the compiler vectorise the adds and
/// works as a short pairwise tree for the rounding error.
const LANES: usize = 8;

fn sum_seq(a: &[f32]) -> f64 {
    let mut acc = [0f64; LANES];
    let chunks = a.chunks_exact(LANES);
    let tail = chunks.remainder();
    for c in chunks {
        for (s, x) in acc.iter_mut().zip(c) {
            *s += f64::from(*x);
        }
    }
    let mut total = fold_lanes(acc);
    for x in tail {
        total += f64::from(*x);
    }
    total
}

fn dot_seq(a: &[f32], b: &[f32]) -> f64 {
    let mut acc = [0f64; LANES];
    let ca = a.chunks_exact(LANES);
    let cb = b.chunks_exact(LANES);
    let (ta, tb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for i in 0..LANES {
            acc[i] += f64::from(x[i]) * f64::from(y[i]);
        }
    }
    let mut total = fold_lanes(acc);
    for (x, y) in ta.iter().zip(tb) {
        total += f64::from(*x) * f64::from(*y);
    }
    total
}

fn fold_lanes(a: [f64; LANES]) -> f64 {
    ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]))
}

/// Row-major `out (m×n) = a (m×k) · b (k×n)`, each row accumulated in f64.
pub fn matmul(a: &[f32], b: &[f32], out: &mut [f32], m: usize, n: usize, k: usize) {
    assert!(a.len() == m * k && b.len() == k * n && out.len() == m * n);
    if m == 0 || n == 0 {
        return;
    }
    let row = |i: usize, acc: &mut Vec<f64>, orow: &mut [f32]| {
        // i-k-j order: the inner loop streams one row of B and the
        // accumulator row with unit stride, which vectorises.
        acc.clear();
        acc.resize(n, 0.0);
        for (p, &aip) in a[i * k..(i + 1) * k].iter().enumerate() {
            let aip = f64::from(aip);
            for (s, &bpj) in acc.iter_mut().zip(&b[p * n..(p + 1) * n]) {
                *s += aip * f64::from(bpj);
            }
        }
        for (o, s) in orow.iter_mut().zip(acc.iter()) {
            *o = *s as f32;
        }
    };
    let work = m as u64 * n as u64 * k.max(1) as u64;
    if work >= PAR_MATMUL_WORK && m > 1 {
        out.par_chunks_mut(n)
            .enumerate()
            .for_each_init(Vec::new, |acc, (i, orow)| row(i, acc, orow));
    } else {
        let mut acc = Vec::with_capacity(n);
        for (i, orow) in out.chunks_mut(n).enumerate() {
            row(i, &mut acc, orow);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::run_to_completion;
    use crate::descriptor::validate;
    use crate::layout::Sqe;

    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        /// Uniform in [-1, 1), with the occasional larger magnitude.
        fn f(&mut self) -> f32 {
            let u = (self.next() >> 40) as f32 / (1u64 << 24) as f32;
            let x = 2.0 * u - 1.0;
            if self.next().is_multiple_of(64) {
                x * 1000.0
            } else {
                x
            }
        }
        fn vec(&mut self, n: usize) -> Vec<f32> {
            (0..n).map(|_| self.f()).collect()
        }
    }

    const SIZES: [usize; 6] = [0, 1, 7, 1000, 4097, (1 << 20) + 7];

    #[test]
    fn vector_add_is_bit_exact() {
        let mut rng = Rng(1);
        for n in SIZES {
            let (a, b) = (rng.vec(n), rng.vec(n));
            let mut out = vec![f32::NAN; n];
            vector_add(&a, &b, &mut out);
            for i in 0..n {
                assert_eq!(out[i].to_bits(), (a[i] + b[i]).to_bits(), "n={n} i={i}");
            }
        }
    }

    #[test]
    fn reduce_and_dot_match_f64_reference() {
        let mut rng = Rng(2);
        for n in SIZES {
            let (a, b) = (rng.vec(n), rng.vec(n));
            let exact: f64 = a.iter().map(|&x| f64::from(x)).sum();
            let mag: f64 = a.iter().map(|&x| f64::from(x).abs()).sum();
            let got = reduce(&a);
            assert!(
                (f64::from(got) - exact).abs() <= 1e-5 * mag + f64::from(f32::MIN_POSITIVE),
                "reduce n={n}: {got} vs {exact}"
            );
            let exact: f64 = a.iter().zip(&b).map(|(&x, &y)| f64::from(x) * f64::from(y)).sum();
            let mag: f64 = a.iter().zip(&b).map(|(&x, &y)| (f64::from(x) * f64::from(y)).abs()).sum();
            let got = dot_product(&a, &b);
            assert!(
                (f64::from(got) - exact).abs() <= 1e-5 * mag + f64::from(f32::MIN_POSITIVE),
                "dot n={n}: {got} vs {exact}"
            );
        }
        assert_eq!(reduce(&[]).to_bits(), 0.0f32.to_bits());
        assert_eq!(dot_product(&[], &[]).to_bits(), 0.0f32.to_bits());
    }

    #[test]
    fn sums_do_not_depend_on_threads() {
        let mut rng = Rng(3);
        let a = rng.vec(5 * PAR_CHUNK + 3);
        let pool = rayon::ThreadPoolBuilder::new().num_threads(1).build().unwrap();
        let one = pool.install(|| (reduce(&a), dot_product(&a, &a)));
        assert_eq!(one.0.to_bits(), reduce(&a).to_bits());
        assert_eq!(one.1.to_bits(), dot_product(&a, &a).to_bits());
    }

    #[test]
    fn matmul_matches_f64_reference() {
        let mut rng = Rng(4);
        let shapes = [
            (0, 0, 0),
            (0, 3, 4),
            (3, 0, 4),
            (3, 4, 0),
            (1, 1, 1),
            (1, 7, 1),
            (7, 1, 5),
            (5, 9, 13),
            (33, 17, 65),
            (64, 64, 64),
            (130, 70, 33),
            (1, 1000, 300),
        ];
        for (m, n, k) in shapes {
            let (a, b) = (rng.vec(m * k), rng.vec(k * n));
            let mut out = vec![f32::NAN; m * n];
            matmul(&a, &b, &mut out, m, n, k);
            for i in 0..m {
                for j in 0..n {
                    let mut exact = 0f64;
                    let mut mag = 0f64;
                    for p in 0..k {
                        let t = f64::from(a[i * k + p]) * f64::from(b[p * n + j]);
                        exact += t;
                        mag += t.abs();
                    }
                    let got = f64::from(out[i * n + j]);
                    assert!(
                        (got - exact).abs() <= 1e-5 * mag + f64::from(f32::MIN_POSITIVE),
                        "matmul {m}x{n}x{k} [{i},{j}]: {got} vs {exact}"
                    );
                    if k == 0 {
                        assert_eq!(got.to_bits(), 0f64.to_bits());
                    }
                }
            }
        }
    }

    #[test]
    fn ieee_specials_propagate() {
        let a = [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 1.0];
        let b = [1.0, 1.0, f32::INFINITY, f32::MAX];
        let mut out = [0.0; 4];
        vector_add(&a, &b, &mut out);
        assert!(out[0].is_nan() && out[1] == f32::INFINITY && out[2].is_nan());
        assert_eq!(out[3], f32::MAX);
        assert!(reduce(&a).is_nan());
        assert_eq!(reduce(&[f32::INFINITY, 1.0]), f32::INFINITY);
        // The f64 accumulator does not overflow where f32 would, but the
        // rounded result does.
        assert_eq!(reduce(&[f32::MAX, f32::MAX]), f32::INFINITY);
        assert_eq!(reduce(&[f32::MAX, f32::MAX, -f32::MAX]), f32::MAX);
        assert!(dot_product(&[0.0], &[f32::INFINITY]).is_nan());
    }

    #[test]
    fn backend_runs_a_mixed_launch_through_the_arena() {
        let mut rng = Rng(5);
        let mut buf = vec![0f32; 1 << 16];
        for x in buf.iter_mut() {
            *x = rng.f();
        }
        let snapshot = buf.clone();
        let arena_bytes = (buf.len() * 4) as u64;
        let sqe = |i: u64| Sqe {
            user_data: i,
            kernel: Kernel::VectorAdd.id(),
            in0: i * 64,
            in1: i * 64 + 16,
            out: 0x20000 + i * 16,
            in0_len: 4,
            in1_len: 4,
            out_len: 4,
            ..Sqe::default()
        };
        let jobs: Vec<Job> = (0..100).map(|i| validate(&sqe(i), arena_bytes).unwrap()).collect();
        let mut backend = CpuBackend::new(0);
        assert!(backend.name().starts_with("cpu-"));
        {
            let arena = Arena::from_slice(&mut buf);
            for independent in [false, true] {
                let launch = Launch {
                    kernel: Kernel::VectorAdd,
                    jobs: &jobs,
                    independent,
                };
                run_to_completion(&mut backend, &arena, &launch).unwrap();
            }
        }
        assert_eq!(backend.in_flight(), 0);
        for i in 0..100usize {
            for e in 0..4 {
                let want = snapshot[i * 16 + e] + snapshot[i * 16 + 4 + e];
                assert_eq!(buf[0x20000 / 4 + i * 4 + e], want);
            }
        }
    }

    /// With `fault-injection`, a job flagged EC_FLAG_FAULT makes the launch
    /// fail as a device failure (gpud then exits 3); its output is untouched.
    #[cfg(feature = "fault-injection")]
    #[test]
    fn fault_flag_is_a_device_error() {
        let mut buf = vec![1f32; 64];
        let mut s = Sqe {
            user_data: 1,
            kernel: Kernel::VectorAdd.id(),
            in0: 0,
            in1: 16,
            out: 128,
            in0_len: 4,
            in1_len: 4,
            out_len: 4,
            ..Sqe::default()
        };
        let good = validate(&s, 256).unwrap();
        s.flags = crate::layout::EC_FLAG_FAULT;
        let bad = validate(&s, 256).unwrap();
        let mut backend = CpuBackend::new(0);
        let arena = Arena::from_slice(&mut buf);
        let jobs = [good, bad];
        let launch = Launch {
            kernel: Kernel::VectorAdd,
            jobs: &jobs,
            independent: false,
        };
        let e = backend.submit(&arena, &launch).unwrap_err();
        assert!(matches!(e, Error::Device(_)), "{e}");
        assert_eq!(e.exit_code(), 3);
        assert_eq!(unsafe { arena.input(good.out()) }, &[1.0; 4], "a faulting launch ran anyway");
    }
}
