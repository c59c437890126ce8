//! The one validator: a job in its general form (`ec_job_args`: slots,
//! lengths, parameters, options), whatever travelled on the wire, held to
//! its kernel's signature (laid out by slot: a `Plan`). A built-in's
//! descriptor is read as the same form ([`Form`], `mod.rs`), so both kinds
//! of kernel are judged by this code.
//!
//! Checks, in order, each answering its own status:
//! 1. fields that must be 0 (unused slots' addresses and buffer bits,
//!    unused parameters, `block_start`, `reserved`, unknown `given` bits,
//!    an option without its bit; a built-in takes no options): BAD_FLAGS;
//! 2. parameters: a dimension is at most 2^32-1 (BAD_SHAPE), an integer
//!    scalar lies in its type's range (BAD_TYPE), a float scalar is any
//!    bits;
//! 3. lengths: an unused slot's is 0, every other one its expression's
//!    value (free lengths as the inputs fix them, products without
//!    overflow, divisions exact), and every dimension in its range: BAD_SHAPE;
//! 4. a user's launch options (grid, `{block, B}` by the kernel's
//!    `block_rule`, shared memory) and its virtual blocks: BAD_SHAPE;
//! 5. inputs in slot order: a buffer (its bit in `buffers`) must be live
//!    with the slot's type and length (BAD_BUFFER), an io argument must be
//!    a buffer (BAD_BUFFER); anything else an arena region (OUT_OF_BOUNDS,
//!    MISALIGNED);
//! 6. an io buffer named by another slot of the job: OVERLAP;
//! 7. outputs in the arena, each overlapping no input and no other output:
//!    OVERLAP (inputs may overlap each other: reading twice is harmless);
//! 8. last of all, the outputs that make new buffers (so that a refused
//!    job holds none): BAD_BUFFER, OOM, TOO_LARGE.

use super::job::{Geometry, Job, KernelRef};
use super::region::{Region, Sizes};
use crate::kitjob::{self, Job as KitJob};
use crate::layout::{
    ElemType, JobArgs, Status, EC_MAX_PARAMS, EC_MAX_SLOTS, EC_MAX_VECTORS, EC_OPT_BLOCK, EC_OPT_GRID,
    EC_OPT_CPU_RUNS_CPU, EC_OPT_CPU_RUNS_GPU, EC_OPT_MAX_WAIT, EC_OPT_SHARED_BYTES, EC_OPT_THREAD_ORDER,
};
use crate::modules::UserKernel;
use crate::sigplan::{Check, Param, Plan};
use crate::signature::{Ty, MAX_FREE};

const MV: usize = EC_MAX_VECTORS as usize;
const SLOTS: usize = EC_MAX_SLOTS as usize;
// The thread order's seed is any u32: only a GPU body run on the CPU reads it.
const OPTS: u32 = EC_OPT_GRID | EC_OPT_BLOCK | EC_OPT_SHARED_BYTES | EC_OPT_THREAD_ORDER | EC_OPT_MAX_WAIT | CPU_RUNS;
/// The body a job names: one or none.
const CPU_RUNS: u32 = EC_OPT_CPU_RUNS_GPU | EC_OPT_CPU_RUNS_CPU;

/// What validation asks about device buffers: the region of a live one,
/// and a new one for a job's output. [`NoBuffers`] knows none (every
/// buffer named is then BAD_BUFFER).
pub trait BufferTable {
    /// The region of live buffer `id` of `len` elements of `ty`.
    fn lookup(&self, id: u64, ty: ElemType, len: u32) -> Result<Region, Status>;
    /// Creates buffer `id` for an output: called last, once everything
    /// else about the job has passed.
    fn create(&mut self, id: u64, ty: ElemType, len: u32) -> Result<Region, Status>;
    /// Forgets buffer `id`, just created for a job that a later output's
    /// buffer then refused: nothing has used it, so a refused job holds
    /// no buffer.
    fn discard(&mut self, id: u64);
}

/// The buffer table of a gpud without buffers (tests, the fuzz reference).
pub struct NoBuffers;

