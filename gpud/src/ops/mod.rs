//! The host side of every kernel: one file per kernel, `ops/<atom>.rs`,
//! each implementing [`KernelOp`] — how a job runs on the CPU, and how a
//! batch of jobs is described to the device and launched. The list of them
//! is generated from the kernel table of `c_src/erlcuda_ring.h` (see
//! `build.rs`), like candle's `Map1` ops beside its `candle-kernels` module
//! table, or io_uring's `io_issue_defs[]`: adding a kernel edits no switch.
//!
//! What validation already settled (`descriptor.rs`, from the table's row)
//! is not repeated here: a [`Job`] that reaches an op has the kernel's shape,
//! one of its element types, and regions inside the arena.

use std::ops::{Add, AddAssign, Mul};

use crate::arena::Arena;
use crate::descriptor::Job;
use crate::kitjob;
use crate::layout::{ElemType, Kernel, EC_MAX_SLOTS, EC_MAX_VECTORS, EC_SUM_CHUNK, EC_SUM_GROUPS, EC_SUM_SERIAL};

// The kernels' ABI (job-table structs, grid rules), shared verbatim with the
// device code.
#[path = "../../../kernels/src/abi.rs"]
#[allow(clippy::all)]
pub mod abi;

// The CPU sums' order (serial runs, pairwise within a chunk), the very
// code the kit's host sums run.
#[path = "../../../kernels/kit/src/sum_order.rs"]
mod sum_order;
const _: () = assert!(
    sum_order::SERIAL == EC_SUM_SERIAL as usize
        && sum_order::CHUNK == EC_SUM_CHUNK as usize
        && sum_order::GROUPS == EC_SUM_GROUPS as usize
);

// Users' kernels: the same trait over a loaded module's declaration.
pub mod user;

include!(concat!(env!("OUT_DIR"), "/ops_table.rs"));

// The device code states the header's accumulation depths in abi.rs (it
// cannot read the C header); they must be the header's.
const _: () = assert!(abi::SUM_SERIAL == EC_SUM_SERIAL as u64 && abi::SUM_CHUNK == EC_SUM_CHUNK as u64);
// Likewise the kit's: its reductions (SERIAL terms per thread, one chunk
// per block of the default size) state the header's depths.
const _: () = assert!(kitjob::SERIAL == EC_SUM_SERIAL as u64);
const _: () = assert!(kitjob::SERIAL * kitjob::DEFAULT_THREADS as u64 == EC_SUM_CHUNK as u64);

/// grid.x cap of the launches of kit-declared kernels: 64 blocks per SM of a
/// 132-SM H100/H200, as for the built-ins' own tables (the entries are
/// grid-stride, so any grid is correct).
pub const KIT_MAX_GRID: u32 = 132 * 64;

/// The host side of `kernel`.
pub fn op(kernel: Kernel) -> &'static (dyn KernelOp + Sync) {
    OPS[kernel as usize - 1]
}

/// Device addresses of one job's slots (the job's own numbering: vectors
/// from 0, outputs from `EC_MAX_VECTORS`), after the backend placed them.
#[derive(Clone, Copy, Debug, Default)]
pub struct DevPtrs {
    pub addr: [u64; EC_MAX_SLOTS as usize],
}

impl DevPtrs {
    /// A built-in's first vector.
    pub fn in0(&self) -> u64 {
        self.addr[0]
    }
    /// A built-in's second vector.
    pub fn in1(&self) -> u64 {
        self.addr[1]
    }
    /// A built-in's output.
    pub fn out(&self) -> u64 {
        self.addr[EC_MAX_VECTORS as usize]
    }
}

/// How one chunk of a batch is launched: the grid, the dynamic shared
/// memory and the u32 parameters that follow the table pointer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeviceLaunch {
    pub grid: u32,
    /// Threads per block.
    pub block: u32,
    pub smem: u32,
    pub params: [u32; 4],
    pub nparams: usize,
}

