//! Validation of submissions: pure functions from an untrusted [`Sqe`] copy
//! (and, for a user's kernel, a copy of its `ec_job_args` record) to a
//! [`Job`] whose regions are proven to lie inside the arena, or to the
//! [`Status`] that refuses it.
//!
//! Everything here treats the descriptor as hostile: all arithmetic is
//! checked, and nothing panics whatever the bytes contain. A [`Job`] can
//! only be built by validation, so holding one is the proof the backends
//! rely on when they turn its regions into slices.
//!
//! Two wire forms, one validator: a built-in's compact descriptor (in0,
//! in1, out, the parameter area `p`) is read as the general form of a
//! user's job (`ec_job_args`: slots and parameters), and both are held to
//! their kernel's signature (laid out by slot: `sigplan.rs`) by the same
//! code, `check.rs`:
//! - this file: the descriptor itself (flags, kernel, type, a user's
//!   record's place), and a built-in's descriptor as the general form;
//! - `region.rs`: the arena segments and validated regions;
//! - `job.rs`: the validated job;
//! - `check.rs`: the validator of the general form.
//!
//! Each built-in is validated by its own copy of that code, its plan a
//! compile-time constant there ([`Kernel::with_plan`]), so that the
//! checks compile to its own signature's; the built-ins' path allocates
//! nothing, and a built-in's job holds its three regions inline.

mod check;
mod job;
mod region;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod user_tests;

pub use check::{BufferTable, NoBuffers};
pub use job::{may_be_small, Geometry, Job, KernelRef};
pub use region::{Region, SegmentSizes, Sizes, BUFFER_SEG};

use crate::layout::{
    ElemType, JobArgs, Kernel, Params, Sqe, Status, EC_ADDR_SEGMENT_SHIFT, EC_FLAG_ARGS, EC_FLAG_FAULT,
    EC_FLAG_IN0_BUF, EC_FLAG_IN1_BUF, EC_FLAG_OUT_BUF, EC_JOB_ARGS_BYTES, EC_MAX_PARAMS, EC_MAX_SEGMENTS,
    EC_MAX_SLOTS, EC_MAX_VECTORS, EC_USER_KERNEL_BASE,
};
use crate::layout::{WithPlan, KERNEL_PLANS};
use crate::modules::{Registry, UserKernel};

/// The flags that name buffers (built-ins; a user's job says it per slot).
pub const BUF_FLAGS: u8 = EC_FLAG_IN0_BUF | EC_FLAG_IN1_BUF | EC_FLAG_OUT_BUF;

/// Where a user's job's record is read from: the arena's memory.
pub trait ArgsMemory {
    /// The `ec_job_args` at `r`, copied once: `r` is a validated arena
    /// region of `EC_JOB_ARGS_BYTES` bytes at an 8-aligned offset.
    fn copy_args(&self, r: Region) -> JobArgs;
}

/// No arena to read records from: validation of built-ins alone (tests,
/// the fuzz reference), where a user's kernel is unknown before any
/// record would be read. Reads a record of zeros.
pub struct NoArena;

impl ArgsMemory for NoArena {
    fn copy_args(&self, _: Region) -> JobArgs {
        JobArgs::default()
    }
}

/// True when `sqe` is a job and one of the arena addresses it uses names a
/// segment slot (1 <= i < EC_MAX_SEGMENTS) that `sizes` does not know yet:
/// the VM sends a segment before any descriptor naming it, so gpud should
/// read the socket and validate again before refusing the job. A user's
/// job counts its record's address and every slot of the record (read
/// from `mem` when the record's own place is valid): while the arena grew,
/// their jobs in a segment queued on the socket came back `out_of_bounds`
/// when only the descriptor's addresses were looked at.
pub fn names_unknown_segment(sqe: &Sqe, sizes: &SegmentSizes, mem: &dyn ArgsMemory) -> bool {
    let unknown = |a: u64| {
        let seg = (a >> EC_ADDR_SEGMENT_SHIFT) as usize;
        seg < EC_MAX_SEGMENTS as usize && !sizes.is_known(seg)
    };
    if sqe.kernel >= EC_USER_KERNEL_BASE {
        if sqe.flags & EC_FLAG_ARGS == 0 {
            return false;
        }
        if unknown(sqe.in0) {
            return true;
        }
        // Any slot not named a buffer is an arena address (unused ones are
        // 0, in segment 0, which is always known).
        return match args_region(sqe.in0, sizes) {
            Ok(r) => {
                let a = mem.copy_args(r);
                (0..EC_MAX_SLOTS as usize).any(|i| a.buffers & (1 << i) == 0 && unknown(a.addr[i]))
            }
            Err(_) => false,
        };
    }
    let Some(kernel) = Kernel::from_id(sqe.kernel) else { return false };
    // A one-vector kernel's in1 address is unused, whatever it holds.
    let mut addrs = [Some(sqe.in0), (kernel.vector_inputs() > 1).then_some(sqe.in1), Some(sqe.out)];
    // Buffer ids are not arena addresses.
    for (i, flag) in [EC_FLAG_IN0_BUF, EC_FLAG_IN1_BUF, EC_FLAG_OUT_BUF].into_iter().enumerate() {
        if sqe.flags & flag != 0 {
            addrs[i] = None;
        }
    }
    addrs.into_iter().flatten().any(unknown)
}

