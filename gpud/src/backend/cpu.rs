//! The CPU backend: every kernel's CPU path (`ops/<kernel>.rs`) on rayon's
//! pool.
//!
//! Semantics every backend must match: IEEE NaN/Inf, sums accumulated in
//! the element type in the order `c_src/erlcuda_ring.h` states (see
//! [`crate::ops::sum`]). Results do not depend on the thread count:
//! parallel sums combine their per-chunk partials in a fixed order.

use rayon::prelude::*;

use std::ptr::NonNull;
use std::sync::Arc;

use super::pace::{Dir, Pacer, Pacing};
use super::{Backend, Launch, Registered, Registrar, Ticket};
use crate::arena::Arena;
use crate::buffers::{BufferMemory, HostMemory};
use crate::descriptor::Job;
use crate::error::{Error, Result};
use crate::modules::{ModuleLoader, UserKernel};

/// Total elements in a launch above which its jobs are spread over threads.
const PAR_BATCH_WORK: u64 = 1 << 15;

/// Synchronous behind the asynchronous trait: `submit` runs the launch to
/// the end and queues its ticket, `poll` hands the tickets out.
pub struct CpuBackend {
    name: String,
    /// Device buffers: gpud's own heap, a quarter of the machine's memory
    /// being its "device" (the VM lives there too).
    memory: HostMemory,
    next_ticket: Ticket,
    done: Vec<Ticket>,
    /// The faulted jobs of finished launches not yet answered: (ticket,
    /// user_data, fault). Empty but for a faulty user's kernel.
    faults: Vec<(Ticket, u64, crate::kitjob::Fault)>,
    /// Puts' and gets' copies, a piece at a time.
    copies: Pacer<()>,
    /// Each piece takes at least this long (fault injection only, else 0).
    piece_delay: std::time::Duration,
}

impl CpuBackend {
    pub fn new(_device: u32) -> CpuBackend {
        CpuBackend {
            name: format!("cpu-{}-threads", rayon::current_num_threads()),
            memory: HostMemory { blocks: 0, capacity: crate::buffers::host_ram() / 4 },
            next_ticket: 1,
            done: Vec::new(),
            faults: Vec::new(),
            // Copied when issued: nothing goes ahead (pace.rs).
            copies: Pacer::new(Pacing::default(), 0),
            piece_delay: slow_copies(),
        }
    }
}

/// Registration on the CPU: nothing to do, so the path that a GPU's slow
/// registration takes is the same here and can be tested without one.
struct CpuRegistrar {
    delay: std::time::Duration,
}

impl Registrar for CpuRegistrar {
    fn register(&mut self, base: NonNull<u8>, bytes: u64) -> Result<Registered> {
        std::thread::sleep(self.delay);
        Ok(Registered { base, bytes, dev: 0, reg_base: base.as_ptr() as usize, reg_bytes: bytes as usize, piece: 0, took: self.delay })
    }
}

/// With `fault-injection`, ERLCUDA_GPUD_SLOW_REGISTER_MS makes each
/// registration of a segment after the first take that long (a GPU's
/// cuMemHostRegister of a fresh segment takes 84-178 ms), so tests can see
/// that no other job waits for it.
fn slow_registration() -> std::time::Duration {
    let ms = if cfg!(feature = "fault-injection") {
        std::env::var("ERLCUDA_GPUD_SLOW_REGISTER_MS").ok().and_then(|v| v.parse().ok()).unwrap_or(0)
    } else {
        0
    };
    std::time::Duration::from_millis(ms)
}

/// With `fault-injection`, ERLCUDA_GPUD_SLOW_COPY_US makes each piece of a
/// put's or get's copy take at least that long, as a GPU's copy engine
/// does at PCIe speed, so that tests on a loaded machine can tell a small
/// job held behind one piece from one held behind a whole copy.
fn slow_copies() -> std::time::Duration {
    let us = if cfg!(feature = "fault-injection") {
        std::env::var("ERLCUDA_GPUD_SLOW_COPY_US").ok().and_then(|v| v.parse().ok()).unwrap_or(0)
    } else {
        0
    };
    std::time::Duration::from_micros(us)
}