impl BufferTable for NoBuffers {
    fn lookup(&self, _: u64, _: ElemType, _: u32) -> Result<Region, Status> {
        Err(Status::BadBuffer)
    }
    fn create(&mut self, _: u64, _: ElemType, _: u32) -> Result<Region, Status> {
        Err(Status::BadBuffer)
    }
    fn discard(&mut self, _: u64) {}
}

/// The element type `ty` names when T is `t`.
#[inline]
fn elem(ty: Ty, t: ElemType) -> ElemType {
    match ty {
        Ty::T => t,
        // Every concrete Ty is numbered as its EC_TYPES row.
        other => ElemType::from_id(other as u8).unwrap_or(t),
    }
}

/// A scalar parameter's bits hold a value of `ty`: floats are any bits
/// (the kernel rounds), integers must fit their type as an s64.
fn scalar_fits(ty: ElemType, v: u64) -> bool {
    let s = v as i64;
    match ty {
        ElemType::F32 | ElemType::F64 | ElemType::S64 => true,
        ElemType::S32 => i32::try_from(s).is_ok(),
        ElemType::U32 => u32::try_from(s).is_ok(),
        ElemType::U8 => u8::try_from(s).is_ok(),
    }
}

/// A job's arguments as validation reads them: the general form itself
/// (`ec_job_args`, a user's record), or a built-in's descriptor read as
/// one (`mod.rs`) without building a record, each slot and parameter where
/// the general form has it. Whatever a form cannot hold reads as 0.
pub(super) trait Form {
    /// Slot `i`'s address (or buffer id) and length.
    fn addr(&self, i: usize) -> u64;
    fn len(&self, i: usize) -> u32;
    fn param(&self, i: usize) -> u64;
    /// Bit `i`: slot `i` names a buffer.
    fn buffers(&self) -> u32;
    /// `grid`, `block`, `shared_bytes`, `given`, `seed`.
    fn options(&self) -> [u32; 5];
    /// `max_wait_us` (0 unless EC_OPT_MAX_WAIT is given).
    fn max_wait_us(&self) -> u32;
    /// `block_start` and `reserved` are 0.
    fn rest_is_zero(&self) -> bool;
}

impl Form for JobArgs {
    #[inline(always)]
    fn addr(&self, i: usize) -> u64 {
        self.addr[i]
    }
    #[inline(always)]
    fn len(&self, i: usize) -> u32 {
        self.len[i]
    }
    #[inline(always)]
    fn param(&self, i: usize) -> u64 {
        self.param[i]
    }
    #[inline(always)]
    fn buffers(&self) -> u32 {
        self.buffers
    }
    #[inline(always)]
    fn options(&self) -> [u32; 5] {
        [self.grid, self.block, self.shared_bytes, self.given, self.seed]
    }
    #[inline(always)]
    fn max_wait_us(&self) -> u32 {
        self.max_wait_us
    }
    #[inline(always)]
    fn rest_is_zero(&self) -> bool {
        self.block_start == 0 && self.reserved == [0; 3]
    }
}

/// Who submitted a job and what it runs: the validated job's head.
pub(super) struct Head {
    pub user_data: u64,
    pub kernel: KernelRef,
    pub fault: bool,
}