impl DeviceLaunch {
    /// `(njobs, total)`: the parameters of the kernels that take them.
    pub fn counted(njobs: usize, total: u32, max_grid: u32, smem: u32) -> DeviceLaunch {
        DeviceLaunch {
            grid: abi::grid_for(total, max_grid),
            block: 256,
            smem,
            params: [njobs as u32, total, 0, 0],
            nparams: 2,
        }
    }
}

/// Where a job's data lives while its kernel runs (the cuda backend's
/// choice, per kernel and size: measured, see `backend/cuda.rs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    /// The kernel reads and writes the arena through its device mapping.
    Mapped,
    /// Inputs copied to device scratch (async, from the registered arena);
    /// the kernel writes its output straight into the mapped arena.
    CopyIn,
    /// Inputs copied in, output computed in device scratch and copied back.
    CopyInOut,
}

/// One kernel's host side.
pub trait KernelOp {
    /// CPU backend: computes `job` into its output region.
    ///
    /// # Safety
    /// While this runs, no other thread may hold a slice that conflicts
    /// with the job's regions (the output must not be read or written
    /// elsewhere, and the inputs not written).
    unsafe fn cpu(&self, arena: &Arena<'_>, job: &Job);

    /// CPU backend: [`KernelOp::cpu`], and the fault that stopped the job
    /// short, if any: only a user's GPU body run on the CPU can fault (a
    /// divergent barrier or warp operation, which on a GPU would hang the
    /// launch). The job alone is answered with it.
    ///
    /// # Safety
    /// As [`KernelOp::cpu`].
    unsafe fn cpu_checked(&self, arena: &Arena<'_>, job: &Job) -> Option<crate::kitjob::Fault> {
        // SAFETY: the caller's promise, passed on.
        unsafe { self.cpu(arena, job) };
        None
    }

    /// CPU backend: runs all of `jobs` at once, when the op is one launch
    /// of them together (a group launch), returning the faulted jobs'
    /// user_data and faults; None (the default) when each job runs on
    /// its own ([`KernelOp::cpu_checked`]).
    ///
    /// # Safety
    /// As [`KernelOp::cpu`], for every job.
    unsafe fn cpu_together(&self, _arena: &Arena<'_>, _jobs: &[Job]) -> Option<Vec<(u64, crate::kitjob::Fault)>> {
        None
    }

    /// CUDA: appends the job table of `jobs` (device pointers in `ptrs`, one
    /// per job) to `table` and says how to launch it; `None` when the batch
    /// is too large for the kernel's u32 counts (the caller splits it).
    fn device_table(&self, jobs: &[Job], ptrs: &[DevPtrs], table: &mut Vec<u8>) -> Option<DeviceLaunch>;

    /// Virtual blocks one job takes in its kernel's grid (to split batches
    /// whose total would not fit a u32).
    fn blocks(&self, job: &Job) -> u64;

    /// Where the job's data should be (see [`Placement`]).
    fn placement(&self, _job: &Job, _njobs: usize) -> Placement {
        Placement::Mapped
    }

    /// True when the job's outputs must start zeroed in device memory: the
    /// kernel may add into them atomically, so an output not in a device
    /// buffer lives in zeroed device scratch (atomics over PCIe to mapped
    /// host memory are not guaranteed) and is copied back; one in a buffer
    /// is zeroed in place.
    fn accumulates_into_output(&self, _job: &Job) -> bool {
        false
    }

    /// Tests: the exact result in f64 of a job on `ty` with vector inputs
    /// `ins` (values of `ty`), scalar and dimension arguments in order: per
    /// output element, the value and Σ|terms| (the scale of the rounding
    /// error a backend may add; see `testvec`).
    ///
    /// Every built-in has one; a user's kernel has none here (its module's
    /// tests hold its reference), so the default is empty, which no length
    /// check accepts.
    fn reference(&self, _ty: ElemType, _ins: &[&[f64]], _scalars: &[f64], _dims: &[u32]) -> Vec<(f64, f64)> {
        Vec::new()
    }
}

/// `Σ a·b` over `pairs` as accurately as if computed in twice f64's
/// precision (Ogita, Rump and Oishi's Dot2: error-free products and sums),
/// and `Σ |a·b|`. The references' sums: a plain f64 sum of 2^20 terms errs
/// by as much as the f64 kernels may, so it cannot judge them.
pub fn dot2(pairs: impl Iterator<Item = (f64, f64)>) -> (f64, f64) {
    let (mut s, mut c, mut mag) = (0f64, 0f64, 0f64);
    for (a, b) in pairs {
        let p = a * b;
        let pe = a.mul_add(b, -p); // the product's rounding error, exactly
        let t = s + p;
        let z = t - s;
        let se = (s - (t - z)) + (p - z); // the sum's rounding error, exactly
        s = t;
        c += pe + se;
        mag += p.abs();
    }
    (s + c, mag)
}

/// `x` rounded to the element type `ty` (a scalar argument as the kernel
/// sees it).
// `.into()` is f32 -> f64, and f64 -> f64 for the f64 arm.
#[allow(clippy::useless_conversion)]
pub fn rounded(x: f64, ty: ElemType) -> f64 {
    crate::with_float!(ty, T => T::from_f64(x).into())
}

/// `job` as a job of a kit-declared kernel (`kitjob::Job`, the layout of
/// `ec_job_args`): each slot's address from `p` (unused slots 0) and its
/// length, the parameters, the launch options as the wire gave them;
/// `buffers` cleared (the addresses are all memory now) and `block_start`
/// left to `kitjob::prepare`.
pub fn kit_job(job: &Job, p: &DevPtrs) -> kitjob::Job {
    let mut kj = kitjob::Job { param: job.params(), ..kitjob::Job::default() };
    let outs = EC_MAX_VECTORS as usize..EC_MAX_VECTORS as usize + job.outputs().len();
    for i in (0..job.inputs().len()).chain(outs) {
        kj.addr[i] = p.addr[i];
        kj.len[i] = job.slot(i).len() as u32;
    }
    [kj.grid, kj.block, kj.shared_bytes, kj.given, kj.seed] = job.launch_opts();
    kj
}

/// Appends the bytes of plain `#[repr(C)]` descriptors.
pub fn push_pod<T: Copy>(out: &mut Vec<u8>, items: &[T]) {
    // SAFETY: T is one of abi.rs's #[repr(C)] descriptor structs or
    // kitjob::Job: plain integers, floats and bytes with no padding (sizes
    // asserted there).
    let b = unsafe { std::slice::from_raw_parts(items.as_ptr().cast::<u8>(), std::mem::size_of_val(items)) };
    out.extend_from_slice(b);
}

/// The element types the built-in kernels compute in on the CPU.
pub trait Float:
    Copy + Default + PartialEq + Send + Sync + Add<Output = Self> + Mul<Output = Self> + AddAssign + Into<f64> + 'static
{
    const ZERO: Self;
    /// Rounds a scalar argument (carried as f64) to the element type.
    fn from_f64(x: f64) -> Self;
}

impl Float for f32 {
    const ZERO: f32 = 0.0;
    fn from_f64(x: f64) -> f32 {
        x as f32
    }
}

impl Float for f64 {
    const ZERO: f64 = 0.0;
    fn from_f64(x: f64) -> f64 {
        x
    }
}

/// `with_float!(ty, T => expr)`: `expr` with `T` the Rust type of `ty`,
/// one of the float types (validation admits no other for the built-ins).
#[macro_export]
macro_rules! with_float {
    ($ty:expr, $T:ident => $body:expr) => {
        match $ty {
            $crate::layout::ElemType::F32 => {
                type $T = f32;
                $body
            }
            $crate::layout::ElemType::F64 => {
                type $T = f64;
                $body
            }
            t => unreachable!("the built-in kernels run on f32 and f64, validation let {t:?} through"),
        }
    };
}

/// Elements per parallel chunk for the streaming kernels on the CPU. Below
/// two chunks a job runs on the calling thread: fork/join would cost more
/// than it saves.
pub const PAR_CHUNK: usize = 1 << 16;

/// A sum of `len` terms `term(i)` in the element type, in the order the
/// header states for every backend: runs of at most `EC_SUM_SERIAL` terms
/// added serially, their partials combined pairwise inside each
/// `EC_SUM_CHUNK`-term chunk, and the chunks' partials added in index order
/// in at most `EC_SUM_GROUPS` groups (`sum_order::combine`).
/// Chunks run in parallel when there are several; the result does not
/// depend on the thread count.
pub fn sum<T: Float>(len: usize, term: impl Fn(usize) -> T + Sync) -> T {
    use rayon::prelude::*;
    let chunk = EC_SUM_CHUNK as usize;
    let one = |c: usize| chunk_sum(c * chunk, ((c + 1) * chunk).min(len), &term);
    let n = len.div_ceil(chunk);
    if n >= 2 {
        let parts: Vec<T> = (0..n).into_par_iter().map(one).collect();
        sum_order::combine(T::ZERO, n, |c| parts[c])
    } else if n == 1 {
        one(0)
    } else {
        T::ZERO
    }
}

fn chunk_sum<T: Float>(lo: usize, hi: usize, term: &impl Fn(usize) -> T) -> T {
    sum_order::chunk_sum(T::ZERO, lo, hi, term)
}

/// The job's elementwise output on the CPU: `out[i] = f(a[i], b[i])`, in
/// parallel chunks when long.
///
/// # Safety
/// As for [`KernelOp::cpu`].
pub unsafe fn elementwise<T: Float>(arena: &Arena<'_>, job: &Job, f: impl Fn(T, T) -> T + Sync) {
    use rayon::prelude::*;
    // SAFETY: forwarded; validation proved the output disjoint from the inputs.
    let (a, b, out) = unsafe { (arena.input::<T>(job.in0()), arena.input::<T>(job.in1()), arena.output::<T>(job.out())) };
    let seq = |a: &[T], b: &[T], o: &mut [T]| {
        for ((o, &x), &y) in o.iter_mut().zip(a).zip(b) {
            *o = f(x, y);
        }
    };
    if out.len() >= 2 * PAR_CHUNK {
        out.par_chunks_mut(PAR_CHUNK)
            .zip(a.par_chunks(PAR_CHUNK).zip(b.par_chunks(PAR_CHUNK)))
            .for_each(|(o, (a, b))| seq(a, b, o));
    } else {
        seq(a, b, out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// matmul_f32 launches take the wide tile (256 rows) where that makes
    /// at least MATMUL_WIDE_MIN_TILES tiles, counted over the whole launch,
    /// the narrow one (64 rows) where 128-row tiles would be at most
    /// MATMUL_NARROW_MAX_TILES, and pass the height as the kernel's 4th
    /// parameter with its shared memory.
    #[test]
    fn matmul_launches_choose_their_tile_height_by_size() {
        use crate::descriptor::validate;
        let launch = |dims: &[[u32; 3]]| {
            let jobs: Vec<_> = dims
                .iter()
                .map(|&d| {
                    let mut sqe = crate::testvec::shaped_sqe(Kernel::Matmul, ElemType::F32, 0, d, &[]);
                    (sqe.in1, sqe.out) = (1 << 40, 1 << 41);
                    validate(&sqe, 1u64 << 44).unwrap()
                })
                .collect();
            let ptrs = vec![DevPtrs::default(); jobs.len()];
            let mut table = Vec::new();
            let l = op(Kernel::Matmul).device_table(&jobs, &ptrs, &mut table).unwrap();
            (l.params[1], l.params[2], l.nparams, l.smem)
        };
        // 1024^2: 32 wide tiles, too few; 64 square ones would leave half
        // the SMs idle: 128 narrow ones
        assert_eq!(launch(&[[1024, 1024, 1024]]), (128, 64, 3, abi::MATMUL_NARROW_SMEM_BYTES));
        // 1280^2: 50 wide tiles, 100 square ones
        assert_eq!(launch(&[[1280, 1280, 64]]), (100, 128, 3, abi::MATMUL_SMEM_BYTES));
        // 32^2: one tile of any height, the narrow one wastes least
        assert_eq!(launch(&[[32, 32, 32]]), (1, 64, 3, abi::MATMUL_NARROW_SMEM_BYTES));
        // 2048^2: 128 wide tiles
        assert_eq!(launch(&[[2048, 2048, 2048]]), (128, 256, 3, abi::MATMUL_WIDE_SMEM_BYTES));
        // two 1024^2 jobs make 64 wide tiles together
        assert_eq!(launch(&[[1024, 1024, 8], [1024, 1024, 8]]), (64, 256, 3, abi::MATMUL_WIDE_SMEM_BYTES));
        // 32 + 24 = 56 wide tiles, 64 + 48 = 112 square ones
        assert_eq!(launch(&[[1024, 1024, 8], [768, 1024, 8]]).1, 128);
    }

    #[test]
    fn every_row_has_its_op() {
        for k in Kernel::ALL {
            // The generated table is in id order: the op at k's index is k's.
            let _ = op(k);
        }
        assert_eq!(OPS.len(), Kernel::ALL.len());
    }

    #[test]
    fn kit_jobs_carry_the_jobs_slots_and_parameters() {
        use crate::descriptor::validate;
        use crate::signature::Kind;
        for k in Kernel::ALL {
            // A validated built-in as the kit's record: in0, in1, out in
            // slots 0, 1, EC_MAX_VECTORS, its parameters in declared order.
            let mut sqe = crate::testvec::shaped_sqe(k, ElemType::F64, 16, [2, 4, 3], &[-1.25]);
            (sqe.in1, sqe.out) = (0x1000, 0x2000);
            let job = validate(&sqe, 1u64 << 20).unwrap();
            let mut p = DevPtrs::default();
            p.addr[0] = 1;
            p.addr[1] = 2;
            p.addr[EC_MAX_VECTORS as usize] = 3;
            let kj = kit_job(&job, &p);
            let two = k.vector_inputs() == 2;
            assert_eq!(kj.addr[0], 1);
            assert_eq!(kj.addr[1], if two { 2 } else { 0 }, "{k:?}");
            assert_eq!(kj.addr[EC_MAX_VECTORS as usize], 3);
            assert_eq!(kj.len[0], job.in0().len() as u32);
            assert_eq!(kj.len[EC_MAX_VECTORS as usize], job.out().len() as u32);
            assert_eq!((kj.buffers, kj.block_start, kj.given), (0, 0, 0));
            let mut want = [0u64; 8];
            let mut dims = [2u64, 4, 3].into_iter();
            for a in k.sig().args() {
                match a.kind {
                    Kind::Scalar => want[usize::from(a.slot)] = (-1.25f64).to_bits(),
                    Kind::Dim => want[usize::from(a.slot)] = dims.next().unwrap(),
                    _ => {}
                }
            }
            assert_eq!(kj.param, want, "{k:?}");
        }
    }

    #[test]
    fn sums_follow_the_stated_order() {
        // 1.0 followed by 2^24 - 1 ones of 2^-24... exercise serial runs,
        // the pairwise tree and several chunks; compare with an exact sum.
        for len in [0usize, 1, 255, 256, 257, 65535, 65536, 65537, 3 * 65536 + 5] {
            let got: f64 = sum(len, |i| (i % 7) as f64);
            let exact: f64 = (0..len).map(|i| (i % 7) as f64).sum();
            assert_eq!(got, exact, "len {len}");
            let got32: f32 = sum(len, |i| (i % 3) as f32);
            let exact: f64 = (0..len).map(|i| (i % 3) as f64).sum();
            // Every partial is an integer below 2^24: exact in f32 too.
            assert_eq!(got32 as f64, exact, "len {len}");
        }
    }
}
