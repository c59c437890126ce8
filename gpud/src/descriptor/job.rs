//! A validated job: what a backend may rely on. Only validation
//! (`check.rs`) makes one, so holding one is the proof that its regions
//! lie inside the arena (or are live buffers), that its lengths are its
//! kernel's signature's, and that what it writes overlaps nothing it reads.

use std::sync::Arc;

use super::region::Region;
use crate::layout::{ElemType, Kernel, Shape, Sqe, EC_FLAG_ARGS, EC_MAX_PARAMS, EC_MAX_SLOTS, EC_MAX_VECTORS};

/// Which kernel a job runs: a row of the built-in table, or a user's
/// kernel of a loaded module (by id, see `modules.rs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KernelRef {
    Builtin(Kernel),
    User(u16),
    /// A group launch of user kernel `id` (its group entry); never a job's
    /// own kernel, only a launch's.
    UserGroup(u16),
}

/// How a job is launched: the block size, the dynamic shared memory and
/// the grid (0: as the kernel computes it). Jobs coalesce only with jobs of
/// the same kernel, type and geometry.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Geometry {
    pub threads: u32,
    pub shared_bytes: u32,
    pub grid: u32,
}

const MV: usize = EC_MAX_VECTORS as usize;

/// Slots and parameters a job holds inline: every built-in's (in0, in1,
/// out and a 16-byte parameter area), and a small user's kernel's. A job
/// of a wider signature keeps them in a [`Wide`] behind an `Arc`, so that
/// the jobs validation, coalescing and the launches copy stay small.
const INLINE_VECTORS: usize = 2;
const INLINE_OUTPUTS: usize = 1;
const INLINE_PARAMS: usize = 4;

/// Every slot and parameter of a job too wide to hold them inline.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Wide {
    pub(super) slots: [Region; EC_MAX_SLOTS as usize],
    pub(super) param: [u64; EC_MAX_PARAMS as usize],
}

/// A job that passed validation. Fields are private to the validator so
/// that nothing else can make one.
///
/// Its slots are the wire's (`ec_job_args`): slot `i < EC_MAX_VECTORS` the
/// i-th v or io argument, slot `EC_MAX_VECTORS + j` the j-th output; a
/// built-in's in0, in1 and out are slots 0, 1 and `EC_MAX_VECTORS`.
/// A job touching at most this many elements (inputs and outputs; a
/// matmul's multiply-adds) is small: a few microseconds of an H100's time.
/// Small jobs are coalesced only with each other, never with a large job or
/// a pipelined job's pieces (whose launch they would wait for), and their
/// launches take the latency lane. To be sized by the mixed-load benchmark
/// (`bench/erlcuda_mixed_bench.erl`).
pub const SMALL_JOB_WORK: u64 = 1 << 20;