/// Validates job form `a` of a kernel laid out as `plan` with T `t`;
/// `user` is the user's kernel (its launch declaration), `None` for a
/// built-in.
#[inline(always)]
pub(super) fn check<F: Form>(
    head: Head,
    a: &F,
    plan: &Plan,
    t: ElemType,
    sizes: impl Sizes + Copy,
    bufs: &mut dyn BufferTable,
    user: Option<&UserKernel>,
) -> Result<Job, Status> {
    zeros(a, plan, user.is_some())?;
    params(a, plan, t)?;
    lengths(a, plan)?;
    let (geometry, blocks) = match user {
        Some(k) => launch(a, k)?,
        None => (Geometry::default(), 0),
    };
    let mut slots = [Region::EMPTY; SLOTS];
    let nvec = usize::from(plan.nvec);
    let buffers = a.buffers();
    for i in 0..nvec {
        let ty = elem(plan.ty[i], t);
        let buffer = buffers & (1 << i) != 0;
        if plan.io & (1 << i) != 0 && !buffer {
            return Err(Status::BadBuffer);
        }
        slots[i] = if buffer { bufs.lookup(a.addr(i), ty, a.len(i))? } else { Region::new(a.addr(i), a.len(i), ty, sizes)? };
    }
    if plan.io != 0 {
        io_named_once(a, plan)?;
    }
    for i in MV..MV + usize::from(plan.nout) {
        if buffers & (1 << i) != 0 {
            continue;
        }
        let r = Region::new(a.addr(i), a.len(i), elem(plan.ty[i], t), sizes)?;
        if slots[..nvec].iter().chain(&slots[MV..i]).any(|o| r.overlaps(o)) {
            return Err(Status::Overlap);
        }
        slots[i] = r;
    }
    if buffers >> MV != 0 {
        new_buffers(a, plan, t, bufs, &mut slots)?;
    }
    let mut job = Job {
        user_data: head.user_data,
        kernel: head.kernel,
        ty: t,
        nvec: plan.nvec,
        nout: plan.nout,
        io: plan.io as u8,
        fault: head.fault,
        geometry,
        blocks,
        opts: a.options(),
        max_wait_us: a.max_wait_us(),
        regions: [Region::EMPTY; 3],
        param: [0; 4],
        wide: None,
    };
    let param = std::array::from_fn(|i| a.param(i));
    job.set_slots(&slots, &param, plan.nparams);
    Ok(job)
}

/// Step 1: what must be 0.
#[inline(always)]
fn zeros<F: Form>(a: &F, plan: &Plan, takes_options: bool) -> Result<(), Status> {
    let [grid, block, shared_bytes, given, seed] = a.options();
    let unset = |bit: u32, v: u32| given & bit != 0 || v == 0;
    let options_ok = if takes_options {
        given & !OPTS == 0
            && given & CPU_RUNS != CPU_RUNS
            && unset(EC_OPT_GRID, grid)
            && unset(EC_OPT_BLOCK, block)
            && unset(EC_OPT_SHARED_BYTES, shared_bytes)
            && unset(EC_OPT_THREAD_ORDER, seed)
            && unset(EC_OPT_MAX_WAIT, a.max_wait_us())
    } else {
        given | grid | block | shared_bytes | seed | a.max_wait_us() == 0
    };
    let mut stray = 0u64;
    for i in 0..SLOTS {
        if plan.used & (1 << i) == 0 {
            stray |= a.addr(i);
        }
    }
    for i in usize::from(plan.nparams)..EC_MAX_PARAMS as usize {
        stray |= a.param(i);
    }
    if !options_ok || stray != 0 || a.buffers() & !plan.used != 0 || !a.rest_is_zero() {
        return Err(Status::BadFlags);
    }
    Ok(())
}

/// Step 2: every parameter a value of its kind.
#[inline(always)]
fn params<F: Form>(a: &F, plan: &Plan, t: ElemType) -> Result<(), Status> {
    for (i, &kind) in plan.param[..usize::from(plan.nparams)].iter().enumerate() {
        let v = a.param(i);
        match kind {
            Param::Dim if v > u64::from(u32::MAX) => return Err(Status::BadShape),
            Param::Scalar(ty) if !scalar_fits(elem(ty, t), v) => return Err(Status::BadType),
            _ => {}
        }
    }
    Ok(())
}