/// The device buffers `sqe` names, by id: a built-in's or a get's
/// `EC_FLAG_*_BUF` operands, a user's record's buffer slots (read from
/// `mem` when the record's own place is valid). For holding back a job
/// whose buffer is still being copied in by a put.
pub fn named_buffers(sqe: &Sqe, sizes: &SegmentSizes, mem: &dyn ArgsMemory) -> Vec<u64> {
    // A user's job carries its record (EC_FLAG_ARGS); a get and the
    // built-ins name buffers by flags.
    if sqe.kernel >= EC_USER_KERNEL_BASE && sqe.flags & EC_FLAG_ARGS != 0 {
        return match args_region(sqe.in0, sizes) {
            Ok(r) => {
                let a = mem.copy_args(r);
                (0..EC_MAX_SLOTS as usize).filter(|&i| a.buffers & (1 << i) != 0).map(|i| a.addr[i]).collect()
            }
            Err(_) => Vec::new(),
        };
    }
    [(EC_FLAG_IN0_BUF, sqe.in0), (EC_FLAG_IN1_BUF, sqe.in1), (EC_FLAG_OUT_BUF, sqe.out)]
        .into_iter()
        .filter(|&(flag, _)| sqe.flags & flag != 0)
        .map(|(_, id)| id)
        .collect()
}

/// A user's record's place: `EC_JOB_ARGS_BYTES` bytes of the arena at
/// `addr`, 8-aligned.
fn args_region(addr: u64, sizes: impl Sizes) -> Result<Region, Status> {
    let r = Region::new(addr, EC_JOB_ARGS_BYTES, ElemType::U8, sizes)?;
    if !r.offset().is_multiple_of(8) {
        return Err(Status::Misaligned);
    }
    Ok(r)
}

/// Turns a copied submission of a built-in kernel into a job, or names
/// what is wrong with it (users' kernels: [`validate_bufs`]).
pub fn validate(sqe: &Sqe, sizes: impl Sizes + Copy) -> Result<Job, Status> {
    validate_bufs(sqe, sizes, &Registry::default(), &mut NoBuffers, &NoArena)
}

/// [`validate`] for any kernel, without device buffers: a user's kernel is
/// judged by its module's declaration in `modules`, its record read from
/// `mem`.
pub fn validate_with(sqe: &Sqe, sizes: impl Sizes + Copy, modules: &Registry, mem: &dyn ArgsMemory) -> Result<Job, Status> {
    validate_bufs(sqe, sizes, modules, &mut NoBuffers, mem)
}

/// Validates any job: flags first (unknown bits: BAD_FLAGS), then the
/// kernel (BAD_KERNEL), then its form: a user's kernel takes exactly
/// EC_FLAG_ARGS and its record, a built-in never does. A slot whose buffer
/// bit is set names a device buffer, looked up (inputs) or created
/// (outputs, last) in `bufs`; buffers and the arena mix freely.
pub fn validate_bufs(
    sqe: &Sqe,
    sizes: impl Sizes + Copy,
    modules: &Registry,
    bufs: &mut dyn BufferTable,
    mem: &dyn ArgsMemory,
) -> Result<Job, Status> {
    let fault_bit = if cfg!(feature = "fault-injection") { EC_FLAG_FAULT } else { 0 };
    if sqe.flags & !(EC_FLAG_ARGS | BUF_FLAGS | fault_bit) != 0 {
        return Err(Status::BadFlags);
    }
    if sqe.kernel >= EC_USER_KERNEL_BASE {
        let k = modules.kernel(sqe.kernel).ok_or(Status::BadKernel)?;
        return validate_user(sqe, sizes, k, bufs, mem);
    }
    let kernel = Kernel::from_id(sqe.kernel).ok_or(Status::BadKernel)?;
    if sqe.flags & EC_FLAG_ARGS != 0 {
        return Err(Status::BadFlags);
    }
    let ty = ElemType::from_id(sqe.ty).filter(|t| kernel.runs_on(*t)).ok_or(Status::BadType)?;
    kernel.with_plan(BuiltinCheck { sqe, kernel, ty, sizes, bufs })
}