/// Whether a descriptor still in the SQ may be a small job (see
/// [`SMALL_JOB_WORK`]), read before validation: the daemon drains the SQ
/// for one at once, however many large launches are in flight
/// (daemon/wait.rs). A hint only, on lengths the VM wrote, so a lie
/// changes nothing but when a drain happens: a user's job counts as small
/// (its lengths are in its record), a control descriptor or an unknown
/// kernel as not (they launch nothing).
pub fn may_be_small(sqe: &Sqe) -> bool {
    if sqe.flags & EC_FLAG_ARGS != 0 {
        return true;
    }
    let Some(k) = Kernel::from_id(sqe.kernel) else { return false };
    let base = sqe.in0_len as u64 + sqe.in1_len as u64 + sqe.out_len as u64;
    let work = match k.row().shape {
        Shape::Matmul => {
            let d = sqe.p.decode(k.plan());
            base.max(d[0].saturating_mul(d[1]).saturating_mul(d[2]))
        }
        _ => base,
    };
    work <= SMALL_JOB_WORK
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Job {
    pub(super) user_data: u64,
    pub(super) kernel: KernelRef,
    /// The kernel's T (a kernel with no T: F32).
    pub(super) ty: ElemType,
    /// Vector slots used (v and io arguments), outputs.
    pub(super) nvec: u8,
    pub(super) nout: u8,
    /// Bit `i`: vector slot `i` is an io argument, written in place.
    pub(super) io: u8,
    /// EC_FLAG_FAULT was set (only possible with the `fault-injection` feature).
    pub(super) fault: bool,
    pub(super) geometry: Geometry,
    /// A user's job: its virtual blocks at `geometry.threads` (the kit's
    /// `blocks` rule); 0 for the built-ins, whose ops count their own.
    pub(super) blocks: u32,
    /// A user's job: its launch options as the wire gave them (grid,
    /// block, shared_bytes, given, seed), which its record shows the kernel.
    pub(super) opts: [u32; 5],
    /// A user's job: how long it may wait for companions (`{max_wait_us,
    /// W}`), 0 for none.
    pub(super) max_wait_us: u32,
    /// Inline (`wide` is None): slots 0, 1 and `EC_MAX_VECTORS`, unused
    /// ones [`Region::EMPTY`]; the parameters.
    pub(super) regions: [Region; 3],
    /// The s and d arguments in declared order: a float scalar's f64 bits
    /// (a NaN scalar is a valid argument, and a job must still equal
    /// itself), an integer scalar as an s64, a dimension widened.
    pub(super) param: [u64; INLINE_PARAMS],
    pub(super) wide: Option<Arc<Wide>>,
}

impl Job {
    /// Whether a kernel of `nvec` vectors, `nout` outputs and `nparams`
    /// parameters holds its jobs' slots inline.
    pub(super) fn fits_inline(nvec: u8, nout: u8, nparams: u8) -> bool {
        usize::from(nvec) <= INLINE_VECTORS && usize::from(nout) <= INLINE_OUTPUTS && usize::from(nparams) <= INLINE_PARAMS
    }

    /// Stores the validated `slots` and `param` (of which the first
    /// `nparams` are used, the rest 0) in the job.
    #[inline(always)]
    pub(super) fn set_slots(&mut self, slots: &[Region; EC_MAX_SLOTS as usize], param: &[u64; EC_MAX_PARAMS as usize], nparams: u8) {
        if Job::fits_inline(self.nvec, self.nout, nparams) {
            self.regions = [slots[0], slots[1], slots[MV]];
            self.param.copy_from_slice(&param[..INLINE_PARAMS]);
            self.wide = None;
        } else {
            self.wide = Some(Arc::new(Wide { slots: *slots, param: *param }));
        }
    }
    pub fn user_data(&self) -> u64 {
        self.user_data
    }
    pub fn kernel(&self) -> KernelRef {
        self.kernel
    }
    /// The built-in kernel, `None` for a user's kernel.
    pub fn builtin(&self) -> Option<Kernel> {
        match self.kernel {
            KernelRef::Builtin(k) => Some(k),
            KernelRef::User(_) | KernelRef::UserGroup(_) => None,
        }
    }
    pub fn geometry(&self) -> Geometry {
        self.geometry
    }
    /// The kernel's T: the element type of every argument declared `T`.
    pub fn ty(&self) -> ElemType {
        self.ty
    }
    /// Slot `i` (unused: [`Region::EMPTY`]).
    pub fn slot(&self, i: usize) -> Region {
        match (&self.wide, i) {
            (Some(w), _) => w.slots[i],
            (None, 0 | 1) => self.regions[i],
            (None, MV) => self.regions[2],
            (None, _) => Region::EMPTY,
        }
    }
    /// The vector slots the kernel declares (v and io arguments), in order.
    pub fn inputs(&self) -> &[Region] {
        match &self.wide {
            Some(w) => &w.slots[..usize::from(self.nvec)],
            None => &self.regions[..usize::from(self.nvec)],
        }
    }
    /// The outputs the kernel declares, in order.
    pub fn outputs(&self) -> &[Region] {
        match &self.wide {
            Some(w) => &w.slots[MV..MV + usize::from(self.nout)],
            None => &self.regions[2..2 + usize::from(self.nout)],
        }
    }
    /// Bit `i`: vector slot `i` is an io argument (a buffer written in place).
    pub fn io_mask(&self) -> u8 {
        self.io
    }
    /// Every region the job writes: its outputs and its io arguments.
    pub fn writes(&self) -> impl Iterator<Item = Region> + '_ {
        let io = self.io;
        self.outputs()
            .iter()
            .copied()
            .chain(self.inputs().iter().enumerate().filter(move |(i, _)| io & (1 << i) != 0).map(|(_, r)| *r))
    }
    /// A built-in's first vector.
    pub fn in0(&self) -> Region {
        self.slot(0)
    }
    /// A built-in's second vector ([`Region::EMPTY`] for kernels with one).
    pub fn in1(&self) -> Region {
        self.slot(1)
    }
    /// A built-in's output (a user's first).
    pub fn out(&self) -> Region {
        self.slot(MV)
    }
    /// The s and d arguments, in declared order (unused: 0).
    pub fn params(&self) -> [u64; EC_MAX_PARAMS as usize] {
        match &self.wide {
            Some(w) => w.param,
            None => {
                let mut p = [0; EC_MAX_PARAMS as usize];
                p[..INLINE_PARAMS].copy_from_slice(&self.param);
                p
            }
        }
    }
    /// Parameter `i`.
    pub fn param(&self, i: usize) -> u64 {
        match &self.wide {
            Some(w) => w.param[i],
            None => self.param.get(i).copied().unwrap_or(0),
        }
    }
    /// Parameter `i` as a float scalar.
    pub fn param_f64(&self, i: usize) -> f64 {
        f64::from_bits(self.param(i))
    }
    /// Matmul dimensions (A is m×k, B is k×n); zero for other shapes.
    pub fn dims(&self) -> (usize, usize, usize) {
        match self.builtin().map(|k| k.row().shape) {
            Some(Shape::Matmul) => (self.param(0) as usize, self.param(1) as usize, self.param(2) as usize),
            _ => (0, 0, 0),
        }
    }
    /// A user's job: its virtual blocks (see [`Job::geometry`]).
    pub fn blocks(&self) -> u32 {
        self.blocks
    }
    /// A user's job: `(grid, block, shared_bytes, given, seed)` as the wire gave them.
    pub fn launch_opts(&self) -> [u32; 5] {
        self.opts
    }
    /// How long gpud may hold the job for a group launch (see
    /// `daemon::submit`), 0: not at all.
    pub fn max_wait(&self) -> std::time::Duration {
        std::time::Duration::from_micros(u64::from(self.max_wait_us))
    }
    /// True when the job asks the backend to fault the device on purpose.
    /// Always false without the `fault-injection` feature.
    pub fn fault(&self) -> bool {
        self.fault
    }
    /// A small job: coalesced only with small jobs, and launched on the
    /// latency lane (see [`SMALL_JOB_WORK`]).
    pub fn is_small(&self) -> bool {
        self.work() <= SMALL_JOB_WORK
    }
    /// Elements touched; a rough measure of the work, for scheduling.
    pub fn work(&self) -> u64 {
        let base = self.inputs().iter().chain(self.outputs()).map(|r| r.len() as u64).sum::<u64>();
        match self.builtin().map(|k| k.row().shape) {
            // m*n*k multiply-adds; computed in u128 so that it cannot overflow.
            Some(Shape::Matmul) => {
                let (m, n, k) = self.dims();
                let mnk = m as u128 * n as u128 * k as u128;
                base.max(mnk.min(u64::MAX as u128) as u64)
            }
            _ => base,
        }
    }
}