impl ModuleLoader for CpuBackend {
    fn load_module(&mut self, _slot: u16, _ptx: &str, _kernels: &[Arc<UserKernel>]) -> std::result::Result<(), String> {
        // The module's host library (loaded by `modules.rs`) is all the CPU runs.
        Ok(())
    }

    fn unload_module(&mut self, _slot: u16) {}
}

impl Backend for CpuBackend {
    fn kind(&self) -> &'static str {
        "cpu"
    }

    fn name(&self) -> &str {
        &self.name
    }

    fn add_segment(&mut self, seg: usize, _base: NonNull<u8>, _bytes: u64) -> Result<()> {
        // Plain memory: the mapping is all the CPU needs (a slow
        // registration, under test, costs the same here as off the loop).
        if seg > 0 {
            std::thread::sleep(slow_registration());
        }
        Ok(())
    }

    fn registrar(&self) -> Box<dyn Registrar> {
        Box::new(CpuRegistrar { delay: slow_registration() })
    }

    fn adopt_segment(&mut self, _seg: usize, _reg: Registered) -> Result<()> {
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
        let faults = self.run(arena, launch);
        let t = self.ticket();
        self.faults.extend(faults.into_iter().map(|(u, f)| (t, u, f)));
        self.done.push(t);
        Ok(t)
    }

    fn take_faults(&mut self, ticket: Ticket) -> Vec<(u64, crate::kitjob::Fault)> {
        if self.faults.is_empty() {
            return Vec::new();
        }
        let (mine, rest) = std::mem::take(&mut self.faults).into_iter().partition(|(t, _, _)| *t == ticket);
        self.faults = rest;
        mine.into_iter().map(|(_, u, f)| (u, f)).collect()
    }

    fn poll(&mut self, done: &mut Vec<Ticket>) -> Result<()> {
        done.append(&mut self.done);
        // A piece is copied when it is issued: each poll moves every copy
        // on by `depth` pieces, so gpud's loop serves the SQ between them.
        let delay = self.piece_delay;
        self.copies.advance(
            done,
            |dir, dev, host, n| {
                if !delay.is_zero() {
                    std::thread::sleep(delay);
                }
                // SAFETY: `dev` lies in a live buffer block and `host` in the
                // copy's own arena region, n bytes each (copy_in, copy_out),
                // disjoint.
                unsafe {
                    match dir {
                        Dir::ToDevice => std::ptr::copy_nonoverlapping(host as *const u8, dev as *mut u8, n),
                        Dir::ToHost => std::ptr::copy_nonoverlapping(dev as *const u8, host as *mut u8, n),
                    }
                }
                Ok(())
            },
            |_| Ok(true),
            |_| {},
        )
    }

    fn in_flight(&self) -> usize {
        self.done.len() + self.copies.open()
    }

    fn buffer_memory(&mut self) -> &mut dyn BufferMemory {
        &mut self.memory
    }

    fn host_buffers(&self) -> bool {
        true
    }

    fn copy_in(&mut self, addr: u64, src: *const u8, bytes: usize) -> Result<Ticket> {
        let t = self.ticket();
        self.copies.push(Dir::ToDevice, t, addr, src as usize, bytes);
        Ok(t)
    }

    fn copy_out(&mut self, addr: u64, dst: *mut u8, bytes: usize) -> Result<Ticket> {
        let t = self.ticket();
        self.copies.push(Dir::ToHost, t, addr, dst as usize, bytes);
        Ok(t)
    }

    fn copies_in_flight(&self) -> usize {
        self.copies.open()
    }

    fn set_pacing(&mut self, pacing: Pacing) {
        self.copies.set_pacing(pacing);
    }
}

impl CpuBackend {
    fn ticket(&mut self) -> Ticket {
        let t = self.next_ticket;
        self.next_ticket += 1;
        t
    }