/// A built-in's descriptor, read as the general form and checked against
/// its kernel's plan, a constant in each kernel's copy of this check.
struct BuiltinCheck<'a, S> {
    sqe: &'a Sqe,
    kernel: Kernel,
    ty: ElemType,
    sizes: S,
    bufs: &'a mut dyn BufferTable,
}

impl<S: Sizes + Copy> WithPlan for BuiltinCheck<'_, S> {
    type Out = Result<Job, Status>;

    #[inline]
    fn with<const K: usize>(self) -> Result<Job, Status> {
        let plan = &KERNEL_PLANS[K];
        let sqe = self.sqe;
        let form = BuiltinForm { sqe, two: plan.nvec > 1, param: sqe.p.decode(plan) };
        let fault = sqe.flags & EC_FLAG_FAULT != 0;
        let head = check::Head { user_data: sqe.user_data, kernel: KernelRef::Builtin(self.kernel), fault };
        check::check(head, &form, plan, self.ty, self.sizes, self.bufs, None)
    }
}

/// A built-in's descriptor read as the general form: in0, in1 (a
/// two-vector kernel's; a one-vector kernel's in1 address is unused,
/// whatever it holds, while its length must be 0) and out in slots 0, 1
/// and `EC_MAX_VECTORS`, the buffer flags as their slots' bits, the
/// parameter area decoded by the kernel's plan, no launch options.
struct BuiltinForm<'a> {
    sqe: &'a Sqe,
    two: bool,
    param: [u64; EC_MAX_PARAMS as usize],
}

const OUT: usize = EC_MAX_VECTORS as usize;

impl check::Form for BuiltinForm<'_> {
    #[inline(always)]
    fn addr(&self, i: usize) -> u64 {
        match i {
            0 => self.sqe.in0,
            1 if self.two => self.sqe.in1,
            OUT => self.sqe.out,
            _ => 0,
        }
    }
    #[inline(always)]
    fn len(&self, i: usize) -> u32 {
        match i {
            0 => self.sqe.in0_len,
            1 => self.sqe.in1_len,
            OUT => self.sqe.out_len,
            _ => 0,
        }
    }
    #[inline(always)]
    fn param(&self, i: usize) -> u64 {
        self.param[i]
    }
    #[inline(always)]
    fn buffers(&self) -> u32 {
        let bit = |flag: u8, slot: usize| if self.sqe.flags & flag != 0 { 1u32 << slot } else { 0 };
        bit(EC_FLAG_IN0_BUF, 0) | bit(EC_FLAG_IN1_BUF, 1) | bit(EC_FLAG_OUT_BUF, OUT)
    }
    #[inline(always)]
    fn options(&self) -> [u32; 5] {
        [0; 5]
    }
    #[inline(always)]
    fn max_wait_us(&self) -> u32 {
        0
    }
    #[inline(always)]
    fn rest_is_zero(&self) -> bool {
        true
    }
}

/// A user's job: exactly EC_FLAG_ARGS; `type` the kernel's T (one of its
/// set; a kernel with no T says F32); in0 the record's arena address,
/// in0_len its size in bytes; the rest of the descriptor 0 (lengths:
/// BAD_SHAPE, addresses and parameters: BAD_FLAGS). The record is copied
/// out of the arena once, and the copy is what is validated and run.
fn validate_user(sqe: &Sqe, sizes: impl Sizes + Copy, k: &UserKernel, bufs: &mut dyn BufferTable, mem: &dyn ArgsMemory) -> Result<Job, Status> {
    if sqe.flags != EC_FLAG_ARGS {
        return Err(Status::BadFlags);
    }
    let ty = ElemType::from_id(sqe.ty).filter(|t| k.runs_on(*t)).ok_or(Status::BadType)?;
    if sqe.in0_len != EC_JOB_ARGS_BYTES || sqe.in1_len != 0 || sqe.out_len != 0 {
        return Err(Status::BadShape);
    }
    if sqe.in1 != 0 || sqe.out != 0 || sqe.p != Params::default() {
        return Err(Status::BadFlags);
    }
    let record = mem.copy_args(args_region(sqe.in0, sizes)?);
    let head = check::Head { user_data: sqe.user_data, kernel: KernelRef::User(k.id), fault: false };
    check::check(head, &record, &k.plan, ty, sizes, bufs, Some(k))
}