/// Step 3: every slot's length its signature's.
#[inline(always)]
fn lengths<F: Form>(a: &F, plan: &Plan) -> Result<(), Status> {
    let mut stray = 0u32;
    for i in 0..SLOTS {
        if plan.used & (1 << i) == 0 {
            stray |= a.len(i);
        }
    }
    if stray != 0 {
        return Err(Status::BadShape);
    }
    let mut free = [0u64; MAX_FREE];
    for (f, &slot) in free.iter_mut().zip(&plan.free_slot[..usize::from(plan.nfree)]) {
        *f = u64::from(a.len(usize::from(slot)));
    }
    let mut param = None;
    let mut used = plan.used;
    while used != 0 {
        let i = used.trailing_zeros() as usize;
        used &= used - 1;
        let ok = match plan.check[i] {
            Check::Unused | Check::Fixes => true,
            Check::Same(j) => a.len(i) == a.len(usize::from(j)),
            Check::Const(c) => a.len(i) == c,
            Check::Eval => {
                let p = param.get_or_insert_with(|| std::array::from_fn::<u64, { EC_MAX_PARAMS as usize }, _>(|k| a.param(k)));
                matches!(plan.len[i].eval(p, &free), Ok(Some(v)) if v == u64::from(a.len(i)))
            }
        };
        if !ok {
            return Err(Status::BadShape);
        }
    }
    for b in &plan.bounds[..usize::from(plan.nbounds)] {
        let p = param.get_or_insert_with(|| std::array::from_fn::<u64, { EC_MAX_PARAMS as usize }, _>(|k| a.param(k)));
        if !matches!(b.holds(p, &free), Ok(true)) {
            return Err(Status::BadShape);
        }
    }
    Ok(())
}

/// Step 6: an io buffer is written, so no other slot may name it too.
fn io_named_once<F: Form>(a: &F, plan: &Plan) -> Result<(), Status> {
    let buffers = a.buffers();
    for i in (0..MV).filter(|i| plan.io & (1 << i) != 0) {
        let named = (0..usize::from(plan.nvec)).any(|j| j != i && buffers & (1 << j) != 0 && a.addr(j) == a.addr(i));
        if named {
            return Err(Status::Overlap);
        }
    }
    Ok(())
}

/// Step 4: a user's geometry (its declaration, overridden by the options
/// given) and its virtual blocks, which must fit a launch's u32 count.
fn launch<F: Form>(a: &F, k: &UserKernel) -> Result<(Geometry, u32), Status> {
    let [grid, block, shared_bytes, given, _seed] = a.options();
    let mut g = Geometry { threads: k.threads, shared_bytes: k.shared, grid: 0 };
    if given & EC_OPT_GRID != 0 {
        if grid == 0 || grid > i32::MAX as u32 {
            return Err(Status::BadShape);
        }
        g.grid = grid;
    }
    if given & EC_OPT_BLOCK != 0 {
        if !k.block_rule.allows(block) {
            return Err(Status::BadShape);
        }
        g.threads = block;
    }
    if given & EC_OPT_SHARED_BYTES != 0 {
        if shared_bytes > kitjob::MAX_SHARED_BYTES {
            return Err(Status::BadShape);
        }
        // More than the kernel declares, never less: what it declares is
        // what its own code (block reductions) needs.
        g.shared_bytes = shared_bytes.max(k.shared);
    }
    let view = KitJob { len: std::array::from_fn(|i| a.len(i)), param: std::array::from_fn(|i| a.param(i)), ..KitJob::default() };
    let blocks = k.blocks.of(&k.sig, &view, g.threads).and_then(|b| u32::try_from(b).ok()).ok_or(Status::BadShape)?;
    Ok((g, blocks))
}

/// Step 8: the outputs that make new buffers, each a distinct id; undone
/// if any fails.
fn new_buffers<F: Form>(a: &F, plan: &Plan, t: ElemType, bufs: &mut dyn BufferTable, slots: &mut [Region; SLOTS]) -> Result<(), Status> {
    let outs = MV..MV + usize::from(plan.nout);
    let buffers = a.buffers();
    let is_new = |i: usize| buffers & (1 << i) != 0;
    for i in outs.clone().filter(|&i| is_new(i)) {
        if (MV..i).any(|j| is_new(j) && a.addr(j) == a.addr(i)) {
            return Err(Status::BadBuffer);
        }
    }
    for i in outs.filter(|&i| is_new(i)) {
        match bufs.create(a.addr(i), elem(plan.ty[i], t), a.len(i)) {
            Ok(r) => slots[i] = r,
            Err(s) => {
                for made in (MV..i).filter(|&m| is_new(m)) {
                    bufs.discard(a.addr(made));
                }
                return Err(s);
            }
        }
    }
    Ok(())
}