    /// Runs every job of the launch, each on its own (coalesced jobs too),
    /// so a job's fault is its own: returns the faulted jobs' user_data
    /// and faults.
    fn run(&mut self, arena: &Arena<'_>, launch: &Launch<'_>) -> Vec<(u64, crate::kitjob::Fault)> {
        // SAFETY: a group launch's jobs are independent (the daemon groups
        // only those), and each job's output is disjoint from its inputs.
        if let Some(faults) = unsafe { launch.op.cpu_together(arena, launch.jobs) } {
            return faults;
        }
        let work: u64 = launch.jobs.iter().map(Job::work).fold(0, u64::saturating_add);
        let one = |job: &Job| {
            // SAFETY: see the two callers below.
            unsafe { launch.op.cpu_checked(arena, job) }.map(|f| (job.user_data(), f))
        };
        if launch.independent && launch.jobs.len() > 1 && work >= PAR_BATCH_WORK {
            // SAFETY (one): `independent` means no job's output overlaps a
            // region of any other job, and within a job validation proved
            // the output disjoint from the inputs, so concurrent jobs never
            // alias.
            launch.jobs.par_iter().filter_map(one).collect()
        } else {
            // SAFETY (one): one job at a time; its slices die before the
            // next job's are made, and within the job validation proved the
            // output disjoint from the inputs.
            launch.jobs.iter().filter_map(one).collect()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops;
    use crate::backend::run_to_completion;
    use crate::descriptor::validate;
    use crate::layout::{ElemType, Kernel, Params, Sqe, EC_SUM_CHUNK, EC_SUM_GROUPS};

    use crate::testvec::{depth, round_to as round, unit_roundoff as unit, Rng, TestArena};

    /// Runs one job of `kernel` on `ty` through the backend over the tests'
    /// shared-memory arena: vectors at 256-byte boundaries, the output
    /// poisoned with NaN.
    fn run_one(kernel: Kernel, ty: ElemType, vecs: &[&[f64]], scalars: &[f64], dims: &[u32], out_len: usize) -> Vec<f64> {
        let bytes: usize = vecs.iter().map(|v| v.len()).sum::<usize>() + out_len;
        let mut ta = TestArena::new(&[((bytes as u64 + 3) * 8).next_multiple_of(4096).max(1 << 16)]);
        let addrs: Vec<u64> = vecs.iter().map(|v| ta.write_of(0, v, ty, 0)).collect();
        let out = ta.write_of(0, &vec![f64::NAN; out_len], ty, 0);
        let sqe = Sqe {
            user_data: 1,
            kernel: kernel.id(),
            ty: ty.id(),
            in0: addrs[0],
            in1: addrs.get(1).copied().unwrap_or(0),
            out,
            in0_len: vecs[0].len() as u32,
            in1_len: vecs.get(1).map_or(0, |v| v.len() as u32),
            out_len: out_len as u32,
            p: Params::pack(kernel.plan(), scalars, dims),
            ..Sqe::default()
        };
        let job = validate(&sqe, &ta.sizes()).unwrap();
        let mut backend = CpuBackend::new(0);
        let jobs = [job];
        let launch = Launch::builtin(kernel, ty, &jobs, true);
        run_to_completion(&mut backend, &ta.arena(), &launch).unwrap();
        ta.load(out, out_len, ty)
    }

    const SIZES: [usize; 6] = [0, 1, 7, 1023, 4097, (1 << 20) + 7];
    const FLOATS: [ElemType; 2] = [ElemType::F32, ElemType::F64];

    #[test]
    fn elementwise_kernels_match_the_f64_reference() {
        let mut rng = Rng(1);
        for ty in FLOATS {
            for n in SIZES {
                let (a, b) = (rng.vec_of(n, ty), rng.vec_of(n, ty));
                let out = run_one(Kernel::VectorAdd, ty, &[&a, &b], &[], &[], n);
                for i in 0..n {
                    // One rounding of the exact sum: bit-exact.
                    assert_eq!(out[i], round(a[i] + b[i], ty), "{ty:?} n={n} i={i}");
                }
                let alpha = rng.of(ElemType::F64);
                let out = run_one(Kernel::Saxpy, ty, &[&a, &b], &[alpha], &[], n);
                let al = round(alpha, ty);
                for i in 0..n {
                    let exact = al * a[i] + b[i];
                    let tol = 2.0 * unit(ty) * ((al * a[i]).abs() + b[i].abs());
                    assert!((out[i] - exact).abs() <= tol, "saxpy {ty:?} n={n} i={i}: {} vs {exact}", out[i]);
                }
            }
        }
    }

    #[test]
    fn reductions_match_the_f64_reference_within_the_stated_depth() {
        let mut rng = Rng(2);
        for ty in FLOATS {
            for n in SIZES {
                let (a, b) = (rng.vec_of(n, ty), rng.vec_of(n, ty));
                let tol = |mag: f64| depth(Kernel::Reduce, n, 0) * unit(ty) * mag + f64::MIN_POSITIVE;
                let got = run_one(Kernel::Reduce, ty, &[&a], &[], &[], 1)[0];
                let exact: f64 = a.iter().sum();
                let mag: f64 = a.iter().map(|x| x.abs()).sum();
                assert!((got - exact).abs() <= tol(mag), "reduce {ty:?} n={n}: {got} vs {exact}");
                let got = run_one(Kernel::DotProduct, ty, &[&a, &b], &[], &[], 1)[0];
                let exact: f64 = a.iter().zip(&b).map(|(x, y)| x * y).sum();
                let mag: f64 = a.iter().zip(&b).map(|(x, y)| (x * y).abs()).sum();
                assert!((got - exact).abs() <= tol(mag), "dot {ty:?} n={n}: {got} vs {exact}");
                if n == 0 {
                    assert_eq!(got.to_bits(), 0f64.to_bits());
                }
            }
        }
    }

    #[test]
    fn sums_do_not_depend_on_threads() {
        let mut rng = Rng(3);
        let a: Vec<f32> = rng.vec_of(5 * ops::PAR_CHUNK + 3, ElemType::F32).iter().map(|&x| x as f32).collect();
        let sum = || ops::sum::<f32>(a.len(), |i| a[i]);
        let pool = rayon::ThreadPoolBuilder::new().num_threads(1).build().unwrap();
        assert_eq!(pool.install(sum).to_bits(), sum().to_bits());
    }

    /// The pipelined submit (c_src/pipeline.c) runs a reduction as one job
    /// per group of the sum order and adds the groups' sums in index order
    /// from +0.0: that must be the same bits as the whole sum, at sizes
    /// around the group boundaries (1, 32 and 33 chunks, odd tails).
    #[test]
    fn a_sum_by_groups_is_the_whole_sum() {
        let chunk = EC_SUM_CHUNK as usize;
        let mut rng = Rng(5);
        for len in [2 * chunk + 1, 32 * chunk, 32 * chunk + 7, 33 * chunk - 1, 70 * chunk + 12345, (1 << 20) + 7] {
            let a: Vec<f32> = rng.vec_of(len, ElemType::F32).iter().map(|&x| x as f32).collect();
            let whole = ops::sum::<f32>(len, |i| a[i]);
            let slice = sum_order_group_chunks(len.div_ceil(chunk)) * chunk;
            let mut total = 0f32;
            for lo in (0..len).step_by(slice) {
                let part = &a[lo..len.min(lo + slice)];
                total += ops::sum::<f32>(part.len(), |i| part[i]);
            }
            assert_eq!(total.to_bits(), whole.to_bits(), "len {len}");
        }
    }

    /// ceil(chunks / EC_SUM_GROUPS), as c_src/pipeline.c computes it.
    fn sum_order_group_chunks(chunks: usize) -> usize {
        chunks.div_ceil(EC_SUM_GROUPS as usize).max(1)
    }

    #[test]
    fn matmul_matches_the_f64_reference() {
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
            (130, 70, 33),
            (1, 1000, 300),
        ];
        for ty in FLOATS {
            for (m, n, k) in shapes {
                let (a, b) = (rng.vec_of(m * k, ty), rng.vec_of(k * n, ty));
                let out = run_one(Kernel::Matmul, ty, &[&a, &b], &[], &[m as u32, n as u32, k as u32], m * n);
                for i in 0..m {
                    for j in 0..n {
                        let (mut exact, mut mag) = (0f64, 0f64);
                        for p in 0..k {
                            let t = a[i * k + p] * b[p * n + j];
                            exact += t;
                            mag += t.abs();
                        }
                        let got = out[i * n + j];
                        // A serial chain of k multiply-adds, then nothing.
                        let tol = depth(Kernel::Matmul, 0, k) * unit(ty) * mag + f64::MIN_POSITIVE;
                        assert!((got - exact).abs() <= tol, "matmul {ty:?} {m}x{n}x{k} [{i},{j}]: {got} vs {exact}");
                        if k == 0 {
                            assert_eq!(got.to_bits(), 0f64.to_bits());
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn ieee_specials_propagate() {
        let (nan, inf) = (f64::NAN, f64::INFINITY);
        let f32max = f64::from(f32::MAX);
        let out = run_one(Kernel::VectorAdd, ElemType::F32, &[&[nan, inf, -inf, 1.0], &[1.0, 1.0, inf, f32max]], &[], &[], 4);
        assert!(out[0].is_nan() && out[1] == inf && out[2].is_nan());
        assert_eq!(out[3], f32max);
        let reduce = |ty, a: &[f64]| run_one(Kernel::Reduce, ty, &[a], &[], &[], 1)[0];
        assert!(reduce(ElemType::F32, &[nan, inf, -inf, 1.0]).is_nan());
        assert_eq!(reduce(ElemType::F32, &[inf, 1.0]), inf);
        // Accumulated in f32: f32 overflows where f64 would not.
        assert_eq!(reduce(ElemType::F32, &[f32max, f32max, -f32max]), inf);
        assert_eq!(reduce(ElemType::F64, &[f32max, f32max, -f32max]), f32max);
        assert!(run_one(Kernel::DotProduct, ElemType::F64, &[&[0.0], &[inf]], &[], &[], 1)[0].is_nan());
        assert!(run_one(Kernel::Saxpy, ElemType::F32, &[&[1.0], &[1.0]], &[nan], &[], 1)[0].is_nan());
    }

    #[test]
    fn backend_runs_a_mixed_launch_through_the_arena() {
        let mut rng = Rng(5);
        let mut buf = vec![0f64; 1 << 15];
        let arena_bytes = (buf.len() * 8) as u64;
        let floats: &mut [f32] = unsafe { std::slice::from_raw_parts_mut(buf.as_mut_ptr().cast(), buf.len() * 2) };
        for x in floats.iter_mut() {
            *x = rng.f();
        }
        let snapshot = floats.to_vec();
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
                let launch = Launch::builtin(Kernel::VectorAdd, ElemType::F32, &jobs, independent);
                run_to_completion(&mut backend, &arena, &launch).unwrap();
            }
        }
        assert_eq!(backend.in_flight(), 0);
        let floats: &[f32] = unsafe { std::slice::from_raw_parts(buf.as_ptr().cast(), buf.len() * 2) };
        for i in 0..100usize {
            for e in 0..4 {
                let want = snapshot[i * 16 + e] + snapshot[i * 16 + 4 + e];
                assert_eq!(floats[0x20000 / 4 + i * 4 + e], want);
            }
        }
    }

    /// With `fault-injection`, a job flagged EC_FLAG_FAULT makes the launch
    /// fail as a device failure (gpud then exits 3); its output is untouched.
    #[cfg(feature = "fault-injection")]
    #[test]
    fn fault_flag_is_a_device_error() {
        let mut buf = vec![1f64; 32];
        let floats: &mut [f32] = unsafe { std::slice::from_raw_parts_mut(buf.as_mut_ptr().cast(), 64) };
        floats.fill(1.0);
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
        let jobs = [good.clone(), bad];
        let launch = Launch::builtin(Kernel::VectorAdd, ElemType::F32, &jobs, false);
        let e = backend.submit(&arena, &launch).unwrap_err();
        assert!(matches!(e, Error::Device(_)), "{e}");
        assert_eq!(e.exit_code(), 3);
        assert_eq!(unsafe { arena.input::<f32>(good.out()) }, &[1.0; 4], "a faulting launch ran anyway");
    }
}
